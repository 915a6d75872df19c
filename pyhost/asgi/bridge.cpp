// The ASGI 3.0 HTTP bridge: the app thread's half of a core pair, as a
// loop_source of cadeloop.Loop. This file holds the bridge's life (its
// Python objects, the interned names, the scope template, cancelling and
// forgetting at shutdown) and its loop_source part: run() drains the inbound
// ring inside the loop's pass and hands each message to its handler;
// try_park()/unpark() join the loop's check before park; end_of_pass()
// publishes the pass's responses as one batch.
//
// The per-request path, all C API, is in the other bridge files:
// bridge_request.cpp (scope, app, task; the end of a request),
// bridge_receive.cpp and bridge_send.cpp (the app's receive() and send()),
// bridge_websocket.cpp (the same for a WebSocket) and request_type.cpp
// (the Python types).
#include <algorithm>
#include <new>
#include <utility>
#include <vector>

#include "asgi/request_type.hpp"

namespace cadeloop::pyhost::server {

namespace {

// Messages drained per run(), so a flood cannot starve the loop's other callbacks.
constexpr std::size_t messages_per_run = 1024;

PyObject* intern(const char* s) {
  return PyUnicode_InternFromString(s);
}

}  // namespace

// --------------------------------------------------------------- names

bool names::init() {
  struct entry {
    PyObject** slot;
    const char* text;
  };
  const entry entries[] = {
      {&type, "type"},
      {&asgi, "asgi"},
      {&http_version, "http_version"},
      {&method, "method"},
      {&scheme, "scheme"},
      {&path, "path"},
      {&raw_path, "raw_path"},
      {&query_string, "query_string"},
      {&root_path, "root_path"},
      {&headers, "headers"},
      {&client, "client"},
      {&server, "server"},
      {&state, "state"},
      {&body, "body"},
      {&more_body, "more_body"},
      {&status, "status"},
      {&trailers, "trailers"},
      {&v10, "1.0"},
      {&v11, "1.1"},
      {&http_request, "http.request"},
      {&http_disconnect, "http.disconnect"},
      {&response_start, "http.response.start"},
      {&response_body, "http.response.body"},
      {&done, "done"},
      {&exception, "exception"},
      {&set_result, "set_result"},
      {&set_exception, "set_exception"},
      {&add_done_callback, "add_done_callback"},
      {&cancel, "cancel"},
      {&websocket, "websocket"},
      {&ws, "ws"},
      {&wss, "wss"},
      {&subprotocols, "subprotocols"},
      {&subprotocol, "subprotocol"},
      {&extensions, "extensions"},
      {&text, "text"},
      {&bytes, "bytes"},
      {&code, "code"},
      {&reason, "reason"},
      {&ws_connect, "websocket.connect"},
      {&ws_receive, "websocket.receive"},
      {&ws_disconnect, "websocket.disconnect"},
      {&ws_accept, "websocket.accept"},
      {&ws_send, "websocket.send"},
      {&ws_close, "websocket.close"},
      {&ws_response_start, "websocket.http.response.start"},
      {&ws_response_body, "websocket.http.response.body"},
  };
  for (const entry& e : entries) {
    *e.slot = intern(e.text);
    if (*e.slot == nullptr) {
      return false;
    }
  }
  empty_bytes = PyBytes_FromStringAndSize("", 0);
  if (empty_bytes == nullptr) {
    return false;
  }
  const char* method_names[] = {"GET",   "HEAD",    "POST",  "PUT",    "DELETE",
                                "PATCH", "OPTIONS", "TRACE", "CONNECT"};
  for (const char* m : method_names) {
    PyObject* s = intern(m);
    if (s == nullptr) {
      return false;
    }
    methods.push_back(s);
  }
  return true;
}

void names::clear() {
  PyObject** all[] = {&type,
                      &asgi,
                      &http_version,
                      &method,
                      &scheme,
                      &path,
                      &raw_path,
                      &query_string,
                      &root_path,
                      &headers,
                      &client,
                      &server,
                      &state,
                      &body,
                      &more_body,
                      &status,
                      &trailers,
                      &v10,
                      &v11,
                      &http_request,
                      &http_disconnect,
                      &response_start,
                      &response_body,
                      &done,
                      &exception,
                      &set_result,
                      &set_exception,
                      &add_done_callback,
                      &cancel,
                      &empty_bytes,
                      &websocket,
                      &ws,
                      &wss,
                      &subprotocols,
                      &subprotocol,
                      &extensions,
                      &text,
                      &bytes,
                      &code,
                      &reason,
                      &ws_connect,
                      &ws_receive,
                      &ws_disconnect,
                      &ws_accept,
                      &ws_send,
                      &ws_close,
                      &ws_response_start,
                      &ws_response_body};
  for (PyObject** p : all) {
    Py_CLEAR(*p);
  }
  for (PyObject* m : methods) {
    Py_DECREF(m);
  }
  methods.clear();
}

// --------------------------------------------------------------- bridge

bridge::bridge(runtime::app_side& side, PyObject* app, PyObject* loop, PyObject* on_error,
               PyObject* on_stopped, PyObject* request_type, PyObject* ready_type,
               PyObject* disconnected_type, bridge_options options)
    : side_{side},
      options_{std::move(options)},
      app_{Py_NewRef(app)},
      loop_{Py_NewRef(loop)},
      on_error_{Py_NewRef(on_error)},
      on_stopped_{Py_NewRef(on_stopped)},
      request_type_{Py_NewRef(request_type)},
      ready_type_{Py_NewRef(ready_type)},
      disconnected_type_{Py_NewRef(disconnected_type)} {
  live_.live_prev = live_.live_next = &live_;
  auto fail = [this]() {
    // The destructor does not run for a constructor that throws: drop the
    // Python references here; the Python error stays set for the caller.
    release_python();
    throw std::bad_alloc();
  };
  if (!n_.init()) {
    fail();
  }
  create_future_ = PyObject_GetAttrString(loop_, "create_future");
  if (create_future_ == nullptr) {
    fail();
  }
  if (!options_.asyncio_tasks) {
    // The native request task (app_task.hpp), a type of the module the
    // Request type belongs to.
    PyObject* module = PyType_GetModule(reinterpret_cast<PyTypeObject*>(request_type_));
    PyObject* task_type =
        module != nullptr ? PyObject_GetAttrString(module, "RequestTask") : nullptr;
    task_env_ = task_type != nullptr ? app_task_env_new(task_type, loop_) : nullptr;
    Py_XDECREF(task_type);
    PyObject* asyncio = task_env_ != nullptr ? PyImport_ImportModule("asyncio") : nullptr;
    iscoroutine_ = asyncio != nullptr ? PyObject_GetAttrString(asyncio, "iscoroutine") : nullptr;
    Py_XDECREF(asyncio);
    if (iscoroutine_ == nullptr) {
      fail();
    }
  }
#if PY_VERSION_HEX >= 0x030C0000
  PyObject* asyncio = PyImport_ImportModule("asyncio");
  if (asyncio == nullptr) {
    fail();
  }
  task_factory_ = PyObject_GetAttrString(asyncio, "Task");
  Py_DECREF(asyncio);
  task_kwnames_ = Py_BuildValue("(ss)", "loop", "eager_start");
  if (task_factory_ == nullptr || task_kwnames_ == nullptr) {
    fail();
  }
#else
  task_factory_ = PyObject_GetAttrString(loop_, "create_task");
  if (task_factory_ == nullptr) {
    fail();
  }
#endif
  none_ready_ = reinterpret_cast<PyObject*>(
      PyObject_New(ready_object, reinterpret_cast<PyTypeObject*>(ready_type_)));
  if (none_ready_ == nullptr) {
    fail();
  }
  reinterpret_cast<ready_object*>(none_ready_)->value = Py_NewRef(Py_None);
  PyObject* asgi = Py_BuildValue("{s:s,s:s}", "version", "3.0", "spec_version", "2.5");
  PyObject* root = PyUnicode_FromStringAndSize(options_.root_path.data(),
                                               static_cast<Py_ssize_t>(options_.root_path.size()));
  scope_template_ = PyDict_New();
  PyObject* http = intern("http");
  const bool ok = asgi != nullptr && root != nullptr && scope_template_ != nullptr &&
                  http != nullptr && PyDict_SetItem(scope_template_, n_.type, http) == 0 &&
                  PyDict_SetItem(scope_template_, n_.asgi, asgi) == 0 &&
                  PyDict_SetItem(scope_template_, n_.scheme, http) == 0 &&
                  PyDict_SetItem(scope_template_, n_.root_path, root) == 0;
  Py_XDECREF(asgi);
  Py_XDECREF(root);
  Py_XDECREF(http);
  if (!ok) {
    fail();
  }
}

bridge::~bridge() {
  release_python();
}

void bridge::release_python() {
  release_owners();  // what the I/O side wrote or dropped before it stopped
  // Live requests outlive us only through their tasks; cut them loose.
  for (request_object* r = live_.live_next; r != nullptr && r != &live_;) {
    request_object* next = r->live_next;
    r->owner = nullptr;
    r->live_prev = r->live_next = nullptr;
    r = next;
  }
  live_.live_prev = live_.live_next = &live_;
  for (auto [r, scope] : deferred_) {
    Py_DECREF(scope);
    Py_DECREF(r);
  }
  deferred_.clear();
  drop_gate();
  forget_connections();
  for (auto& [name, bytes] : header_names_) {
    Py_DECREF(bytes);
  }
  header_names_.clear();
  for (PyObject*& pair : header_pairs_) {
    Py_CLEAR(pair);
  }
  Py_CLEAR(last_path_);
  Py_CLEAR(last_raw_path_);
  Py_CLEAR(last_client_host_);
  Py_CLEAR(done_context_);
  Py_CLEAR(done_kwnames_);
  n_.clear();
  Py_CLEAR(app_);
  Py_CLEAR(loop_);
  Py_CLEAR(on_error_);
  Py_CLEAR(on_stopped_);
  Py_CLEAR(request_type_);
  Py_CLEAR(ready_type_);
  Py_CLEAR(disconnected_type_);
  Py_CLEAR(task_factory_);
  Py_CLEAR(task_kwnames_);
  app_task_env_release(task_env_);
  task_env_ = nullptr;
  Py_CLEAR(iscoroutine_);
  Py_CLEAR(create_future_);
  Py_CLEAR(scope_template_);
  Py_CLEAR(full_template_);
  Py_CLEAR(first_base_);
  Py_CLEAR(state_);
  Py_CLEAR(none_ready_);
  Py_CLEAR(last_server_);
  Py_CLEAR(http_extensions_);
  for (auto* spares : {&spare_receive_, &spare_send_}) {
    for (PyObject* fn : *spares) {
      Py_DECREF(fn);
    }
    spares->clear();
  }
}

void bridge::set_state(PyObject* state) {
  Py_XINCREF(state);
  Py_XSETREF(state_, state);
}

void bridge::forget_connections() {
  std::vector<PyObject*> drop;
  for (conn_state& cs : conns_) {
    for (request_object* r : cs.active) {
      r->disconnected = true;
      drop.push_back(reinterpret_cast<PyObject*>(r));
    }
    cs.active.clear();
    if (cs.client != nullptr) {
      drop.push_back(std::exchange(cs.client, nullptr));
    }
    if (cs.scope_base != nullptr) {
      drop.push_back(std::exchange(cs.scope_base, nullptr));
    }
  }
  for (PyObject* o : drop) {
    Py_DECREF(o);
  }
}

void bridge::cancel_tasks() {
  std::vector<PyObject*> tasks;
  for (request_object* r = live_.live_next; r != &live_; r = r->live_next) {
    if (r->task != nullptr) {
      tasks.push_back(Py_NewRef(r->task));
    }
  }
  for (PyObject* t : tasks) {
    PyObject* res = PyObject_CallMethodNoArgs(t, n_.cancel);
    if (res == nullptr) {
      PyErr_Clear();
    }
    Py_XDECREF(res);
    Py_DECREF(t);
  }
}
// --------------------------------------------------------------- loop_source

void bridge::release_owners() {
  try {
    side_.take_owners(owners_scratch_);
  } catch (const std::bad_alloc&) {
    return;  // still held there: the next pass takes them
  }
  for (void* owner : owners_scratch_) {
    Py_DECREF(static_cast<PyObject*>(owner));
  }
  owners_scratch_.clear();
}

int bridge::run() {
  if (side_.owners_waiting()) {
    release_owners();
  }
  if (stopped_) {
    return 0;
  }
  std::size_t n = 0;
  try {
    n = side_.drain_inbound([this](runtime::inbound_message&& m) { on_message(m); },
                            messages_per_run);
  } catch (const std::bad_alloc&) {
    start_deferred();
    PyErr_NoMemory();
    return -1;
  }
  start_deferred();  // requests with a body, now that their first pieces are in
  if (PyErr_Occurred()) {
    return -1;  // KeyboardInterrupt / SystemExit raised by an app: stop the loop
  }
  if (!gated_.empty()) {
    release_gate();  // bridge_gate.cpp: disconnects and drained notices may have opened it
    if (!gated_.empty()) {
      shed_stalled();
    }
  }
  if (n == 0 && side_.io_stopped() && !side_.has_inbound()) {
    stopped_ = true;
    PyObject* r = PyObject_CallNoArgs(on_stopped_);
    if (r == nullptr) {
      return -1;
    }
    Py_DECREF(r);
    return 1;
  }
  if (n != 0) {
    ++stats_.passes_with_work;
  }
  return static_cast<int>(std::min<std::size_t>(n, 1u << 30));
}

bool bridge::try_park() noexcept {
  return stopped_ || side_.try_park();
}

void bridge::unpark(bool signalled) noexcept {
  side_.unpark(signalled);
}

void bridge::end_of_pass() noexcept {
  (void)side_.flush();
}

void bridge::on_message(runtime::inbound_message& m) {
  switch (m.kind) {
    case runtime::inbound_kind::request:
      on_request(m);
      break;
    case runtime::inbound_kind::body:
      on_body(m);
      break;
    case runtime::inbound_kind::disconnect:
      on_disconnect(m);
      break;
    case runtime::inbound_kind::drained:
      on_drained(m);
      break;
    case runtime::inbound_kind::peer_eof:
      on_peer_eof(m);
      break;
    case runtime::inbound_kind::ws_message:
      on_ws_message(m);
      break;
    case runtime::inbound_kind::ws_close:
      on_ws_close(m);
      break;
  }
}

}  // namespace cadeloop::pyhost::server
