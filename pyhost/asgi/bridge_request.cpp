// A request's life in the ASGI bridge, from the inbound ring to the end of
// its task: the Request object made for a request head, its scope (one dict
// copied from the bridge's template and filled with interned keys, a headers
// list whose common names are cached bytes), the app called and its
// asyncio.Task started eagerly (3.12+), so that an app that never suspends
// is answered within the loop pass that drained the request; then the task's
// end, the 500 (or the cut connection) for an app error, and forgetting the
// request. The scope is built here, beside on_request, so that it inlines.
#include <algorithm>
#include <cstring>
#include <iterator>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include <cadeloop/http/request.hpp>

#include "asgi/request_type.hpp"
#include "py_exception.hpp"

namespace cadeloop::pyhost::server {

namespace {

// Header names longer than this are not cached (nor are more than this many names).
constexpr std::size_t cached_name_max_len = 48;
constexpr std::size_t cached_names_max = 256;
// Targets longer than this are not shared between requests (bridge::build_scope).
constexpr std::size_t shared_path_max = 256;
// Spare receive()/send() callables kept for later requests, of each kind.
constexpr std::size_t spare_callables_max = 256;

std::string_view bytes_of(PyObject* b) noexcept {
  return {PyBytes_AS_STRING(b), static_cast<std::size_t>(PyBytes_GET_SIZE(b))};
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

}  // namespace

// --------------------------------------------------------------- arrival

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
    Py_CLEAR(cs.scope_base);
    set_staged(cs, 0);
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
  r->gated = r->receive_fn = r->send_fn = nullptr;
  r->conn = m.conn;
  r->seq = m.request;
  r->status = 0;
  r->body = pending_body{};
  r->ws = nullptr;
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
  r->te_trailers = accepts_trailers(head);  // bridge_extensions.cpp
  r->trailers = r->body_done = false;
  // Linked before anything can fail, so dealloc finds a consistent list.
  r->live_next = &live_;
  r->live_prev = live_.live_prev;
  live_.live_prev->live_next = r;
  live_.live_prev = r;
  PyObject_GC_Track(reinterpret_cast<PyObject*>(r));
  try {
    if (m.info.websocket) {
      // No encoder until the app sends a denial response (bridge_websocket.cpp).
      r->ws = new ws_session();
    } else {
      make_encoder(r, dates_,
                   http::encoder_options{options_.server_header, options_.date_header,
                                         options_.extra_headers, &header_lines_});
    }
    cs.active.push_back(r);  // the connection's reference
  } catch (const std::bad_alloc&) {
    Py_DECREF(r);
    side_.abort(m.conn);
    return;
  }
  ++stats_.requests;
  PyObject* scope = build_scope(m, cs);
  if (scope != nullptr && r->ws != nullptr) {
    scope = websocket_scope(scope, *m.head, m.info.tls);  // bridge_websocket.cpp
  }
  side_.recycle(m.conn, std::move(m.head));
  if (scope == nullptr) {
    PyObject* exc = take_exception();
    app_error(r, "cannot build the ASGI scope", exc);
    Py_XDECREF(exc);
    finish(r);
    return;
  }
  // A request with a body starts when the batch is drained (start_deferred),
  // so that body pieces that came with the head are there for its first
  // receive(): one ready message instead of a Future resolved later. The
  // requests after it in the batch wait as well, so apps start in order.
  if ((r->has_body && r->ws == nullptr) || !deferred_.empty()) {
    try {
      deferred_.push_back({r, scope});
      Py_INCREF(r);
      return;
    } catch (const std::bad_alloc&) {
      // started now, without the body
    }
  }
  (void)start_app(r, scope);
}

void bridge::start_deferred() {
  if (deferred_.empty()) {
    return;
  }
  deferred_swap_.swap(deferred_);
  for (auto [r, scope] : deferred_swap_) {
    if (PyErr_Occurred() != nullptr) {
      Py_DECREF(scope);  // a fatal error is pending: the loop stops; nothing more starts
      finish(r);
    } else {
      (void)start_app(r, scope);
    }
    Py_DECREF(r);
  }
  deferred_swap_.clear();
}

bool bridge::start_app(request_object* r, PyObject* scope) {
  PyObject* self = reinterpret_cast<PyObject*>(r);
  // The request keeps its receive and send until finish(), which makes them
  // spares for later requests when nothing else holds them.
  r->receive_fn = bind_callable(receive_def, spare_receive_, self);
  r->send_fn = r->receive_fn != nullptr ? bind_callable(send_def, spare_send_, self) : nullptr;
  PyObject* coro = nullptr;
  if (r->send_fn != nullptr) {
    PyObject* args[] = {scope, r->receive_fn, r->send_fn};
    coro = PyObject_Vectorcall(app_, args, 3, nullptr);
  }
  Py_DECREF(scope);
  if (coro != nullptr && task_env_ != nullptr) {
    return start_native(r, coro);
  }
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
  // The done callback runs in one empty Context of the bridge: without one,
  // add_done_callback would copy the current context for every request.
  if (done_context_ == nullptr && is_done == 0) {
    done_context_ = PyContext_New();
    done_kwnames_ = done_context_ != nullptr ? Py_BuildValue("(s)", "context") : nullptr;
    if (done_kwnames_ == nullptr) {
      Py_CLEAR(done_context_);
      PyErr_Clear();
    }
  }
  PyObject* res = nullptr;
  if (is_done == 0 && done_context_ != nullptr) {
    PyObject* args[] = {task, self, done_context_};
    res = PyObject_VectorcallMethod(n_.add_done_callback, args, 2, done_kwnames_);
  } else if (is_done == 0) {
    res = PyObject_CallMethodOneArg(task, n_.add_done_callback, self);
  }
  if (res == nullptr) {
    PyErr_Clear();
  }
  Py_XDECREF(res);
  return true;
}

bool bridge::start_native(request_object* r, PyObject* coro) {
  PyObject* self = reinterpret_cast<PyObject*>(r);
  int is_coro = PyCoro_CheckExact(coro) ? 1 : 0;
  if (is_coro == 0) {
    // What asyncio.Task takes: a coroutine of another kind (collections.abc.Coroutine).
    PyObject* yes = PyObject_CallOneArg(iscoroutine_, coro);
    is_coro = yes != nullptr ? PyObject_IsTrue(yes) : -1;
    Py_XDECREF(yes);
    if (is_coro == 0) {
      PyErr_Format(PyExc_TypeError, "a coroutine was expected, got %R", coro);
    }
  }
  PyObject* task =
      is_coro > 0 ? app_task_new(task_env_, coro, self, &bridge::native_task_done) : nullptr;
  Py_DECREF(coro);
  if (task == nullptr) {
    PyObject* exc = take_exception();
    app_error(r, "Exception in ASGI application", exc);
    Py_XDECREF(exc);
    finish(r);
    return true;
  }
  Py_INCREF(r);  // the task's end may drop the last other reference
  r->task = task;
  ++active_tasks_;
  const int started = app_task_start(task);
  if (r->finished) {
    ++stats_.eager_completed;
  }
  Py_DECREF(r);
  if (started < 0) {
    // KeyboardInterrupt or SystemExit (the loop stops), or the task's own failure.
    PyObject* exc = take_exception();
    if (is_fatal(exc)) {
      restore_exception(exc);
      return false;
    }
    restore_exception(exc);
    PyErr_WriteUnraisable(self);
  }
  return true;
}

void bridge::native_task_done(PyObject* owner, PyObject* task) {
  auto* r = reinterpret_cast<request_object*>(owner);
  if (r->owner == nullptr || r->finished || r->task == nullptr) {
    return;  // the bridge is gone, or the request was finished without its task
  }
  PyObject* exc = app_task_outcome(task);
  if (exc == nullptr) {
    exc = take_exception();
  }
  r->owner->app_ended(r, exc);
  Py_XDECREF(exc);
}

// --------------------------------------------------------------- scope

PyObject* bridge::header_name(std::string_view name) {
  if (name.size() <= cached_name_max_len) {
    if (auto it = header_names_.find(std::string{name}); it != header_names_.end()) {
      return Py_NewRef(it->second);
    }
  }
  PyObject* b = PyBytes_FromStringAndSize(name.data(), static_cast<Py_ssize_t>(name.size()));
  if (b != nullptr && name.size() <= cached_name_max_len &&
      header_names_.size() < cached_names_max) {
    try {
      header_names_.emplace(std::string{name}, Py_NewRef(b));
    } catch (const std::bad_alloc&) {
      Py_DECREF(b);  // the cache's reference; not cached
    }
  }
  return b;
}

namespace {

// Headers whose values repeat from one request to the next (a browser sends
// the same ones on every connection). Their (name, value) tuples are shared:
// a tuple of two bytes objects is immutable, so an app cannot change what
// another request sees. Anything secret or unique per request (cookie,
// authorization, sec-websocket-key, ...) is not listed.
constexpr std::string_view repeated_headers[] = {
    "host",
    "connection",
    "upgrade",
    "sec-websocket-version",
    "origin",
    "user-agent",
    "accept",
    "accept-encoding",
    "accept-language",
    "cache-control",
    "pragma",
    "sec-websocket-extensions",
};
constexpr std::size_t repeated_value_max = 256;  // longer values are not shared

std::size_t repeated_index(std::string_view name) noexcept {
  for (std::size_t i = 0; i < std::size(repeated_headers); ++i) {
    if (repeated_headers[i] == name) {
      return i;
    }
  }
  return std::size(repeated_headers);
}

}  // namespace

PyObject* bridge::header_pair(const http::header_field& f) {
  std::size_t k =
      f.value.size() <= repeated_value_max ? repeated_index(f.name) : std::size(repeated_headers);
  if (k < std::size(repeated_headers)) {
    if (header_pairs_.empty()) {
      try {
        header_pairs_.assign(std::size(repeated_headers), nullptr);
      } catch (const std::bad_alloc&) {
        k = std::size(repeated_headers);  // not shared
      }
    }
    // One tuple per name: the last value seen (a new value replaces it).
    if (PyObject* t = k < header_pairs_.size() ? header_pairs_[k] : nullptr; t != nullptr) {
      const std::string_view cached = bytes_of(PyTuple_GET_ITEM(t, 1));
      if (cached == f.value) {
        return Py_NewRef(t);
      }
    }
  }
  PyObject* name = header_name(f.name);
  PyObject* value =
      PyBytes_FromStringAndSize(f.value.data(), static_cast<Py_ssize_t>(f.value.size()));
  PyObject* pair = name != nullptr && value != nullptr ? PyTuple_Pack(2, name, value) : nullptr;
  Py_XDECREF(name);
  Py_XDECREF(value);
  if (pair != nullptr && k < header_pairs_.size()) {
    Py_XSETREF(header_pairs_[k], Py_NewRef(pair));
  }
  return pair;
}

PyObject* bridge::build_headers(const http::request_head& head) {
  const http::header_block& block = head.headers();
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(block.size()));
  if (list == nullptr) {
    return nullptr;
  }
  for (std::size_t i = 0; i < block.size(); ++i) {
    PyObject* pair = header_pair(block[i]);
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
    if (server_side) {
      const std::string host = a.host();
      return Py_BuildValue("(s#i)", host.data(), static_cast<Py_ssize_t>(host.size()),
                           static_cast<int>(a.port));
    }
    // A client's host str is shared with the previous client's when it is the
    // same address (a str is immutable; the tuple is per connection). The
    // address is compared as bytes: its text (inet_ntop, which formats with
    // sprintf) is made only for a new one.
    if (last_client_host_ == nullptr || a.family != last_client_addr_.family ||
        a.bytes != last_client_addr_.bytes) {
      const std::string host = a.host();
      PyObject* h = PyUnicode_FromStringAndSize(host.data(), static_cast<Py_ssize_t>(host.size()));
      if (h == nullptr) {
        return nullptr;
      }
      Py_XSETREF(last_client_host_, h);
      last_client_addr_ = a;
    }
    PyObject* port = PyLong_FromLong(static_cast<long>(a.port));
    if (port == nullptr) {
      return nullptr;
    }
    PyObject* t = PyTuple_Pack(2, last_client_host_, port);
    Py_DECREF(port);
    return t;
  }
  if (a.family == fam::unix_socket && server_side) {
    return Py_BuildValue("(s#O)", options_.unix_path.data(),
                         static_cast<Py_ssize_t>(options_.unix_path.size()), Py_None);
  }
  Py_RETURN_NONE;
}

namespace {

/// A str from `text`, or None when it is empty (a new reference; null on error).
PyObject* str_or_none(const std::string& text) {
  if (text.empty()) {
    Py_RETURN_NONE;
  }
  return PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "replace");
}

/// scope["extensions"]["tls"] of the ASGI TLS extension (a new reference; null on error).
PyObject* tls_extension(const net::tls_details& d) {
  PyObject* chain = PyList_New(0);
  for (std::size_t i = 0; chain != nullptr && i < d.client_cert_chain.size(); ++i) {
    PyObject* pem = str_or_none(d.client_cert_chain[i]);
    if (pem == nullptr || PyList_Append(chain, pem) != 0) {
      Py_CLEAR(chain);
    }
    Py_XDECREF(pem);
  }
  if (chain == nullptr) {
    return nullptr;
  }
  static const std::string none;
  return Py_BuildValue("{s:N,s:N,s:N,s:N,s:i,s:i}", "server_cert",
                       str_or_none(d.server_cert ? *d.server_cert : none), "client_cert_chain",
                       chain, "client_cert_name", str_or_none(d.client_cert_name),
                       "client_cert_error", str_or_none(d.client_cert_error), "tls_version",
                       static_cast<int>(d.version), "cipher_suite",
                       static_cast<int>(d.cipher_suite));
}

}  // namespace

PyObject* bridge::decode_path(std::string_view raw) {
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
    path = PyUnicode_DecodeUTF8(path_scratch_.data(), static_cast<Py_ssize_t>(path_scratch_.size()),
                                "replace");
  }
  if (!options_.root_path.empty() && path != nullptr) {
    // ASGI (and uvicorn 0.26+): path starts with root_path; raw_path stays as received.
    PyObject* full = PyUnicode_Concat(PyDict_GetItem(scope_template_, n_.root_path), path);
    Py_DECREF(path);
    path = full;
  }
  return path;
}

PyObject* bridge::build_scope(const runtime::inbound_message& m, conn_state& cs) {
  const http::request_head& head = *m.head;
  if (full_template_ == nullptr || full_template_state_ != (state_ != nullptr)) {
    Py_CLEAR(full_template_);
    full_template_ = PyDict_Copy(scope_template_);
    if (full_template_ == nullptr) {
      return nullptr;
    }
    full_template_state_ = state_ != nullptr;
    ++template_generation_;  // the connections' scope bases are of the old one
    // Every key a scope gets is in the template (None until set), so setting
    // it replaces a value and never grows the copy.
    PyObject* keys[] = {n_.http_version, n_.method, n_.path,   n_.raw_path,   n_.query_string,
                        n_.headers,      n_.client, n_.server, n_.extensions, n_.state};
    for (PyObject* k : keys) {
      if ((k != n_.state || state_ != nullptr) && PyDict_SetItem(full_template_, k, Py_None) != 0) {
        Py_CLEAR(full_template_);
        return nullptr;
      }
    }
  }
  if (cs.client == nullptr) {
    cs.client = address_tuple(m.info.client, false);
  }
  if (last_server_ == nullptr ||
      std::memcmp(&last_server_addr_, &m.info.server, sizeof m.info.server) != 0) {
    Py_CLEAR(last_server_);
    last_server_ = address_tuple(m.info.server, true);
    last_server_addr_ = m.info.server;
  }
  if (cs.client == nullptr || last_server_ == nullptr) {
    return nullptr;
  }
  PyObject* const version = head.version_minor() == 0 ? n_.v10 : n_.v11;
  const auto mi = static_cast<std::size_t>(head.method());
  PyObject* method =
      mi < n_.methods.size()
          ? Py_NewRef(n_.methods[mi])
          : PyUnicode_FromStringAndSize(head.method_name().data(),
                                        static_cast<Py_ssize_t>(head.method_name().size()));
  // path: percent-decoded, then UTF-8 (invalid sequences replaced). The
  // last target's str and bytes are reused when the next one is the same
  // (many clients of one route: both are immutable, so they can be shared).
  //
  // A target (or query) the connection's scope base holds is taken from it
  // first: then the key is left as copied below, even when other
  // connections' targets came in between and the last target is another.
  if (cs.scope_base != nullptr && cs.scope_base_of != template_generation_) {
    Py_CLEAR(cs.scope_base);  // made from the old template; base_* dangle
  }
  const bool have_base = cs.scope_base != nullptr;
  const std::string_view raw = head.path();
  PyObject* path = nullptr;
  PyObject* raw_path = nullptr;
  if (have_base && bytes_of(cs.base_raw_path) == raw) {
    path = Py_NewRef(cs.base_path);  // decoded from these very bytes
    raw_path = Py_NewRef(cs.base_raw_path);
  } else if (last_path_ != nullptr && raw == last_raw_text_) {
    path = Py_NewRef(last_path_);
    raw_path = Py_NewRef(last_raw_path_);
  } else {
    path = decode_path(raw);
    raw_path = PyBytes_FromStringAndSize(raw.data(), static_cast<Py_ssize_t>(raw.size()));
    if (path != nullptr && raw_path != nullptr && raw.size() <= shared_path_max) {
      try {
        last_raw_text_.assign(raw);
        Py_XSETREF(last_path_, Py_NewRef(path));
        Py_XSETREF(last_raw_path_, Py_NewRef(raw_path));
      } catch (const std::bad_alloc&) {
        Py_CLEAR(last_path_);  // not shared
      }
    }
  }
  const std::string_view query_text = head.query();
  PyObject* query =  // b"" is CPython's one empty bytes object
      have_base && bytes_of(cs.base_query) == query_text
          ? Py_NewRef(cs.base_query)
          : PyBytes_FromStringAndSize(query_text.data(),
                                      static_cast<Py_ssize_t>(query_text.size()));
  auto drop_parts = [&] {
    Py_XDECREF(method);
    Py_XDECREF(path);
    Py_XDECREF(raw_path);
    Py_XDECREF(query);
  };
  if (method == nullptr || path == nullptr || raw_path == nullptr || query == nullptr) {
    drop_parts();
    return nullptr;
  }
  // A keep-alive connection's later requests copy its own base, which has
  // the keys that stay for the connection (and its second request's target):
  // up to seven dict stores fewer each.
  if (cs.scope_base == nullptr && cs.had_request) {
    PyObject* b = template_for(version, method, path, raw_path, query);
    if (b == nullptr || PyDict_SetItem(b, n_.client, cs.client) != 0) {
      Py_XDECREF(b);
      drop_parts();
      return nullptr;
    }
    cs.scope_base = b;
    cs.scope_base_of = template_generation_;
    cs.scope_base_v10 = version == n_.v10;
    cs.base_method = method;
    cs.base_path = path;
    cs.base_raw_path = raw_path;
    cs.base_query = query;
  }
  cs.had_request = true;
  const bool from_base = cs.scope_base != nullptr;
  // Without a base of its own this is the connection's first request: it
  // copies the bridge's first_base_ when that holds what it asks.
  const bool from_first = !from_base && use_first_base(version, method, path, raw_path, query);
  PyObject* scope =
      PyDict_Copy(from_base ? cs.scope_base : from_first ? first_base_ : full_template_);
  if (scope == nullptr) {
    drop_parts();
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
  // Steals value. Leaves the key as copied when the base holds this very
  // object (method, path, raw_path, query_string of a target asked again).
  auto put_new = [&](PyObject* key, PyObject* value, PyObject* in_base) {
    if (from_base && value == in_base) {
      Py_DECREF(value);
      return true;
    }
    return put(key, value);
  };
  // From first_base_, the target's keys hold equal values already.
  auto keep_first_base = [&] {
    Py_CLEAR(method);
    Py_CLEAR(path);
    Py_CLEAR(raw_path);
    Py_CLEAR(query);
    return true;
  };
  const bool ok = ((from_base && cs.scope_base_v10 == (version == n_.v10)) || from_first ||
                   put(n_.http_version, Py_NewRef(version))) &&
                  (from_first
                       ? keep_first_base()
                       : put_new(n_.method, std::exchange(method, nullptr), cs.base_method) &&
                             put_new(n_.path, std::exchange(path, nullptr), cs.base_path) &&
                             put_new(n_.raw_path, std::exchange(raw_path, nullptr),
                                     cs.base_raw_path) &&
                             put_new(n_.query_string, std::exchange(query, nullptr),
                                     cs.base_query)) &&
                  put(n_.headers, build_headers(head)) &&
                  (from_base || (put(n_.client, Py_NewRef(cs.client)) &&
                                 (from_first || put(n_.server, Py_NewRef(last_server_))))) &&
                  (state_ == nullptr || put(n_.state, PyDict_Copy(state_)));
  if (!ok) {
    // What a failed store left unstolen (the stores steal in order).
    Py_XDECREF(path);
    Py_XDECREF(raw_path);
    Py_XDECREF(method);
    Py_XDECREF(query);
  }
  // Over TLS: scheme https and the TLS extension. A WebSocket scope gets its
  // extensions in websocket_scope (the template's None stays until then).
  const bool tls_ext = m.info.tls && m.info.tls_info;
  const bool tls_ok =
      !m.info.tls ||
      (put(n_.scheme, PyUnicode_FromString("https")) &&
       (!tls_ext ||
        put(n_.extensions, Py_BuildValue("{s:N}", "tls", tls_extension(*m.info.tls_info)))));
  if (!ok || !tls_ok || (!m.info.websocket && !add_http_extensions(scope, tls_ext)) ||
      !apply_forwarded(scope, n_.client, n_.scheme, options_.proxy, m.info.client, head,
                       m.info.websocket)) {
    Py_DECREF(scope);
    return nullptr;
  }
  return scope;
}

PyObject* bridge::template_for(PyObject* version, PyObject* method, PyObject* path,
                               PyObject* raw_path, PyObject* query) {
  PyObject* b = PyDict_Copy(full_template_);
  if (b == nullptr || PyDict_SetItem(b, n_.http_version, version) != 0 ||
      PyDict_SetItem(b, n_.server, last_server_) != 0 || PyDict_SetItem(b, n_.method, method) != 0 ||
      PyDict_SetItem(b, n_.path, path) != 0 || PyDict_SetItem(b, n_.raw_path, raw_path) != 0 ||
      PyDict_SetItem(b, n_.query_string, query) != 0) {
    Py_XDECREF(b);
    return nullptr;
  }
  return b;
}

bool bridge::use_first_base(PyObject* version, PyObject* method, PyObject* path,
                            PyObject* raw_path, PyObject* query) {
  // (path is decoded from raw_path: equal raw bytes give an equal path.)
  const bool valid = first_base_ != nullptr && first_base_of_ == template_generation_;
  // The same version, listener and method objects; the target and query
  // compared as bytes (a query's bytes are made per request). Equal raw
  // bytes decode to an equal path.
  if (valid && fb_version_ == version && fb_server_ == last_server_ && fb_method_ == method &&
      bytes_of(fb_raw_path_) == bytes_of(raw_path) && bytes_of(fb_query_) == bytes_of(query)) {
    first_base_misses_ = 0;
    return true;
  }
  // Something else: the base is made anew for this request only once the
  // last one went unused for 16 first requests in a row, so clients that
  // each ask another target pay a build every 16th connection, and two
  // targets taking turns keep the base of one.
  if (valid && ++first_base_misses_ < 16) {
    return false;
  }
  first_base_misses_ = 0;
  PyObject* b = template_for(version, method, path, raw_path, query);
  if (b == nullptr) {
    PyErr_Clear();  // only a shortcut: the scope is built the long way, which reports its own errors
    Py_CLEAR(first_base_);
    return false;
  }
  Py_XSETREF(first_base_, b);
  first_base_of_ = template_generation_;
  fb_version_ = version;
  fb_server_ = last_server_;
  fb_method_ = method;
  fb_raw_path_ = raw_path;
  fb_query_ = query;
  return true;
}

// --------------------------------------------------------------- completion

PyObject* bridge::task_done(request_object* r, PyObject* task) {
  if (r->finished || r->task == nullptr) {
    Py_RETURN_NONE;
  }
  PyObject* exc = PyObject_CallMethodNoArgs(task, n_.exception);
  if (exc == nullptr) {
    exc = take_exception();  // CancelledError: the task was cancelled
  }
  app_ended(r, exc);
  Py_XDECREF(exc);
  Py_RETURN_NONE;
}

void bridge::app_ended(request_object* r, PyObject* exc) {
  Py_INCREF(r);  // finish() may drop the last references
  --active_tasks_;
  if (is_fatal(exc)) {
    // KeyboardInterrupt, SystemExit: the loop stops; nothing to log or answer.
  } else if (r->ws != nullptr) {
    ws_task_done(r, exc != Py_None ? exc : nullptr);  // bridge_websocket.cpp
  } else if (exc != nullptr && exc != Py_None) {
    app_error(r, "Exception in ASGI application", exc);
  } else if (!r->complete && !r->disconnected) {
    // Once the connection is gone (the client left, or a timeout cut it) the
    // app cannot answer: returning without a response is what ASGI asks
    // then, not an app error (uvicorn does not log it either), so a client
    // that resets cannot fill the error log and the app_errors counter.
    app_error(r,
              r->started ? "ASGI application returned without completing the response"
                         : "ASGI application returned without starting a response",
              nullptr);
  }
  finish(r);
  Py_DECREF(r);
}

void bridge::app_error(request_object* r, const char* what, PyObject* exc) {
  // A ClientDisconnected the app let through (send() raised it) is the
  // client's doing: on_error_ logs it at debug level, and it is not counted.
  if (exc == nullptr || PyErr_GivenExceptionMatches(exc, disconnected_type_) == 0) {
    ++stats_.app_errors;
    side_.count_app_error();
  }
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
      http::encoder_options eo{options_.server_header, options_.date_header,
                               options_.extra_headers};
      (void)http::encode_error_response(500, "Internal Server Error\n", dates_, scratch_, eo, {},
                                        r->ctx.is_head);
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
  Py_CLEAR(r->gated);  // a send held by the staging gate (the queue drops r later)
  r->body.destroy();
  if (r->ws != nullptr) {
    r->ws->inbox.clear();
  }
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
  // Last: a callable's reference may be the last one to r when the
  // connection's is gone (not owned), and r is not touched after them.
  PyObject* receive_fn = std::exchange(r->receive_fn, nullptr);
  PyObject* send_fn = std::exchange(r->send_fn, nullptr);
  release_callable(receive_fn, spare_receive_);
  release_callable(send_fn, spare_send_);
  if (owned) {
    Py_DECREF(r);
  }
}

PyObject* bridge::bind_callable(PyMethodDef& def, std::vector<PyObject*>& spares, PyObject* self) {
  if (spares.empty()) {
    return PyCFunction_NewEx(&def, self, nullptr);
  }
  PyObject* fn = spares.back();
  spares.pop_back();
  Py_SETREF(reinterpret_cast<PyCFunctionObject*>(fn)->m_self, Py_NewRef(self));  // was None
  return fn;
}

void bridge::release_callable(PyObject*& slot, std::vector<PyObject*>& spares) {
  PyObject* fn = std::exchange(slot, nullptr);
  if (fn == nullptr) {
    return;
  }
  auto* f = reinterpret_cast<PyCFunctionObject*>(fn);
  // Only the request held it: no frame, closure or weak reference of the
  // app's can see it serve another request.
  if (Py_REFCNT(fn) == 1 && f->m_weakreflist == nullptr && spares.size() < spare_callables_max) {
    try {
      spares.push_back(fn);
      Py_SETREF(f->m_self, Py_NewRef(Py_None));  // may free the request: it is not touched after
      return;
    } catch (const std::bad_alloc&) {
      // released below
    }
  }
  Py_DECREF(fn);
}
}  // namespace cadeloop::pyhost::server
