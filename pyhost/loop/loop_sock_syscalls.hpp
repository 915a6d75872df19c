// The system calls of LoopCore's low-level socket calls (loop_sock.cpp):
// recv(2) and send(2) straight on the fd, with the socket module's EINTR
// rule (run the signal handlers, retry) and asyncio's "try again" errors
// told apart from real failures. Loop thread, GIL held.
#pragma once

#include "loop/loop_methods.hpp"  // Python.h first

#include <cstdint>

namespace cadeloop::pyhost::loop::sock_syscalls {

/// What one attempt came to.
enum class outcome : std::uint8_t { done, failed, wait };

/// EAGAIN, EWOULDBLOCK or EINPROGRESS: the call has to wait for the fd.
bool would_block(int err);

/// Whether the pending exception is BlockingIOError or InterruptedError
/// (asyncio's "try again"); clears it if so.
bool clear_if_would_block();

/// recv(2) into a new bytes object of up to n bytes (n > 0).
outcome raw_recv(int fd, Py_ssize_t n, PyObject** result);

/// recv(2) into `buf`'s writable buffer; 0 = the socket's method is needed
/// (not a simple writable buffer, or an empty one).
int raw_recv_into(int fd, PyObject* buf, PyObject** result, outcome* out);

/// send(2) of [p, p + len); the count sent, 0 when it would block, -1 with
/// an exception set on failure.
Py_ssize_t raw_send(int fd, const char* p, Py_ssize_t len);

}  // namespace cadeloop::pyhost::loop::sock_syscalls
