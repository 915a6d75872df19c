// cadeloop._core.ServerCore: one core pair (native I/O thread, rings) plus
// the ASGI bridge that joins the pair's inbound ring to a cadeloop.Loop.
// Cold paths (construction, start, stop, stats) go through pybind11; the
// per-request path lives in server_bridge.cpp on the raw C API.
#include <pybind11/stl.h>

#include <cadeloop/runtime/core_pair.hpp>

#include <chrono>
#include <memory>
#include <new>
#include <string>

#include "register.hpp"
#include "server_bridge.hpp"

namespace cadeloop::pyhost {

namespace py = pybind11;

namespace {

template <class T>
T option(const py::dict& options, const char* key, T fallback) {
  if (!options.contains(key)) {
    return fallback;
  }
  py::object v = options[key];
  if (v.is_none()) {
    return fallback;
  }
  return v.cast<T>();
}

std::chrono::milliseconds seconds_option(const py::dict& options, const char* key, std::chrono::milliseconds fallback) {
  if (!options.contains(key) || py::object(options[key]).is_none()) {
    return fallback;
  }
  const double s = py::object(options[key]).cast<double>();
  return std::chrono::milliseconds{static_cast<std::int64_t>(s * 1000.0)};
}

/// One core pair and its bridge. Made, used and destroyed on the loop thread
/// (the thread that runs the cadeloop.Loop it is attached to).
class server_core {
 public:
  server_core(py::object app, py::object loop, py::dict options, py::object on_error, py::object on_stopped) {
    runtime::core_pair_options o;
    const std::string kind = option<std::string>(options, "kind", "tcp");
    const int backlog = option<int>(options, "backlog", 1024);
    if (kind == "unix") {
      o.listen = net::listen_spec::unix_socket(option<std::string>(options, "path", ""), backlog);
    } else if (kind == "fd") {
      o.listen = net::listen_spec::inherited(option<int>(options, "fd", -1));
    } else {
      o.listen = net::listen_spec::tcp(option<std::string>(options, "host", "127.0.0.1"),
                                       option<std::uint16_t>(options, "port", 8000), backlog);
    }
    net::server_options& s = o.server;
    s.limits.max_body = option<std::uint64_t>(options, "max_body", s.limits.max_body);
    s.limits.max_url = option<std::size_t>(options, "max_url", s.limits.max_url);
    s.limits.max_header_bytes = option<std::size_t>(options, "max_header_bytes", s.limits.max_header_bytes);
    s.limits.max_headers = option<std::size_t>(options, "max_headers", s.limits.max_headers);
    s.max_pipelined = option<std::uint32_t>(options, "max_pipelined", s.max_pipelined);
    s.body_window = option<std::uint64_t>(options, "body_window", s.body_window);
    s.drain_low_mark = option<std::uint64_t>(options, "drain_low_mark", s.drain_low_mark);
    s.max_connections = option<std::size_t>(options, "max_connections", s.max_connections);
    s.max_requests_in_flight = option<std::size_t>(options, "max_requests_in_flight", s.max_requests_in_flight);
    s.request_line_timeout = seconds_option(options, "request_line_timeout", s.request_line_timeout);
    s.keepalive_idle = seconds_option(options, "keepalive_idle", s.keepalive_idle);
    s.linger_timeout = seconds_option(options, "linger_timeout", s.linger_timeout);
    s.server_header = option<std::string>(options, "server_header", s.server_header);
    o.grace = seconds_option(options, "grace", o.grace);
    o.spin = std::chrono::microseconds{option<std::int64_t>(options, "io_spin_us", 0)};
    const std::string server_header = s.server_header;
    pair_ = std::make_unique<runtime::core_pair>(std::move(o));

    server::bridge_options b;
    b.send_high_mark = option<std::uint64_t>(options, "send_high_mark", b.send_high_mark);
    b.root_path = option<std::string>(options, "root_path", "");
    b.unix_path = option<std::string>(options, "path", "");
    b.server_header = server_header;
    py::module_ core = py::module_::import("cadeloop._core");
    py::object request_type = core.attr("Request");
    py::object ready_type = core.attr("Ready");
    py::object disconnected = core.attr("ClientDisconnected");
    try {
      bridge_ = std::make_unique<server::bridge>(pair_->app(), app.ptr(), loop.ptr(), on_error.ptr(),
                                                 on_stopped.ptr(), request_type.ptr(), ready_type.ptr(),
                                                 disconnected.ptr(), std::move(b));
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
    const runtime::core_pair_stats s = pair_->stats();
    py::dict d;
    d["requests"] = s.requests;
    d["responses"] = s.responses;
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
    d["io_passes"] = s.io_passes;
    d["io_parks"] = s.io_parks;
    d["inbound_messages"] = s.inbound_messages;
    d["inbound_depth"] = s.inbound_depth;
    d["wakeups_to_app"] = s.wakeups_to_app;
    d["outbound_messages"] = s.outbound_messages;
    d["outbound_depth"] = s.outbound_depth;
    d["app_parks"] = s.app_parks;
    d["wakeups_to_io"] = s.wakeups_to_io;
    if (bridge_) {
      const server::bridge_stats& b = bridge_->stats();
      d["app_requests"] = b.requests;
      d["eager_completed"] = b.eager_completed;
      d["app_errors"] = b.app_errors;
      d["drain_waits"] = b.drain_waits;
      d["app_passes_with_work"] = b.passes_with_work;
      d["active_tasks"] = bridge_->active_tasks();
    }
    return d;
  }

 private:
  std::unique_ptr<runtime::core_pair> pair_;
  std::unique_ptr<server::bridge> bridge_;
  bool started_ = false;
};

}  // namespace

void register_server(py::module_& m) {
  if (server::add_types(m.ptr()) < 0) {
    throw py::error_already_set();
  }
  py::class_<server_core>(m, "ServerCore",
                          "One core pair (native I/O thread) and its ASGI bridge; see cadeloop.server. Loop thread.")
      .def(py::init<py::object, py::object, py::dict, py::object, py::object>(), py::arg("app"), py::arg("loop"),
           py::arg("options"), py::arg("on_error"), py::arg("on_stopped"))
      .def("start", &server_core::start,
           "Listens and starts the I/O thread; returns '' or one line saying why not (address in use, ...).")
      .def("request_stop", &server_core::request_stop,
           "Graceful stop: no more accepts, in-flight responses finish within grace. Any thread.")
      .def("join", &server_core::join, "Waits for the I/O thread (the GIL is released meanwhile).")
      .def_property_readonly("description", &server_core::description)
      .def_property_readonly("port", &server_core::port)
      .def("source_capsule",
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
      .def("set_state",
           [](server_core& core, py::object state) { core.bridge().set_state(state.is_none() ? nullptr : state.ptr()); },
           "The lifespan state dict copied (shallowly) into every request's scope, or None.")
      .def("active_tasks", [](server_core& core) { return core.bridge().active_tasks(); },
           "App tasks still running.")
      .def("cancel_tasks", [](server_core& core) { core.bridge().cancel_tasks(); }, "Cancels every running app task.")
      .def("close", &server_core::close_bridge, "Drops the bridge; detach it from the loop first.")
      .def("stats", &server_core::stats, "The pair's and the bridge's counters.");
}

}  // namespace cadeloop::pyhost
