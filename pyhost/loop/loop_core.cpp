// cadeloop._core.LoopCore: the scheduling core of cadeloop.Loop in C++ — the
// ready queue, the timer heap, the run-once step (epoll poll with timeout,
// check before park, optional spin), the fd interest table behind
// add_reader/add_writer, and the cross-thread queue behind
// call_soon_threadsafe. cadeloop.Loop (Python) inherits from it and from
// asyncio's selector loop, whose Python code supplies the cold paths.
#include <time.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <system_error>
#include <utility>

#include "cadeloop/runtime/cpu_relax.hpp"
#include "loop/loop_core.hpp"
#include "register.hpp"

namespace cadeloop::pyhost {

namespace {

using loop::fd_entry;
using loop::handle_object;
using loop::loop_object;
using loop::loop_state;
using loop::state_of;
using loop::timer_handle_object;

/// epoll token of the parker's eventfd; fds use their own number.
constexpr std::uint64_t wake_token = std::numeric_limits<std::uint64_t>::max();
/// epoll token of an attached loop_source's eventfd.
constexpr std::uint64_t source_token = wake_token - 1;
/// The longest single poll, as asyncio's MAXIMUM_SELECT_TIMEOUT (one day).
constexpr double max_poll_seconds = 24 * 3600.0;
/// selectors.EVENT_READ / EVENT_WRITE, for the selector view.
constexpr long event_read = 1;
constexpr long event_write = 2;


double monotonic_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

PyObject* closed_error() {
  PyErr_SetString(PyExc_RuntimeError, "Event loop is closed");
  return nullptr;
}

/// Drops a reference the loop held, once the structure it came from is
/// already consistent (a finaliser may re-enter the loop).
void release(PyObject* o) { Py_XDECREF(o); }

/// Splits call_soon-style arguments: positional `fixed` leading arguments,
/// then the callback and its args, then an optional keyword `context`.
struct call_args {
  PyObject* callback = nullptr;
  PyObject* const* args = nullptr;
  Py_ssize_t nargs = 0;
  PyObject* context = nullptr;  // borrowed; NULL means copy the current one
};

bool parse_call(const char* name, Py_ssize_t fixed, PyObject* const* args, Py_ssize_t nargs,
                PyObject* kwnames, call_args& out, PyObject* context_name) {
  if (nargs < fixed + 1) {
    PyErr_Format(PyExc_TypeError, "%s() missing required positional arguments", name);
    return false;
  }
  if (kwnames != nullptr) {
    const Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nkw; ++i) {
      PyObject* key = PyTuple_GET_ITEM(kwnames, i);
      // Keyword names are interned by the compiler and by _asyncio: the
      // pointer test is the common case.
      if (key != context_name && PyUnicode_CompareWithASCIIString(key, "context") != 0) {
        PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", name, key);
        return false;
      }
      out.context = args[nargs + i];
    }
  }
  if (out.context == Py_None) {
    out.context = nullptr;
  }
  out.callback = args[fixed];
  out.args = args + fixed + 1;
  out.nargs = nargs - fixed - 1;
  return true;
}

/// The debug-mode checks asyncio makes before scheduling.
bool debug_checks(PyObject* self, PyObject* callback, const char* method, bool check_thread) {
  if (check_thread) {
    PyObject* r = PyObject_CallMethod(self, "_check_thread", nullptr);
    if (r == nullptr) {
      return false;
    }
    Py_DECREF(r);
  }
  PyObject* r = PyObject_CallMethod(self, "_check_callback", "Os", callback, method);
  if (r == nullptr) {
    return false;
  }
  Py_DECREF(r);
  return true;
}

/// Makes a Handle (or the handle part of a TimerHandle); returns a new reference.
PyObject* make_handle(PyObject* self, loop_state& st, PyObject* type, const call_args& a) {
  PyObject* args = PyTuple_New(a.nargs);
  if (args == nullptr) {
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < a.nargs; ++i) {
    PyTuple_SET_ITEM(args, i, Py_NewRef(a.args[i]));
  }
  PyObject* context = a.context != nullptr ? Py_NewRef(a.context) : PyContext_CopyCurrent();
  if (context == nullptr) {
    Py_DECREF(args);
    return nullptr;
  }
  handle_object* h = nullptr;
  if (type == st.timer_type) {
    auto* t = PyObject_GC_New(timer_handle_object, reinterpret_cast<PyTypeObject*>(type));
    if (t != nullptr) {
      t->when = 0;
      t->seq = 0;
      t->heap_index = runtime::timer_heap<timer_handle_object>::npos;
      h = &t->base;
    }
  } else {
    h = PyObject_GC_New(handle_object, reinterpret_cast<PyTypeObject*>(type));
  }
  if (h == nullptr) {
    Py_DECREF(args);
    Py_DECREF(context);
    return nullptr;
  }
  h->callback = Py_NewRef(a.callback);
  h->args = args;
  h->loop = Py_NewRef(self);
  h->context = context;
  h->source_traceback = nullptr;
  h->repr = nullptr;
  h->weakrefs = nullptr;
  h->cancelled = false;
  PyObject* o = reinterpret_cast<PyObject*>(h);
  // Not tracked by the cycle collector while the loop holds it: see
  // loop::release_handle().
  if (st.debug) {
    // Where it was scheduled from, for the debug-mode reports.
    PyObject* tb = PyObject_CallMethod(self, "_cadeloop_extract_stack", nullptr);
    if (tb == nullptr) {
      Py_DECREF(o);
      return nullptr;
    }
    h->source_traceback = tb == Py_None ? nullptr : tb;
    if (tb == Py_None) {
      Py_DECREF(tb);
    }
  }
  return o;
}

// ---------------------------------------------------------------- scheduling

/// Moves what other threads queued onto the ready queue, in their order.
void drain_xthread(loop_state& st) {
  st.xthread_items += st.xthread.drain([&](PyObject*&& h) noexcept { st.ready.push_back(h); });
}

/// Appends to the ready queue after whatever other threads queued before:
/// a call_soon_threadsafe that happened before this call_soon (same thread,
/// or another thread ordered by a lock) runs first, as with asyncio. Costs
/// one atomic load when the cross-thread queue is empty.
void push_ready(loop_state& st, PyObject* h) {
  if (!st.xthread.empty()) {
    drain_xthread(st);
  }
  st.ready.push_back(h);
}


PyObject* loop_call_soon(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  loop_state& st = state_of(self);
  call_args a;
  if (!parse_call("call_soon", 0, args, nargs, kwnames, a, st.str_context)) {
    return nullptr;
  }
  if (st.closed) {
    return closed_error();
  }
  if (st.debug && !debug_checks(self, a.callback, "call_soon", true)) {
    return nullptr;
  }
  PyObject* h = make_handle(self, st, st.handle_type, a);
  if (h == nullptr) {
    return nullptr;
  }
  push_ready(st, Py_NewRef(h));
  return h;
}

PyObject* loop_call_soon_threadsafe(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                                    PyObject* kwnames) {
  loop_state& st = state_of(self);
  call_args a;
  if (!parse_call("call_soon_threadsafe", 0, args, nargs, kwnames, a, st.str_context)) {
    return nullptr;
  }
  if (st.closed) {
    return closed_error();
  }
  if (st.debug && !debug_checks(self, a.callback, "call_soon_threadsafe", false)) {
    return nullptr;
  }
  PyObject* h = make_handle(self, st, st.handle_type, a);
  if (h == nullptr) {
    return nullptr;
  }
  try {
    st.xthread.push(Py_NewRef(h));
  } catch (const std::bad_alloc&) {
    Py_DECREF(h);
    Py_DECREF(h);
    return PyErr_NoMemory();
  }
  // Check before park, producer side: a system call only if the loop sleeps.
  // When it does, the GIL is let go around the write (as socket.send does in
  // asyncio's self-pipe wake): the woken loop thread needs the GIL at once,
  // and would otherwise wait until this thread next blocks.
  // The first look is relaxed: this thread holds the interpreter's GIL and
  // the loop parks only while holding it, so the GIL already orders the two;
  // wake() itself does the seq_cst check for producers without a GIL.
  if (st.parker.parked()) {
    Py_BEGIN_ALLOW_THREADS
    st.parker.wake();
    Py_END_ALLOW_THREADS
  }
  return h;
}

PyObject* schedule_at(PyObject* self, loop_state& st, double when, const call_args& a, const char* name) {
  if (st.closed) {
    return closed_error();
  }
  if (st.debug && !debug_checks(self, a.callback, name, true)) {
    return nullptr;
  }
  PyObject* o = make_handle(self, st, st.timer_type, a);
  if (o == nullptr) {
    return nullptr;
  }
  auto* t = reinterpret_cast<timer_handle_object*>(o);
  t->when = when;
  try {
    st.timers.push(t);
  } catch (const std::bad_alloc&) {
    Py_DECREF(o);
    return PyErr_NoMemory();
  }
  Py_INCREF(o);  // the heap's reference
  return o;
}

PyObject* loop_call_at(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  loop_state& st = state_of(self);
  call_args a;
  if (!parse_call("call_at", 1, args, nargs, kwnames, a, st.str_context)) {
    return nullptr;
  }
  if (args[0] == Py_None) {
    PyErr_SetString(PyExc_TypeError, "when cannot be None");
    return nullptr;
  }
  const double when = PyFloat_AsDouble(args[0]);
  if (when == -1.0 && PyErr_Occurred()) {
    return nullptr;
  }
  return schedule_at(self, st, when, a, "call_at");
}

PyObject* loop_call_later(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  loop_state& st = state_of(self);
  call_args a;
  if (!parse_call("call_later", 1, args, nargs, kwnames, a, st.str_context)) {
    return nullptr;
  }
  if (args[0] == Py_None) {
    PyErr_SetString(PyExc_TypeError, "delay must not be None");
    return nullptr;
  }
  const double delay = PyFloat_AsDouble(args[0]);
  if (delay == -1.0 && PyErr_Occurred()) {
    return nullptr;
  }
  return schedule_at(self, st, monotonic_now() + delay, a, "call_later");
}

PyObject* loop_time(PyObject*, PyObject*) { return PyFloat_FromDouble(monotonic_now()); }

// Every Future and Task asks its loop get_debug() when it is made, and
// asyncio's Queue, gather and friends make futures through create_future():
// as C methods these cost no Python frame.

PyObject* loop_get_debug(PyObject* self, PyObject*) { return PyBool_FromLong(state_of(self).debug); }

/// module.<name>, looked up at each call as asyncio's own code does (tests
/// and instrumentation replace asyncio.tasks.Task and futures.Future).
PyObject* module_attr(PyObject* module, PyObject* name) { return PyObject_GetAttr(module, name); }

PyObject* loop_create_future(PyObject* self, PyObject*) {
  loop_state& st = state_of(self);
  PyObject* cls = module_attr(st.futures_module, st.str_future);
  if (cls == nullptr) {
    return nullptr;
  }
  PyObject* args[1] = {self};
  PyObject* fut = PyObject_Vectorcall(cls, args, 0, st.kw_loop);
  Py_DECREF(cls);
  return fut;
}

/// create_task(coro, *, name=None, context=None). The plain case (no task
/// factory, not in debug mode) makes the Task here; the rest is asyncio's
/// BaseEventLoop.create_task.
PyObject* loop_create_task(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  loop_state& st = state_of(self);
  PyObject* name = nullptr;
  PyObject* context = nullptr;
  bool plain = nargs == 1 && st.task_factory == nullptr && !st.debug;
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t i = 0; plain && i < nkw; ++i) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, i);
    if (PyUnicode_CompareWithASCIIString(key, "name") == 0) {
      name = args[nargs + i];
    } else if (key == st.str_context || PyUnicode_CompareWithASCIIString(key, "context") == 0) {
      context = args[nargs + i];
    } else {
      plain = false;
    }
  }
  if (!plain) {
    PyObject* slow = PyObject_GetAttrString(self, "_cadeloop_create_task");
    if (slow == nullptr) {
      return nullptr;
    }
    PyObject* r = PyObject_Vectorcall(slow, args, static_cast<std::size_t>(nargs), kwnames);
    Py_DECREF(slow);
    return r;
  }
  if (st.closed) {
    return closed_error();
  }
  PyObject* cls = module_attr(st.tasks_module, st.str_task);
  if (cls == nullptr) {
    return nullptr;
  }
  PyObject* task = nullptr;
  if (name == nullptr && context == nullptr) {
    PyObject* call[2] = {args[0], self};
    task = PyObject_Vectorcall(cls, call, 1, st.kw_loop);
  } else {
    PyObject* kw = PyTuple_New(1 + (name != nullptr) + (context != nullptr));
    if (kw != nullptr) {
      PyObject* call[4] = {args[0], self, nullptr, nullptr};
      Py_ssize_t k = 0;
      PyTuple_SET_ITEM(kw, k++, PyUnicode_FromString("loop"));
      if (name != nullptr) {
        call[1 + k] = name;
        PyTuple_SET_ITEM(kw, k++, PyUnicode_FromString("name"));
      }
      if (context != nullptr) {
        call[1 + k] = context;
        PyTuple_SET_ITEM(kw, k++, PyUnicode_FromString("context"));
      }
      bool ok = true;
      for (Py_ssize_t j = 0; j < k; ++j) {
        ok = ok && PyTuple_GET_ITEM(kw, j) != nullptr;
      }
      if (ok) {
        task = PyObject_Vectorcall(cls, call, 1, kw);
      }
      Py_DECREF(kw);
    }
  }
  Py_DECREF(cls);
  return task;
}

/// _add_callback(handle): queue an already made handle (asyncio's own
/// Handle objects arrive here from the signal path).
PyObject* loop_add_callback(PyObject* self, PyObject* handle) {
  loop_state& st = state_of(self);
  if (loop::is_own_handle(st, handle)) {
    if (reinterpret_cast<handle_object*>(handle)->cancelled) {
      Py_RETURN_NONE;
    }
  } else {
    PyObject* c = PyObject_GetAttrString(handle, "_cancelled");
    if (c == nullptr) {
      return nullptr;
    }
    const int cancelled = PyObject_IsTrue(c);
    Py_DECREF(c);
    if (cancelled != 0) {
      if (cancelled < 0) {
        return nullptr;
      }
      Py_RETURN_NONE;
    }
  }
  push_ready(st, Py_NewRef(handle));
  Py_RETURN_NONE;
}

PyObject* loop_timer_handle_cancelled(PyObject* self, PyObject* handle) {
  loop_state& st = state_of(self);
  if (reinterpret_cast<PyObject*>(Py_TYPE(handle)) == st.timer_type) {
    loop::unschedule_timer(reinterpret_cast<timer_handle_object*>(handle));
  }
  Py_RETURN_NONE;
}

/// _make_transport_core(owner, fd): the C++ half of a socket transport.
PyObject* loop_make_transport_core(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  loop_state& st = state_of(self);
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "_make_transport_core(owner, fd)");
    return nullptr;
  }
  if (st.closed) {
    return closed_error();
  }
  const int fd = PyObject_AsFileDescriptor(args[1]);
  if (fd < 0) {
    return nullptr;
  }
  return loop::new_transport(self, args[0], fd);
}

PyObject* loop_wake(PyObject* self, PyObject*) {
  state_of(self).parker.wake();
  Py_RETURN_NONE;
}

// ---------------------------------------------------------------- fds

/// The fd of an int or of an object with fileno(), as selectors accept them.
int fd_of(PyObject* fileobj) {
  const int fd = PyObject_AsFileDescriptor(fileobj);
  if (fd < 0 && !PyErr_Occurred()) {
    PyErr_Format(PyExc_ValueError, "Invalid file descriptor: %d", fd);
  }
  return fd;
}

PyObject* os_error(const std::error_code& ec) {
  errno = ec.value();
  return PyErr_SetFromErrno(PyExc_OSError);
}

/// Registers (or re-registers) `fd` with `events`; keeps fds_registered right.
bool apply_interest(loop_state& st, int fd, fd_entry& e, std::uint32_t events) {
  if (events == e.events) {
    return true;
  }
  std::error_code ec;
  if (events == 0) {
    ec = st.poller.remove(fd);
  } else if (e.events == 0) {
    ec = st.poller.add(fd, events, static_cast<std::uint64_t>(fd));
  } else {
    ec = st.poller.modify(fd, events, static_cast<std::uint64_t>(fd));
  }
  if (ec) {
    os_error(ec);
    return false;
  }
  if (e.events == 0 && events != 0) {
    ++st.fds_registered;
  } else if (e.events != 0 && events == 0) {
    --st.fds_registered;
  }
  e.events = events;
  return true;
}

/// The epoll mask `e` needs: its handles' and its transport's interest.
std::uint32_t desired_events(const fd_entry& e) {
  std::uint32_t events = 0;
  if (e.reader != nullptr) {
    events |= runtime::poller::readable;
  }
  if (e.writer != nullptr) {
    events |= runtime::poller::writable;
  }
  if (e.transport != nullptr) {
    const auto* t = reinterpret_cast<const loop::transport_object*>(e.transport);
    if (t->want_read) {
      events |= runtime::poller::readable;
    }
    if (t->want_write) {
      events |= runtime::poller::writable;
    }
  }
  return events;
}

fd_entry* entry_for(loop_state& st, int fd, bool create) {
  const auto i = static_cast<std::size_t>(fd);
  if (i >= st.fds.size()) {
    if (!create) {
      return nullptr;
    }
    st.fds.resize(std::max(i + 1, st.fds.size() * 2));
  }
  return &st.fds[i];
}

/// Cancels a handle the loop no longer points at (the old reader/writer).
bool cancel_and_release(const loop_state& st, PyObject* handle) {
  PyObject* r = PyObject_CallMethod(handle, "cancel", nullptr);
  loop::release_handle(st, handle);
  if (r == nullptr) {
    return false;
  }
  Py_DECREF(r);
  return true;
}

PyObject* add_interest(PyObject* self, PyObject* const* args, Py_ssize_t nargs, bool writer,
                       const char* name) {
  loop_state& st = state_of(self);
  if (nargs < 2) {
    PyErr_Format(PyExc_TypeError, "%s() needs an fd and a callback", name);
    return nullptr;
  }
  if (st.closed) {
    return closed_error();
  }
  const int fd = fd_of(args[0]);
  if (fd < 0) {
    return nullptr;
  }
  call_args a;
  a.callback = args[1];
  a.args = args + 2;
  a.nargs = nargs - 2;
  PyObject* h = make_handle(self, st, st.handle_type, a);
  if (h == nullptr) {
    return nullptr;
  }
  fd_entry* e = entry_for(st, fd, true);
  const std::uint32_t bit = writer ? runtime::poller::writable : runtime::poller::readable;
  if (!apply_interest(st, fd, *e, desired_events(*e) | bit)) {
    Py_DECREF(h);
    return nullptr;
  }
  PyObject*& slot = writer ? e->writer : e->reader;
  PyObject* old = std::exchange(slot, Py_NewRef(h));
  if (old != nullptr && !cancel_and_release(st, old)) {
    Py_DECREF(h);
    return nullptr;
  }
  return h;
}

PyObject* remove_interest(PyObject* self, PyObject* fileobj, bool writer) {
  loop_state& st = state_of(self);
  if (st.closed) {
    Py_RETURN_FALSE;
  }
  const int fd = fd_of(fileobj);
  if (fd < 0) {
    return nullptr;
  }
  fd_entry* e = entry_for(st, fd, false);
  if (e == nullptr || e->events == 0) {
    Py_RETURN_FALSE;
  }
  PyObject*& slot = writer ? e->writer : e->reader;
  if (slot == nullptr && !writer && e->transport != nullptr) {
    // asyncio's transport code stops reading with loop._remove_reader(fd)
    // (at EOF when the protocol keeps the connection open).
    auto* t = reinterpret_cast<loop::transport_object*>(e->transport);
    const bool was_reading = t->want_read;
    t->want_read = false;
    if (!apply_interest(st, fd, *e, desired_events(*e))) {
      return nullptr;
    }
    return PyBool_FromLong(was_reading);
  }
  PyObject* old = std::exchange(slot, nullptr);
  if (!apply_interest(st, fd, *e, desired_events(*e))) {
    slot = old;
    return nullptr;
  }
  if (old == nullptr) {
    Py_RETURN_FALSE;
  }
  if (!cancel_and_release(st, old)) {
    return nullptr;
  }
  Py_RETURN_TRUE;
}

PyObject* loop_add_reader(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return add_interest(self, args, nargs, false, "_add_reader");
}
PyObject* loop_add_writer(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return add_interest(self, args, nargs, true, "_add_writer");
}
PyObject* loop_remove_reader(PyObject* self, PyObject* fd) { return remove_interest(self, fd, false); }
PyObject* loop_remove_writer(PyObject* self, PyObject* fd) { return remove_interest(self, fd, true); }

/// _fd_key(fd) -> (events, reader, writer) or None: what the selector view
/// (loop._selector) reports for repr() and asyncio's transport checks.
PyObject* loop_fd_key(PyObject* self, PyObject* fileobj) {
  loop_state& st = state_of(self);
  const int fd = fd_of(fileobj);
  if (fd < 0) {
    return nullptr;
  }
  fd_entry* e = entry_for(st, fd, false);
  if (e == nullptr || e->events == 0) {
    Py_RETURN_NONE;
  }
  long mask = 0;
  if (e->events & runtime::poller::readable) {
    mask |= event_read;
  }
  if (e->events & runtime::poller::writable) {
    mask |= event_write;
  }
  return Py_BuildValue("(lOO)", mask, e->reader != nullptr ? e->reader : Py_None,
                       e->writer != nullptr ? e->writer : Py_None);
}

PyObject* loop_fd_list(PyObject* self, PyObject*) {
  loop_state& st = state_of(self);
  PyObject* out = PyList_New(0);
  if (out == nullptr) {
    return nullptr;
  }
  for (std::size_t i = 0; i < st.fds.size(); ++i) {
    if (st.fds[i].events == 0) {
      continue;
    }
    PyObject* n = PyLong_FromSize_t(i);
    if (n == nullptr || PyList_Append(out, n) < 0) {
      Py_XDECREF(n);
      Py_DECREF(out);
      return nullptr;
    }
    Py_DECREF(n);
  }
  return out;
}

// ---------------------------------------------------------------- run once

/// Queues the reader/writer handles for the events epoll reported.
/// Returns whether the parker's eventfd was among them. -1 on error.
int dispatch_events(PyObject* self, loop_state& st, int n) {
  int signalled = 0;
  for (int i = 0; i < n; ++i) {
    const epoll_event& ev = st.events[static_cast<std::size_t>(i)];
    if (ev.data.u64 == wake_token) {
      signalled = 1;
      continue;
    }
    if (ev.data.u64 == source_token) {
      st.source_signalled = true;
      continue;
    }
    const auto fd = static_cast<std::size_t>(ev.data.u64);
    if (fd >= st.fds.size() || st.fds[fd].events == 0) {
      continue;  // unregistered since the poll
    }
    if (PyObject* to = st.fds[fd].transport; to != nullptr) {
      // The transport runs from the ready queue like a reader handle would,
      // once per pass however many events it got.
      auto* t = reinterpret_cast<loop::transport_object*>(to);
      std::uint32_t mine = 0;
      if (t->want_read && (ev.events & ~static_cast<std::uint32_t>(EPOLLOUT)) != 0) {
        mine |= EPOLLIN;
      }
      if (t->want_write && (ev.events & ~static_cast<std::uint32_t>(EPOLLIN)) != 0) {
        mine |= EPOLLOUT;
      }
      if (mine != 0) {
        t->pending |= mine;
        if (!t->queued) {
          t->queued = true;
          st.ready.push_back(Py_NewRef(to));
        }
      }
    }
    // As selectors.EpollSelector: anything but "only writable" wakes the
    // reader, anything but "only readable" wakes the writer (errors, hangups).
    for (const bool writer : {false, true}) {
      const std::uint32_t others = writer ? ~static_cast<std::uint32_t>(EPOLLIN)
                                          : ~static_cast<std::uint32_t>(EPOLLOUT);
      if ((ev.events & others) == 0) {
        continue;
      }
      PyObject* h = writer ? st.fds[fd].writer : st.fds[fd].reader;
      if (h == nullptr) {
        continue;
      }
      if (reinterpret_cast<handle_object*>(h)->cancelled) {
        PyObject* fdo = PyLong_FromSize_t(fd);
        if (fdo == nullptr) {
          return -1;
        }
        PyObject* r = remove_interest(self, fdo, writer);
        Py_DECREF(fdo);
        if (r == nullptr) {
          return -1;
        }
        Py_DECREF(r);
      } else {
        st.ready.push_back(Py_NewRef(h));
      }
    }
  }
  return signalled;
}

int timeout_ms_for(double seconds) {
  seconds = std::min(seconds, max_poll_seconds);
  // Rounded up, as asyncio does, so a wake-up never comes before the timer is due.
  return static_cast<int>(std::ceil(seconds * 1e3));
}

/// Spin before park: with the GIL released, watch the cross-thread queue and
/// (if there are fds) poll without blocking, for up to spin_us. Returns the
/// number of poll events found (>= 0), or -1 for "work arrived in the queue".
int spin(loop_state& st, int timeout_ms) {
  const double budget = std::min(static_cast<double>(st.spin_us) * 1e-6,
                                 timeout_ms < 0 ? max_poll_seconds : timeout_ms * 1e-3);
  const double deadline = monotonic_now() + budget;
  int found = 0;
  Py_BEGIN_ALLOW_THREADS
  for (unsigned i = 0;; ++i) {
    if (!st.xthread.empty()) {
      found = -1;
      break;
    }
    if (st.fds_registered > 0 && i % 16 == 15) {
      const int n = st.poller.wait(st.events, 0);
      if (n != 0) {
        found = n;
        break;
      }
    }
    if (monotonic_now() >= deadline) {
      break;
    }
    runtime::cpu_relax();
  }
  Py_END_ALLOW_THREADS
  return found;
}

bool should_spin(loop_state& st) {
  if (st.spin_us == 0) {
    return false;
  }
  if (!st.adaptive_spin || st.spin_misses_in_row < 8) {
    return true;
  }
  // Adaptive: after a run of fruitless spins, spin only every 16th park to
  // notice when traffic comes back.
  return ++st.parks_since_probe % 16 == 0;
}

/// One pass of the loop, with asyncio's _run_once semantics: poll (blocking
/// only if nothing is ready), queue I/O callbacks and due timers, then run
/// exactly the callbacks that were ready at that point.
PyObject* loop_run_once(PyObject* self, PyObject*) {
  loop_state& st = state_of(self);
  if (st.released) {
    return closed_error();
  }
  ++st.ticks;
  drain_xthread(st);
  // Writes made while the loop was not running (before run_forever, between
  // run_until_complete calls) have not been flushed yet.
  if (!st.flush_list.empty() && loop::flush_transports(st) < 0) {
    return nullptr;
  }

  // The source runs after the cross-thread queue; work it handled (eager
  // tasks, callbacks scheduled) means no sleep this pass.
  int sourced = 0;
  if (st.source != nullptr && (sourced = st.source->run()) < 0) {
    return nullptr;
  }
  int timeout_ms = -1;
  if (!st.ready.empty() || st.stopping || sourced > 0) {
    timeout_ms = 0;
  } else if (!st.timers.empty()) {
    const double delay = st.timers.top_when() - monotonic_now();
    timeout_ms = delay <= 0 ? 0 : timeout_ms_for(delay);
  }

  int n = 0;
  bool parked = false;
  if (timeout_ms != 0 && should_spin(st)) {
    ++st.spins;
    n = spin(st, timeout_ms);
    if (n != 0) {
      ++st.spin_hits;
      st.spin_misses_in_row = 0;
      if (n < 0) {
        n = 0;
      }
      timeout_ms = 0;
      ++st.polls;
    } else {
      ++st.spin_misses_in_row;
    }
  }
  if (timeout_ms != 0) {
    // Check before park, consumer side: announce the sleep, then look at the
    // cross-thread queue once more; a producer that pushed before the
    // announcement is seen here, one that pushes after sees `parked`.
    // Python producers of this interpreter hold its GIL, which this thread
    // keeps until the poll below, so for them the GIL alone orders push and
    // park; the re-check is what keeps producers that do not take this GIL
    // (C++ threads, the I/O thread's ring) from losing a wake-up.
    // An attached source announces on its own parker after ours and
    // re-checks its own ring; if it found work, ours is withdrawn.
    bool may_sleep = st.parker.try_park([&] { return !st.xthread.empty(); });
    if (may_sleep && st.source != nullptr && !st.source->try_park()) {
      st.parker.cancel_park();
      may_sleep = false;
    }
    if (may_sleep) {
      parked = true;
      ++st.parks;
    } else {
      timeout_ms = 0;
    }
  }
  if (parked) {
    Py_BEGIN_ALLOW_THREADS
    n = st.poller.wait(st.events, timeout_ms);
    Py_END_ALLOW_THREADS
    ++st.polls;
  } else if (timeout_ms == 0 && n == 0) {
    if (st.fds_registered == 0) {
      // Nothing to poll for: the cross-thread queue is read directly, so a
      // non-blocking poll could only find the eventfd. Skip the system call.
      ++st.polls_elided;
    } else {
      n = st.poller.wait(st.events, 0);
      ++st.polls;
    }
  }
  st.source_signalled = false;
  if (n < 0) {
    if (parked) {
      st.parker.unpark(false);
      if (st.source != nullptr) {
        st.source->unpark(false);
      }
    }
    errno = -n;
    return PyErr_SetFromErrno(PyExc_OSError);
  }
  const int signalled = dispatch_events(self, st, n);
  if (parked) {
    st.parker.unpark(signalled > 0);
    if (st.source != nullptr) {
      st.source->unpark(st.source_signalled);
    }
  }
  if (signalled < 0) {
    return nullptr;
  }
  // An interrupted poll returns no events; let Python run its signal
  // handlers now (KeyboardInterrupt leaves run_forever from here).
  if (parked && PyErr_CheckSignals() < 0) {
    return nullptr;
  }
  drain_xthread(st);
  if (st.source != nullptr && st.source->run() < 0) {
    return nullptr;
  }

  // Due timers, in deadline order; the heap's reference moves to the queue.
  const double end_time = monotonic_now() + 1e-9;
  while (!st.timers.empty() && st.timers.top_when() < end_time) {
    timer_handle_object* t = st.timers.pop();
    st.ready.push_back(reinterpret_cast<PyObject*>(t));
    ++st.timers_fired;
  }

  // Only what is ready now; callbacks scheduled by these run next pass.
  for (std::size_t todo = st.ready.size(); todo > 0 && !st.ready.empty(); --todo) {
    PyObject* item = st.ready.front();
    st.ready.pop_front();
    int rc = 0;
    if (reinterpret_cast<PyObject*>(Py_TYPE(item)) == st.transport_type) {
      rc = loop::transport_run_ready(st, reinterpret_cast<loop::transport_object*>(item));
    } else if (loop::is_own_handle(st, item)) {
      auto* h = reinterpret_cast<handle_object*>(item);
      if (!h->cancelled) {
        ++st.callbacks_dispatched;
        if (st.debug) {
          PyObject* r = PyObject_CallMethod(self, "_cadeloop_run_debug", "O", item);
          rc = r == nullptr ? -1 : 0;
          Py_XDECREF(r);
        } else {
          rc = loop::run_handle(h);
        }
      }
    } else {
      // A handle made by asyncio's Python code (signal handlers).
      ++st.callbacks_dispatched;
      PyObject* r = PyObject_CallMethod(self, "_cadeloop_run_foreign", "O", item);
      rc = r == nullptr ? -1 : 0;
      Py_XDECREF(r);
    }
    loop::release_handle(st, item);
    if (rc < 0) {
      return nullptr;
    }
  }
  // The writes this pass made go out now, one send per transport, before
  // the next poll.
  if (!st.flush_list.empty() && loop::flush_transports(st) < 0) {
    return nullptr;
  }
  if (st.source != nullptr) {
    st.source->end_of_pass();  // one published batch per pass
  }
  Py_RETURN_NONE;
}

/// _attach_source(capsule): joins a loop_source (capsule "cadeloop.loop_source",
/// whose context is the owner to keep alive) to every pass. Loop thread.
PyObject* loop_attach_source(PyObject* self, PyObject* capsule) {
  loop_state& st = state_of(self);
  auto* src = static_cast<loop_source*>(PyCapsule_GetPointer(capsule, "cadeloop.loop_source"));
  if (src == nullptr) {
    return nullptr;
  }
  if (st.source != nullptr || st.closed) {
    PyErr_SetString(PyExc_RuntimeError, st.closed ? "Event loop is closed" : "a source is already attached");
    return nullptr;
  }
  if (const std::error_code ec = st.poller.add(src->fd(), runtime::poller::readable, source_token); ec) {
    return os_error(ec);
  }
  PyObject* owner = static_cast<PyObject*>(PyCapsule_GetContext(capsule));
  st.source = src;
  st.source_owner = Py_NewRef(owner != nullptr ? owner : capsule);
  Py_RETURN_NONE;
}

/// _detach_source(): the attached source leaves the loop (no-op if none). Loop thread.
PyObject* loop_detach_source(PyObject* self, PyObject*) {
  loop_state& st = state_of(self);
  if (st.source != nullptr) {
    (void)st.poller.remove(st.source->fd());
    st.source = nullptr;
    release(std::exchange(st.source_owner, nullptr));
  }
  Py_RETURN_NONE;
}

/// _run_until_stopped(): run_forever's inner loop (passes until stop()),
/// without a Python frame per pass. Signal handlers still run between passes,
/// as they would between the bytecodes of asyncio's own loop.
PyObject* loop_run_until_stopped(PyObject* self, PyObject*) {
  loop_state& st = state_of(self);
  for (;;) {
    PyObject* r = loop_run_once(self, nullptr);
    if (r == nullptr) {
      return nullptr;
    }
    Py_DECREF(r);
    if (st.stopping) {
      break;
    }
    if (PyErr_CheckSignals() < 0) {
      return nullptr;
    }
  }
  Py_RETURN_NONE;
}

// ---------------------------------------------------------------- lifetime

/// Drops every Python object the core holds. Collects them first so no
/// finaliser runs while a structure is half updated.
void release_objects(loop_state& st) {
  std::vector<PyObject*> drop;
  drop.reserve(st.ready.size() + st.timers.size());
  for (PyObject* o : st.ready) {
    drop.push_back(o);
  }
  st.ready.clear();
  st.timers.clear([&](timer_handle_object* t) { drop.push_back(reinterpret_cast<PyObject*>(t)); });
  st.xthread.drain([&](PyObject*&& o) noexcept { drop.push_back(o); });
  for (PyObject* o : st.flush_list) {
    reinterpret_cast<loop::transport_object*>(o)->in_flush_list = false;
    drop.push_back(o);
  }
  st.flush_list.clear();
  for (std::size_t fd = 0; fd < st.fds.size(); ++fd) {
    fd_entry& e = st.fds[fd];
    if (e.events != 0) {
      (void)st.poller.remove(static_cast<int>(fd));
    }
    if (e.reader != nullptr) {
      drop.push_back(std::exchange(e.reader, nullptr));
    }
    if (e.writer != nullptr) {
      drop.push_back(std::exchange(e.writer, nullptr));
    }
    if (e.transport != nullptr) {
      reinterpret_cast<loop::transport_object*>(e.transport)->attached = false;
      --st.connections;
      drop.push_back(std::exchange(e.transport, nullptr));
    }
    e.events = 0;
  }
  st.fds_registered = 0;
  if (st.source != nullptr) {
    (void)st.poller.remove(st.source->fd());
    st.source = nullptr;
    drop.push_back(std::exchange(st.source_owner, nullptr));
  }
  for (PyObject* o : drop) {
    loop::release_handle(st, o);
  }
}

PyObject* loop_release_core(PyObject* self, PyObject*) {
  loop_state& st = state_of(self);
  st.closed = true;
  st.released = true;
  release_objects(st);
  Py_RETURN_NONE;
}

PyObject* loop_core_stats(PyObject* self, PyObject*) {
  loop_state& st = state_of(self);
  return Py_BuildValue(
      "{s:s,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:n,s:n,s:n,s:K,s:K,s:K,s:K}", "backend", "epoll",
      "ticks",
      static_cast<unsigned long long>(st.ticks), "polls", static_cast<unsigned long long>(st.polls),
      "polls_elided", static_cast<unsigned long long>(st.polls_elided), "callbacks_dispatched",
      static_cast<unsigned long long>(st.callbacks_dispatched), "timers_fired",
      static_cast<unsigned long long>(st.timers_fired), "xthread_items",
      static_cast<unsigned long long>(st.xthread_items), "wakeups_sent",
      static_cast<unsigned long long>(st.parker.wakeups_sent()), "spins",
      static_cast<unsigned long long>(st.spins), "spin_hits",
      static_cast<unsigned long long>(st.spin_hits), "parks", static_cast<unsigned long long>(st.parks),
      "ready_len", static_cast<Py_ssize_t>(st.ready.size()), "timers_len",
      static_cast<Py_ssize_t>(st.timers.size()), "fds_registered",
      static_cast<Py_ssize_t>(st.fds_registered), "bytes_received",
      static_cast<unsigned long long>(st.bytes_received), "bytes_sent",
      static_cast<unsigned long long>(st.bytes_sent), "sends_posted",
      static_cast<unsigned long long>(st.sends_posted), "connections",
      static_cast<unsigned long long>(st.connections));
}

PyObject* loop_set_spin(PyObject* self, PyObject* args) {
  unsigned int spin_us = 0;
  int adaptive = 0;
  if (!PyArg_ParseTuple(args, "Ip", &spin_us, &adaptive)) {
    return nullptr;
  }
  loop_state& st = state_of(self);
  st.spin_us = spin_us;
  st.adaptive_spin = adaptive != 0;
  Py_RETURN_NONE;
}

PyObject* get_flag(bool v) { return PyBool_FromLong(v); }
int set_flag(bool& target, PyObject* value) {
  if (value == nullptr) {
    PyErr_SetString(PyExc_AttributeError, "cannot delete a loop flag");
    return -1;
  }
  const int v = PyObject_IsTrue(value);
  if (v < 0) {
    return -1;
  }
  target = v != 0;
  return 0;
}
PyObject* get_closed(PyObject* self, void*) { return get_flag(state_of(self).closed); }
int set_closed(PyObject* self, PyObject* v, void*) { return set_flag(state_of(self).closed, v); }
PyObject* get_stopping(PyObject* self, void*) { return get_flag(state_of(self).stopping); }
int set_stopping(PyObject* self, PyObject* v, void*) { return set_flag(state_of(self).stopping, v); }
PyObject* get_debug(PyObject* self, void*) { return get_flag(state_of(self).debug); }
PyObject* get_task_factory(PyObject* self, void*) {
  PyObject* f = state_of(self).task_factory;
  return Py_NewRef(f != nullptr ? f : Py_None);
}
int set_task_factory(PyObject* self, PyObject* value, void*) {
  Py_XSETREF(state_of(self).task_factory, value == nullptr || value == Py_None ? nullptr : Py_NewRef(value));
  return 0;
}
int set_debug(PyObject* self, PyObject* v, void*) { return set_flag(state_of(self).debug, v); }

PyObject* loop_new(PyTypeObject* type, PyObject*, PyObject*) {
  PyObject* handle_type = PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "_handle_type");
  if (handle_type == nullptr) {
    return nullptr;
  }
  PyObject* timer_type = PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "_timer_handle_type");
  if (timer_type == nullptr) {
    Py_DECREF(handle_type);
    return nullptr;
  }
  PyObject* transport_type = PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "_transport_type");
  PyObject* names[3] = {PyUnicode_InternFromString("data_received"), PyUnicode_InternFromString("get_buffer"),
                        PyUnicode_InternFromString("buffer_updated")};
  PyObject* self = nullptr;
  if (transport_type != nullptr && names[0] != nullptr && names[1] != nullptr && names[2] != nullptr) {
    self = type->tp_alloc(type, 0);
  }
  if (self == nullptr) {
    Py_DECREF(handle_type);
    Py_DECREF(timer_type);
    Py_XDECREF(transport_type);
    for (PyObject* n : names) {
      Py_XDECREF(n);
    }
    return nullptr;
  }
  try {
    auto* st = new loop_state();
    st->handle_type = handle_type;
    st->timer_type = timer_type;
    st->transport_type = transport_type;
    st->str_data_received = names[0];
    st->str_get_buffer = names[1];
    st->str_buffer_updated = names[2];
    reinterpret_cast<loop_object*>(self)->state = st;
    st->str_context = PyUnicode_InternFromString("context");
    st->str_future = PyUnicode_InternFromString("Future");
    st->str_task = PyUnicode_InternFromString("Task");
    st->kw_loop = Py_BuildValue("(s)", "loop");
    st->futures_module = PyImport_ImportModule("asyncio.futures");
    st->tasks_module = PyImport_ImportModule("asyncio.tasks");
    if (st->str_context == nullptr || st->str_future == nullptr || st->str_task == nullptr ||
        st->kw_loop == nullptr || st->futures_module == nullptr || st->tasks_module == nullptr) {
      Py_DECREF(self);  // dealloc drops what was made
      return nullptr;
    }
  } catch (const std::system_error& e) {
    Py_DECREF(handle_type);
    Py_DECREF(timer_type);
    Py_DECREF(transport_type);
    for (PyObject* n : names) {
      Py_DECREF(n);
    }
    Py_DECREF(self);
    errno = e.code().value();
    return PyErr_SetFromErrno(PyExc_OSError);
  } catch (const std::bad_alloc&) {
    Py_DECREF(handle_type);
    Py_DECREF(timer_type);
    Py_DECREF(transport_type);
    for (PyObject* n : names) {
      Py_DECREF(n);
    }
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  return self;
}

int loop_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  loop_state* st = reinterpret_cast<loop_object*>(self)->state;
  if (st == nullptr) {
    return 0;
  }
  for (PyObject* o : st->ready) {
    if (const int rc = loop::traverse_held(*st, o, visit, arg); rc != 0) {
      return rc;
    }
  }
  int rc = 0;
  st->timers.for_each([&](timer_handle_object* t) {
    if (rc == 0) {
      rc = loop::traverse_held(*st, reinterpret_cast<PyObject*>(t), visit, arg);
    }
  });
  if (rc != 0) {
    return rc;
  }
  for (const fd_entry& e : st->fds) {
    if (e.reader != nullptr && (rc = loop::traverse_held(*st, e.reader, visit, arg)) != 0) {
      return rc;
    }
    if (e.writer != nullptr && (rc = loop::traverse_held(*st, e.writer, visit, arg)) != 0) {
      return rc;
    }
    Py_VISIT(e.transport);
  }
  for (PyObject* o : st->flush_list) {
    Py_VISIT(o);
  }
  Py_VISIT(st->handle_type);
  Py_VISIT(st->timer_type);
  Py_VISIT(st->transport_type);
  Py_VISIT(st->task_factory);
  Py_VISIT(st->futures_module);
  Py_VISIT(st->tasks_module);
  Py_VISIT(st->source_owner);
  return 0;
}

int loop_clear(PyObject* self) {
  loop_state* st = reinterpret_cast<loop_object*>(self)->state;
  if (st != nullptr) {
    st->closed = true;
    st->released = true;
    release_objects(*st);
    Py_CLEAR(st->task_factory);
  }
  return 0;
}

void loop_dealloc(PyObject* self) {
  PyTypeObject* tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  auto* lo = reinterpret_cast<loop_object*>(self);
  if (lo->state != nullptr) {
    release_objects(*lo->state);
    Py_CLEAR(lo->state->handle_type);
    Py_CLEAR(lo->state->timer_type);
    Py_CLEAR(lo->state->transport_type);
    Py_CLEAR(lo->state->str_data_received);
    Py_CLEAR(lo->state->str_get_buffer);
    Py_CLEAR(lo->state->str_buffer_updated);
    Py_CLEAR(lo->state->str_context);
    Py_CLEAR(lo->state->str_future);
    Py_CLEAR(lo->state->str_task);
    Py_CLEAR(lo->state->kw_loop);
    Py_CLEAR(lo->state->futures_module);
    Py_CLEAR(lo->state->tasks_module);
    Py_CLEAR(lo->state->task_factory);
    delete std::exchange(lo->state, nullptr);
  }
  tp->tp_free(self);
  Py_DECREF(tp);
}

PyMethodDef loop_methods[] = {
    {"call_soon", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(loop_call_soon)),
     METH_FASTCALL | METH_KEYWORDS,
     "call_soon(callback, *args, context=None) -> Handle: run callback on the next pass. Loop thread."},
    {"call_soon_threadsafe",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(loop_call_soon_threadsafe)),
     METH_FASTCALL | METH_KEYWORDS,
     "call_soon_threadsafe(callback, *args, context=None) -> Handle. Any thread of this interpreter; "
     "wakes the loop (one eventfd write) only if it is parked."},
    {"call_later", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(loop_call_later)),
     METH_FASTCALL | METH_KEYWORDS, "call_later(delay, callback, *args, context=None) -> TimerHandle."},
    {"call_at", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(loop_call_at)),
     METH_FASTCALL | METH_KEYWORDS, "call_at(when, callback, *args, context=None) -> TimerHandle."},
    {"time", loop_time, METH_NOARGS, "The loop's clock (CLOCK_MONOTONIC, as time.monotonic())."},
    {"get_debug", loop_get_debug, METH_NOARGS, "Whether the loop is in debug mode. Any thread."},
    {"create_future", loop_create_future, METH_NOARGS, "A new asyncio.Future bound to this loop. Loop thread."},
    {"create_task", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(loop_create_task)),
     METH_FASTCALL | METH_KEYWORDS,
     "create_task(coro, *, name=None, context=None) -> Task: schedule a coroutine. Loop thread."},
    {"_run_once", loop_run_once, METH_NOARGS, nullptr},
    {"_run_until_stopped", loop_run_until_stopped, METH_NOARGS, nullptr},
    {"_add_callback", loop_add_callback, METH_O, nullptr},
    {"_timer_handle_cancelled", loop_timer_handle_cancelled, METH_O, nullptr},
    {"_add_reader", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(loop_add_reader)),
     METH_FASTCALL, nullptr},
    {"_add_writer", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(loop_add_writer)),
     METH_FASTCALL, nullptr},
    {"_remove_reader", loop_remove_reader, METH_O, nullptr},
    {"_remove_writer", loop_remove_writer, METH_O, nullptr},
    {"_fd_key", loop_fd_key, METH_O, nullptr},
    {"_fd_list", loop_fd_list, METH_NOARGS, nullptr},
    {"_wake", loop_wake, METH_NOARGS, nullptr},
    {"_make_transport_core",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(loop_make_transport_core)), METH_FASTCALL,
     nullptr},
    {"_release_core", loop_release_core, METH_NOARGS, nullptr},
    {"_core_stats", loop_core_stats, METH_NOARGS, nullptr},
    {"_set_spin", loop_set_spin, METH_VARARGS, nullptr},
    {"_attach_source", loop_attach_source, METH_O, nullptr},
    {"_detach_source", loop_detach_source, METH_NOARGS, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef loop_getsets[] = {
    {"_closed", get_closed, set_closed, nullptr, nullptr},
    {"_stopping", get_stopping, set_stopping, nullptr, nullptr},
    {"_debug", get_debug, set_debug, nullptr, nullptr},
    {"_task_factory", get_task_factory, set_task_factory, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyType_Slot loop_slots[] = {
    {Py_tp_doc, const_cast<char*>("The C++ scheduling core of cadeloop.Loop; use cadeloop.Loop.")},
    {Py_tp_new, reinterpret_cast<void*>(loop_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(loop_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(loop_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(loop_clear)},
    {Py_tp_methods, loop_methods},
    {Py_tp_getset, loop_getsets},
    {0, nullptr},
};

PyType_Spec loop_spec = {"cadeloop._core.LoopCore", static_cast<int>(sizeof(loop_object)), 0,
                         Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, loop_slots};

}  // namespace

namespace loop {

bool update_interest(loop_state& st, int fd) {
  fd_entry* e = entry_for(st, fd, false);
  if (e == nullptr) {
    return true;
  }
  return apply_interest(st, fd, *e, desired_events(*e));
}

loop_state::loop_state() : events(256) {
  const std::error_code ec = poller.add(parker.fd(), runtime::poller::readable, wake_token);
  if (ec) {
    throw std::system_error(ec, "epoll_ctl(eventfd)");
  }
}

}  // namespace loop

void register_loop(pybind11::module_& m) {
  PyObject* module = m.ptr();
  PyObject* handle_type = nullptr;
  PyObject* timer_type = nullptr;
  PyObject* transport_type = nullptr;
  if (loop::add_handle_types(module, &handle_type, &timer_type) < 0 ||
      loop::add_transport_type(module, &transport_type) < 0) {
    Py_XDECREF(handle_type);
    Py_XDECREF(timer_type);
    Py_XDECREF(transport_type);
    throw pybind11::error_already_set();
  }
  PyObject* loop_type = PyType_FromModuleAndSpec(module, &loop_spec, nullptr);
  bool ok = loop_type != nullptr &&
            PyObject_SetAttrString(loop_type, "_handle_type", handle_type) == 0 &&
            PyObject_SetAttrString(loop_type, "_timer_handle_type", timer_type) == 0 &&
            PyObject_SetAttrString(loop_type, "_transport_type", transport_type) == 0 &&
            PyModule_AddObjectRef(module, "LoopCore", loop_type) == 0;
  Py_XDECREF(loop_type);
  Py_DECREF(handle_type);
  Py_DECREF(timer_type);
  Py_DECREF(transport_type);
  if (!ok) {
    throw pybind11::error_already_set();
  }
}

}  // namespace cadeloop::pyhost
