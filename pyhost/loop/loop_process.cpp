// LoopCore._watch_child: a child process watched with its pidfd (Linux 5.3+),
// in the loop's own fd table, with no thread and no SIGCHLD handler.
//
// cadeloop.Loop._make_subprocess_transport opens the pidfd (os.pidfd_open)
// once the child is started and hands it here with the transport's
// _process_exited. The pidfd becomes readable when the child exits (at once
// if it already did: a zombie's pidfd is readable). Then, on the loop's
// thread: waitpid(pid, WNOHANG) reaps it, the pidfd leaves the fd table and
// is closed, and loop.call_soon(process_exited, returncode) runs, with
// asyncio's returncode convention (the exit status, or minus the signal
// number), one pass later as asyncio's own pidfd watcher calls it. A child
// someone else reaped first (ECHILD) is reported by the Python half
// (loop._cadeloop_child_status_lost(pid, process_exited)).
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "loop/loop_methods.hpp"

namespace cadeloop::pyhost::loop {

namespace {

// The watch's state, the self of its reader callback: a tuple
// (loop, pidfd, pid, process_exited, children). `children` is the loop's
// dict pidfd -> transport of the children it watches (for close()).
enum watch_field : Py_ssize_t { w_loop, w_pidfd, w_pid, w_exited, w_children, w_size };

/// The pidfd's reader: reap the child if it exited, then report it.
PyObject* child_ready(PyObject* watch, PyObject*) {
  PyObject* loop = PyTuple_GET_ITEM(watch, w_loop);
  PyObject* pidfd_obj = PyTuple_GET_ITEM(watch, w_pidfd);
  PyObject* pid_obj = PyTuple_GET_ITEM(watch, w_pid);
  const long pid = PyLong_AsLong(pid_obj);
  const long pidfd = PyLong_AsLong(pidfd_obj);
  if (PyErr_Occurred()) {
    return nullptr;
  }
  int status = 0;
  const pid_t r = ::waitpid(static_cast<pid_t>(pid), &status, WNOHANG);
  if (r == 0 || (r < 0 && errno == EINTR)) {
    Py_RETURN_NONE;  // not exited yet (a spurious readiness): keep watching
  }
  PyObject* returncode = nullptr;
  if (r < 0) {
    // ECHILD: reaped by someone else (Popen.poll(), a SIGCHLD handler).
    returncode = PyObject_CallMethod(loop, "_cadeloop_child_status_lost", "OO", pid_obj,
                                     PyTuple_GET_ITEM(watch, w_exited));
  } else if (WIFSIGNALED(status)) {
    returncode = PyLong_FromLong(-static_cast<long>(WTERMSIG(status)));
  } else {
    returncode = PyLong_FromLong(WEXITSTATUS(status));
  }
  if (returncode == nullptr) {
    return nullptr;
  }
  PyObject* removed = remove_interest(loop, pidfd_obj, false);
  Py_XDECREF(removed);
  if (removed == nullptr) {
    Py_DECREF(returncode);
    return nullptr;
  }
  if (pidfd >= 0) {
    ::close(static_cast<int>(pidfd));
  }
  if (PyDict_DelItem(PyTuple_GET_ITEM(watch, w_children), pidfd_obj) < 0) {
    PyErr_Clear();  // already forgotten (close() got there first)
  }
  PyObject* r2 =
      PyObject_CallMethod(loop, "call_soon", "OO", PyTuple_GET_ITEM(watch, w_exited), returncode);
  Py_DECREF(returncode);
  if (r2 == nullptr) {
    return nullptr;
  }
  Py_DECREF(r2);
  Py_RETURN_NONE;
}

PyMethodDef child_ready_def = {"_cadeloop_child_ready", child_ready, METH_NOARGS,
                               "A watched child's pidfd is readable: reap and report it."};

}  // namespace

/// _watch_child(pidfd, pid, process_exited, children): watch the child
/// `pid` through its `pidfd` (owned from now on: closed once the child is
/// reaped; the caller closes the ones still in `children` at loop close).
PyObject* loop_watch_child(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4 || !PyLong_Check(args[0]) || !PyLong_Check(args[1]) || !PyDict_Check(args[3])) {
    PyErr_SetString(PyExc_TypeError, "_watch_child(pidfd, pid, process_exited, children)");
    return nullptr;
  }
  PyObject* watch = PyTuple_Pack(w_size, self, args[0], args[1], args[2], args[3]);
  if (watch == nullptr) {
    return nullptr;
  }
  PyObject* ready = PyCFunction_New(&child_ready_def, watch);
  Py_DECREF(watch);
  if (ready == nullptr) {
    return nullptr;
  }
  PyObject* add[2] = {args[0], ready};
  PyObject* handle = loop_add_reader(self, add, 2);
  Py_DECREF(ready);
  if (handle == nullptr) {
    return nullptr;
  }
  Py_DECREF(handle);
  Py_RETURN_NONE;
}

}  // namespace cadeloop::pyhost::loop
