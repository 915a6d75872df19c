// The receive side of the ASGI bridge: a request's receive() (the body
// pieces the I/O thread read, one http.request message at a time, credited
// back to the connection as the app takes them; http.disconnect once the
// client is gone or the response is complete), the Ready awaitables and the
// Futures it returns, and the connection events that feed it from the
// inbound ring (body, disconnect, drained, peer EOF).
#include <cstring>
#include <utility>
#include <vector>

#include "asgi/request_type.hpp"

namespace cadeloop::pyhost::server {

namespace {

PyObject* request_receive(PyObject* self, PyObject*) {
  auto* r = reinterpret_cast<request_object*>(self);
  return r->owner == nullptr ? bridge_gone() : r->owner->receive(r);
}

}  // namespace

PyMethodDef receive_def = {"receive", request_receive, METH_NOARGS,
                           "receive() -> awaitable of the next ASGI event of this request."};

request_object* bridge::find_request(conn_state& cs, std::uint32_t seq) noexcept {
  for (request_object* r : cs.active) {
    if (r->seq == seq) {
      return r;
    }
  }
  return nullptr;
}

// --------------------------------------------------------------- connection events

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
    r->body.push(std::move(m.body));
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
  PyObject* scope_base = std::exchange(cs->scope_base, nullptr);
  cs->had_request = false;
  cs->generation = 0;
  set_staged(*cs, 0);
  for (request_object* r : active) {
    r->disconnected = true;
    if (r->ws != nullptr) {
      r->ws->peer_closed = true;  // keeps the code of a ws_close before it (1006 without one)
    }
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
  Py_XDECREF(scope_base);
}

void bridge::on_drained(const runtime::inbound_message& m) {
  conn_state* cs = conn_of(m.conn);
  if (cs == nullptr) {
    return;
  }
  cs->waiting_drain = false;
  set_staged(*cs, m.unsent);
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

PyObject* bridge::disconnect_message() {
  return Py_BuildValue("{O:O}", n_.type, n_.http_disconnect);
}

PyObject* bridge::body_message(request_object* r) {
  pending_body& pending = r->body;
  const std::size_t total = pending.size();
  PyObject* bytes = nullptr;
  if (total == 0) {
    bytes = Py_NewRef(n_.empty_bytes);
  } else if (pending.rest == nullptr || pending.rest->empty()) {
    bytes = PyBytes_FromStringAndSize(pending.first_data(), static_cast<Py_ssize_t>(total));
  } else {
    bytes = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(total));
    if (bytes != nullptr) {
      char* at = PyBytes_AS_STRING(bytes);
      std::memcpy(at, pending.first_data(), pending.first_size);
      at += pending.first_size;
      for (const net::byte_buffer& b : *pending.rest) {
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
  PyObject* msg = request_message(bytes, more);
  if (msg == nullptr) {
    return nullptr;
  }
  pending.clear();
  if (!more) {
    r->body_delivered = true;
  }
  if (total != 0 && !r->disconnected) {
    side_.consumed(r->conn, total);  // credit: the I/O thread may read on
  }
  return msg;
}

PyObject* bridge::request_message(PyObject* bytes, bool more) {
  // Three items set on a new dict: what Py_BuildValue would make, without
  // parsing a format string per message.
  PyObject* msg = PyDict_New();
  if (msg == nullptr || PyDict_SetItem(msg, n_.type, n_.http_request) != 0 ||
      PyDict_SetItem(msg, n_.body, bytes) != 0 ||
      PyDict_SetItem(msg, n_.more_body, more ? Py_True : Py_False) != 0) {
    Py_XDECREF(msg);
    Py_DECREF(bytes);
    return nullptr;
  }
  Py_DECREF(bytes);
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
  if (r->ws != nullptr) {
    ws_wake(r);
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
  if (r->ws != nullptr) {
    return ws_receive(r);
  }
  // ASGI: receive() after the response was sent is http.disconnect, even
  // with body left unread (as uvicorn does).
  if (r->disconnected || r->complete) {
    return ready(disconnect_message());
  }
  conn_state* cs = conn_of(r->conn);
  if (!r->body_delivered) {
    if (!r->has_body) {
      r->body_delivered = true;
      return ready(request_message(Py_NewRef(n_.empty_bytes), false));
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
    if (!r->body.empty() || r->body_complete) {
      return ready(body_message(r));
    }
  } else if (cs != nullptr && cs->peer_eof) {
    return ready(disconnect_message());
  }
  if (r->receive_waiter != nullptr) {
    PyObject* done = PyObject_CallMethodNoArgs(r->receive_waiter, n_.done);
    const int is_done = done == nullptr ? -1 : PyObject_IsTrue(done);
    Py_XDECREF(done);
    if (is_done <= 0) {
      if (is_done == 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "receive() called while another receive() of this request is waiting");
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

}  // namespace cadeloop::pyhost::server
