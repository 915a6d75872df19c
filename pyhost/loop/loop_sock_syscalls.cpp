// recv(2) and send(2) for LoopCore's low-level socket calls
// (loop_sock_syscalls.hpp says what each does).
#include "loop/loop_sock_syscalls.hpp"  // Python.h first

#include <sys/socket.h>

#include <cerrno>
#include <cstddef>

namespace cadeloop::pyhost::loop::sock_syscalls {

bool would_block(int err) {
  return err == EAGAIN || err == EWOULDBLOCK || err == EINPROGRESS;
}

/// Whether the pending exception is BlockingIOError or InterruptedError
/// (asyncio's "try again"); clears it if so.
bool clear_if_would_block() {
  if (PyErr_ExceptionMatches(PyExc_BlockingIOError) ||
      PyErr_ExceptionMatches(PyExc_InterruptedError)) {
    PyErr_Clear();
    return true;
  }
  return false;
}

/// recv(2) into a new bytes object of up to n bytes (n > 0).
outcome raw_recv(int fd, Py_ssize_t n, PyObject** result) {
  PyObject* b = PyBytes_FromStringAndSize(nullptr, n);
  if (b == nullptr) {
    return outcome::failed;
  }
  ssize_t got;
  for (;;) {
    got = ::recv(fd, PyBytes_AS_STRING(b), static_cast<std::size_t>(n), 0);
    if (got >= 0) {
      break;
    }
    const int err = errno;
    if (err == EINTR) {  // as the socket module: run signal handlers, retry
      if (PyErr_CheckSignals() < 0) {
        Py_DECREF(b);
        return outcome::failed;
      }
      continue;
    }
    Py_DECREF(b);
    if (would_block(err)) {
      return outcome::wait;
    }
    errno = err;
    PyErr_SetFromErrno(PyExc_OSError);
    return outcome::failed;
  }
  if (got != n && _PyBytes_Resize(&b, got) < 0) {
    return outcome::failed;
  }
  *result = b;
  return outcome::done;
}

/// recv(2) into `buf`'s writable buffer; 0 = the socket's method is needed
/// (not a simple writable buffer, or an empty one).
int raw_recv_into(int fd, PyObject* buf, PyObject** result, outcome* out) {
  Py_buffer v;
  if (PyObject_GetBuffer(buf, &v, PyBUF_WRITABLE) < 0) {
    PyErr_Clear();
    return 0;
  }
  if (v.len == 0) {
    PyBuffer_Release(&v);
    return 0;
  }
  ssize_t got;
  for (;;) {
    got = ::recv(fd, v.buf, static_cast<std::size_t>(v.len), 0);
    if (got >= 0) {
      break;
    }
    const int err = errno;
    if (err == EINTR) {
      if (PyErr_CheckSignals() < 0) {
        PyBuffer_Release(&v);
        *out = outcome::failed;
        return 1;
      }
      continue;
    }
    PyBuffer_Release(&v);
    if (would_block(err)) {
      *out = outcome::wait;
      return 1;
    }
    errno = err;
    PyErr_SetFromErrno(PyExc_OSError);
    *out = outcome::failed;
    return 1;
  }
  PyBuffer_Release(&v);
  *result = PyLong_FromSsize_t(got);
  *out = *result != nullptr ? outcome::done : outcome::failed;
  return 1;
}

/// send(2) of [p, p + len); the count sent, 0 when it would block, -1 with
/// an exception set on failure.
Py_ssize_t raw_send(int fd, const char* p, Py_ssize_t len) {
  for (;;) {
    const ssize_t n = ::send(fd, p, static_cast<std::size_t>(len), MSG_NOSIGNAL);
    if (n >= 0) {
      return n;
    }
    const int err = errno;
    if (err == EINTR) {
      if (PyErr_CheckSignals() < 0) {
        return -1;
      }
      continue;
    }
    if (would_block(err)) {
      return 0;
    }
    errno = err;
    PyErr_SetFromErrno(PyExc_OSError);
    return -1;
  }
}

}  // namespace cadeloop::pyhost::loop::sock_syscalls
