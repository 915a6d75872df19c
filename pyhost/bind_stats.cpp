// cadeloop._core.StatsEndpoint: the native stats endpoint (/stats, /metrics,
// /healthz, /readyz, the dashboard) started from Python, over the pairs'
// shared stats region, or over a Python callable for tests.
#include <pybind11/stl.h>

#include <cadeloop/runtime/stats/stats_endpoint.hpp>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "register.hpp"

namespace cadeloop::pyhost {

namespace py = pybind11;

namespace {

using runtime::pair_state;
using runtime::pair_stats_snapshot;

std::uint64_t u64(const py::dict& d, const char* key) {
  return d.contains(key) ? py::object(d[key]).cast<std::uint64_t>() : 0;
}

pair_state state_from(const py::object& v) {
  if (py::isinstance<py::str>(v)) {
    const auto name = v.cast<std::string>();
    for (const pair_state s : {pair_state::unused, pair_state::starting, pair_state::serving,
                               pair_state::draining, pair_state::stopped, pair_state::stuck}) {
      if (runtime::state_name(s) == name) {
        return s;
      }
    }
    throw py::value_error("unknown pair state '" + name + "'");
  }
  return static_cast<pair_state>(v.cast<std::uint32_t>());
}

// A snapshot from a dict whose keys are pair_stats_snapshot's field names
// (missing keys are 0; "state" a name or a number; "latency_buckets" a list
// of at most latency_bucket_count counts). GIL held.
pair_stats_snapshot snapshot_from(const py::handle& item, std::uint32_t position) {
  const auto d = py::reinterpret_borrow<py::dict>(item);
  pair_stats_snapshot s;
  s.valid = d.contains("valid") ? py::object(d["valid"]).cast<bool>() : true;
  s.index = d.contains("index") ? py::object(d["index"]).cast<std::uint32_t>() : position;
  s.pid = d.contains("pid") ? py::object(d["pid"]).cast<std::int32_t>() : 0;
  s.state = d.contains("state") ? state_from(d["state"]) : pair_state::serving;
  s.started_unix_ms = u64(d, "started_unix_ms");
#define CADELOOP_FIELD(name) s.name = u64(d, #name)
  CADELOOP_FIELD(requests);
  CADELOOP_FIELD(responses);
  CADELOOP_FIELD(responses_1xx);
  CADELOOP_FIELD(responses_2xx);
  CADELOOP_FIELD(responses_3xx);
  CADELOOP_FIELD(responses_4xx);
  CADELOOP_FIELD(responses_5xx);
  CADELOOP_FIELD(bytes_in);
  CADELOOP_FIELD(bytes_out);
  CADELOOP_FIELD(unsent_bytes);
  CADELOOP_FIELD(connections_open);
  CADELOOP_FIELD(connections_accepted);
  CADELOOP_FIELD(requests_in_flight);
  CADELOOP_FIELD(protocol_errors);
  CADELOOP_FIELD(timeouts);
  CADELOOP_FIELD(stale_messages);
  CADELOOP_FIELD(accept_pauses);
  CADELOOP_FIELD(write_calls);
  CADELOOP_FIELD(access_log_dropped);
  CADELOOP_FIELD(io_passes);
  CADELOOP_FIELD(io_parks);
  CADELOOP_FIELD(spins);
  CADELOOP_FIELD(spin_hits);
  CADELOOP_FIELD(inbound_messages);
  CADELOOP_FIELD(inbound_depth);
  CADELOOP_FIELD(wakeups_to_app);
  CADELOOP_FIELD(outbound_messages);
  CADELOOP_FIELD(outbound_depth);
  CADELOOP_FIELD(wakeups_to_io);
  CADELOOP_FIELD(app_parks);
  CADELOOP_FIELD(loop_ticks);
  CADELOOP_FIELD(app_errors);
  CADELOOP_FIELD(concurrency_refusals);
  CADELOOP_FIELD(stuck_episodes);
  CADELOOP_FIELD(solo_handoffs);
  CADELOOP_FIELD(solo_steals);
  CADELOOP_FIELD(solo_passes);
  CADELOOP_FIELD(latency_count);
  CADELOOP_FIELD(latency_sum_us);
#undef CADELOOP_FIELD
  if (d.contains("latency_buckets")) {
    const auto buckets = py::object(d["latency_buckets"]).cast<std::vector<std::uint64_t>>();
    if (buckets.size() > s.latency_buckets.size()) {
      throw py::value_error("latency_buckets: at most " + std::to_string(s.latency_buckets.size()) +
                            " counts");
    }
    std::copy(buckets.begin(), buckets.end(), s.latency_buckets.begin());
  }
  return s;
}

std::string info_string(const py::dict& info, const char* key, std::string fallback) {
  if (info.contains(key) && !py::object(info[key]).is_none()) {
    return py::str(info[key]).cast<std::string>();
  }
  return fallback;
}

/// The Python object. Made, closed and destroyed on a thread holding the GIL
/// (the main thread); the endpoint's own thread never touches Python unless
/// the reader is a Python callable (tests), when it takes the GIL per call.
class stats_endpoint_handle {
 public:
  stats_endpoint_handle(py::object source, const std::string& host, std::uint16_t port,
                        const py::dict& info) {
    runtime::stats_process_info pinfo;
    pinfo.isolation = info_string(info, "isolation", "unknown");
    pinfo.python_version =
        info_string(info, "python_version",
                    py::module_::import("platform").attr("python_version")().cast<std::string>());
    pinfo.cadeloop_version = info_string(info, "cadeloop_version", CADELOOP_VERSION);
    if (info.contains("started_unix_ms") && !py::object(info["started_unix_ms"]).is_none()) {
      pinfo.started_unix_ms = py::object(info["started_unix_ms"]).cast<std::int64_t>();
    } else {
      pinfo.started_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count();
    }

    runtime::stats_reader reader;
    const py::object region_type = py::module_::import("cadeloop._core").attr("StatsRegion");
    if (py::isinstance(source, region_type)) {
      // The shared pages, by address (StatsRegion.address: valid while the
      // region object lives, which keep_alive in the binding ensures). Read
      // on the endpoint's thread without the GIL and without locks.
      std::vector<const runtime::pair_stats_page*> pages;
      const auto n = py::len(source);
      for (std::size_t i = 0; i < n; ++i) {
        const auto address = source.attr("address")(i).cast<std::uintptr_t>();
        pages.push_back(reinterpret_cast<const runtime::pair_stats_page*>(address));
      }
      reader = [pages = std::move(pages)] {
        std::vector<pair_stats_snapshot> out;
        out.reserve(pages.size());
        for (const runtime::pair_stats_page* page : pages) {
          out.push_back(runtime::snapshot(*page));
        }
        return out;
      };
    } else if (PyCallable_Check(source.ptr()) != 0) {
      // Tests: a callable returning a list of dicts (see snapshot_from). The
      // function object is shared so the last reference can drop under the GIL.
      auto fn = std::shared_ptr<py::object>(new py::object(std::move(source)), [](py::object* o) {
        const py::gil_scoped_acquire gil;
        delete o;
      });
      reader = [fn] {
        const py::gil_scoped_acquire gil;
        try {
          std::vector<pair_stats_snapshot> out;
          std::uint32_t i = 0;
          for (const py::handle item : (*fn)()) {
            out.push_back(snapshot_from(item, i++));
          }
          return out;
        } catch (py::error_already_set& e) {
          // Becomes a 500 naming the Python error; the error state is cleared.
          throw std::runtime_error(e.what());
        }
      };
    } else {
      throw py::type_error(
          "StatsEndpoint: expected a StatsRegion or a callable returning a list of dicts");
    }

    runtime::stats_endpoint_options options{host, port, {}};
    if (info.contains("allowed_hosts") && !py::object(info["allowed_hosts"]).is_none()) {
      options.allowed_hosts = py::object(info["allowed_hosts"]).cast<std::vector<std::string>>();
    }
    std::string error;
    {
      // Binding may resolve a host name; nothing here needs Python.
      const py::gil_scoped_release release;
      endpoint_ =
          runtime::stats_endpoint::start(options, std::move(pinfo), std::move(reader), error);
    }
    if (!endpoint_) {
      throw py::value_error(error);
    }
  }

  stats_endpoint_handle(const stats_endpoint_handle&) = delete;
  stats_endpoint_handle& operator=(const stats_endpoint_handle&) = delete;

  ~stats_endpoint_handle() {
    if (endpoint_) {
      // A Python reader in progress needs the GIL to finish: release it while
      // the endpoint's thread is joined.
      const py::gil_scoped_release release;
      endpoint_.reset();
    }
  }

  [[nodiscard]] std::uint16_t port() const { return live().port(); }
  [[nodiscard]] std::string address() const { return live().description(); }
  void set_draining() { live().set_draining(); }
  void count_restart() { live().count_restart(); }
  [[nodiscard]] std::uint64_t restarts() const { return live().restarts(); }
  [[nodiscard]] bool draining() const { return live().draining(); }
  [[nodiscard]] bool closed() const { return !endpoint_; }

  void close() {
    if (endpoint_) {
      const py::gil_scoped_release release;
      endpoint_.reset();
    }
  }

 private:
  [[nodiscard]] runtime::stats_endpoint& live() const {
    if (!endpoint_) {
      throw py::value_error("the stats endpoint is closed");
    }
    return *endpoint_;
  }

  std::unique_ptr<runtime::stats_endpoint> endpoint_;
};

}  // namespace

void register_stats(py::module_& m) {
  py::class_<stats_endpoint_handle>(
      m, "StatsEndpoint",
      "The stats endpoint: /stats (JSON), /metrics (Prometheus), /healthz, /readyz "
      "and the dashboard at /, served by a native thread of this process.")
      .def(py::init<py::object, const std::string&, std::uint16_t, const py::dict&>(),
           py::arg("region"), py::arg("host") = "127.0.0.1", py::arg("port") = 0,
           py::arg("info") = py::dict(),
           // The region's pages are read by the endpoint's thread: keep it alive.
           py::keep_alive<1, 2>(),
           "Binds host:port (0: any free port) and starts serving. `region` is the pairs' "
           "StatsRegion (or, "
           "for tests, a callable returning a list of dicts named like the snapshot fields). "
           "`info` may give "
           "isolation, python_version, cadeloop_version and started_unix_ms. Raises ValueError "
           "with one "
           "line when the address can't be bound.")
      .def_property_readonly("port", &stats_endpoint_handle::port, "The bound port.")
      .def_property_readonly("address", &stats_endpoint_handle::address, "host:port as bound.")
      .def_property_readonly("draining", &stats_endpoint_handle::draining,
                             "True once set_draining() was called.")
      .def_property_readonly("closed", &stats_endpoint_handle::closed,
                             "True once close() was called.")
      .def("set_draining", &stats_endpoint_handle::set_draining,
           "From now on /readyz answers 503. Call it at SIGTERM, before the listeners close. Any "
           "thread.")
      .def("count_restart", &stats_endpoint_handle::count_restart,
           "Counts one restart of a pair or serving process (/stats `restarts`, /metrics "
           "`cadeloop_restarts_total`). Any thread.")
      .def_property_readonly("restarts", &stats_endpoint_handle::restarts,
                             "The restarts counted so far.")
      .def("close", &stats_endpoint_handle::close,
           "Stops serving and joins the endpoint's thread. Idempotent.");
}

}  // namespace cadeloop::pyhost
