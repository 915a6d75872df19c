// The pair's staging gate: with staged_budget bytes staged (copied for the
// I/O thread and not yet known to be written), a send() of a body part
// bigger than gate_pass_size waits before its bytes are copied. Many slow
// readers then cost the server nothing beyond the budget: each waiting send
// holds only a reference to the app's message, whose bytes the app holds
// anyway. Held messages are staged in arrival order once disconnects and
// drained notices bring the total back under the budget (checked after each
// pass over the inbound messages). Small parts pass, so a short response is
// never held behind slow readers.
#include <utility>

#include "asgi/request_type.hpp"
#include "py_exception.hpp"

namespace cadeloop::pyhost::server {

PyObject* bridge::wait_for_gate(request_object* r, PyObject* message, PyObject* body) {
  if (body == nullptr) {
    return nullptr;  // no body: passes
  }
  const Py_ssize_t size = PyObject_Length(body);
  if (size < 0) {
    PyErr_Clear();  // not a buffer: send_body names the type
    return nullptr;
  }
  if (size <= gate_pass_size) {
    return nullptr;
  }
  if (r->gated != nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "send() called before an earlier send() was awaited");
    return nullptr;
  }
  PyObject* held = PyDict_Copy(message);  // the app may reuse its dict once send() returned
  if (held == nullptr) {
    return nullptr;
  }
  PyObject* fut = PyObject_CallNoArgs(create_future_);
  if (fut == nullptr) {
    Py_DECREF(held);
    return nullptr;
  }
  try {
    gated_.push_back(r);
  } catch (const std::bad_alloc&) {
    Py_DECREF(held);
    Py_DECREF(fut);
    return PyErr_NoMemory();
  }
  Py_INCREF(r);
  r->gated = held;
  Py_XSETREF(r->send_waiter, Py_NewRef(fut));
  ++stats_.gate_waits;
  return fut;
}

void bridge::release_gate() {
  while (!gated_.empty() && staged_total_ < options_.staged_budget) {
    request_object* r = gated_.front();
    gated_.pop_front();
    PyObject* message = std::exchange(r->gated, nullptr);
    if (message != nullptr && r->owner == this && !r->disconnected && !r->finished) {
      PyObject* fut = std::exchange(r->send_waiter, nullptr);
      releasing_gate_ = true;
      PyObject* res = send_body(r, message);
      releasing_gate_ = false;
      if (res == nullptr) {
        PyObject* exc = take_exception();
        if (exc != nullptr) {
          resolve(fut, exc, true);
        }
        Py_XDECREF(fut);  // resolve() took it unless there was no exception
      } else if (res == none_ready_) {
        Py_DECREF(res);
        resolve(fut, Py_NewRef(Py_None), false);
      } else {
        // The part is staged and the connection passed its high mark: the app,
        // which awaits fut, now waits for "drained" on it instead.
        Py_DECREF(res);
        Py_XSETREF(r->send_waiter, fut);
      }
    }
    Py_XDECREF(message);
    Py_DECREF(r);
  }
}

void bridge::shed_stalled() {
  conn_state* oldest = nullptr;
  std::size_t slot = 0;
  for (std::size_t i = 0; i < conns_.size(); ++i) {
    conn_state& cs = conns_[i];
    if (cs.generation != 0 && cs.shed) {
      // One cut at a time: its bytes leave staged_total_ only when its
      // disconnect comes back. Judging again before then would cut the next
      // oldest waiter, and the next, down to a client that reads (its first
      // part staged while the pair was over the budget, not yet written).
      return;
    }
    if (cs.generation == 0 || !cs.waiting_drain ||
        (oldest != nullptr && cs.drain_asked >= oldest->drain_asked)) {
      continue;
    }
    // Only a connection whose app waits in send() for it to drain: a notice
    // asked for at the end of a short response is no sign of a slow client.
    for (const request_object* r : cs.active) {
      if (r->send_waiter != nullptr && r->gated == nullptr) {
        oldest = &cs;
        slot = i;
        break;
      }
    }
  }
  if (oldest == nullptr) {
    ask_stale_counts();
    return;
  }
  oldest->shed = true;
  ++stats_.gate_cuts;
  side_.abort(net::connection_id{static_cast<std::uint32_t>(slot), oldest->generation});
}

// No send waits for a drain: what holds the gate are counts of bytes staged
// on connections that asked for no notice (each stayed under its high mark
// when it sent them). Those bytes may long be written; ask each such
// connection for a notice now (an empty send that only asks), so the I/O
// side answers with what is really unsent and the gate opens or a later
// pass can cut a reader that does not read.
void bridge::ask_stale_counts() {
  for (std::size_t i = 0; i < conns_.size(); ++i) {
    conn_state& cs = conns_[i];
    if (cs.generation == 0 || cs.waiting_drain || cs.shed || cs.sent_since_notice == 0 ||
        cs.active.empty()) {
      continue;
    }
    const request_object* r = cs.active.front();
    runtime::send_options o;
    o.notify_drained = true;
    try {
      side_.send(net::connection_id{static_cast<std::uint32_t>(i), cs.generation}, r->seq,
                 net::byte_buffer{}, o);
    } catch (const std::bad_alloc&) {
      return;  // the next pass asks again
    }
    asked_drain(cs);
  }
}

void bridge::drop_gate() noexcept {
  std::deque<request_object*> held = std::move(gated_);
  gated_.clear();
  for (request_object* r : held) {
    Py_CLEAR(r->gated);
    Py_DECREF(r);
  }
}

}  // namespace cadeloop::pyhost::server
