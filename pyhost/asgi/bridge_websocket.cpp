// The WebSocket side of the ASGI bridge (ASGI spec "WebSocket", 2.5): the
// websocket scope (made from the http one), the app's receive()
// (websocket.connect, then websocket.receive per message, each reported
// taken to the I/O thread so it reads on under ws_max_queue, then
// websocket.disconnect with the code and reason) and send()
// (websocket.accept, websocket.send with the drained-notice backpressure of
// HTTP bodies, websocket.close, and the denial response
// websocket.http.response.*), the inbound ws_message/ws_close events, and
// what a task's end means for its WebSocket (403 without an accept, 500 for
// an exception before it, close 1011 after it, 1000 for a plain return).
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include <cadeloop/http/response_encoder.hpp>

#include "asgi/request_type.hpp"
#include "py_exception.hpp"

namespace cadeloop::pyhost::server {

namespace {

/// The ASCII case-insensitive comparison of a header name.
bool name_is(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) {
    return false;
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto x = static_cast<unsigned char>(a[i]);
    const auto y = static_cast<unsigned char>(b[i]);
    if ((x >= 'A' && x <= 'Z' ? x + 32 : x) != (y >= 'A' && y <= 'Z' ? y + 32 : y)) {
      return false;
    }
  }
  return true;
}

bool is_token_char(unsigned char c) noexcept {
  if (c >= '0' && c <= '9') {
    return true;
  }
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') {
    return true;
  }
  return std::string_view{"!#$%&'*+-.^_`|~"}.find(static_cast<char>(c)) != std::string_view::npos;
}

/// Whether `v` may be a header value (no CR, LF or NUL).
bool is_field_value(std::string_view v) noexcept {
  return v.find_first_of(std::string_view{"\r\n\0", 3}) == std::string_view::npos;
}

std::string_view bytes_view(PyObject* b) {
  return {PyBytes_AS_STRING(b), static_cast<std::size_t>(PyBytes_GET_SIZE(b))};
}

/// The message's `key` (borrowed; NULL when missing or None, with no error set
/// unless the lookup failed).
PyObject* optional_item(PyObject* message, PyObject* key) {
  PyObject* v = PyDict_GetItemWithError(message, key);
  return v == Py_None ? nullptr : v;
}

}  // namespace

// --------------------------------------------------------------- scope

PyObject* bridge::websocket_scope(PyObject* scope, const http::request_head& head, bool tls) {
  // subprotocols: every Sec-WebSocket-Protocol field, split at commas, trimmed.
  PyObject* subprotocols = PyList_New(0);
  // The key is interned (one str per interpreter, not one per connection).
  PyObject* denial = PyUnicode_InternFromString("websocket.http.response");
  PyObject* extensions = denial != nullptr ? Py_BuildValue("{N:{}}", denial) : nullptr;
  bool ok = subprotocols != nullptr && extensions != nullptr;
  if (PyObject* given = PyDict_GetItem(scope, n_.extensions);
      ok && given != nullptr && given != Py_None) {
    ok = PyDict_Update(extensions, given) == 0;  // the TLS extension build_scope put there
  }
  const http::header_block& block = head.headers();
  for (std::size_t i = 0; ok && i < block.size(); ++i) {
    const http::header_field f = block[i];
    if (!name_is(f.name, "sec-websocket-protocol")) {
      continue;
    }
    std::string_view rest = f.value;
    while (ok && !rest.empty()) {
      const std::size_t comma = rest.find(',');
      std::string_view item = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
      while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) {
        item.remove_prefix(1);
      }
      while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) {
        item.remove_suffix(1);
      }
      if (item.empty()) {
        continue;
      }
      PyObject* s =
          PyUnicode_DecodeLatin1(item.data(), static_cast<Py_ssize_t>(item.size()), nullptr);
      ok = s != nullptr && PyList_Append(subprotocols, s) == 0;
      Py_XDECREF(s);
    }
  }
  // The scheme: wss over TLS, or when a trusted proxy said the client's
  // connection was secure (build_scope applied X-Forwarded-Proto/Forwarded).
  bool secure = tls;
  if (PyObject* given = PyDict_GetItem(scope, n_.scheme); given != nullptr) {
    secure = secure || PyUnicode_CompareWithASCIIString(given, "https") == 0 ||
             PyUnicode_CompareWithASCIIString(given, "wss") == 0;
  }
  ok = ok && PyDict_SetItem(scope, n_.type, n_.websocket) == 0 &&
       PyDict_SetItem(scope, n_.scheme, secure ? n_.wss : n_.ws) == 0 &&
       PyDict_DelItem(scope, n_.method) == 0 &&
       PyDict_SetItem(scope, n_.subprotocols, subprotocols) == 0 &&
       PyDict_SetItem(scope, n_.extensions, extensions) == 0;
  Py_XDECREF(subprotocols);
  Py_XDECREF(extensions);
  if (!ok) {
    Py_DECREF(scope);
    return nullptr;
  }
  return scope;
}

// --------------------------------------------------------------- inbound events

request_object* bridge::ws_request_of(net::connection_id id) noexcept {
  conn_state* cs = conn_of(id);
  if (cs == nullptr) {
    return nullptr;
  }
  for (request_object* r : cs->active) {
    if (r->ws != nullptr) {
      return r;
    }
  }
  return nullptr;
}

void bridge::on_ws_message(runtime::inbound_message& m) {
  request_object* r = ws_request_of(m.conn);
  if (r == nullptr) {
    side_.ws_consumed(m.conn);  // the app is done with it: nobody will take it
    return;
  }
  r->ws->inbox.push_back(ws_inbound{std::move(m.body), m.text});
  ws_wake(r);
}

void bridge::on_ws_close(runtime::inbound_message& m) {
  request_object* r = ws_request_of(m.conn);
  if (r == nullptr || r->ws->peer_closed) {
    return;
  }
  ws_session& ws = *r->ws;
  ws.peer_closed = true;
  ws.close_code = m.code;
  ws.close_reason.assign(m.body.data(), m.body.size());
  ws_wake(r);
}

// --------------------------------------------------------------- receive

PyObject* bridge::ws_next_event(request_object* r) {
  ws_session& ws = *r->ws;
  if (!ws.connect_delivered) {
    ws.connect_delivered = true;
    return Py_BuildValue("{O:O}", n_.type, n_.ws_connect);
  }
  if (!ws.inbox.empty()) {
    ws_inbound& in = ws.inbox.front();
    PyObject* value =
        in.text
            ? PyUnicode_DecodeUTF8(in.bytes.data(), static_cast<Py_ssize_t>(in.bytes.size()),
                                   "surrogateescape")
            : PyBytes_FromStringAndSize(in.bytes.data(), static_cast<Py_ssize_t>(in.bytes.size()));
    if (value == nullptr) {
      return nullptr;
    }
    PyObject* msg =
        Py_BuildValue("{O:O,O:N}", n_.type, n_.ws_receive, in.text ? n_.text : n_.bytes, value);
    if (msg == nullptr) {
      return nullptr;
    }
    ws.inbox.pop_front();
    if (!r->disconnected) {
      try {
        side_.ws_consumed(r->conn);  // the I/O thread may read on
      } catch (const std::bad_alloc&) {
        Py_DECREF(msg);
        return PyErr_NoMemory();
      }
    }
    return msg;
  }
  // A denied upgrade ends with the response: the app sees 1006, as under uvicorn.
  if (ws.peer_closed || r->disconnected || ws.state == ws_session::phase::denied) {
    ws.disconnect_delivered = true;
    const std::uint16_t code = ws.peer_closed ? ws.close_code : std::uint16_t{1006};
    PyObject* reason = PyUnicode_DecodeUTF8(
        ws.close_reason.data(), static_cast<Py_ssize_t>(ws.close_reason.size()), "replace");
    if (reason == nullptr) {
      return nullptr;
    }
    return Py_BuildValue("{O:O,O:i,O:N}", n_.type, n_.ws_disconnect, n_.code,
                         static_cast<int>(code), n_.reason, reason);
  }
  Py_RETURN_NONE;  // nothing yet
}

/// Whether `fut` is done (a receive() the app cancelled); -1 with an error set.
static int bridge_future_done(PyObject* fut, PyObject* done_name) {
  PyObject* done = PyObject_CallMethodNoArgs(fut, done_name);
  const int is_done = done == nullptr ? -1 : PyObject_IsTrue(done);
  Py_XDECREF(done);
  return is_done;
}

PyObject* bridge::ws_receive(request_object* r) {
  if (r->receive_waiter != nullptr) {
    const int is_done = bridge_future_done(r->receive_waiter, n_.done);
    if (is_done <= 0) {
      if (is_done == 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "receive() called while another receive() of this WebSocket is waiting");
      }
      return nullptr;
    }
    Py_CLEAR(r->receive_waiter);  // cancelled: nothing was taken for it
  }
  PyObject* ev = ws_next_event(r);
  if (ev == nullptr) {
    return nullptr;
  }
  if (ev != Py_None) {
    return ready(ev);
  }
  Py_DECREF(ev);
  PyObject* fut = PyObject_CallNoArgs(create_future_);
  if (fut == nullptr) {
    return nullptr;
  }
  r->receive_waiter = Py_NewRef(fut);
  return fut;
}

void bridge::ws_wake(request_object* r) {
  if (r->receive_waiter == nullptr) {
    return;
  }
  const int is_done = bridge_future_done(r->receive_waiter, n_.done);
  if (is_done != 0) {
    // Cancelled by the app: the event stays queued for its next receive().
    PyErr_Clear();
    Py_CLEAR(r->receive_waiter);
    return;
  }
  PyObject* ev = ws_next_event(r);
  if (ev == nullptr) {
    // Could not build the event (memory): the waiter gets the error.
    PyObject* exc = take_exception();
    if (exc != nullptr) {
      resolve(r->receive_waiter, exc, true);
    }
    return;
  }
  if (ev == Py_None) {
    Py_DECREF(ev);
    return;
  }
  resolve(r->receive_waiter, ev, false);
}

// --------------------------------------------------------------- send

PyObject* bridge::ws_send(request_object* r, PyObject* type, PyObject* message) {
  ws_session& ws = *r->ws;
  const bool is_send = str_equal(type, n_.ws_send);
  const bool is_close = !is_send && str_equal(type, n_.ws_close);
  const bool is_accept = !is_send && !is_close && str_equal(type, n_.ws_accept);
  const bool is_start =
      !is_send && !is_close && !is_accept && str_equal(type, n_.ws_response_start);
  const bool is_body =
      !is_send && !is_close && !is_accept && !is_start && str_equal(type, n_.ws_response_body);
  if (!is_send && !is_close && !is_accept && !is_start && !is_body) {
    PyErr_Format(PyExc_RuntimeError,
                 "unexpected ASGI message type %R for a WebSocket (expected 'websocket.accept', "
                 "'websocket.send', 'websocket.close' or 'websocket.http.response.*')",
                 type);
    return nullptr;
  }
  switch (ws.state) {
    case ws_session::phase::connecting:
      if (r->disconnected) {
        PyErr_SetString(disconnected_type_, "client disconnected");
        return nullptr;
      }
      if (is_accept) {
        return ws_accept(r, message);
      }
      if (is_close) {
        ws_deny(r, 403);
        return r->complete ? Py_NewRef(none_ready_) : PyErr_NoMemory();
      }
      if (is_start) {
        if (r->encoder == nullptr) {  // made for a denial response only: an accepted one needs none
          make_encoder(r, dates_,
                       http::encoder_options{options_.server_header, options_.date_header,
                                             options_.extra_headers});
        }
        return send_start(r, message);  // the denial response (bridge_send.cpp)
      }
      if (is_body) {
        if (!r->started) {
          PyErr_SetString(PyExc_RuntimeError,
                          "'websocket.http.response.body' sent before "
                          "'websocket.http.response.start'");
          return nullptr;
        }
        PyObject* res = send_body(r, message);
        if (r->complete) {
          ws.state = ws_session::phase::denied;
          ws_wake(r);
        }
        return res;
      }
      PyErr_Format(PyExc_RuntimeError,
                   "%R sent before 'websocket.accept' (expected 'websocket.accept', "
                   "'websocket.close' or 'websocket.http.response.start')",
                   type);
      return nullptr;
    case ws_session::phase::accepted:
      if (ws.app_closed) {
        PyErr_Format(PyExc_RuntimeError, "%R sent after 'websocket.close'", type);
        return nullptr;
      }
      if (is_close) {
        return ws_close(r, message);
      }
      if (ws.peer_closed || r->disconnected) {
        PyErr_SetString(disconnected_type_, "WebSocket closed by the client");
        return nullptr;
      }
      if (is_send) {
        return ws_send_message(r, message);
      }
      PyErr_Format(PyExc_RuntimeError, "%R sent after 'websocket.accept'", type);
      return nullptr;
    case ws_session::phase::denied:
      break;
  }
  PyErr_Format(PyExc_RuntimeError, "%R sent after the WebSocket was denied", type);
  return nullptr;
}

PyObject* bridge::ws_accept(request_object* r, PyObject* message) {
  PyObject* sub = optional_item(message, n_.subprotocol);
  if (sub == nullptr && PyErr_Occurred()) {
    return nullptr;
  }
  std::string_view subprotocol;
  if (sub != nullptr) {
    Py_ssize_t n = 0;
    const char* s = PyUnicode_Check(sub) ? PyUnicode_AsUTF8AndSize(sub, &n) : nullptr;
    if (s == nullptr) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "'subprotocol' in 'websocket.accept' must be a str, got %R",
                   sub);
      return nullptr;
    }
    subprotocol = {s, static_cast<std::size_t>(n)};
    for (const char c : subprotocol) {
      if (!is_token_char(static_cast<unsigned char>(c))) {
        PyErr_Format(PyExc_ValueError, "'subprotocol' %R in 'websocket.accept' is not a token",
                     sub);
        return nullptr;
      }
    }
    if (subprotocol.empty() || subprotocol.size() > 1024) {
      PyErr_Format(PyExc_ValueError, "'subprotocol' %R in 'websocket.accept' is not a token", sub);
      return nullptr;
    }
  }
  PyObject* headers = optional_item(message, n_.headers);
  if (headers == nullptr && PyErr_Occurred()) {
    return nullptr;
  }
  PyObject* list = header_pair_list(headers, "websocket.accept");
  if (list == nullptr) {
    return nullptr;
  }
  scratch_.clear();
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); ++i) {
    PyObject* pair = PyList_GET_ITEM(list, i);
    const std::string_view name = bytes_view(PyTuple_GET_ITEM(pair, 0));
    const std::string_view value = bytes_view(PyTuple_GET_ITEM(pair, 1));
    bool valid = !name.empty() && is_field_value(value);
    for (const char c : name) {
      valid = valid && is_token_char(static_cast<unsigned char>(c));
    }
    if (!valid) {
      PyErr_Format(PyExc_ValueError,
                   "header %zd in 'websocket.accept' must be a (name, value) pair of bytes "
                   "(a token and a value without CR/LF), got %R",
                   i, pair);
      Py_DECREF(list);
      return nullptr;
    }
    scratch_.append(name).append(": ").append(value).append("\r\n");
  }
  Py_DECREF(list);
  try {
    side_.ws_accept(r->conn, r->seq, subprotocol, scratch_);
  } catch (const std::bad_alloc&) {
    return PyErr_NoMemory();
  }
  r->ws->state = ws_session::phase::accepted;
  r->started = r->head_written = r->complete = true;  // no HTTP response follows
  return Py_NewRef(none_ready_);
}

PyObject* bridge::ws_send_message(request_object* r, PyObject* message) {
  PyObject* bytes = optional_item(message, n_.bytes);
  if (bytes == nullptr && PyErr_Occurred()) {
    return nullptr;
  }
  PyObject* text = optional_item(message, n_.text);
  if (text == nullptr && PyErr_Occurred()) {
    return nullptr;
  }
  if ((bytes == nullptr) == (text == nullptr)) {
    PyErr_SetString(PyExc_ValueError,
                    "'websocket.send' must have exactly one of 'bytes' and 'text' (not None)");
    return nullptr;
  }
  net::byte_buffer out;
  if (text != nullptr) {
    Py_ssize_t n = 0;
    const char* s = PyUnicode_Check(text) ? PyUnicode_AsUTF8AndSize(text, &n) : nullptr;
    if (s == nullptr) {
      if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "'text' in 'websocket.send' must be a str, got %.100s",
                     Py_TYPE(text)->tp_name);
      }
      return nullptr;  // or the UnicodeEncodeError of a lone surrogate
    }
    try {
      out = net::byte_buffer::copy_of({s, static_cast<std::size_t>(n)});
    } catch (const std::bad_alloc&) {
      return PyErr_NoMemory();
    }
  } else {
    Py_buffer view{};
    if (PyUnicode_Check(bytes) || PyObject_GetBuffer(bytes, &view, PyBUF_SIMPLE) < 0) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "'bytes' in 'websocket.send' must be bytes, got %.100s",
                   Py_TYPE(bytes)->tp_name);
      return nullptr;
    }
    try {
      out = net::byte_buffer::copy_of(
          {static_cast<const char*>(view.buf), static_cast<std::size_t>(view.len)});
    } catch (const std::bad_alloc&) {
      PyBuffer_Release(&view);
      return PyErr_NoMemory();
    }
    PyBuffer_Release(&view);
  }
  // Backpressure as for HTTP bodies: past the high mark the send asks for a
  // drained notice and waits for it (on_drained resolves the waiter).
  bool notify = false;
  bool wait = false;
  conn_state* cs = conn_of(r->conn);
  if (cs != nullptr) {
    set_staged(*cs,
               cs->sent_since_notice + out.size() + 2);  // a frame has a 2-byte header at least
    if (over_staged(*cs) && !cs->waiting_drain) {
      asked_drain(*cs);
      notify = true;
    }
    wait = cs->waiting_drain;
  }
  try {
    side_.ws_send(r->conn, std::move(out), text != nullptr, notify);
  } catch (const std::bad_alloc&) {
    return PyErr_NoMemory();
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

PyObject* bridge::ws_close(request_object* r, PyObject* message) {
  PyObject* code_obj = optional_item(message, n_.code);
  if (code_obj == nullptr && PyErr_Occurred()) {
    return nullptr;
  }
  long code = 1000;
  if (code_obj != nullptr) {
    code = PyLong_Check(code_obj) && !PyBool_Check(code_obj) ? PyLong_AsLong(code_obj) : -1;
    PyErr_Clear();
    // What a close frame may carry (RFC 6455 section 7.4): 1000-1014 but not the
    // reserved 1004-1006, and 3000-4999 for apps and libraries.
    const bool valid =
        (code >= 1000 && code <= 1014 && code != 1004 && code != 1005 && code != 1006) ||
        (code >= 3000 && code <= 4999);
    if (!valid) {
      PyErr_Format(PyExc_ValueError, "'code' %R in 'websocket.close' is not a valid close code",
                   code_obj);
      return nullptr;
    }
  }
  PyObject* reason_obj = optional_item(message, n_.reason);
  if (reason_obj == nullptr && PyErr_Occurred()) {
    return nullptr;
  }
  std::string_view reason;
  if (reason_obj != nullptr) {
    Py_ssize_t n = 0;
    const char* s = PyUnicode_Check(reason_obj) ? PyUnicode_AsUTF8AndSize(reason_obj, &n) : nullptr;
    if (s == nullptr) {
      if (!PyUnicode_Check(reason_obj)) {
        PyErr_Format(PyExc_TypeError, "'reason' in 'websocket.close' must be a str, got %.100s",
                     Py_TYPE(reason_obj)->tp_name);
      }
      return nullptr;
    }
    reason = {s, static_cast<std::size_t>(n)};
    if (reason.size() > 123) {  // a control frame's payload is at most 125 bytes
      std::size_t cut = 123;
      while (cut > 0 && (static_cast<unsigned char>(reason[cut]) & 0xC0) == 0x80) {
        --cut;  // not inside a UTF-8 sequence
      }
      reason = reason.substr(0, cut);
    }
  }
  r->ws->app_closed = true;
  if (r->ws->peer_closed || r->disconnected) {
    return Py_NewRef(none_ready_);  // already closed by the client: nothing to send
  }
  try {
    side_.ws_close(r->conn, static_cast<std::uint16_t>(code), reason);
  } catch (const std::bad_alloc&) {
    return PyErr_NoMemory();
  }
  return Py_NewRef(none_ready_);
}

void bridge::ws_deny(request_object* r, unsigned status) {
  r->ws->state = ws_session::phase::denied;
  if (r->complete || r->disconnected) {
    return;
  }
  r->complete = true;
  try {
    scratch_.clear();
    http::encoder_options eo{options_.server_header, true};
    (void)http::encode_error_response(status,
                                      status == 403 ? "Forbidden\n" : "Internal Server Error\n",
                                      dates_, scratch_, eo, {}, false);
    runtime::send_options o;
    o.end_of_response = true;
    o.keep_alive = false;
    o.status = static_cast<std::uint16_t>(status);
    side_.send(r->conn, r->seq, net::byte_buffer::copy_of(scratch_), o);
  } catch (const std::bad_alloc&) {
    r->complete = false;
    PyErr_Clear();
  }
  ws_wake(r);
}

// --------------------------------------------------------------- the task's end

void bridge::ws_task_done(request_object* r, PyObject* exc) {
  ws_session& ws = *r->ws;
  const bool failed = exc != nullptr;
  switch (ws.state) {
    case ws_session::phase::connecting:
      if (failed || r->started) {
        // A 500, or a cut connection once the denial's head is out.
        app_error(r,
                  failed ? "Exception in ASGI application"
                         : "ASGI application returned without completing the denial response",
                  exc);
      } else {
        // Logged (marked complete so that app_error answers nothing), then the 403.
        r->complete = true;
        app_error(r, "ASGI application returned without accepting the WebSocket (answered 403)",
                  nullptr);
        r->complete = false;
        ws_deny(r, 403);
      }
      ws.state = ws_session::phase::denied;
      return;
    case ws_session::phase::accepted:
      if (failed) {
        // Logged and counted; the accept marked the request complete, so no HTTP answer.
        app_error(r, "Exception in ASGI application", exc);
      }
      if (!ws.app_closed && !ws.peer_closed && !r->disconnected) {
        ws.app_closed = true;
        try {
          side_.ws_close(r->conn, failed ? 1011 : 1000, {});
        } catch (const std::bad_alloc&) {
          side_.abort(r->conn);
        }
      }
      return;
    case ws_session::phase::denied:
      if (failed) {
        app_error(r, "Exception in ASGI application", exc);
      }
      return;
  }
}

}  // namespace cadeloop::pyhost::server
