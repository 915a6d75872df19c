// cadeloop._core.SocketTransportCore: the hot half of cadeloop's TCP/Unix
// socket transport. The read path goes from the epoll event straight to
// protocol.data_received (or get_buffer/buffer_updated) with no Python frame
// of ours in between; write() only queues, and the loop flushes each
// transport written to with one send (send or sendmsg over all queued
// chunks) at the end of the pass, before it polls again. The Python half,
// cadeloop._loop._SocketTransport, is asyncio's selector socket transport with
// its state moved here; its cold paths (close, abort, fatal errors,
// connection_lost, sendfile) stay asyncio's code and are called from here
// only when something other than plain data happens.
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <new>
#include <utility>

#include "loop/loop_core.hpp"
#include "loop/loop_methods.hpp"
#include "loop/loop_transport_close.hpp"

namespace cadeloop::pyhost::loop {

namespace {

/// The most chunks one sendmsg gathers; the rest wait for the next pass.
constexpr int max_iov = 64;
/// recv size for data_received protocols, as asyncio's max_size.
constexpr std::size_t read_size = 256 * 1024;

transport_object* as_transport(PyObject* o) {
  return reinterpret_cast<transport_object*>(o);
}

bool must_stop_loop() {
  return PyErr_ExceptionMatches(PyExc_SystemExit) ||
         PyErr_ExceptionMatches(PyExc_KeyboardInterrupt);
}

/// Result of a call into the Python half: an exception escaping it stops
/// the loop (asyncio's own methods catch what they should).
int settle(PyObject* result) {
  if (result == nullptr) {
    return -1;
  }
  Py_DECREF(result);
  return 0;
}

/// owner.<name>(): a cold path of the Python half. Holds the transport while
/// Python runs, since the call may end the connection.
int call_owner(transport_object* t, const char* name) {
  if (t->owner == nullptr) {
    return 0;
  }
  PyObject* owner = Py_NewRef(t->owner);
  const int rc = settle(PyObject_CallMethod(owner, name, nullptr));
  Py_DECREF(owner);
  return rc;
}

/// An exception from the protocol or the socket: owner._fatal_error(exc, msg),
/// as asyncio's transport reports it; SystemExit and KeyboardInterrupt leave
/// the loop instead.
int fatal_error(transport_object* t, const char* message) {
  if (must_stop_loop() || t->owner == nullptr) {
    return -1;
  }
  if (t->native_close && !state_of(t->loop).debug && PyErr_ExceptionMatches(PyExc_OSError)) {
    // _SocketTransport._fatal_error: an OSError outside debug mode is only
    // _force_close(exc); done here, connection_lost scheduled as C++.
    PyObject* exc = take_exception();
    const int rc = exc == nullptr ? -1 : force_close(t, exc);
    Py_XDECREF(exc);
    return rc;
  }
  PyObject* exc = take_exception();
  PyObject* owner = Py_NewRef(t->owner);
  const int rc = settle(
      PyObject_CallMethod(owner, "_fatal_error", "Os", exc != nullptr ? exc : Py_None, message));
  Py_DECREF(owner);
  Py_XDECREF(exc);
  return rc;
}

/// Sets OSError from errno (the subclass for the code, as socket does).
void set_errno_error(int err) {
  errno = err;
  PyErr_SetFromErrno(PyExc_OSError);
}

bool would_block(int err) {
  return err == EAGAIN || err == EWOULDBLOCK || err == EINTR;
}

/// `slot` = a copy of the current contextvars.Context, as asyncio's Handle
/// takes one when it is made. False with an exception set on failure.
bool copy_current_context(PyObject*& slot) {
  PyObject* ctx = PyContext_CopyCurrent();
  if (ctx == nullptr) {
    return false;
  }
  Py_XSETREF(slot, ctx);
  return true;
}

/// Runs fn() inside `ctx` (a transport's read or write context; NULL runs it
/// in the current one), as asyncio's handle would run the callback. A context
/// already entered further up the stack (a flush started from inside the same
/// context) is not entered twice: fn() runs in the current one then.
template <typename Fn>
int run_in(PyObject* ctx, Fn&& fn) {
  if (ctx == nullptr) {
    return fn();
  }
  Py_INCREF(ctx);  // the callback may replace the transport's context
  const int enter_rc = PyContext_Enter(ctx);
  if (enter_rc < 0) {
    if (!PyErr_ExceptionMatches(PyExc_RuntimeError)) {
      Py_DECREF(ctx);
      return -1;
    }
    PyErr_Clear();
  }
  int rc = fn();
  if (enter_rc == 0 && PyContext_Exit(ctx) < 0) {
    rc = -1;
  }
  Py_DECREF(ctx);
  return rc;
}

}  // namespace

// Shared with loop_transport_close.cpp (loop_transport_close.hpp).

void clear_chunks(transport_object* t) {
  if (t->chunks == nullptr || t->chunks->empty()) {
    t->buffered_bytes = 0;
    return;
  }
  // Taken out first: the deque is consistent before any object goes away.
  std::deque<write_chunk> gone;
  gone.swap(*t->chunks);
  t->buffered_bytes = 0;
  for (write_chunk& c : gone) {
    Py_DECREF(c.bytes);
  }
}

/// Takes the fd out of the loop's table (and epoll) before its socket closes.
void detach(transport_object* t) {
  if (!t->attached) {
    return;
  }
  t->attached = false;
  t->want_read = false;
  t->want_write = false;
  loop_state& st = state_of(t->loop);
  const auto i = static_cast<std::size_t>(t->fd);
  if (i < st.fds.size() && st.fds[i].transport == reinterpret_cast<PyObject*>(t)) {
    PyObject* mine = std::exchange(st.fds[i].transport, nullptr);
    --st.connections;
    if (!update_interest(st, t->fd)) {
      PyErr_Clear();  // the fd may be gone already; nothing is registered for it then
    }
    Py_DECREF(mine);
  }
}

bool apply(transport_object* t) {
  if (!t->attached) {
    return true;
  }
  return update_interest(state_of(t->loop), t->fd);
}

namespace {

// ---------------------------------------------------------------- reading

int on_eof(transport_object* t) {
  return call_owner(t, "_read_ready__on_eof");
}

int read_into_protocol_buffer(loop_state& st, transport_object* t, PyObject* protocol) {
  PyObject* minus_one = PyLong_FromLong(-1);
  PyObject* args[2] = {protocol, minus_one};
  PyObject* buf = PyObject_VectorcallMethod(st.str_get_buffer, args, 2, nullptr);
  Py_DECREF(minus_one);
  Py_buffer view{};
  if (buf != nullptr && PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE) < 0) {
    Py_CLEAR(buf);
  }
  if (buf != nullptr && view.len == 0) {
    PyBuffer_Release(&view);
    Py_CLEAR(buf);
    PyErr_SetString(PyExc_RuntimeError, "get_buffer() returned an empty buffer");
  }
  if (buf == nullptr) {
    return fatal_error(t, "Fatal error: protocol.get_buffer() call failed.");
  }
  const ssize_t n = ::recv(t->fd, view.buf, static_cast<std::size_t>(view.len), 0);
  const int err = errno;
  PyBuffer_Release(&view);
  Py_DECREF(buf);
  if (n < 0) {
    if (would_block(err)) {
      return 0;
    }
    set_errno_error(err);
    return fatal_error(t, "Fatal read error on socket transport");
  }
  if (n == 0) {
    return on_eof(t);
  }
  st.bytes_received += static_cast<std::uint64_t>(n);
  PyObject* count = PyLong_FromSsize_t(n);
  if (count == nullptr) {
    return -1;
  }
  PyObject* args2[2] = {protocol, count};
  PyObject* r = PyObject_VectorcallMethod(st.str_buffer_updated, args2, 2, nullptr);
  Py_DECREF(count);
  if (r == nullptr) {
    return fatal_error(t, "Fatal error: protocol.buffer_updated() call failed.");
  }
  Py_DECREF(r);
  return 0;
}

int read_to_data_received(loop_state& st, transport_object* t, PyObject* protocol) {
  if (st.read_buffer.size() < read_size) {
    try {
      st.read_buffer.resize(read_size);
    } catch (const std::bad_alloc&) {
      PyErr_NoMemory();
      return -1;
    }
  }
  const ssize_t n = ::recv(t->fd, st.read_buffer.data(), st.read_buffer.size(), 0);
  if (n < 0) {
    const int err = errno;
    if (would_block(err)) {
      return 0;
    }
    set_errno_error(err);
    return fatal_error(t, "Fatal read error on socket transport");
  }
  if (n == 0) {
    return on_eof(t);
  }
  st.bytes_received += static_cast<std::uint64_t>(n);
  PyObject* data = PyBytes_FromStringAndSize(st.read_buffer.data(), n);
  if (data == nullptr) {
    return -1;
  }
  PyObject* args[2] = {protocol, data};
  PyObject* r = PyObject_VectorcallMethod(st.str_data_received, args, 2, nullptr);
  Py_DECREF(data);
  if (r == nullptr) {
    return fatal_error(t, "Fatal error: protocol.data_received() call failed.");
  }
  Py_DECREF(r);
  return 0;
}

int do_read(loop_state& st, transport_object* t) {
  if (t->protocol == nullptr) {
    return 0;
  }
  // The protocol may be replaced (start_tls) or dropped during the call.
  PyObject* protocol = Py_NewRef(t->protocol);
  const int rc = t->buffered ? read_into_protocol_buffer(st, t, protocol)
                             : read_to_data_received(st, t, protocol);
  Py_DECREF(protocol);
  return rc;
}

// ---------------------------------------------------------------- writing

/// Drops `n` sent bytes from the front of the queue.
void consume(transport_object* t, std::size_t n) {
  t->buffered_bytes -= static_cast<Py_ssize_t>(n);
  while (n > 0) {
    write_chunk& c = t->chunks->front();
    const auto left = static_cast<std::size_t>(PyBytes_GET_SIZE(c.bytes) - c.offset);
    if (n < left) {
      c.offset += static_cast<Py_ssize_t>(n);
      return;
    }
    n -= left;
    PyObject* done = c.bytes;
    t->chunks->pop_front();
    Py_DECREF(done);  // bytes have no finaliser: nothing re-enters here
  }
}

/// One send of everything queued (up to max_iov chunks). Returns -1 only for
/// what must stop the loop.
int flush_one(loop_state& st, transport_object* t) {
  if (t->chunks == nullptr || t->chunks->empty() || t->conn_lost > 0 || !t->attached) {
    return 0;
  }
  if (t->flushed_tick == st.ticks) {
    // Already sent once in this pass: the rest goes after the next poll.
    if (!t->want_write) {
      t->want_write = true;
      if (!apply(t)) {
        return -1;
      }
    }
    return 0;
  }
  t->flushed_tick = st.ticks;
  iovec iov[max_iov];
  int count = 0;
  for (const write_chunk& c : *t->chunks) {
    if (count == max_iov) {
      break;
    }
    iov[count].iov_base = PyBytes_AS_STRING(c.bytes) + c.offset;
    iov[count].iov_len = static_cast<std::size_t>(PyBytes_GET_SIZE(c.bytes) - c.offset);
    ++count;
  }
  ssize_t n = 0;
  // MSG_NOSIGNAL: a peer that went away is an EPIPE here, not a SIGPIPE for
  // an embedding program that did not ignore it.
  if (count == 1) {
    n = ::send(t->fd, iov[0].iov_base, iov[0].iov_len, MSG_NOSIGNAL);
  } else {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(count);
    n = ::sendmsg(t->fd, &msg, MSG_NOSIGNAL);
  }
  ++st.sends_posted;
  if (n < 0) {
    const int err = errno;
    if (!would_block(err)) {
      set_errno_error(err);
      if (must_stop_loop()) {
        return -1;
      }
      PyObject* exc = take_exception();
      PyObject* owner = Py_XNewRef(t->owner);
      int rc = 0;
      if (owner != nullptr) {
        rc = run_in(t->write_context, [&] {
          return settle(PyObject_CallMethod(owner, "_cadeloop_write_error", "O", exc));
        });
        Py_DECREF(owner);
      }
      Py_XDECREF(exc);
      return rc;
    }
  } else {
    st.bytes_sent += static_cast<std::uint64_t>(n);
    consume(t, static_cast<std::size_t>(n));
    if (t->protocol_paused && t->buffered_bytes <= t->low_water &&
        run_in(t->write_context, [&] { return call_owner(t, "_maybe_resume_protocol"); }) < 0) {
      return -1;  // resume_writing() may have written more: looked at below
    }
  }
  if (t->chunks->empty()) {
    if (t->want_write) {
      t->want_write = false;
      if (!apply(t)) {
        return -1;
      }
    }
    if (t->empty_waiter != nullptr || t->closing || t->eof) {
      return run_in(t->write_context, [&] { return call_owner(t, "_cadeloop_drained"); });
    }
    return 0;
  }
  if (!t->want_write && t->attached) {
    // The socket is full: the rest goes when epoll says it is writable.
    t->want_write = true;
    if (!apply(t)) {
      return -1;
    }
  }
  return 0;
}

/// Queues `bytes` (a new reference, consumed) and puts the transport on the
/// loop's flush list. Returns -1 with an exception set on failure.
int enqueue(transport_object* t, PyObject* bytes) {
  const Py_ssize_t len = PyBytes_GET_SIZE(bytes);
  if (t->chunks == nullptr) {  // made at the first write (most transports of a churn write nothing)
    t->chunks = new (std::nothrow) std::deque<write_chunk>();
    if (t->chunks == nullptr) {
      Py_DECREF(bytes);
      PyErr_NoMemory();
      return -1;
    }
  }
  // asyncio's write() into an empty buffer sends at once and, if the socket
  // did not take it all, registers its writer handle with a copy of the
  // caller's context: what the flush calls back runs there.
  if (t->chunks->empty() && !copy_current_context(t->write_context)) {
    Py_DECREF(bytes);
    return -1;
  }
  try {
    t->chunks->push_back(write_chunk{bytes, 0});
  } catch (const std::bad_alloc&) {
    Py_DECREF(bytes);
    PyErr_NoMemory();
    return -1;
  }
  t->buffered_bytes += len;
  loop_state& st = state_of(t->loop);
  // Waiting for EPOLLOUT means the socket is full: that event sends it.
  if (!t->want_write && !t->in_flush_list && t->attached && !st.released) {
    try {
      st.flush_list.push_back(reinterpret_cast<PyObject*>(t));
    } catch (const std::bad_alloc&) {
      PyErr_NoMemory();
      return -1;
    }
    Py_INCREF(t);
    t->in_flush_list = true;
  }
  return 0;
}

/// The checks asyncio's write() makes before it buffers anything. Returns
/// 1 to go on, 0 to return None at once, -1 on error.
int check_writable(transport_object* t, const char* what) {
  if (t->eof) {
    PyErr_Format(PyExc_RuntimeError, "Cannot call %s() after write_eof()", what);
    return -1;
  }
  if (t->empty_waiter != nullptr) {
    PyErr_Format(PyExc_RuntimeError, "unable to %s; sendfile is in progress", what);
    return -1;
  }
  return 1;
}

/// `data` as bytes to keep: bytes are immutable and kept as they are; a
/// bytearray or memoryview is copied, since the caller may change it after
/// write() returns. New reference, or NULL with TypeError.
PyObject* as_bytes(PyObject* data) {
  if (PyBytes_Check(data)) {
    return Py_NewRef(data);
  }
  if (PyByteArray_Check(data) || PyMemoryView_Check(data)) {
    Py_buffer view{};
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
      return nullptr;
    }
    PyObject* copy = PyBytes_FromStringAndSize(static_cast<const char*>(view.buf), view.len);
    PyBuffer_Release(&view);
    return copy;
  }
  PyErr_Format(PyExc_TypeError, "data argument must be a bytes-like object, not '%.100s'",
               Py_TYPE(data)->tp_name);
  return nullptr;
}

/// asyncio's warning for writes to a lost connection, on its own logger.
int log_lost_write() {
  PyObject* mod = PyImport_ImportModule("asyncio.log");
  if (mod == nullptr) {
    return -1;
  }
  PyObject* logger = PyObject_GetAttrString(mod, "logger");
  Py_DECREF(mod);
  if (logger == nullptr) {
    return -1;
  }
  const int rc =
      settle(PyObject_CallMethod(logger, "warning", "s", "socket.send() raised exception."));
  Py_DECREF(logger);
  return rc;
}

PyObject* maybe_pause(transport_object* t) {
  if (!t->protocol_paused && t->buffered_bytes > t->high_water &&
      call_owner(t, "_maybe_pause_protocol") < 0) {
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* transport_write(PyObject* self, PyObject* data) {
  transport_object* t = as_transport(self);
  PyObject* bytes = as_bytes(data);
  if (bytes == nullptr) {
    return nullptr;
  }
  const int ok = check_writable(t, "write");
  if (ok <= 0 || PyBytes_GET_SIZE(bytes) == 0) {
    Py_DECREF(bytes);
    if (ok < 0) {
      return nullptr;
    }
    Py_RETURN_NONE;
  }
  if (t->conn_lost > 0) {
    Py_DECREF(bytes);
    // asyncio logs once the count passes constants.LOG_THRESHOLD_FOR_CONNLOST_WRITES.
    if (t->conn_lost >= 5 && log_lost_write() < 0) {
      return nullptr;
    }
    ++t->conn_lost;
    Py_RETURN_NONE;
  }
  if (enqueue(t, bytes) < 0) {
    return nullptr;
  }
  return maybe_pause(t);
}

PyObject* transport_writelines(PyObject* self, PyObject* iterable) {
  transport_object* t = as_transport(self);
  if (check_writable(t, "writelines") < 0) {
    return nullptr;
  }
  PyObject* it = PyObject_GetIter(iterable);
  if (it == nullptr) {
    return nullptr;
  }
  while (PyObject* item = PyIter_Next(it)) {
    PyObject* bytes = as_bytes(item);
    Py_DECREF(item);
    if (bytes == nullptr) {
      Py_DECREF(it);
      return nullptr;
    }
    if (PyBytes_GET_SIZE(bytes) == 0 || t->conn_lost > 0) {
      Py_DECREF(bytes);
      continue;
    }
    if (enqueue(t, bytes) < 0) {
      Py_DECREF(it);
      return nullptr;
    }
  }
  Py_DECREF(it);
  if (PyErr_Occurred()) {
    return nullptr;
  }
  return maybe_pause(t);
}

// ---------------------------------------------------------------- methods

PyObject* transport_start_reading(PyObject* self, PyObject*) {
  transport_object* t = as_transport(self);
  if (t->closing || t->paused) {
    Py_RETURN_NONE;
  }
  // asyncio's _add_reader makes a new reader handle each time, with a copy of
  // the context current then (a copy of the transport's creation context, the
  // first time): reads run there.
  if (!copy_current_context(t->read_context)) {
    return nullptr;
  }
  if (t->want_read) {
    Py_RETURN_NONE;
  }
  t->want_read = true;
  if (!apply(t)) {
    t->want_read = false;
    return nullptr;
  }
  Py_RETURN_NONE;
}

/// pause_reading(): True if it paused (asyncio then logs in debug mode).
PyObject* transport_pause_reading(PyObject* self, PyObject*) {
  transport_object* t = as_transport(self);
  if (t->closing || t->paused) {
    Py_RETURN_FALSE;
  }
  t->paused = true;
  if (t->want_read) {
    t->want_read = false;
    if (!apply(t)) {
      return nullptr;
    }
  }
  Py_RETURN_TRUE;
}

PyObject* transport_resume_reading(PyObject* self, PyObject*) {
  transport_object* t = as_transport(self);
  if (t->closing || !t->paused) {
    Py_RETURN_FALSE;
  }
  if (!copy_current_context(t->read_context)) {
    return nullptr;
  }
  t->paused = false;
  t->want_read = true;
  if (!apply(t)) {
    return nullptr;
  }
  Py_RETURN_TRUE;
}

/// Drops what is queued and stops waiting for EPOLLOUT (abort, fatal errors).
PyObject* transport_discard(PyObject* self, PyObject*) {
  transport_object* t = as_transport(self);
  clear_chunks(t);
  if (t->want_write) {
    t->want_write = false;
    if (!apply(t)) {
      return nullptr;
    }
  }
  Py_RETURN_NONE;
}

PyObject* transport_set_protocol(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "set_protocol(protocol, buffered)");
    return nullptr;
  }
  transport_object* t = as_transport(self);
  const int buffered = PyObject_IsTrue(args[1]);
  if (buffered < 0) {
    return nullptr;
  }
  Py_XSETREF(t->protocol, Py_NewRef(args[0]));
  t->buffered = buffered != 0;
  Py_RETURN_NONE;
}

PyObject* transport_unregister(PyObject* self, PyObject*) {
  detach(as_transport(self));
  Py_RETURN_NONE;
}

}  // namespace

/// After connection_lost: drops everything the core holds, which breaks the
/// owner <-> core cycle at once.
PyObject* transport_release(PyObject* self, PyObject*) {
  transport_object* t = as_transport(self);
  detach(t);
  clear_chunks(t);
  Py_CLEAR(t->protocol);
  Py_CLEAR(t->empty_waiter);
  Py_CLEAR(t->read_context);
  Py_CLEAR(t->write_context);
  Py_CLEAR(t->owner);
  Py_RETURN_NONE;
}

namespace {

/// flush(): one send of what is queued, now (at most one per pass still).
PyObject* transport_flush_now(PyObject* self, PyObject*) {
  transport_object* t = as_transport(self);
  if (flush_one(state_of(t->loop), t) < 0) {
    return nullptr;
  }
  Py_RETURN_NONE;
}

Py_ssize_t transport_len(PyObject* self) {
  return as_transport(self)->buffered_bytes;
}

// ---------------------------------------------------------------- attributes

template <bool transport_object::*Field>
PyObject* get_bool(PyObject* self, void*) {
  return PyBool_FromLong(as_transport(self)->*Field);
}

template <bool transport_object::*Field>
int set_bool(PyObject* self, PyObject* value, void*) {
  if (value == nullptr) {
    PyErr_SetString(PyExc_AttributeError, "cannot delete a transport flag");
    return -1;
  }
  const int v = PyObject_IsTrue(value);
  if (v < 0) {
    return -1;
  }
  as_transport(self)->*Field = v != 0;
  return 0;
}

template <Py_ssize_t transport_object::*Field>
PyObject* get_size(PyObject* self, void*) {
  return PyLong_FromSsize_t(as_transport(self)->*Field);
}

template <Py_ssize_t transport_object::*Field>
int set_size(PyObject* self, PyObject* value, void*) {
  if (value == nullptr) {
    PyErr_SetString(PyExc_AttributeError, "cannot delete a transport counter");
    return -1;
  }
  const Py_ssize_t v = PyLong_AsSsize_t(value);
  if (v == -1 && PyErr_Occurred()) {
    return -1;
  }
  as_transport(self)->*Field = v;
  return 0;
}

/// Setting closing stops reading (asyncio's close() and _force_close() pair
/// the two).
int set_closing(PyObject* self, PyObject* value, void* closure) {
  if (set_bool<&transport_object::closing>(self, value, closure) < 0) {
    return -1;
  }
  transport_object* t = as_transport(self);
  if (t->closing && t->want_read) {
    t->want_read = false;
    if (!apply(t)) {
      return -1;
    }
  }
  return 0;
}

PyObject* get_empty_waiter(PyObject* self, void*) {
  PyObject* w = as_transport(self)->empty_waiter;
  return Py_NewRef(w != nullptr ? w : Py_None);
}

int set_empty_waiter(PyObject* self, PyObject* value, void*) {
  Py_XSETREF(as_transport(self)->empty_waiter,
             value == nullptr || value == Py_None ? nullptr : Py_NewRef(value));
  return 0;
}

PyObject* get_fd(PyObject* self, void*) {
  return PyLong_FromLong(as_transport(self)->fd);
}

PyMethodDef transport_methods[] = {
    {"write", transport_write, METH_O,
     "write(data): queue bytes; the loop sends them at the end of this pass. Loop thread."},
    {"writelines", transport_writelines, METH_O,
     "writelines(iterable of bytes-like): as write() for each."},
    {"start_reading", transport_start_reading, METH_NOARGS, "Read from epoll into the protocol."},
    {"pause_reading", transport_pause_reading, METH_NOARGS,
     "asyncio's pause_reading(); True if it paused."},
    {"resume_reading", transport_resume_reading, METH_NOARGS,
     "asyncio's resume_reading(); True if it resumed."},
    {"discard", transport_discard, METH_NOARGS, "Drop the write buffer (abort)."},
    {"clear", transport_discard, METH_NOARGS,
     "As discard(); for code that treats this as the buffer."},
    {"set_protocol",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(transport_set_protocol)),
     METH_FASTCALL, "set_protocol(protocol, buffered)."},
    {"unregister", transport_unregister, METH_NOARGS,
     "Leave the loop's fd table; before the socket closes."},
    {"flush", transport_flush_now, METH_NOARGS,
     "Send what is queued now (one send; a protocol switch)."},
    {"release", transport_release, METH_NOARGS, "Drop every reference; after connection_lost."},
    {"connection_lost", transport_connection_lost, METH_O,
     "_SocketTransport._call_connection_lost(exc), in C++ (native_close)."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef transport_getsets[] = {
    {"closing", get_bool<&transport_object::closing>, set_closing, nullptr, nullptr},
    {"eof", get_bool<&transport_object::eof>, set_bool<&transport_object::eof>, nullptr, nullptr},
    {"paused", get_bool<&transport_object::paused>, set_bool<&transport_object::paused>, nullptr,
     nullptr},
    {"protocol_paused", get_bool<&transport_object::protocol_paused>,
     set_bool<&transport_object::protocol_paused>, nullptr, nullptr},
    {"reading", get_bool<&transport_object::want_read>, nullptr, nullptr, nullptr},
    {"writing", get_bool<&transport_object::want_write>, nullptr, nullptr, nullptr},
    {"conn_lost", get_size<&transport_object::conn_lost>, set_size<&transport_object::conn_lost>,
     nullptr, nullptr},
    {"high_water", get_size<&transport_object::high_water>, set_size<&transport_object::high_water>,
     nullptr, nullptr},
    {"low_water", get_size<&transport_object::low_water>, set_size<&transport_object::low_water>,
     nullptr, nullptr},
    {"buffer_size", get_size<&transport_object::buffered_bytes>, nullptr, nullptr, nullptr},
    {"empty_waiter", get_empty_waiter, set_empty_waiter, nullptr, nullptr},
    {"fd", get_fd, nullptr, nullptr, nullptr},
    {"native_close", get_bool<&transport_object::native_close>,
     set_bool<&transport_object::native_close>, nullptr, nullptr},
    {"detach_transport", get_bool<&transport_object::detach_transport>,
     set_bool<&transport_object::detach_transport>, nullptr, nullptr},
    {"fd_private", get_bool<&transport_object::fd_private>, set_bool<&transport_object::fd_private>,
     nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

int transport_traverse(PyObject* self, visitproc visit, void* arg) {
  transport_object* t = as_transport(self);
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(t->loop);
  Py_VISIT(t->owner);
  Py_VISIT(t->protocol);
  Py_VISIT(t->empty_waiter);
  Py_VISIT(t->read_context);
  Py_VISIT(t->write_context);
  return 0;
}

int transport_clear(PyObject* self) {
  transport_object* t = as_transport(self);
  if (t->loop != nullptr && !state_of(t->loop).released) {
    detach(t);
  }
  Py_CLEAR(t->owner);
  Py_CLEAR(t->protocol);
  Py_CLEAR(t->empty_waiter);
  Py_CLEAR(t->read_context);
  Py_CLEAR(t->write_context);
  return 0;
}

void transport_dealloc(PyObject* self) {
  PyTypeObject* tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  transport_object* t = as_transport(self);
  // Neither the fd table nor the flush list can hold it now: both keep a
  // reference. Only the buffer and the plain references are left.
  if (t->chunks != nullptr) {
    clear_chunks(t);
    delete std::exchange(t->chunks, nullptr);
  }
  Py_CLEAR(t->owner);
  Py_CLEAR(t->protocol);
  Py_CLEAR(t->empty_waiter);
  Py_CLEAR(t->read_context);
  Py_CLEAR(t->write_context);
  Py_CLEAR(t->loop);
  tp->tp_free(self);
  Py_DECREF(tp);
}

PyType_Slot transport_slots[] = {
    {Py_tp_doc,
     const_cast<char*>("The C++ half of a cadeloop socket transport; made by cadeloop.Loop.")},
    {Py_tp_dealloc, reinterpret_cast<void*>(transport_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(transport_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(transport_clear)},
    {Py_tp_methods, transport_methods},
    {Py_tp_getset, transport_getsets},
    {Py_sq_length, reinterpret_cast<void*>(transport_len)},
    {0, nullptr},
};

PyType_Spec transport_spec = {
    "cadeloop._core.SocketTransportCore", static_cast<int>(sizeof(transport_object)), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION, transport_slots};

}  // namespace

int add_transport_type(PyObject* module, PyObject** transport_type) {
  *transport_type = PyType_FromModuleAndSpec(module, &transport_spec, nullptr);
  if (*transport_type == nullptr) {
    return -1;
  }
  return PyModule_AddObjectRef(module, "SocketTransportCore", *transport_type);
}

PyObject* new_transport(PyObject* loop, PyObject* owner, int fd) {
  loop_state& st = state_of(loop);
  const auto i = static_cast<std::size_t>(fd);
  if (fd < 0) {
    PyErr_Format(PyExc_ValueError, "Invalid file descriptor: %d", fd);
    return nullptr;
  }
  if (i >= st.fds.size()) {
    try {
      st.fds.resize(std::max(i + 1, st.fds.size() * 2));
    } catch (const std::bad_alloc&) {
      return PyErr_NoMemory();
    }
  }
  auto* t = PyObject_GC_New(transport_object, reinterpret_cast<PyTypeObject*>(st.transport_type));
  if (t == nullptr) {
    return nullptr;
  }
  t->loop = Py_NewRef(loop);
  t->owner = Py_NewRef(owner);
  t->protocol = nullptr;
  t->empty_waiter = nullptr;
  t->read_context = nullptr;
  t->write_context = nullptr;
  t->fd = fd;
  t->flushed_tick = 0;
  t->buffered = false;
  t->attached = false;
  t->want_read = false;
  t->want_write = false;
  t->in_flush_list = false;
  t->queued = false;
  t->paused = false;
  t->closing = false;
  t->eof = false;
  t->protocol_paused = false;
  t->native_close = false;
  t->detach_transport = false;
  t->fd_private = false;
  t->inline_server = false;
  t->pending = 0;
  t->conn_lost = 0;
  t->high_water = 64 * 1024;
  t->low_water = 16 * 1024;
  t->buffered_bytes = 0;
  t->chunks = nullptr;  // made by the first write
  PyObject* o = reinterpret_cast<PyObject*>(t);
  PyObject_GC_Track(o);
  if (!st.released) {
    fd_entry& e = st.fds[i];
    if (e.transport != nullptr) {
      // A transport whose socket was closed without connection_lost (its fd
      // number is being reused): it no longer owns the fd.
      auto* stale = as_transport(e.transport);
      stale->attached = false;
      stale->want_read = false;
      stale->want_write = false;
      --st.connections;
      Py_DECREF(std::exchange(e.transport, nullptr));
    }
    e.transport = Py_NewRef(o);
    t->attached = true;
    ++st.connections;
  }
  return o;
}

int transport_run_ready(loop_state& st, transport_object* t) {
  t->queued = false;
  const std::uint32_t events = std::exchange(t->pending, 0);
  if ((events & EPOLLIN) != 0 && t->want_read && t->conn_lost == 0) {
    ++st.callbacks_dispatched;
    if (run_in(t->read_context, [&] { return do_read(st, t); }) < 0) {
      return -1;
    }
  }
  if ((events & EPOLLOUT) != 0 && t->want_write && t->conn_lost == 0) {
    if (flush_one(st, t) < 0) {
      return -1;
    }
  }
  return 0;
}

int flush_transports(loop_state& st) {
  // Indexes, not iterators: Python code run by a flush (resume_writing,
  // connection_lost) may write to other transports and append here; those
  // wait for the next pass.
  const std::size_t count = st.flush_list.size();
  std::size_t i = 0;
  int rc = 0;
  for (; i < count && i < st.flush_list.size() && rc == 0; ++i) {
    transport_object* t = as_transport(st.flush_list[i]);
    t->in_flush_list = false;
    rc = flush_one(st, t);
  }
  // Emptied under us (the loop was released by the Python code a flush ran).
  i = std::min(i, st.flush_list.size());
  std::vector<PyObject*> done(st.flush_list.begin(),
                              st.flush_list.begin() + static_cast<std::ptrdiff_t>(i));
  st.flush_list.erase(st.flush_list.begin(),
                      st.flush_list.begin() + static_cast<std::ptrdiff_t>(i));
  for (PyObject* o : done) {
    Py_DECREF(o);
  }
  return rc;
}

}  // namespace cadeloop::pyhost::loop
