// cadeloop._core.ServerCore: one core pair (native I/O thread, rings) plus
// the ASGI bridge that joins the pair's inbound ring to a cadeloop.Loop; the
// settings hand-off from Python (core_options, pair_options_preview).
// Cold paths (construction, start, stop, stats) go through pybind11; the
// per-request path lives in bridge*.cpp and request_type.cpp on the raw C API.
#include <pybind11/stl.h>

#include <cadeloop/config/settings.hpp>
#include <cadeloop/http/request.hpp>
#include <cadeloop/net/access_log.hpp>
#include <cadeloop/net/tls_context.hpp>
#include <cadeloop/runtime/core_pair.hpp>
#include <cadeloop/runtime/pair_settings.hpp>
#include <cadeloop/runtime/server_log.hpp>
#include <cadeloop/runtime/stats/stats_page.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <mutex>
#include <thread>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "asgi/bridge.hpp"
#include "config_values.hpp"
#include "register.hpp"

namespace cadeloop::pyhost {

namespace py = pybind11;

namespace {

// ---------------------------------------------------------------- the settings hand-off
//
// ServerCore's options are the dict cadeloop.config.Config.core_options()
// gives: every setting of the table by name (checked again here, through the
// table, as Config checks it), plus the pair's placement keys. The resolved
// values become the pair's options in one place, runtime::pair_settings_from.

/// Options that are not settings: where the pair's stats page is, set per
/// pair by whoever starts it (cadeloop._supervisor).
constexpr std::array<std::string_view, 4> placement_keys{"stats_index", "stats_region",
                                                         "stats_page_address", "stuck_notify_fd"};

bool is_placement_key(std::string_view key) {
  return std::find(placement_keys.begin(), placement_keys.end(), key) != placement_keys.end();
}

/// A placement key's value, or `fallback` when it is missing or None.
template <class T>
T placement(const py::dict& options, const char* key, T fallback) {
  if (!options.contains(key) || py::object(options[key]).is_none()) {
    return fallback;
  }
  return py::object(options[key]).cast<T>();
}

/// A limit that may be removed (a nullable size) crosses as a number: its
/// none is http::request_limits::unlimited, the core's one "no limit".
bool is_removable_limit(const config::setting& s) {
  return s.nullable && s.type == config::kind::size;
}

config::typed_input core_input(const config::setting& s, const py::handle& obj) {
  if (is_removable_limit(s) && PyLong_Check(obj.ptr())) {
    const unsigned long long n = PyLong_AsUnsignedLongLong(obj.ptr());
    if (n == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
      PyErr_Clear();  // negative or too large: typed_input_from shows it as it is
    } else if (n == http::request_limits::unlimited) {
      return std::monostate{};
    }
  }
  return typed_input_from(obj);
}

/// The settings in `options`, read through the table; a setting that is not
/// there keeps its default. Raises SettingError for a bad value or a key that
/// is neither a setting nor a placement key.
config::resolved_values settings_from(const py::dict& options) {
  try {
    config::resolved_values values;
    for (const auto& [key, v] : options) {
      const std::string name = py::str(key);
      if (is_placement_key(name)) {
        continue;
      }
      const config::setting& s = config::require_setting(name);
      values.set(config::id_of(s), config::accept(s, core_input(s, v), name));
    }
    return values;
  } catch (const config::setting_error& e) {
    raise_setting_error(e);
  }
}

runtime::pair_settings pair_settings_from(const py::dict& options) {
  const config::resolved_values values = settings_from(options);
  try {
    return runtime::pair_settings_from(values);
  } catch (const config::setting_error& e) {
    raise_setting_error(e);
  }
}

/// Config.core_options(): the table's values (checked) as ServerCore reads them.
py::dict core_options(const py::dict& values) {
  const config::resolved_values v = settings_from(values);
  py::dict out;
  for (const config::setting& s : config::settings()) {
    const config::setting_id id = config::id_of(s);
    if (is_removable_limit(s) && v.is_none(id)) {
      out[py::str(std::string{s.name})] = py::int_(http::request_limits::unlimited);
    } else {
      out[py::str(std::string{s.name})] = to_python(v[id]);
    }
  }
  return out;
}

/// _core.pair_options_preview: every option field a setting fills, read back.
py::list pair_options_preview(const py::dict& options) {
  py::list out;
  for (const runtime::option_reading& r : runtime::read_back(pair_settings_from(options))) {
    out.append(
        py::make_tuple(std::string{config::row(r.id).name}, std::string{r.field}, to_python(r.v)));
  }
  return out;
}

/// A stats snapshot as a dict: every counter of pair_stats_snapshot under its
/// own name, `state` as its name, the latency percentiles (µs; see
/// runtime::latency_percentile_us for the error bound) and `latency_buckets`
/// (counts; bounds from latency_bucket_bounds_us()).
py::dict snapshot_dict(const runtime::pair_stats_snapshot& s) {
  py::dict d;
  d["valid"] = s.valid;
  d["index"] = s.index;
  d["pid"] = s.pid;
  d["state"] = std::string{runtime::state_name(s.state)};
  d["started_unix_ms"] = s.started_unix_ms;
  d["requests"] = s.requests;
  d["responses"] = s.responses;
  d["responses_1xx"] = s.responses_1xx;
  d["responses_2xx"] = s.responses_2xx;
  d["responses_3xx"] = s.responses_3xx;
  d["responses_4xx"] = s.responses_4xx;
  d["responses_5xx"] = s.responses_5xx;
  d["requests_in_flight"] = s.requests_in_flight;
  d["bytes_in"] = s.bytes_in;
  d["bytes_out"] = s.bytes_out;
  d["unsent_bytes"] = s.unsent_bytes;
  d["connections_accepted"] = s.connections_accepted;
  d["connections_open"] = s.connections_open;
  d["protocol_errors"] = s.protocol_errors;
  d["timeouts"] = s.timeouts;
  d["stale_messages"] = s.stale_messages;
  d["accept_pauses"] = s.accept_pauses;
  d["write_calls"] = s.write_calls;
  d["access_log_dropped"] = s.access_log_dropped;
  d["tls_handshakes"] = s.tls_handshakes;
  d["tls_resumed"] = s.tls_resumed;
  d["tls_fail_protocol"] = s.tls_fail_protocol;
  d["tls_fail_client_cert"] = s.tls_fail_client_cert;
  d["tls_fail_timeout"] = s.tls_fail_timeout;
  d["tls_fail_plain_http"] = s.tls_fail_plain_http;
  d["tls_fail_closed"] = s.tls_fail_closed;
  d["io_passes"] = s.io_passes;
  d["io_parks"] = s.io_parks;
  d["spins"] = s.spins;
  d["spin_hits"] = s.spin_hits;
  d["inbound_messages"] = s.inbound_messages;
  d["inbound_depth"] = s.inbound_depth;
  d["wakeups_to_app"] = s.wakeups_to_app;
  d["outbound_messages"] = s.outbound_messages;
  d["outbound_depth"] = s.outbound_depth;
  d["app_parks"] = s.app_parks;
  d["wakeups_to_io"] = s.wakeups_to_io;
  d["loop_ticks"] = s.loop_ticks;
  d["app_errors"] = s.app_errors;
  d["concurrency_refusals"] = s.concurrency_refusals;
  d["stuck_episodes"] = s.stuck_episodes;
  d["solo_handoffs"] = s.solo_handoffs;
  d["solo_steals"] = s.solo_steals;
  d["solo_passes"] = s.solo_passes;
  d["io_beat_ms"] = s.io_beat_ms;
  d["stuck_since_ms"] = s.stuck_since_ms;
  d["latency_count"] = s.latency_count;
  d["latency_sum_us"] = s.latency_sum_us;
  const runtime::latency_percentiles p = runtime::percentiles(s);
  d["latency_p50_us"] = p.p50_us;
  d["latency_p90_us"] = p.p90_us;
  d["latency_p99_us"] = p.p99_us;
  d["latency_p999_us"] = p.p999_us;
  py::list buckets(s.latency_buckets.size());
  for (std::size_t i = 0; i < s.latency_buckets.size(); ++i) {
    buckets[i] = py::int_(s.latency_buckets[i]);
  }
  d["latency_buckets"] = std::move(buckets);
  return d;
}

/// _core.StatsRegion: pages in one MAP_SHARED mapping (runtime::stats_region).
/// Made in the main interpreter of the main process, before worker processes
/// are forked (they inherit the mapping). Its methods only read the pages:
/// any thread holding this interpreter's GIL may call them, in the main
/// process or a forked child. Pairs in sub-interpreters are placed on a page
/// by its address (an int), since no Python object crosses interpreters: the
/// region object must then stay alive in the main interpreter until every
/// such pair has ended.
class py_stats_region {
 public:
  explicit py_stats_region(std::size_t pages) : region_{pages} {}

  [[nodiscard]] std::size_t size() const noexcept { return region_.size(); }
  runtime::pair_stats_page& page(std::size_t i) { return region_.page(i); }
  [[nodiscard]] std::uintptr_t address(std::size_t i) {
    return reinterpret_cast<std::uintptr_t>(&region_.page(i));
  }
  [[nodiscard]] py::dict snapshot(std::size_t i) const {
    return snapshot_dict(runtime::snapshot(region_.page(i)));
  }
  [[nodiscard]] py::list snapshot_all() const {
    py::list out;
    for (const runtime::pair_stats_snapshot& s : region_.snapshot_all()) {
      out.append(snapshot_dict(s));
    }
    return out;
  }
  [[nodiscard]] py::dict totals() const {
    const std::vector<runtime::pair_stats_snapshot> all = region_.snapshot_all();
    return snapshot_dict(runtime::merge(all));
  }

 private:
  runtime::stats_region region_;
};

/// Whether [address, address + size) is mapped in this process (mincore
/// fails with ENOMEM otherwise), so a wrong integer gives a ValueError, not
/// a crash.
bool mapped(std::uintptr_t address, std::size_t size) {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const std::uintptr_t start = address & ~(page - 1);
  const std::uintptr_t end = address + size;
  std::vector<unsigned char> residency((end - start + page - 1) / page);
  return ::mincore(reinterpret_cast<void*>(start), end - start, residency.data()) == 0;
}

/// The page `options` place a pair on: "stats_region" (a StatsRegion) with
/// "stats_index", or "stats_page_address" (an int from StatsRegion.address)
/// with "stats_index"; nullptr when neither is given (the pair keeps a
/// private page). `keep` holds the region object while the pair lives.
runtime::pair_stats_page* stats_page_option(const py::dict& options, std::uint32_t index,
                                            py::object& keep) {
  if (options.contains("stats_region") && !py::object(options["stats_region"]).is_none()) {
    py::object region = options["stats_region"];
    auto& r = region.cast<py_stats_region&>();
    if (index >= r.size()) {
      throw py::value_error("stats_index " + std::to_string(index) +
                            " is outside the stats region (" + std::to_string(r.size()) +
                            " pages)");
    }
    keep = std::move(region);
    return &r.page(index);
  }
  const auto address = placement<std::uintptr_t>(options, "stats_page_address", 0);
  if (address == 0) {
    return nullptr;
  }
  if (address % alignof(runtime::pair_stats_page) != 0 ||
      !mapped(address, sizeof(runtime::pair_stats_page))) {
    throw py::value_error("stats_page_address is not the address of a stats page");
  }
  auto* page = reinterpret_cast<runtime::pair_stats_page*>(address);
  if (!page->valid() || page->header.index.load(std::memory_order_relaxed) != index) {
    throw py::value_error("stats_page_address is not page " + std::to_string(index) +
                          " of a live StatsRegion");
  }
  return page;
}

/// One core pair and its bridge. Made, used and destroyed on the loop thread
/// (the thread that runs the cadeloop.Loop it is attached to).
class server_core {
 public:
  server_core(py::object app, py::object loop, py::dict options, py::object on_error,
              py::object on_stopped) {
    runtime::pair_settings settings = pair_settings_from(options);
    runtime::core_pair_options& o = settings.pair;
    o.index = placement<std::uint32_t>(options, "stats_index", 0);
    o.stats_page = stats_page_option(options, o.index, region_);
    const std::uint64_t memory_budget = o.server.memory_budget;
    o.stuck_notify_fd = placement<int>(options, "stuck_notify_fd", -1);
    app_tstate_ = PyThreadState_Get();
    pair_ = std::make_unique<runtime::core_pair>(std::move(o));

    server::bridge_options b;
    b.send_high_mark = settings.app.send_high_mark;
    // A quarter above the I/O thread's budget: the I/O thread reaches its budget
    // first and cuts the slowest clients, whose bytes then leave this count too.
    b.staged_budget = memory_budget + memory_budget / 4;
    b.root_path = std::move(settings.app.root_path);
    b.unix_path = std::move(settings.app.unix_path);
    b.server_header = std::move(settings.app.server_header);
    b.date_header = settings.app.date_header;
    b.asyncio_tasks = settings.app.asyncio_tasks;
    for (std::string_view rest = settings.app.headers; !rest.empty();) {
      const std::size_t end = std::min(rest.find('\n'), rest.size());
      if (end != 0) {
        b.extra_headers.append(rest.substr(0, end)).append("\r\n");  // lines checked by Config
      }
      rest.remove_prefix(std::min(end + 1, rest.size()));
    }
    if (settings.app.proxy_headers) {
      std::string problem;
      auto trust = server::proxy_trust::parse(settings.app.forwarded_allow_ips, problem);
      if (!trust) {
        throw py::value_error("forwarded_allow_ips: " + problem);
      }
      b.proxy = std::move(*trust);
    }
    py::module_ core = py::module_::import("cadeloop._core");
    py::object request_type = core.attr("Request");
    py::object ready_type = core.attr("Ready");
    py::object disconnected = core.attr("ClientDisconnected");
    try {
      bridge_ = std::make_unique<server::bridge>(
          pair_->app(), app.ptr(), loop.ptr(), on_error.ptr(), on_stopped.ptr(), request_type.ptr(),
          ready_type.ptr(), disconnected.ptr(), std::move(b));
    } catch (const std::bad_alloc&) {
      if (PyErr_Occurred()) {
        throw py::error_already_set();
      }
      throw;
    }
  }

  server_core(const server_core&) = delete;
  server_core& operator=(const server_core&) = delete;

  ~server_core() {
    bridge_.reset();
    if (pair_) {
      py::gil_scoped_release nogil;
      pair_.reset();  // stops and joins the I/O thread if it still runs
    }
  }

  /// The loop thread's current Python frame, or None; called from another
  /// thread of the same interpreter holding its GIL (the watchdog's stack
  /// reporter). sys._current_frames() is not used: in 3.13 it also walks
  /// other interpreters' threads, which run under their own GILs.
  py::object app_frame() const {
    PyFrameObject* f = PyThreadState_GetFrame(app_tstate_);
    if (f == nullptr) {
      return py::none();
    }
    return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(f));
  }

  std::string start() {
    std::string error = pair_->start();
    if (error.empty()) {
      started_ = true;
    }
    return error;
  }
  void request_stop() { pair_->request_stop(); }
  void join() {
    py::gil_scoped_release nogil;
    pair_->join();
  }
  std::string description() const { return pair_->description(); }
  void count_concurrency_refusal() { pair_->app().count_concurrency_refusal(); }
  int port() const { return pair_->local_address().port; }
  bool started() const { return started_; }

  server::bridge& bridge() {
    if (!bridge_) {
      throw std::runtime_error("the server core is closed");
    }
    return *bridge_;
  }
  /// Drops the bridge (after it was detached from the loop).
  void close_bridge() { bridge_.reset(); }

  py::dict stats() const {
    py::dict d = snapshot_dict(pair_->stats());
    if (bridge_) {
      const server::bridge_stats& b = bridge_->stats();
      d["app_requests"] = b.requests;
      d["eager_completed"] = b.eager_completed;
      d["app_errors"] = b.app_errors;
      d["drain_waits"] = b.drain_waits;
      d["gate_waits"] = b.gate_waits;
      d["gate_cuts"] = b.gate_cuts;
      d["app_passes_with_work"] = b.passes_with_work;
      d["active_tasks"] = bridge_->active_tasks();
    }
    return d;
  }

 private:
  PyThreadState* app_tstate_ = nullptr;  // the loop thread's, which outlives this object
  py::object region_;  // the StatsRegion the pair's page is in (None: private page or by address)
  std::unique_ptr<runtime::core_pair> pair_;
  std::unique_ptr<server::bridge> bridge_;
  bool started_ = false;
};

// ---------------------------------------------------------------- TLS reload on a signal
//
// The signal handler only writes a byte to a pipe; a thread of this process
// reads it and re-reads the certificate and key of every TLS context the
// process's I/O threads share (net::tls_context::reload_all), whatever the
// interpreters of the process are doing.

int reload_pipe[2] = {-1, -1};

extern "C" void on_tls_reload_signal(int /*signum*/) {
  const int saved = errno;
  const char b = 1;
  (void)!::write(reload_pipe[1], &b, 1);
  errno = saved;
}

void tls_reload_thread() {
  for (;;) {
    char b = 0;
    const ssize_t n = ::read(reload_pipe[0], &b, 1);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      return;
    }
    std::string problems;
    const std::size_t done = net::tls_context::reload_all(problems);
    if (!problems.empty()) {
      runtime::server_log::write(runtime::server_log::log_level::warning, problems);
    }
    if (done != 0) {
      runtime::server_log::write(runtime::server_log::log_level::info,
                                 std::string{"TLS certificate and key reloaded (pid "}
                                     .append(std::to_string(::getpid()))
                                     .append("): new connections get them, open ones keep theirs"));
    }
  }
}

void tls_reload_on_signal(int signum) {
  static std::once_flag once;
  std::call_once(once, [] {
    if (::pipe2(reload_pipe, O_CLOEXEC) != 0) {
      throw std::runtime_error("cannot make the TLS reload pipe");
    }
    std::thread{tls_reload_thread}.detach();
  });
  struct sigaction sa {};
  sa.sa_handler = on_tls_reload_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  if (::sigaction(signum, &sa, nullptr) != 0) {
    throw std::runtime_error("cannot install the TLS reload signal handler");
  }
}

}  // namespace

void register_server(py::module_& m) {
  if (server::add_types(m.ptr()) < 0) {
    throw py::error_already_set();
  }
  py::class_<server_core>(
      m, "ServerCore",
      "One core pair (native I/O thread) and its ASGI bridge; see cadeloop.server. Loop thread.")
      .def(py::init<py::object, py::object, py::dict, py::object, py::object>(), py::arg("app"),
           py::arg("loop"), py::arg("options"), py::arg("on_error"), py::arg("on_stopped"))
      .def("start", &server_core::start,
           "Listens and starts the I/O thread; returns '' or one line saying why not (address in "
           "use, ...).")
      .def("request_stop", &server_core::request_stop,
           "Graceful stop: no more accepts, in-flight responses finish within grace. Any thread.")
      .def("join", &server_core::join, "Waits for the I/O thread (the GIL is released meanwhile).")
      .def_property_readonly("description", &server_core::description)
      .def("count_concurrency_refusal", &server_core::count_concurrency_refusal,
           "Counts one 503 of limit_concurrency in the pair's stats page. Loop thread.")
      .def_property_readonly("port", &server_core::port)
      .def(
          "source_capsule",
          [](py::object self) {
            auto& core = self.cast<server_core&>();
            loop_source* src = &core.bridge();
            PyObject* cap = PyCapsule_New(src, "cadeloop.loop_source", nullptr);
            if (cap == nullptr || PyCapsule_SetContext(cap, self.ptr()) != 0) {
              Py_XDECREF(cap);
              throw py::error_already_set();
            }
            return py::reinterpret_steal<py::object>(cap);
          },
          "A capsule for Loop._attach_source (it keeps this object alive while attached).")
      .def(
          "set_state",
          [](server_core& core, py::object state) {
            core.bridge().set_state(state.is_none() ? nullptr : state.ptr());
          },
          "The lifespan state dict copied (shallowly) into every request's scope, or None.")
      .def(
          "active_tasks", [](server_core& core) { return core.bridge().active_tasks(); },
          "App tasks still running.")
      .def(
          "cancel_tasks", [](server_core& core) { core.bridge().cancel_tasks(); },
          "Cancels every running app task.")
      .def("close", &server_core::close_bridge, "Drops the bridge; detach it from the loop first.")
      .def("app_frame", &server_core::app_frame,
           "The loop thread's current Python frame (or None). Another thread of this "
           "interpreter may call it: the watchdog's stack reporter.")
      .def("stats", &server_core::stats,
           "The pair's counters (read from its stats page, with latency percentiles) and the "
           "bridge's. Loop thread.");

  py::class_<py_stats_region>(
      m, "StatsRegion",
      "Per-pair stats pages in one MAP_SHARED mapping: make it in the main process before forking "
      "workers, "
      "place pair i on page i (ServerCore options stats_region + stats_index, or "
      "stats_page_address + "
      "stats_index), read every page from the main process without locks. It survives os.fork().")
      .def(py::init<std::size_t>(), py::arg("pages"))
      .def("__len__", &py_stats_region::size)
      .def("address", &py_stats_region::address, py::arg("index"),
           "The address of page `index` as an int, for a pair in another interpreter (ServerCore "
           "option "
           "stats_page_address). Valid while this object lives.")
      .def("snapshot", &py_stats_region::snapshot, py::arg("index"),
           "Page `index`'s counters as a dict.")
      .def("snapshot_all", &py_stats_region::snapshot_all, "Every page's counters, in index order.")
      .def("totals", &py_stats_region::totals,
           "The sum of every page in use (histograms merged, so its percentiles are the "
           "process's).");
  m.def(
      "flush_access_logs",
      [](double timeout) {
        py::gil_scoped_release nogil;
        return net::flush_access_logs(
            std::chrono::milliseconds{static_cast<std::int64_t>(timeout * 1000.0)});
      },
      py::arg("timeout") = 5.0,
      "Waits (GIL released) until every access-log line queued in this process is written and "
      "flushed; "
      "False on timeout. Call it after the pairs stopped, before the process exits (os._exit skips "
      "it).");
  m.def("core_options", &core_options, py::arg("values"),
        "The dict ServerCore reads, from the settings table's values by name (each checked as "
        "Config checks it; a missing one is its default): every setting, a removed limit as the "
        "core's 'no limit' number. Raises SettingError.");
  m.def("pair_options_preview", &pair_options_preview, py::arg("options"),
        "For tests: the options ServerCore would build from `options` (a core_options() dict), as "
        "(setting, option field, value read back in the setting's terms) for every field a setting "
        "fills. Raises SettingError.");
  m.def(
      "check_forwarded_allow_ips",
      [](const std::string& list) {
        std::string problem;
        (void)server::proxy_trust::parse(list, problem);
        return problem;
      },
      py::arg("list"),
      "Why a forwarded_allow_ips value is refused, or \"\" when it is good. Any thread.");
  m.def(
      "check_tls",
      [](const py::dict& options) -> std::string {
        const runtime::pair_settings s = pair_settings_from(options);
        if (!s.pair.server.tls.enabled()) {
          return {};
        }
        try {
          net::tls_context::check(s.pair.server.tls);
        } catch (const net::tls_error& e) {
          return e.what();
        }
        return {};
      },
      py::arg("options"),
      "'' when TLS is off or every ssl_* file and value of `options` (a core_options() dict) "
      "loads, else one line naming the file and what is wrong with it. Any thread.");
  m.def(
      "tls_reload",
      [] {
        std::string problems;
        std::size_t n = 0;
        {
          py::gil_scoped_release nogil;
          n = net::tls_context::reload_all(problems);
        }
        return py::make_tuple(n, problems);
      },
      "Re-reads the certificate and key of this process's TLS contexts: (how many were "
      "reloaded, the lines of those refused, which keep their old files). Any thread.");
  m.def("tls_reload_on_signal", &tls_reload_on_signal, py::arg("signum"),
        "From now on `signum` makes this process re-read the certificate and key of its TLS "
        "contexts (a thread does it and logs one line; a refused file keeps the old one).");
  m.def("check_access_log_format", &net::check_access_log_format, py::arg("format"),
        "'' if the access-log format is valid, else one line naming the problem. Any thread.");
  m.def(
      "latency_bucket_bounds_us",
      [] {
        py::list out;
        for (std::size_t i = 0; i < runtime::pair_stats_snapshot::latency_bucket_count; ++i) {
          const std::uint64_t b = runtime::pair_stats_snapshot::bucket_upper_us(i);
          out.append(b == std::numeric_limits<std::uint64_t>::max()
                         ? std::numeric_limits<double>::infinity()
                         : static_cast<double>(b));
        }
        return out;
      },
      "The exclusive upper bound (µs) of each latency bucket, the last one inf: "
      "stats()['latency_buckets'][i] "
      "counts durations below bounds[i] and at or above bounds[i-1].");
}

}  // namespace cadeloop::pyhost
