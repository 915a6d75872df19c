// LoopCore's Unix signal handlers (asyncio's _UnixSelectorEventLoop
// add_signal_handler / remove_signal_handler, in C++): a non-blocking
// socketpair owned by the loop, made on the first add_signal_handler (an
// ordinary loop has no internal fd at all), whose write end is given to
// signal.set_wakeup_fd: CPython's C signal handler writes one byte, the signal
// number, per signal. The read end is an ordinary reader of the C++ fd table
// (_read_from_self, as asyncio's self-pipe reader); each signal number read
// queues that signal's Handle on the ready queue, so the handler runs in the
// pass after the one that read it, as in asyncio. The handles live in
// asyncio's own `_signal_handlers` dict (the loop's, by signal), so code that
// looks at it sees what it would see on asyncio.
//
// Every check is asyncio's, in its order and with its exception types and
// messages: coroutine callbacks (TypeError), signal numbers (TypeError,
// ValueError), a closed loop, the main thread of the main interpreter (the
// ValueError of set_wakeup_fd, raised again as RuntimeError), uncatchable
// signals (sigaction's EINVAL as RuntimeError). Loop thread only.
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <utility>
#include <vector>

#include "loop/loop_methods.hpp"

namespace cadeloop::pyhost::loop {

namespace {

/// Calls `module.name(*args)`; new reference or NULL with the exception set.
PyObject* module_call(const char* module, const char* name, PyObject* const* args,
                      Py_ssize_t nargs) {
  PyObject* mod = PyImport_ImportModule(module);
  if (mod == nullptr) {
    return nullptr;
  }
  PyObject* fn = PyObject_GetAttrString(mod, name);
  Py_DECREF(mod);
  if (fn == nullptr) {
    return nullptr;
  }
  PyObject* r = PyObject_Vectorcall(fn, args, static_cast<std::size_t>(nargs), nullptr);
  Py_DECREF(fn);
  return r;
}

PyObject* module_attr_of(const char* module, const char* name) {
  PyObject* mod = PyImport_ImportModule(module);
  if (mod == nullptr) {
    return nullptr;
  }
  PyObject* r = PyObject_GetAttrString(mod, name);
  Py_DECREF(mod);
  return r;
}

/// signal.set_wakeup_fd(fd): new reference to the old fd, or NULL.
PyObject* set_wakeup_fd(int fd) {
  PyObject* arg = PyLong_FromLong(fd);
  if (arg == nullptr) {
    return nullptr;
  }
  PyObject* r = module_call("signal", "set_wakeup_fd", &arg, 1);
  Py_DECREF(arg);
  return r;
}

/// Raises RuntimeError(message) with `context` (stolen) as its __context__, as
/// asyncio's `raise RuntimeError(...)` inside its `except` block does.
/// `message` NULL: making it failed, and that is the exception set.
void raise_runtime_error(PyObject* message, PyObject* context) {
  raise_in_context(message != nullptr ? PyObject_CallOneArg(PyExc_RuntimeError, message) : nullptr,
                   context);
}

/// Whether the raised exception is one of ValueError / OSError.
bool raised_value_or_os_error() {
  return PyErr_ExceptionMatches(PyExc_ValueError) != 0 ||
         PyErr_ExceptionMatches(PyExc_OSError) != 0;
}

/// signal.set_wakeup_fd(-1); a failure is logged at INFO, as asyncio does.
bool reset_wakeup_fd() {
  PyObject* r = set_wakeup_fd(-1);
  if (r != nullptr) {
    Py_DECREF(r);
    return true;
  }
  if (!raised_value_or_os_error()) {
    return false;
  }
  PyObject* exc = take_exception();
  PyObject* logger = module_attr_of("asyncio.log", "logger");
  PyObject* lr = logger != nullptr ? PyObject_CallMethod(logger, "info", "sO",
                                                         "set_wakeup_fd(-1) failed: %s", exc)
                                   : nullptr;
  Py_XDECREF(logger);
  Py_XDECREF(exc);
  if (lr == nullptr) {
    return false;
  }
  Py_DECREF(lr);
  return true;
}

/// asyncio's _check_signal: an int (TypeError) among signal.valid_signals()
/// (ValueError). Returns the signal number, or -1 with the exception set.
int checked_signal(PyObject* sig) {
  if (!PyLong_Check(sig)) {
    PyErr_Format(PyExc_TypeError, "sig must be an int, not %R", sig);
    return -1;
  }
  int overflow = 0;
  const long n = PyLong_AsLongAndOverflow(sig, &overflow);
  if (n == -1 && PyErr_Occurred()) {
    return -1;
  }
  // valid_signals() is sigfillset()'s set, as CPython builds it.
  sigset_t all;
  sigfillset(&all);
  if (overflow != 0 || n < 1 || n >= NSIG || sigismember(&all, static_cast<int>(n)) != 1) {
    PyObject* text = PyObject_Format(sig, nullptr);
    if (text != nullptr) {
      PyErr_Format(PyExc_ValueError, "invalid signal number %U", text);
      Py_DECREF(text);
    }
    return -1;
  }
  return static_cast<int>(n);
}

/// The loop's _signal_handlers dict, made on first use. Borrowed.
PyObject* handlers_of(loop_state& st) {
  if (st.signal_handlers == nullptr) {
    st.signal_handlers = PyDict_New();
  }
  return st.signal_handlers;
}

/// Raises RuntimeError(f'sig {sig} cannot be caught') for an OSError with
/// EINVAL and leaves any other exception as it is. Always returns false.
bool map_uncatchable(PyObject* sig) {
  if (!PyErr_ExceptionMatches(PyExc_OSError)) {
    return false;
  }
  PyObject* exc = take_exception();
  PyObject* err = exc != nullptr ? PyObject_GetAttrString(exc, "errno") : nullptr;
  const bool einval = err != nullptr && PyLong_Check(err) && PyLong_AsLong(err) == EINVAL;
  Py_XDECREF(err);
  PyErr_Clear();
  if (!einval) {
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc);
    Py_DECREF(exc);
    return false;
  }
  PyObject* text = PyObject_Format(sig, nullptr);
  PyObject* message =
      text != nullptr ? PyUnicode_FromFormat("sig %U cannot be caught", text) : nullptr;
  Py_XDECREF(text);
  raise_runtime_error(message, exc);
  Py_XDECREF(message);
  return false;
}

/// Makes the socketpair and enters its read end in the fd table with
/// _read_from_self as the reader. Returns false with an exception set.
bool open_signal_pipe(PyObject* self, loop_state& st) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) < 0) {
    PyErr_SetFromErrno(PyExc_OSError);
    return false;
  }
  st.signal_read_fd = fds[0];
  st.signal_write_fd = fds[1];
  PyObject* reader = PyObject_GetAttrString(self, "_read_from_self");
  PyObject* fd = PyLong_FromLong(fds[0]);
  PyObject* h = nullptr;
  if (reader != nullptr && fd != nullptr) {
    PyObject* args[2] = {fd, reader};
    h = loop_add_reader(self, args, 2);
  }
  Py_XDECREF(reader);
  Py_XDECREF(fd);
  if (h == nullptr) {
    PyObject* exc = take_exception();
    close_signal_pipe(self, st);
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc);
    Py_DECREF(exc);
    return false;
  }
  Py_DECREF(h);
  return true;
}

/// asyncio's _handle_signal: queue the handle of `sig`, or remove it properly
/// if it was cancelled; an unknown signal is ignored (a race).
bool handle_signal(PyObject* self, loop_state& st, int sig) {
  if (st.signal_handlers == nullptr) {
    return true;
  }
  PyObject* key = PyLong_FromLong(sig);
  if (key == nullptr) {
    return false;
  }
  PyObject* handle = PyDict_GetItemWithError(st.signal_handlers, key);
  if (handle == nullptr) {
    Py_DECREF(key);
    return PyErr_Occurred() == nullptr;
  }
  Py_INCREF(handle);
  int cancelled = 0;
  if (is_own_handle(st, handle)) {
    cancelled = reinterpret_cast<handle_object*>(handle)->cancelled ? 1 : 0;
  } else {
    PyObject* c = PyObject_GetAttrString(handle, "_cancelled");
    cancelled = c != nullptr ? PyObject_IsTrue(c) : -1;
    Py_XDECREF(c);
  }
  PyObject* r = nullptr;
  if (cancelled > 0) {
    r = loop_remove_signal_handler(self, key);
  } else if (cancelled == 0) {
    r = loop_add_callback(self, handle);  // this pass's callbacks are counted: it runs next pass
  }
  Py_DECREF(handle);
  Py_DECREF(key);
  Py_XDECREF(r);
  return r != nullptr;
}

}  // namespace

void close_signal_pipe(PyObject* self, loop_state& st) {
  if (st.signal_read_fd < 0) {
    return;
  }
  // Out of the fd table first (a closed loop's table is already empty).
  PyObject* fd = PyLong_FromLong(st.signal_read_fd);
  PyObject* r = fd != nullptr ? remove_interest(self, fd, false) : nullptr;
  Py_XDECREF(fd);
  if (r == nullptr) {
    PyErr_Clear();
  }
  Py_XDECREF(r);
  ::close(std::exchange(st.signal_read_fd, -1));
  ::close(std::exchange(st.signal_write_fd, -1));
}

void release_signals(loop_state& st, std::vector<PyObject*>& drop) {
  if (st.signal_read_fd >= 0) {
    ::close(std::exchange(st.signal_read_fd, -1));
    ::close(std::exchange(st.signal_write_fd, -1));
  }
  if (st.signal_handlers != nullptr) {
    drop.push_back(std::exchange(st.signal_handlers, nullptr));
  }
}

PyObject* loop_add_signal_handler(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  loop_state& st = state_of(self);
  if (nargs < 2) {
    PyErr_SetString(PyExc_TypeError,
                    "add_signal_handler() missing required arguments: 'sig' and 'callback'");
    return nullptr;
  }
  PyObject* sig = args[0];
  PyObject* callback = args[1];
  for (const char* check : {"iscoroutine", "iscoroutinefunction"}) {
    PyObject* r = module_call("asyncio.coroutines", check, &callback, 1);
    const int is = r != nullptr ? PyObject_IsTrue(r) : -1;
    Py_XDECREF(r);
    if (is < 0) {
      return nullptr;
    }
    if (is > 0) {
      PyErr_SetString(PyExc_TypeError, "coroutines cannot be used with add_signal_handler()");
      return nullptr;
    }
  }
  const int signum = checked_signal(sig);
  if (signum < 0) {
    return nullptr;
  }
  if (st.closed) {
    return closed_error();
  }
  PyObject* handlers = handlers_of(st);
  if (handlers == nullptr) {
    return nullptr;
  }
  const bool made_pipe = st.signal_read_fd < 0;
  if (made_pipe && !open_signal_pipe(self, st)) {
    return nullptr;
  }
  // set_wakeup_fd() raises ValueError off the main thread of the main
  // interpreter: called first, so a loop elsewhere adds no handler.
  if (PyObject* old = set_wakeup_fd(st.signal_write_fd); old != nullptr) {
    Py_DECREF(old);
  } else {
    if (!raised_value_or_os_error()) {
      return nullptr;
    }
    PyObject* exc = take_exception();
    if (made_pipe) {
      close_signal_pipe(self, st);  // no internal fd for a loop that has no handler
    }
    PyObject* text = PyObject_Str(exc);
    raise_runtime_error(text, exc);
    Py_XDECREF(text);
    return nullptr;
  }

  call_args a;
  a.callback = callback;
  a.args = args + 2;
  a.nargs = nargs - 2;
  PyObject* handle = make_handle(self, st, st.handle_type, a);
  if (handle == nullptr) {
    return nullptr;
  }
  // The dict is Python's to see: the handle is an ordinary tracked object.
  PyObject_GC_Track(handle);
  track_context(reinterpret_cast<handle_object*>(handle)->context);
  const int set = PyDict_SetItem(handlers, sig, handle);
  Py_DECREF(handle);
  if (set < 0) {
    return nullptr;
  }

  // A no-op Python handler makes CPython write the signal number to the
  // wakeup fd; SA_RESTART (siginterrupt False) limits EINTR.
  PyObject* noop = module_attr_of("asyncio.unix_events", "_sighandler_noop");
  PyObject* r = nullptr;
  if (noop != nullptr) {
    PyObject* sargs[2] = {sig, noop};
    r = module_call("signal", "signal", sargs, 2);
    Py_DECREF(noop);
  }
  if (r != nullptr) {
    Py_DECREF(r);
    PyObject* iargs[2] = {sig, Py_False};
    r = module_call("signal", "siginterrupt", iargs, 2);
  }
  if (r != nullptr) {
    Py_DECREF(r);
    Py_RETURN_NONE;
  }
  if (!PyErr_ExceptionMatches(PyExc_OSError)) {
    return nullptr;
  }
  PyObject* exc = take_exception();
  if (PyDict_DelItem(handlers, sig) < 0) {
    Py_DECREF(exc);
    return nullptr;
  }
  if (PyDict_GET_SIZE(handlers) == 0 && !reset_wakeup_fd()) {
    Py_DECREF(exc);
    return nullptr;
  }
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc);
  Py_DECREF(exc);
  map_uncatchable(sig);
  return nullptr;
}

PyObject* loop_remove_signal_handler(PyObject* self, PyObject* sig) {
  loop_state& st = state_of(self);
  const int signum = checked_signal(sig);
  if (signum < 0) {
    return nullptr;
  }
  PyObject* handlers = handlers_of(st);
  if (handlers == nullptr) {
    return nullptr;
  }
  if (PyDict_DelItem(handlers, sig) < 0) {
    if (PyErr_ExceptionMatches(PyExc_KeyError)) {
      PyErr_Clear();
      Py_RETURN_FALSE;
    }
    return nullptr;
  }
  PyObject* handler =
      module_attr_of("signal", signum == SIGINT ? "default_int_handler" : "SIG_DFL");
  if (handler == nullptr) {
    return nullptr;
  }
  PyObject* sargs[2] = {sig, handler};
  PyObject* r = module_call("signal", "signal", sargs, 2);
  Py_DECREF(handler);
  if (r == nullptr) {
    map_uncatchable(sig);
    return nullptr;
  }
  Py_DECREF(r);
  if (PyDict_GET_SIZE(handlers) == 0 && !reset_wakeup_fd()) {
    return nullptr;
  }
  Py_RETURN_TRUE;
}

PyObject* loop_read_from_self(PyObject* self, PyObject*) {
  loop_state& st = state_of(self);
  unsigned char buf[4096];
  while (st.signal_read_fd >= 0) {
    const ssize_t n = ::recv(st.signal_read_fd, buf, sizeof buf, 0);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        break;
      }
      return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (n == 0) {
      break;
    }
    for (ssize_t i = 0; i < n; ++i) {
      // A zero byte is a plain wake-up (asyncio's _write_to_self), not a signal.
      if (buf[i] != 0 && !handle_signal(self, st, buf[i])) {
        return nullptr;
      }
    }
  }
  Py_RETURN_NONE;
}

PyObject* loop_close_signal_pipe(PyObject* self, PyObject*) {
  close_signal_pipe(self, state_of(self));
  Py_RETURN_NONE;
}

PyObject* loop_get_signal_handlers(PyObject* self, void*) {
  PyObject* d = handlers_of(state_of(self));
  return Py_XNewRef(d);
}

int loop_set_signal_handlers(PyObject* self, PyObject* value, void*) {
  if (value == nullptr || !PyDict_Check(value)) {
    PyErr_SetString(PyExc_TypeError, "_signal_handlers must be a dict");
    return -1;
  }
  Py_XSETREF(state_of(self).signal_handlers, Py_NewRef(value));
  return 0;
}

}  // namespace cadeloop::pyhost::loop
