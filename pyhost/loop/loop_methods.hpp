#pragma once
// Private to pyhost/loop: LoopCore's C methods, defined by area in
// loop_schedule.cpp (call_soon, timers, futures and tasks), loop_fd_table.cpp
// (readers, writers, transports in the fd table) and loop_pass.cpp (one pass:
// poll, spin, park, run the ready callbacks), and gathered into the type's
// method table by loop_core.cpp; and the few helpers those files share.
//
// A function called once per callback stays in the file of its caller (the
// pass's helpers in loop_pass.cpp, make_handle beside call_soon), or is
// inline here, so splitting the files costs the hot paths no call.

#include <time.h>

#include <cerrno>
#include <cstdint>
#include <limits>
#include <system_error>
#include <vector>

#include "loop/loop_core.hpp"

namespace cadeloop::pyhost::loop {

/// epoll token of the parker's eventfd; fds use their own number.
inline constexpr std::uint64_t wake_token = std::numeric_limits<std::uint64_t>::max();
/// epoll token of an attached loop_source's eventfd.
inline constexpr std::uint64_t source_token = wake_token - 1;
/// epoll token of an attached loop_source's second descriptor (its sockets, in solo mode).
inline constexpr std::uint64_t source_sockets_token = wake_token - 2;
/// The longest single poll, as asyncio's MAXIMUM_SELECT_TIMEOUT (one day).
inline constexpr double max_poll_seconds = 24 * 3600.0;

/// The loop's clock: CLOCK_MONOTONIC in seconds, as time.monotonic(). Any thread.
inline double monotonic_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

/// Raises RuntimeError("Event loop is closed"); returns NULL.
inline PyObject* closed_error() {
  PyErr_SetString(PyExc_RuntimeError, "Event loop is closed");
  return nullptr;
}

/// Raises the OSError for `ec`; returns NULL.
inline PyObject* os_error(const std::error_code& ec) {
  errno = ec.value();
  return PyErr_SetFromErrno(PyExc_OSError);
}

/// Moves what other threads queued onto the ready queue, in their order
/// (Python threads' first, then C++ producers'). Loop thread.
inline void drain_xthread(loop_state& st) {
  if (!st.gil_xthread.empty()) {
    st.xthread_items += st.gil_xthread.size();
    st.ready.insert(st.ready.end(), st.gil_xthread.begin(), st.gil_xthread.end());
    st.gil_xthread.clear();
  }
  st.xthread_items += st.xthread.drain([&](PyObject*&& h) noexcept { st.ready.push_back(h); });
}

/// A callback, its arguments and the context to run it in, as a method's
/// vectorcall arguments hold them (borrowed).
struct call_args {
  PyObject* callback = nullptr;
  PyObject* const* args = nullptr;
  Py_ssize_t nargs = 0;
  PyObject* context = nullptr;  // borrowed; NULL means copy the current one
};

/// Makes a Handle (type == st.handle_type) or the handle part of a
/// TimerHandle (st.timer_type) for `a`; returns a new reference, untracked by
/// the cycle collector (see release_handle()). Loop thread (loop_schedule.cpp).
PyObject* make_handle(PyObject* self, loop_state& st, PyObject* type, const call_args& a);

/// Drops the reader (writer) of `fileobj` and cancels its handle, or stops a
/// transport reading; returns True/False as asyncio's _remove_reader does.
/// Loop thread (loop_fd_table.cpp).
PyObject* remove_interest(PyObject* self, PyObject* fileobj, bool writer);

// --- loop_schedule.cpp: scheduling callbacks, timers, futures and tasks
PyObject* loop_call_soon(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                         PyObject* kwnames);
PyObject* loop_call_soon_threadsafe(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                                    PyObject* kwnames);
PyObject* loop_call_later(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                          PyObject* kwnames);
PyObject* loop_call_at(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames);
PyObject* loop_time(PyObject* self, PyObject* unused);
PyObject* loop_get_debug(PyObject* self, PyObject* unused);
PyObject* loop_create_future(PyObject* self, PyObject* unused);
PyObject* loop_create_task(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                           PyObject* kwnames);
PyObject* loop_add_callback(PyObject* self, PyObject* handle);
PyObject* loop_timer_handle_cancelled(PyObject* self, PyObject* handle);
PyObject* loop_wake(PyObject* self, PyObject* unused);

// --- loop_fd_table.cpp: readers, writers and transports by fd
PyObject* loop_add_reader(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
PyObject* loop_add_writer(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
PyObject* loop_remove_reader(PyObject* self, PyObject* fileobj);
PyObject* loop_remove_writer(PyObject* self, PyObject* fileobj);
PyObject* loop_fd_key(PyObject* self, PyObject* fileobj);
PyObject* loop_fd_list(PyObject* self, PyObject* unused);
PyObject* loop_make_transport_core(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

// --- loop_transport.cpp: which transport owns an fd (accepted transports are
// not in loop._transports; the fd table answers for them)
PyObject* loop_fd_transport(PyObject* self, PyObject* fdo);
/// True if a socket transport's core owns the fd `fdo` (an int) in the loop's
/// table; false for anything else. Never raises.
bool fd_has_transport(PyObject* self, PyObject* fdo);
/// asyncio's Server._attach(transport) (3.13; with_transport) or _attach()
/// (3.11), without their Python frames; false with an exception set.
bool server_attach(PyObject* self, PyObject* server, PyObject* transport, bool with_transport);

// --- loop_pass.cpp: one pass of the loop, spinning and parking, the source
PyObject* loop_run_once(PyObject* self, PyObject* unused);
PyObject* loop_run_until_stopped(PyObject* self, PyObject* unused);
PyObject* loop_set_spin(PyObject* self, PyObject* args);
PyObject* loop_attach_source(PyObject* self, PyObject* capsule);
PyObject* loop_detach_source(PyObject* self, PyObject* unused);

// --- loop_pipe.cpp, loop_process.cpp: pipe transports and child processes (pidfd)
int add_pipe_type(PyObject* module);
PyObject* loop_watch_child(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
// --- loop_sock.cpp: the C halves of sock_recv & co. (cadeloop.Loop's coroutines await them)
PyObject* loop_sock_recv(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
PyObject* loop_sock_recv_into(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
PyObject* loop_sock_recvfrom(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
PyObject* loop_sock_recvfrom_into(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
PyObject* loop_sock_sendall(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
PyObject* loop_sock_sendto(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
PyObject* loop_sock_connect(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
PyObject* loop_sock_accept(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
PyObject* loop_sock_stats(PyObject* self, PyObject* unused);
/// Creates the SockCall type and sets it as loop_type._sock_call_type. -1 on error.
int add_sock_call_type(PyObject* module, PyObject* loop_type);

// --- loop_signal.cpp: add_signal_handler / remove_signal_handler (sigtime)
PyObject* loop_add_signal_handler(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
PyObject* loop_remove_signal_handler(PyObject* self, PyObject* sig);
PyObject* loop_read_from_self(PyObject* self, PyObject* unused);
PyObject* loop_close_signal_pipe(PyObject* self, PyObject* unused);
PyObject* loop_get_signal_handlers(PyObject* self, void* unused);
int loop_set_signal_handlers(PyObject* self, PyObject* value, void* unused);
/// Takes the signal socketpair out of the fd table and closes it (no-op if none).
void close_signal_pipe(PyObject* self, loop_state& st);
/// Closes the socketpair and hands the handlers dict to `drop` (release_objects).
void release_signals(loop_state& st, std::vector<PyObject*>& drop);

// --- loop_pass.cpp: loop.time replaced on the instance (sigtime)
/// self.time() when loop.time is replaced (st.time_override); false with an
/// exception set if it raised or returned no number.
bool overridden_time(PyObject* self, double& now);
/// tp_setattro of LoopCore: the generic one, noting a `time` set or deleted.
int loop_setattro(PyObject* self, PyObject* name, PyObject* value);
/// Whether `type` (a LoopCore subclass) defines its own time().
bool type_overrides_time(PyTypeObject* type);

/// The loop's clock as asyncio's code reads it (self.time()): CLOCK_MONOTONIC,
/// or the replacement's answer when loop.time is replaced. Loop thread.
inline bool loop_clock(PyObject* self, const loop_state& st, double& now) {
  if (!st.time_override) [[likely]] {
    now = monotonic_now();
    return true;
  }
  return overridden_time(self, now);
}

// --- loop_sendfile.cpp: sock_sendfile's native path with sendfile(2) (sigtime)
PyObject* loop_sock_sendfile_native(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
/// Creates the SendfileOp type for this interpreter; new reference or NULL.
PyObject* new_sendfile_op_type(PyObject* module);

}  // namespace cadeloop::pyhost::loop
