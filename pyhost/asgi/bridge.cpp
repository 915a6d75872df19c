// The ASGI 3.0 HTTP bridge: the app thread's half of a core pair.
//
// Hot path per request, all C API: one dict copied from a per-bridge template
// and filled with interned keys, a headers list whose common names are cached
// bytes, two builtin callables bound to one request object, the app call, and
// an asyncio.Task started eagerly (3.12+), so a request whose app never
// suspends is answered within the same loop pass that drained it, with no
// further scheduling. receive() and send() return a reusable ready awaitable
// unless they must wait (body not arrived yet, output over the high mark),
// and only then a Future.
#include "asgi/bridge.hpp"

#include "py_exception.hpp"

#include <cadeloop/http/request.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <new>
#include <utility>

namespace cadeloop::pyhost::server {

namespace {

// Messages drained per run(), so a flood cannot starve the loop's other callbacks.
constexpr std::size_t messages_per_run = 1024;
// Header names longer than this are not cached (nor are more than this many names).
constexpr std::size_t cached_name_max_len = 48;
constexpr std::size_t cached_names_max = 256;

// --------------------------------------------------------------- ready awaitable

/// An awaitable whose result is already known: `await` returns `value` at
/// once, without a Future and without suspending the task.
struct ready_object {
  PyObject_HEAD
  PyObject* value;  // strong
};

PyObject* ready_await(PyObject* self) { return Py_NewRef(self); }

PyObject* ready_next(PyObject* self) {
  PyObject* v = reinterpret_cast<ready_object*>(self)->value;
  if (v != Py_None) {
    // StopIteration(value): wrapped in a tuple so a tuple value is not unpacked.
    PyObject* args = PyTuple_Pack(1, v);
    if (args != nullptr) {
      PyErr_SetObject(PyExc_StopIteration, args);
      Py_DECREF(args);
    }
  }
  return nullptr;  // no exception set: StopIteration(None)
}

void ready_dealloc(PyObject* self) {
  PyTypeObject* tp = Py_TYPE(self);
  Py_XDECREF(reinterpret_cast<ready_object*>(self)->value);
  tp->tp_free(self);
  Py_DECREF(tp);
}

PyType_Slot ready_slots[] = {
    {Py_tp_doc, const_cast<char*>("An already finished ASGI receive()/send() result.")},
    {Py_tp_dealloc, reinterpret_cast<void*>(ready_dealloc)},
    {Py_am_await, reinterpret_cast<void*>(ready_await)},
    {Py_tp_iter, reinterpret_cast<void*>(ready_await)},
    {Py_tp_iternext, reinterpret_cast<void*>(ready_next)},
    {0, nullptr},
};

PyType_Spec ready_spec = {"cadeloop._core.Ready", static_cast<int>(sizeof(ready_object)), 0, Py_TPFLAGS_DEFAULT,
                          ready_slots};

// --------------------------------------------------------------- request object

request_object* as_request(PyObject* o) { return reinterpret_cast<request_object*>(o); }

PyObject* gone(request_object* r) {
  (void)r;
  PyErr_SetString(PyExc_OSError, "the server is gone");
  return nullptr;
}

PyObject* request_receive(PyObject* self, PyObject*) {
  request_object* r = as_request(self);
  return r->owner == nullptr ? gone(r) : r->owner->receive(r);
}

PyObject* request_send(PyObject* self, PyObject* message) {
  request_object* r = as_request(self);
  return r->owner == nullptr ? gone(r) : r->owner->send(r, message);
}

/// tp_call: the task's done callback (`task.add_done_callback(request)`).
PyObject* request_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  request_object* r = as_request(self);
  PyObject* task = nullptr;
  if ((kwargs != nullptr && PyDict_GET_SIZE(kwargs) != 0) || !PyArg_UnpackTuple(args, "request", 1, 1, &task)) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_TypeError, "request callback takes one task");
    }
    return nullptr;
  }
  if (r->owner == nullptr) {
    Py_CLEAR(r->task);
    Py_RETURN_NONE;
  }
  return r->owner->task_done(r, task);
}

PyMethodDef receive_def = {"receive", request_receive, METH_NOARGS,
                           "receive() -> awaitable of the next ASGI event of this request."};
PyMethodDef send_def = {"send", request_send, METH_O, "send(message) -> awaitable: one ASGI response message."};

int request_traverse(PyObject* self, visitproc visit, void* arg) {
  request_object* r = as_request(self);
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(r->task);
  Py_VISIT(r->receive_waiter);
  Py_VISIT(r->send_waiter);
  Py_VISIT(r->start_headers);
  return 0;
}

int request_clear(PyObject* self) {
  request_object* r = as_request(self);
  Py_CLEAR(r->task);
  Py_CLEAR(r->receive_waiter);
  Py_CLEAR(r->send_waiter);
  Py_CLEAR(r->start_headers);
  return 0;
}

void request_dealloc(PyObject* self) {
  PyTypeObject* tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  request_object* r = as_request(self);
  if (r->owner != nullptr) {
    r->owner->unlink(r);
  }
  request_clear(self);
  delete r->body;
  delete r->encoder;
  tp->tp_free(self);
  Py_DECREF(tp);
}

PyType_Slot request_slots[] = {
    {Py_tp_doc, const_cast<char*>("One HTTP request served by cadeloop (owner of its receive/send).")},
    {Py_tp_dealloc, reinterpret_cast<void*>(request_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(request_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(request_clear)},
    {Py_tp_call, reinterpret_cast<void*>(request_call)},
    {0, nullptr},
};

PyType_Spec request_spec = {"cadeloop._core.Request", static_cast<int>(sizeof(request_object)), 0,
                            Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, request_slots};

// --------------------------------------------------------------- helpers


/// Raises `exc` again (takes the reference).
void restore_exception(PyObject* exc) {
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(exc);
#else
  PyErr_Restore(Py_NewRef(reinterpret_cast<PyObject*>(Py_TYPE(exc))), exc, PyException_GetTraceback(exc));
#endif
}

/// True for what must stop the loop rather than become a 500.
bool is_fatal(PyObject* exc) {
  return exc != nullptr && (PyErr_GivenExceptionMatches(exc, PyExc_KeyboardInterrupt) != 0 ||
                            PyErr_GivenExceptionMatches(exc, PyExc_SystemExit) != 0);
}

int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') {
    return c - '0';
  }
  if (c >= 'a' && c <= 'f') {
    return c - 'a' + 10;
  }
  if (c >= 'A' && c <= 'F') {
    return c - 'A' + 10;
  }
  return -1;
}

PyObject* intern(const char* s) { return PyUnicode_InternFromString(s); }

bool str_equal(PyObject* a, PyObject* interned) {
  return a == interned || (PyUnicode_Check(a) && PyUnicode_Compare(a, interned) == 0);
}

/// `message[key]` (borrowed) or NULL without an exception when missing.
PyObject* get_item(PyObject* message, PyObject* key) {
  return PyDict_GetItemWithError(message, key);
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
  const char* method_names[] = {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"};
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
  PyObject** all[] = {&type,         &asgi,          &http_version,      &method,        &scheme,
                      &path,         &raw_path,      &query_string,      &root_path,     &headers,
                      &client,       &server,        &state,             &body,          &more_body,
                      &status,       &trailers,      &v10,               &v11,           &http_request,
                      &http_disconnect, &response_start, &response_body, &done,          &exception,
                      &set_result,   &set_exception, &add_done_callback, &cancel,        &empty_bytes};
  for (PyObject** p : all) {
    Py_CLEAR(*p);
  }
  for (PyObject* m : methods) {
    Py_DECREF(m);
  }
  methods.clear();
}

// --------------------------------------------------------------- bridge

bridge::bridge(runtime::app_side& side, PyObject* app, PyObject* loop, PyObject* on_error, PyObject* on_stopped,
               PyObject* request_type, PyObject* ready_type, PyObject* disconnected_type, bridge_options options)
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
  none_ready_ = reinterpret_cast<PyObject*>(PyObject_New(ready_object, reinterpret_cast<PyTypeObject*>(ready_type_)));
  if (none_ready_ == nullptr) {
    fail();
  }
  reinterpret_cast<ready_object*>(none_ready_)->value = Py_NewRef(Py_None);
  PyObject* asgi = Py_BuildValue("{s:s,s:s}", "version", "3.0", "spec_version", "2.5");
  PyObject* root = PyUnicode_FromStringAndSize(options_.root_path.data(),
                                               static_cast<Py_ssize_t>(options_.root_path.size()));
  scope_template_ = PyDict_New();
  PyObject* http = intern("http");
  const bool ok = asgi != nullptr && root != nullptr && scope_template_ != nullptr && http != nullptr &&
                  PyDict_SetItem(scope_template_, n_.type, http) == 0 &&
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

bridge::~bridge() { release_python(); }

void bridge::release_python() {
  // Live requests outlive us only through their tasks; cut them loose.
  for (request_object* r = live_.live_next; r != nullptr && r != &live_;) {
    request_object* next = r->live_next;
    r->owner = nullptr;
    r->live_prev = r->live_next = nullptr;
    r = next;
  }
  live_.live_prev = live_.live_next = &live_;
  forget_connections();
  for (auto& [name, bytes] : header_names_) {
    Py_DECREF(bytes);
  }
  header_names_.clear();
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
  Py_CLEAR(create_future_);
  Py_CLEAR(scope_template_);
  Py_CLEAR(state_);
  Py_CLEAR(none_ready_);
  Py_CLEAR(last_server_);
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

void bridge::unlink(request_object* r) noexcept {
  if (r->live_prev != nullptr) {
    r->live_prev->live_next = r->live_next;
    r->live_next->live_prev = r->live_prev;
  }
  r->live_prev = r->live_next = nullptr;
  r->owner = nullptr;
}

// --------------------------------------------------------------- loop_source

int bridge::run() {
  if (stopped_) {
    return 0;
  }
  std::size_t n = 0;
  try {
    n = side_.drain_inbound([this](runtime::inbound_message&& m) { on_message(m); }, messages_per_run);
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
    return -1;
  }
  if (PyErr_Occurred()) {
    return -1;  // KeyboardInterrupt / SystemExit raised by an app: stop the loop
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

bool bridge::try_park() noexcept { return stopped_ || side_.try_park(); }

void bridge::unpark(bool signalled) noexcept { side_.unpark(signalled); }

void bridge::end_of_pass() noexcept { (void)side_.flush(); }

// --------------------------------------------------------------- inbound

conn_state* bridge::conn_of(net::connection_id id) noexcept {
  if (id.slot >= conns_.size()) {
    return nullptr;
  }
  conn_state& cs = conns_[id.slot];
  return cs.generation == id.generation ? &cs : nullptr;
}

request_object* bridge::find_request(conn_state& cs, std::uint32_t seq) noexcept {
  for (request_object* r : cs.active) {
    if (r->seq == seq) {
      return r;
    }
  }
  return nullptr;
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
  }
}

void bridge::on_request(runtime::inbound_message& m) {
  if (PyErr_Occurred()) {
    // A fatal error is pending: hand the head back unanswered; the loop stops.
    side_.recycle(m.conn, std::move(m.head));
    return;
  }
  if (m.conn.slot >= conns_.size()) {
    conns_.resize(std::max<std::size_t>(m.conn.slot + 1, conns_.size() * 2));
  }
  conn_state& cs = conns_[m.conn.slot];
  if (cs.generation != m.conn.generation) {
    Py_CLEAR(cs.client);
    cs = conn_state{};
    cs.generation = m.conn.generation;
  }
  const http::request_head& head = *m.head;

  auto* r = PyObject_GC_New(request_object, reinterpret_cast<PyTypeObject*>(request_type_));
  if (r == nullptr) {
    PyErr_Clear();
    side_.abort(m.conn);
    return;
  }
  r->owner = this;
  r->task = r->receive_waiter = r->send_waiter = r->start_headers = nullptr;
  r->conn = m.conn;
  r->seq = m.request;
  r->status = 0;
  r->body = nullptr;
  r->encoder = nullptr;
  r->ctx.is_head = head.method() == http::request_method::head;
  r->ctx.http_minor = head.version_minor();
  r->ctx.client_keep_alive = head.keep_alive();
  r->ctx.server_closing = m.info.server_closing;
  r->has_body = m.info.has_body;
  r->body_complete = !m.info.has_body;
  r->body_delivered = false;
  r->expect_continue = head.expect_continue();
  r->continue_sent = false;
  r->started = r->head_written = r->complete = r->disconnected = r->finished = false;
  // Linked before anything can fail, so dealloc finds a consistent list.
  r->live_next = &live_;
  r->live_prev = live_.live_prev;
  live_.live_prev->live_next = r;
  live_.live_prev = r;
  PyObject_GC_Track(reinterpret_cast<PyObject*>(r));
  try {
    r->body = new std::deque<net::byte_buffer>();
    r->encoder = new http::response_encoder(dates_, http::encoder_options{options_.server_header, true});
    r->encoder->start(r->ctx);
    cs.active.push_back(r);  // the connection's reference
  } catch (const std::bad_alloc&) {
    Py_DECREF(r);
    side_.abort(m.conn);
    return;
  }
  ++stats_.requests;
  PyObject* scope = build_scope(m, cs);
  side_.recycle(m.conn, std::move(m.head));
  if (scope == nullptr) {
    PyObject* exc = take_exception();
    app_error(r, "cannot build the ASGI scope", exc);
    Py_XDECREF(exc);
    finish(r);
    return;
  }
  (void)start_app(r, scope);
}

bool bridge::start_app(request_object* r, PyObject* scope) {
  PyObject* self = reinterpret_cast<PyObject*>(r);
  PyObject* receive = PyCFunction_NewEx(&receive_def, self, nullptr);
  PyObject* send = PyCFunction_NewEx(&send_def, self, nullptr);
  PyObject* coro = nullptr;
  if (receive != nullptr && send != nullptr) {
    PyObject* args[] = {scope, receive, send};
    coro = PyObject_Vectorcall(app_, args, 3, nullptr);
  }
  Py_XDECREF(receive);
  Py_XDECREF(send);
  Py_DECREF(scope);
  PyObject* task = nullptr;
  if (coro != nullptr) {
#if PY_VERSION_HEX >= 0x030C0000
    PyObject* args[] = {coro, loop_, Py_True};
    task = PyObject_Vectorcall(task_factory_, args, 1, task_kwnames_);
#else
    task = PyObject_CallOneArg(task_factory_, coro);
#endif
    Py_DECREF(coro);
  }
  if (task == nullptr) {
    PyObject* exc = take_exception();
    if (is_fatal(exc)) {
      restore_exception(exc);  // stops the loop (KeyboardInterrupt, SystemExit)
      finish(r);
      return false;
    }
    app_error(r, "Exception in ASGI application", exc);
    Py_XDECREF(exc);
    finish(r);
    return true;
  }
  r->task = task;
  ++active_tasks_;
  PyObject* done = PyObject_CallMethodNoArgs(task, n_.done);
  const int is_done = done == nullptr ? -1 : PyObject_IsTrue(done);
  Py_XDECREF(done);
  if (is_done > 0) {
    ++stats_.eager_completed;
    PyObject* res = task_done(r, task);
    Py_XDECREF(res);
    if (res == nullptr) {
      PyErr_Clear();
    }
    return true;
  }
  PyObject* res = is_done < 0 ? nullptr : PyObject_CallMethodOneArg(task, n_.add_done_callback, self);
  if (res == nullptr) {
    PyErr_Clear();
  }
  Py_XDECREF(res);
  return true;
}

void bridge::on_body(runtime::inbound_message& m) {
  conn_state* cs = conn_of(m.conn);
  request_object* r = cs == nullptr ? nullptr : find_request(*cs, m.request);
  if (r == nullptr || r->body_delivered) {
    // Nobody reads it (the request was answered and forgotten): credit it so
    // the connection does not stall on a body no one will take.
    if (!m.body.empty()) {
      side_.consumed(m.conn, m.body.size());
    }
    return;
  }
  if (!m.body.empty()) {
    r->body->push_back(std::move(m.body));
  }
  if (!m.more_body) {
    r->body_complete = true;
  }
  if (r->receive_waiter != nullptr) {
    PyObject* msg = body_message(r);
    if (msg == nullptr) {
      PyErr_Clear();
      return;
    }
    resolve(r->receive_waiter, msg, false);
  }
}

void bridge::on_disconnect(const runtime::inbound_message& m) {
  conn_state* cs = conn_of(m.conn);
  if (cs == nullptr) {
    return;
  }
  std::vector<request_object*> active = std::move(cs->active);
  cs->active.clear();
  PyObject* client = std::exchange(cs->client, nullptr);
  cs->generation = 0;
  for (request_object* r : active) {
    r->disconnected = true;
    wake_receiver(r);
    if (r->send_waiter != nullptr) {
      PyObject* exc = PyObject_CallFunction(disconnected_type_, "s", "client disconnected");
      if (exc == nullptr) {
        PyErr_Clear();
      } else {
        resolve(r->send_waiter, exc, true);
      }
    }
  }
  for (request_object* r : active) {
    Py_DECREF(r);
  }
  Py_XDECREF(client);
}

void bridge::on_drained(const runtime::inbound_message& m) {
  conn_state* cs = conn_of(m.conn);
  if (cs == nullptr) {
    return;
  }
  cs->waiting_drain = false;
  cs->sent_since_notice = m.unsent;
  for (request_object* r : std::vector<request_object*>(cs->active)) {
    if (r->send_waiter != nullptr) {
      resolve(r->send_waiter, Py_NewRef(Py_None), false);
    }
  }
}

void bridge::on_peer_eof(const runtime::inbound_message& m) {
  conn_state* cs = conn_of(m.conn);
  if (cs == nullptr) {
    return;
  }
  cs->peer_eof = true;
  for (request_object* r : std::vector<request_object*>(cs->active)) {
    if (r->body_delivered) {
      wake_receiver(r);
    }
  }
}

// --------------------------------------------------------------- scope

PyObject* bridge::header_name(std::string_view name) {
  if (name.size() <= cached_name_max_len) {
    if (auto it = header_names_.find(std::string{name}); it != header_names_.end()) {
      return Py_NewRef(it->second);
    }
  }
  PyObject* b = PyBytes_FromStringAndSize(name.data(), static_cast<Py_ssize_t>(name.size()));
  if (b != nullptr && name.size() <= cached_name_max_len && header_names_.size() < cached_names_max) {
    try {
      header_names_.emplace(std::string{name}, Py_NewRef(b));
    } catch (const std::bad_alloc&) {
      Py_DECREF(b);  // the cache's reference; not cached
    }
  }
  return b;
}

PyObject* bridge::build_headers(const http::request_head& head) {
  const http::header_block& block = head.headers();
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(block.size()));
  if (list == nullptr) {
    return nullptr;
  }
  for (std::size_t i = 0; i < block.size(); ++i) {
    const http::header_field f = block[i];
    PyObject* name = header_name(f.name);
    PyObject* value = PyBytes_FromStringAndSize(f.value.data(), static_cast<Py_ssize_t>(f.value.size()));
    PyObject* pair = name != nullptr && value != nullptr ? PyTuple_Pack(2, name, value) : nullptr;
    Py_XDECREF(name);
    Py_XDECREF(value);
    if (pair == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), pair);
  }
  return list;
}

PyObject* bridge::address_tuple(const net::socket_address& a, bool server_side) {
  using fam = net::socket_address::family_kind;
  if (a.family == fam::ipv4 || a.family == fam::ipv6) {
    const std::string host = a.host();
    return Py_BuildValue("(s#i)", host.data(), static_cast<Py_ssize_t>(host.size()), static_cast<int>(a.port));
  }
  if (a.family == fam::unix_socket && server_side) {
    return Py_BuildValue("(s#O)", options_.unix_path.data(), static_cast<Py_ssize_t>(options_.unix_path.size()),
                         Py_None);
  }
  Py_RETURN_NONE;
}

PyObject* bridge::build_scope(const runtime::inbound_message& m, conn_state& cs) {
  const http::request_head& head = *m.head;
  PyObject* scope = PyDict_Copy(scope_template_);
  if (scope == nullptr) {
    return nullptr;
  }
  auto put = [&](PyObject* key, PyObject* value) {  // steals value
    if (value == nullptr) {
      return false;
    }
    const int rc = PyDict_SetItem(scope, key, value);
    Py_DECREF(value);
    return rc == 0;
  };
  const auto mi = static_cast<std::size_t>(head.method());
  PyObject* method = mi < n_.methods.size()
                         ? Py_NewRef(n_.methods[mi])
                         : PyUnicode_FromStringAndSize(head.method_name().data(),
                                                       static_cast<Py_ssize_t>(head.method_name().size()));
  // path: percent-decoded, then UTF-8 (invalid sequences replaced).
  const std::string_view raw = head.path();
  PyObject* path = nullptr;
  if (raw.find('%') == std::string_view::npos) {
    path = PyUnicode_DecodeUTF8(raw.data(), static_cast<Py_ssize_t>(raw.size()), "replace");
  } else {
    path_scratch_.clear();
    for (std::size_t i = 0; i < raw.size(); ++i) {
      int hi = 0;
      int lo = 0;
      if (raw[i] == '%' && i + 2 < raw.size() && (hi = hex_value(raw[i + 1])) >= 0 &&
          (lo = hex_value(raw[i + 2])) >= 0) {
        path_scratch_.push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
      } else {
        path_scratch_.push_back(raw[i]);
      }
    }
    path = PyUnicode_DecodeUTF8(path_scratch_.data(), static_cast<Py_ssize_t>(path_scratch_.size()), "replace");
  }
  const std::string_view query = head.query();
  if (cs.client == nullptr) {
    cs.client = address_tuple(m.info.client, false);
  }
  if (last_server_ == nullptr || std::memcmp(&last_server_addr_, &m.info.server, sizeof m.info.server) != 0) {
    Py_CLEAR(last_server_);
    last_server_ = address_tuple(m.info.server, true);
    last_server_addr_ = m.info.server;
  }
  const bool ok =
      put(n_.http_version, Py_NewRef(head.version_minor() == 0 ? n_.v10 : n_.v11)) && put(n_.method, method) &&
      put(n_.path, path) &&
      put(n_.raw_path, PyBytes_FromStringAndSize(raw.data(), static_cast<Py_ssize_t>(raw.size()))) &&
      put(n_.query_string, PyBytes_FromStringAndSize(query.data(), static_cast<Py_ssize_t>(query.size()))) &&
      put(n_.headers, build_headers(head)) && put(n_.client, Py_XNewRef(cs.client)) &&
      put(n_.server, Py_XNewRef(last_server_)) && (state_ == nullptr || put(n_.state, PyDict_Copy(state_)));
  if (!ok) {
    Py_DECREF(scope);
    return nullptr;
  }
  return scope;
}

// --------------------------------------------------------------- receive

PyObject* bridge::ready(PyObject* value) {
  if (value == nullptr) {
    return nullptr;
  }
  auto* o = PyObject_New(ready_object, reinterpret_cast<PyTypeObject*>(ready_type_));
  if (o == nullptr) {
    Py_DECREF(value);
    return nullptr;
  }
  o->value = value;
  return reinterpret_cast<PyObject*>(o);
}

PyObject* bridge::disconnect_message() { return Py_BuildValue("{O:O}", n_.type, n_.http_disconnect); }

PyObject* bridge::body_message(request_object* r) {
  std::size_t total = 0;
  for (const net::byte_buffer& b : *r->body) {
    total += b.size();
  }
  PyObject* bytes = nullptr;
  if (total == 0) {
    bytes = Py_NewRef(n_.empty_bytes);
  } else if (r->body->size() == 1) {
    const net::byte_buffer& b = r->body->front();
    bytes = PyBytes_FromStringAndSize(b.data(), static_cast<Py_ssize_t>(b.size()));
  } else {
    bytes = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(total));
    if (bytes != nullptr) {
      char* at = PyBytes_AS_STRING(bytes);
      for (const net::byte_buffer& b : *r->body) {
        if (!b.empty()) {
          std::memcpy(at, b.data(), b.size());
          at += b.size();
        }
      }
    }
  }
  if (bytes == nullptr) {
    return nullptr;
  }
  const bool more = !r->body_complete;
  PyObject* msg = Py_BuildValue("{O:O,O:N,O:O}", n_.type, n_.http_request, n_.body, bytes, n_.more_body,
                                more ? Py_True : Py_False);
  if (msg == nullptr) {
    return nullptr;
  }
  r->body->clear();
  if (!more) {
    r->body_delivered = true;
  }
  if (total != 0 && !r->disconnected) {
    side_.consumed(r->conn, total);  // credit: the I/O thread may read on
  }
  return msg;
}

bool bridge::resolve(PyObject*& waiter, PyObject* value, bool exception) {
  PyObject* fut = std::exchange(waiter, nullptr);
  if (fut == nullptr) {
    Py_DECREF(value);
    return false;
  }
  PyObject* done = PyObject_CallMethodNoArgs(fut, n_.done);
  const int is_done = done == nullptr ? -1 : PyObject_IsTrue(done);
  Py_XDECREF(done);
  PyObject* res = nullptr;
  if (is_done == 0) {
    res = PyObject_CallMethodOneArg(fut, exception ? n_.set_exception : n_.set_result, value);
  }
  if (res == nullptr && PyErr_Occurred()) {
    PyErr_Clear();
  }
  Py_XDECREF(res);
  Py_DECREF(value);
  Py_DECREF(fut);
  return is_done == 0;
}

void bridge::wake_receiver(request_object* r) {
  if (r->receive_waiter == nullptr) {
    return;
  }
  PyObject* msg = disconnect_message();
  if (msg == nullptr) {
    PyErr_Clear();
    return;
  }
  resolve(r->receive_waiter, msg, false);
}

PyObject* bridge::receive(request_object* r) {
  if (r->disconnected) {
    return ready(disconnect_message());
  }
  conn_state* cs = conn_of(r->conn);
  if (!r->body_delivered) {
    if (!r->has_body) {
      r->body_delivered = true;
      return ready(Py_BuildValue("{O:O,O:O,O:O}", n_.type, n_.http_request, n_.body, n_.empty_bytes, n_.more_body,
                                 Py_False));
    }
    if (r->expect_continue && !r->continue_sent && !r->head_written) {
      // The client waits for this before it sends the body: only now that
      // the app asks for the body is it wanted.
      r->continue_sent = true;
      scratch_.clear();
      if (r->encoder->write_continue(scratch_).ok() && !scratch_.empty()) {
        try {
          side_.send(r->conn, r->seq, net::byte_buffer::copy_of(scratch_), {});
        } catch (const std::bad_alloc&) {
          return PyErr_NoMemory();
        }
      }
    }
    if (!r->body->empty() || r->body_complete) {
      return ready(body_message(r));
    }
  } else if (r->complete || (cs != nullptr && cs->peer_eof)) {
    return ready(disconnect_message());
  }
  if (r->receive_waiter != nullptr) {
    PyObject* done = PyObject_CallMethodNoArgs(r->receive_waiter, n_.done);
    const int is_done = done == nullptr ? -1 : PyObject_IsTrue(done);
    Py_XDECREF(done);
    if (is_done <= 0) {
      if (is_done == 0) {
        PyErr_SetString(PyExc_RuntimeError, "receive() called while another receive() of this request is waiting");
      }
      return nullptr;
    }
    Py_CLEAR(r->receive_waiter);
  }
  PyObject* fut = PyObject_CallNoArgs(create_future_);
  if (fut == nullptr) {
    return nullptr;
  }
  r->receive_waiter = Py_NewRef(fut);
  return fut;
}

// --------------------------------------------------------------- send

PyObject* bridge::send(request_object* r, PyObject* message) {
  if (!PyDict_Check(message)) {
    PyErr_Format(PyExc_TypeError, "send() takes an ASGI message dict, got %.100s", Py_TYPE(message)->tp_name);
    return nullptr;
  }
  PyObject* type = get_item(message, n_.type);
  if (type == nullptr) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_ValueError, "ASGI message without a 'type' key");
    }
    return nullptr;
  }
  if (r->disconnected) {
    PyErr_SetString(disconnected_type_, "client disconnected");
    return nullptr;
  }
  const bool is_start = str_equal(type, n_.response_start);
  const bool is_body = !is_start && str_equal(type, n_.response_body);
  if (!is_start && !is_body) {
    PyErr_Format(PyExc_RuntimeError,
                 "unexpected ASGI message type %R for an HTTP request "
                 "(expected 'http.response.start' or 'http.response.body')",
                 type);
    return nullptr;
  }
  if (r->complete) {
    PyErr_Format(PyExc_OSError, "%R sent after the response was complete", type);
    return nullptr;
  }
  return is_start ? send_start(r, message) : send_body(r, message);
}

PyObject* bridge::send_start(request_object* r, PyObject* message) {
  if (r->started) {
    PyErr_SetString(PyExc_RuntimeError, "'http.response.start' sent twice");
    return nullptr;
  }
  PyObject* status = get_item(message, n_.status);
  if (status == nullptr) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_ValueError, "'http.response.start' without a 'status'");
    }
    return nullptr;
  }
  if (!PyLong_Check(status) || PyBool_Check(status)) {
    PyErr_Format(PyExc_TypeError, "'status' in 'http.response.start' must be an int, got %.100s",
                 Py_TYPE(status)->tp_name);
    return nullptr;
  }
  const long code = PyLong_AsLong(status);
  if (code < 200 || code > 599) {
    if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_OverflowError)) {
      PyErr_Clear();
      PyErr_Format(PyExc_ValueError, "invalid status %R in 'http.response.start' (must be 200..599)", status);
    }
    return nullptr;
  }
  PyObject* headers = get_item(message, n_.headers);
  PyObject* list = nullptr;
  if (headers == nullptr) {
    if (PyErr_Occurred()) {
      return nullptr;
    }
    list = PyList_New(0);
  } else {
    list = PySequence_List(headers);
    if (list == nullptr) {
      PyErr_Format(PyExc_TypeError, "'headers' in 'http.response.start' must be an iterable, got %.100s",
                   Py_TYPE(headers)->tp_name);
      return nullptr;
    }
  }
  if (list == nullptr) {
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); ++i) {
    PyObject* item = PyList_GET_ITEM(list, i);
    PyObject* pair = PySequence_Check(item) && !PyBytes_Check(item) && !PyUnicode_Check(item)
                         ? PySequence_Tuple(item)
                         : nullptr;
    PyErr_Clear();
    const bool good = pair != nullptr && PyTuple_GET_SIZE(pair) == 2 && PyBytes_Check(PyTuple_GET_ITEM(pair, 0)) &&
                      PyBytes_Check(PyTuple_GET_ITEM(pair, 1));
    if (!good) {
      PyErr_Format(PyExc_TypeError,
                   "header %zd in 'http.response.start' must be a (name, value) pair of bytes, got %R", i, item);
      Py_XDECREF(pair);
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, i, pair);  // replaces item, whose reference the list held
    Py_DECREF(item);
  }
  r->started = true;
  r->status = static_cast<unsigned>(code);
  Py_XSETREF(r->start_headers, list);
  return Py_NewRef(none_ready_);
}

bool bridge::encode_head(request_object* r, std::optional<std::uint64_t> body_size) {
  std::vector<http::header_field> fields;
  PyObject* list = r->start_headers;
  const Py_ssize_t n = list == nullptr ? 0 : PyList_GET_SIZE(list);
  fields.reserve(static_cast<std::size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* pair = PyList_GET_ITEM(list, i);
    PyObject* name = PyTuple_GET_ITEM(pair, 0);
    PyObject* value = PyTuple_GET_ITEM(pair, 1);
    fields.push_back({{PyBytes_AS_STRING(name), static_cast<std::size_t>(PyBytes_GET_SIZE(name))},
                      {PyBytes_AS_STRING(value), static_cast<std::size_t>(PyBytes_GET_SIZE(value))}});
  }
  http::response_head head;
  head.status = r->status;
  head.headers = fields;
  head.body_size = body_size;
  const http::encode_status st = r->encoder->write_head(head, scratch_);
  if (!st.ok()) {
    PyErr_Format(PyExc_ValueError, "%s in 'http.response.start'", st.message().c_str());
    return false;
  }
  r->head_written = true;
  Py_CLEAR(r->start_headers);
  return true;
}

PyObject* bridge::send_body(request_object* r, PyObject* message) {
  if (!r->started) {
    PyErr_SetString(PyExc_RuntimeError, "'http.response.body' sent before 'http.response.start'");
    return nullptr;
  }
  PyObject* body = get_item(message, n_.body);
  if (body == nullptr && PyErr_Occurred()) {
    return nullptr;
  }
  PyObject* more_obj = get_item(message, n_.more_body);
  if (more_obj == nullptr && PyErr_Occurred()) {
    return nullptr;
  }
  const int more = more_obj == nullptr ? 0 : PyObject_IsTrue(more_obj);
  if (more < 0) {
    return nullptr;
  }
  Py_buffer view{};
  if (body != nullptr && PyObject_GetBuffer(body, &view, PyBUF_SIMPLE) < 0) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "'body' in 'http.response.body' must be bytes, got %.100s",
                 Py_TYPE(body)->tp_name);
    return nullptr;
  }
  if (body != nullptr && PyUnicode_Check(body)) {
    PyBuffer_Release(&view);
    PyErr_SetString(PyExc_TypeError, "'body' in 'http.response.body' must be bytes, got str");
    return nullptr;
  }
  const auto size = static_cast<std::size_t>(body == nullptr ? 0 : view.len);
  const char* data = body == nullptr ? nullptr : static_cast<const char*>(view.buf);
  auto release = [&] {
    if (body != nullptr) {
      PyBuffer_Release(&view);
    }
  };
  scratch_.clear();
  const bool with_head = !r->head_written;  // this send carries the head: it carries the status too
  if (!r->head_written &&
      !encode_head(r, more ? std::nullopt : std::optional<std::uint64_t>{static_cast<std::uint64_t>(size)})) {
    release();
    return nullptr;
  }
  const http::body_part_framing f = r->encoder->frame_body_part(size, scratch_);
  if (!f.status.ok()) {
    release();
    PyErr_Format(PyExc_ValueError, "%s in 'http.response.body'", f.status.message().c_str());
    return nullptr;
  }
  std::string tail{f.after_body};
  if (!more) {
    const http::encode_status st = r->encoder->finish({}, tail);
    if (!st.ok()) {
      release();
      PyErr_Format(PyExc_ValueError, "%s in 'http.response.body'", st.message().c_str());
      return nullptr;
    }
  }
  const std::size_t body_len = f.send_body ? size : 0;
  bool wait = false;
  try {
    net::byte_buffer out{scratch_.size() + body_len + tail.size()};
    char* at = out.data();
    if (!scratch_.empty()) {
      std::memcpy(at, scratch_.data(), scratch_.size());
      at += scratch_.size();
    }
    if (body_len != 0) {
      std::memcpy(at, data, body_len);
      at += body_len;
    }
    if (!tail.empty()) {
      std::memcpy(at, tail.data(), tail.size());
    }
    release();
    conn_state* cs = conn_of(r->conn);
    runtime::send_options o;
    o.end_of_response = !more;
    o.keep_alive = r->encoder->keep_alive();
    o.status = with_head ? static_cast<std::uint16_t>(r->status) : std::uint16_t{0};
    if (cs != nullptr) {
      cs->sent_since_notice += out.size();
      if (cs->sent_since_notice >= options_.send_high_mark && !cs->waiting_drain) {
        cs->waiting_drain = true;
        o.notify_drained = true;
      }
      wait = cs->waiting_drain && more;
    }
    if (!out.empty() || o.end_of_response) {
      side_.send(r->conn, r->seq, std::move(out), o);
    }
  } catch (const std::bad_alloc&) {
    release();
    return PyErr_NoMemory();
  }
  if (!more) {
    r->complete = true;
    if (r->body_delivered) {
      wake_receiver(r);  // a receive() waiting for the end learns it now
    }
    return Py_NewRef(none_ready_);
  }
  if (!wait) {
    return Py_NewRef(none_ready_);
  }
  ++stats_.drain_waits;
  PyObject* fut = PyObject_CallNoArgs(create_future_);
  if (fut == nullptr) {
    return nullptr;
  }
  Py_XSETREF(r->send_waiter, Py_NewRef(fut));
  return fut;
}

// --------------------------------------------------------------- completion

PyObject* bridge::task_done(request_object* r, PyObject* task) {
  if (r->finished || r->task == nullptr) {
    Py_RETURN_NONE;
  }
  Py_INCREF(r);  // finish() may drop the last references
  --active_tasks_;
  PyObject* exc = PyObject_CallMethodNoArgs(task, n_.exception);
  if (exc == nullptr) {
    exc = take_exception();  // CancelledError: the task was cancelled
  }
  if (exc != nullptr && exc != Py_None) {
    app_error(r, "Exception in ASGI application", exc);
  } else if (!r->complete) {
    app_error(r, r->started ? "ASGI application returned without completing the response"
                            : "ASGI application returned without starting a response",
              nullptr);
  }
  Py_XDECREF(exc);
  finish(r);
  Py_DECREF(r);
  Py_RETURN_NONE;
}

void bridge::app_error(request_object* r, const char* what, PyObject* exc) {
  ++stats_.app_errors;
  side_.count_app_error();
  PyObject* res = PyObject_CallFunction(on_error_, "sO", what, exc != nullptr ? exc : Py_None);
  if (res == nullptr) {
    PyErr_WriteUnraisable(on_error_);
  }
  Py_XDECREF(res);
  if (r->complete || r->disconnected) {
    return;
  }
  r->complete = true;
  try {
    if (!r->head_written) {
      scratch_.clear();
      http::encoder_options eo{options_.server_header, true};
      (void)http::encode_error_response(500, "Internal Server Error\n", dates_, scratch_, eo, {}, r->ctx.is_head);
      runtime::send_options o;
      o.end_of_response = true;
      o.keep_alive = false;
      o.status = 500;
      side_.send(r->conn, r->seq, net::byte_buffer::copy_of(scratch_), o);
    } else {
      // Part of the response is out: only closing tells the client. What was
      // sent is written first (the client sees a cut message), unless the
      // client is not reading anyway.
      const conn_state* cs = conn_of(r->conn);
      if (cs != nullptr && !cs->waiting_drain) {
        side_.close(r->conn);
      } else {
        side_.abort(r->conn);
      }
    }
  } catch (const std::bad_alloc&) {
    PyErr_Clear();
  }
}

void bridge::finish(request_object* r) {
  r->finished = true;
  PyObject* task = std::exchange(r->task, nullptr);
  PyObject* rw = std::exchange(r->receive_waiter, nullptr);
  PyObject* sw = std::exchange(r->send_waiter, nullptr);
  PyObject* hdr = std::exchange(r->start_headers, nullptr);
  r->body->clear();
  bool owned = false;
  if (conn_state* cs = conn_of(r->conn); cs != nullptr) {
    auto it = std::find(cs->active.begin(), cs->active.end(), r);
    if (it != cs->active.end()) {
      cs->active.erase(it);
      owned = true;
    }
  }
  Py_XDECREF(task);
  Py_XDECREF(rw);
  Py_XDECREF(sw);
  Py_XDECREF(hdr);
  if (owned) {
    Py_DECREF(r);
  }
}

// --------------------------------------------------------------- types

int add_types(PyObject* module) {
  PyObject* request_type = PyType_FromModuleAndSpec(module, &request_spec, nullptr);
  PyObject* ready_type = PyType_FromModuleAndSpec(module, &ready_spec, nullptr);
  PyObject* disconnected = PyErr_NewExceptionWithDoc(
      "cadeloop._core.ClientDisconnected",
      "Raised by an ASGI send() when the client has gone (an OSError, as ASGI spec 2.4 asks).", PyExc_OSError,
      nullptr);
  const bool ok = request_type != nullptr && ready_type != nullptr && disconnected != nullptr &&
                  PyModule_AddObjectRef(module, "Request", request_type) == 0 &&
                  PyModule_AddObjectRef(module, "Ready", ready_type) == 0 &&
                  PyModule_AddObjectRef(module, "ClientDisconnected", disconnected) == 0;
  Py_XDECREF(request_type);
  Py_XDECREF(ready_type);
  Py_XDECREF(disconnected);
  return ok ? 0 : -1;
}

}  // namespace cadeloop::pyhost::server
