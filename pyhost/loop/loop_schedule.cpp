// LoopCore's scheduling API: call_soon, call_soon_threadsafe (the one
// cross-thread entry: the ready queue under the GIL plus a wake-up only when
// the loop is parked),
// call_later/call_at on the timer heap, time(), create_future/create_task,
// and the handles asyncio's own code hands in (_add_callback,
// _timer_handle_cancelled). make_handle() lives here, beside call_soon, its
// caller per callback.
#include <cstddef>
#include <new>

#include "loop/loop_methods.hpp"

namespace cadeloop::pyhost::loop {

namespace {

/// Splits call_soon-style arguments: positional `fixed` leading arguments,
/// then the callback and its args, then an optional keyword `context`.
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

/// Appends to the ready queue after whatever other threads queued before:
/// a call_soon_threadsafe that happened before this call_soon (same thread,
/// or another thread ordered by a lock) runs first, as with asyncio. Costs
/// one atomic load when the cross-thread queue is empty.
void push_ready(loop_state& st, PyObject* h) {
  if (!st.gil_xthread.empty() || !st.xthread.empty()) {
    drain_xthread(st);
  }
  st.ready.push_back(h);
}

PyObject* schedule_at(PyObject* self, loop_state& st, double when, const call_args& a,
                      const char* name) {
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

/// module.<name>, looked up at each call as asyncio's own code does (tests
/// and instrumentation replace asyncio.tasks.Task and futures.Future).
PyObject* module_attr(PyObject* module, PyObject* name) {
  return PyObject_GetAttr(module, name);
}

}  // namespace

/// Makes a Handle (or the handle part of a TimerHandle); returns a new reference.
PyObject* make_handle(PyObject* self, loop_state& st, PyObject* type, const call_args& a) {
  PyObject* args = PyTuple_New(a.nargs);
  if (args == nullptr) {
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < a.nargs; ++i) {
    PyTuple_SET_ITEM(args, i, Py_NewRef(a.args[i]));
  }
  PyObject* context = nullptr;
  if (a.context != nullptr) {
    context = Py_NewRef(a.context);
  } else {
    context = PyContext_CopyCurrent();
    if (context == nullptr) {
      Py_DECREF(args);
      return nullptr;
    }
    // The copy is the handle's alone, and the handle is not tracked while
    // the loop holds it (release_handle()): nor is the copy, or every
    // collection would walk the context of every queued callback (a burst
    // of call_soon_threadsafe spent most of its time in the collector). It
    // is tracked again the moment anything else may hold it: when the handle
    // is, and when the handle goes away while the copy lives on.
    if (PyObject_GC_IsTracked(context)) {
      PyObject_GC_UnTrack(context);
    }
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
  // release_handle().
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

PyObject* loop_call_soon(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                         PyObject* kwnames) {
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
  Py_INCREF(h);  // the queue's reference
  try {
#ifndef Py_GIL_DISABLED
    // The caller holds this interpreter's GIL, and the loop thread touches
    // gil_xthread only while it holds the same GIL: a plain vector, with no
    // node to allocate and no atomic exchange.
    st.gil_xthread.push_back(h);
    st.ready_pushed.store(true, std::memory_order_release);
#else
    st.xthread.push(h);
#endif
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
    Py_BEGIN_ALLOW_THREADS st.parker.wake();
    Py_END_ALLOW_THREADS
  }
  return h;
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

PyObject* loop_call_later(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                          PyObject* kwnames) {
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
  double now = 0;
  if (!loop_clock(self, st, now)) {
    return nullptr;
  }
  return schedule_at(self, st, now + delay, a, "call_later");
}

PyObject* loop_time(PyObject*, PyObject*) {
  return PyFloat_FromDouble(monotonic_now());
}

// Every Future and Task asks its loop get_debug() when it is made, and
// asyncio's Queue, gather and friends make futures through create_future():
// as C methods these cost no Python frame.

PyObject* loop_get_debug(PyObject* self, PyObject*) {
  return PyBool_FromLong(state_of(self).debug);
}

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
PyObject* loop_create_task(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                           PyObject* kwnames) {
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
  if (is_own_handle(st, handle)) {
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
    unschedule_timer(reinterpret_cast<timer_handle_object*>(handle));
  }
  Py_RETURN_NONE;
}

PyObject* loop_wake(PyObject* self, PyObject*) {
  state_of(self).parker.wake();
  Py_RETURN_NONE;
}

}  // namespace cadeloop::pyhost::loop
