// The send side of the ASGI bridge: a request's send(), which checks each
// http.response.start / http.response.body message, encodes the head (once
// the first body part tells whether the length is known), frames the body
// and stages the bytes on the outbound ring, one buffer per message (a
// `bytes` body of borrow_min_body or more goes as its own piece, borrowed
// from the app's object, between the head's and the tail's); it returns a
// Ready awaitable unless the connection's unsent output passed the high
// mark, and then a Future resolved by the "drained" notice.
#include <array>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "asgi/request_type.hpp"

namespace cadeloop::pyhost::server {

namespace {

PyObject* request_send(PyObject* self, PyObject* message) {
  auto* r = reinterpret_cast<request_object*>(self);
  return r->owner == nullptr ? bridge_gone() : r->owner->send(r, message);
}

/// A strong reference for the length of a scope (NULL allowed): a borrowed
/// value of the app's message stays alive while the app's code runs (a
/// header iterable, a __bool__) and may change the dict.
struct held_ref {
  PyObject* obj;
  explicit held_ref(PyObject* o) : obj(Py_XNewRef(o)) {}
  held_ref(const held_ref&) = delete;
  held_ref& operator=(const held_ref&) = delete;
  ~held_ref() { Py_XDECREF(obj); }
};
}  // namespace

void bridge::read_fields(PyObject* message, message_fields& f) const {
  PyObject* const keys[] = {n_.type, n_.status, n_.headers, n_.trailers, n_.body, n_.more_body};
  PyObject** const slots[] = {&f.type, &f.status, &f.headers, &f.trailers, &f.body, &f.more_body};
  constexpr std::size_t count = std::size(keys);
  Py_ssize_t pos = 0;
  PyObject* key = nullptr;
  PyObject* value = nullptr;
  while (PyDict_Next(message, &pos, &key, &value) != 0) {
    // The app's literal keys are identifiers, interned: the same objects as
    // the bridge's names. An equal str made at run time is compared.
    std::size_t i = 0;
    while (i < count && key != keys[i]) {
      ++i;
    }
    if (i == count && PyUnicode_Check(key)) {
      i = 0;
      while (i < count && !str_equal(key, keys[i])) {
        ++i;
      }
    }
    if (i < count) {
      *slots[i] = value;
    }
  }
}

PyObject* header_pair_list(PyObject* headers, const char* event) {
  // A list (what apps send) is copied by slicing, and a tuple item is its own
  // pair: both skip the generic iteration (the copy keeps the app's later
  // changes to its list out of a head that is written later).
  PyObject* list = headers == nullptr           ? PyList_New(0)
                   : PyList_CheckExact(headers) ? PyList_GetSlice(headers, 0, PY_SSIZE_T_MAX)
                                                : PySequence_List(headers);
  if (list == nullptr) {
    if (headers != nullptr) {
      PyErr_Format(PyExc_TypeError, "'headers' in '%s' must be an iterable, got %.100s", event,
                   Py_TYPE(headers)->tp_name);
    }
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); ++i) {
    PyObject* item = PyList_GET_ITEM(list, i);
    PyObject* pair = nullptr;
    if (PyTuple_CheckExact(item)) {
      pair = Py_NewRef(item);
    } else {
      pair = PySequence_Check(item) && !PyBytes_Check(item) && !PyUnicode_Check(item)
                 ? PySequence_Tuple(item)
                 : nullptr;
      PyErr_Clear();
    }
    const bool good = pair != nullptr && PyTuple_GET_SIZE(pair) == 2 &&
                      PyBytes_Check(PyTuple_GET_ITEM(pair, 0)) &&
                      PyBytes_Check(PyTuple_GET_ITEM(pair, 1));
    if (!good) {
      PyErr_Format(PyExc_TypeError,
                   "header %zd in '%s' must be a (name, value) pair of bytes, got %R", i, event,
                   item);
      Py_XDECREF(pair);
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, i, pair);  // replaces item, whose reference the list held
    Py_DECREF(item);
  }
  return list;
}

PyMethodDef send_def = {"send", request_send, METH_O,
                        "send(message) -> awaitable: one ASGI response message."};

// --------------------------------------------------------------- send

PyObject* bridge::send(request_object* r, PyObject* message) {
  if (!PyDict_Check(message)) {
    PyErr_Format(PyExc_TypeError, "send() takes an ASGI message dict, got %.100s",
                 Py_TYPE(message)->tp_name);
    return nullptr;
  }
  if (r->ws != nullptr) {  // one lookup: ws_send reads the rest of its messages itself
    PyObject* type = PyDict_GetItemWithError(message, n_.type);
    if (type == nullptr) {
      if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "ASGI message without a 'type' key");
      }
      return nullptr;
    }
    return ws_send(r, type, message);  // bridge_websocket.cpp
  }
  message_fields f;
  read_fields(message, f);
  PyObject* const type = f.type;
  if (type == nullptr) {
    PyErr_SetString(PyExc_ValueError, "ASGI message without a 'type' key");
    return nullptr;
  }
  if (r->disconnected) {
    PyErr_SetString(disconnected_type_, "client disconnected");
    return nullptr;
  }
  const bool is_start = str_equal(type, n_.response_start);
  const bool is_body = !is_start && str_equal(type, n_.response_body);
  if (!is_start && !is_body) {
    if (PyObject* res = send_extension(r, type, message); res != nullptr || PyErr_Occurred()) {
      return res;  // http.response.pathsend or http.response.trailers (bridge_extensions.cpp)
    }
    PyErr_Format(PyExc_RuntimeError,
                 "unexpected ASGI message type %R for an HTTP request "
                 "(expected 'http.response.start', 'http.response.body', "
                 "'http.response.pathsend' or 'http.response.trailers')",
                 type);
    return nullptr;
  }
  if (r->complete) {
    PyErr_Format(PyExc_OSError, "%R sent after the response was complete", type);
    return nullptr;
  }
  return is_start ? send_start(r, f) : send_body(r, message, f);
}

PyObject* bridge::send_start(request_object* r, PyObject* message) {
  message_fields f;
  read_fields(message, f);
  return send_start(r, f);
}

PyObject* bridge::send_start(request_object* r, const message_fields& f) {
  if (r->started) {
    PyErr_SetString(PyExc_RuntimeError, "'http.response.start' sent twice");
    return nullptr;
  }
  PyObject* const status = f.status;
  if (status == nullptr) {
    PyErr_SetString(PyExc_ValueError, "'http.response.start' without a 'status'");
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
      PyErr_Format(PyExc_ValueError,
                   "invalid status %R in 'http.response.start' (must be 200..599)", status);
    }
    return nullptr;
  }
  const held_ref headers{f.headers};  // the iteration below may run the app's code
  const held_ref trailers{f.trailers};
  PyObject* list = header_pair_list(headers.obj, "http.response.start");
  if (list == nullptr) {
    return nullptr;
  }
  const int with_trailers = trailers.obj == nullptr ? 0 : PyObject_IsTrue(trailers.obj);
  if (with_trailers < 0) {
    Py_DECREF(list);
    return nullptr;
  }
  r->trailers = with_trailers != 0;
  r->started = true;
  r->status = static_cast<unsigned>(code);
  Py_XSETREF(r->start_headers, list);
  return Py_NewRef(none_ready_);
}

bool bridge::encode_head(request_object* r, std::optional<std::uint64_t> body_size) {
  std::vector<http::header_field>& fields = fields_scratch_;
  fields.clear();
  PyObject* list = r->start_headers;
  const Py_ssize_t n = list == nullptr ? 0 : PyList_GET_SIZE(list);
  fields.reserve(static_cast<std::size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* pair = PyList_GET_ITEM(list, i);
    PyObject* name = PyTuple_GET_ITEM(pair, 0);
    PyObject* value = PyTuple_GET_ITEM(pair, 1);
    fields.push_back(
        {{PyBytes_AS_STRING(name), static_cast<std::size_t>(PyBytes_GET_SIZE(name))},
         {PyBytes_AS_STRING(value), static_cast<std::size_t>(PyBytes_GET_SIZE(value))}});
  }
  if (!r->ctx.server_closing && side_.stop_requested()) {
    // The pair drains: the I/O thread closes the connection after this
    // response, which says so (nothing is written yet: a 100 Continue
    // leaves the encoder where start() puts it).
    r->ctx.server_closing = true;
    r->encoder->start(r->ctx);
  }
  http::response_head head;
  head.status = r->status;
  head.headers = fields;
  head.body_size = body_size;
  head.trailers = r->trailers && r->te_trailers;  // else they are dropped: chunking is not forced
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
  message_fields f;
  read_fields(message, f);
  return send_body(r, message, f);
}

PyObject* bridge::send_body(request_object* r, PyObject* message, const message_fields& fields) {
  if (!r->started) {
    PyErr_SetString(PyExc_RuntimeError, "'http.response.body' sent before 'http.response.start'");
    return nullptr;
  }
  if (r->body_done) {
    PyErr_SetString(PyExc_RuntimeError,
                    "'http.response.body' sent after the last one (more_body was False)");
    return nullptr;
  }
  // Held: the gate's length check and more_body's __bool__ may run the
  // app's code, which may change the message.
  const held_ref body_ref{fields.body};
  const held_ref more_ref{fields.more_body};
  if (!gate_open()) {  // bridge_gate.cpp: the pair has its staged_budget staged
    if (PyObject* fut = wait_for_gate(r, message, body_ref.obj);
        fut != nullptr || PyErr_Occurred()) {
      return fut;
    }
  }
  PyObject* const body = body_ref.obj;
  PyObject* const more_obj = more_ref.obj;
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
      !encode_head(r, more ? std::nullopt
                           : std::optional<std::uint64_t>{static_cast<std::uint64_t>(size)})) {
    release();
    return nullptr;
  }
  // A body the app's own Content-Length refuses, in the message that carries
  // the head: nothing is staged yet, so the task's error is answered with a
  // 500 (app_error) instead of a cut response.
  const auto refuse = [&](const http::encode_status& st) {
    release();
    if (with_head) {
      r->head_written = false;
    }
    PyErr_Format(PyExc_ValueError, "%s in 'http.response.body'", st.message().c_str());
  };
  const http::body_part_framing f = r->encoder->frame_body_part(size, scratch_);
  if (!f.status.ok()) {
    refuse(f.status);
    return nullptr;
  }
  std::string tail{f.after_body};
  // With trailers announced, the response ends with http.response.trailers.
  const bool ends = !more && !r->trailers;
  if (ends) {
    const http::encode_status st = r->encoder->finish({}, tail);
    if (!st.ok()) {
      refuse(st);
      return nullptr;
    }
  }
  const std::size_t body_len = f.send_body ? size : 0;
  // A large body of an exact bytes object (immutable, its buffer fixed) goes
  // out from the object itself: its reference travels with the bytes and
  // comes back to release_owners() once they are written. Smaller ones are
  // cheaper copied into the piece that carries the head.
  const bool borrow = body_len >= borrow_min_body && PyBytes_CheckExact(body);
  const std::size_t total = scratch_.size() + body_len + tail.size();
  bool wait = false;
  try {
    // One buffer holding `parts` one after another.
    const auto joined = [this](std::initializer_list<std::string_view> parts) {
      std::size_t n = 0;
      for (const std::string_view p : parts) {
        n += p.size();
      }
      net::byte_buffer b = side_.take_buffer(n);
      char* at = b.data();
      for (const std::string_view p : parts) {
        if (!p.empty()) {
          std::memcpy(at, p.data(), p.size());
          at += p.size();
        }
      }
      return b;
    };
    // Stages `pieces` (in order) for the connection: its status with the
    // first (the one that carries the head); the response's end, and a
    // drained notice, with the last.
    const auto post = [&](std::span<net::byte_buffer> pieces) {
      release();
      conn_state* cs = conn_of(r->conn);
      runtime::send_options o;
      o.end_of_response = ends;
      o.keep_alive = r->encoder->keep_alive();
      o.status = with_head ? static_cast<std::uint16_t>(r->status) : std::uint16_t{0};
      if (cs != nullptr) {
        set_staged(*cs, cs->sent_since_notice + total);
        if (over_staged(*cs, !more) && !cs->waiting_drain) {
          asked_drain(*cs);
          o.notify_drained = true;
        }
        wait = cs->waiting_drain && !ends;
      }
      if (total == 0 && !o.end_of_response) {
        return;
      }
      for (std::size_t i = 0; i < pieces.size(); ++i) {
        runtime::send_options oi = o;
        if (i != 0) {
          oi.status = 0;
        }
        if (i + 1 != pieces.size()) {
          oi.end_of_response = false;
          oi.notify_drained = false;
        }
        side_.send(r->conn, r->seq, std::move(pieces[i]), oi);
      }
      if (ends) {
        side_.write_through();  // solo mode: the client has it while the task ends
      }
    };
    if (borrow) {
      std::array<net::byte_buffer, 3> pieces;
      std::size_t count = 0;
      if (!scratch_.empty()) {
        pieces[count++] = joined({scratch_});
      }
      pieces[count++] =
          net::byte_buffer::borrow(data, body_len, Py_NewRef(body), side_.owner_sink());
      if (!tail.empty()) {
        pieces[count++] = joined({tail});
      }
      post({pieces.data(), count});
    } else {
      // The common case: head, body and tail in one piece.
      net::byte_buffer piece = joined({scratch_, std::string_view{data, body_len}, tail});
      post({&piece, 1});
    }
  } catch (const std::bad_alloc&) {
    release();
    return PyErr_NoMemory();
  }
  r->body_done = !more;
  if (ends) {
    r->complete = true;
    // A receive() waiting for the end learns it now. The waiter is tested
    // here so that the common end of a response makes no call to
    // bridge_receive.cpp.
    if (r->body_delivered && r->receive_waiter != nullptr) {
      wake_receiver(r);
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
}  // namespace cadeloop::pyhost::server
