// Handle and TimerHandle: asyncio's handle semantics (cancel, cancelled, when,
// get_context, _run) as C types. What is cold (repr, the exception report)
// calls back into cadeloop._loop so the wording stays asyncio's.
#include "loop/loop_core.hpp"  // Python.h first: 3.11's structmember.h needs it

#include <structmember.h>

namespace cadeloop::pyhost::loop {

namespace {

handle_object* as_handle(PyObject* o) { return reinterpret_cast<handle_object*>(o); }
timer_handle_object* as_timer(PyObject* o) { return reinterpret_cast<timer_handle_object*>(o); }


/// cadeloop._loop.<name>(args...): the Python half of cold paths.
PyObject* call_helper(const char* name, PyObject* a, PyObject* b = nullptr) {
  PyObject* mod = PyImport_ImportModule("cadeloop._loop");
  if (mod == nullptr) {
    return nullptr;
  }
  PyObject* fn = PyObject_GetAttrString(mod, name);
  Py_DECREF(mod);
  if (fn == nullptr) {
    return nullptr;
  }
  PyObject* res = b == nullptr ? PyObject_CallOneArg(fn, a) : PyObject_CallFunctionObjArgs(fn, a, b, nullptr);
  Py_DECREF(fn);
  return res;
}

int handle_traverse(PyObject* self, visitproc visit, void* arg) {
  handle_object* h = as_handle(self);
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(h->callback);
  Py_VISIT(h->args);
  Py_VISIT(h->loop);
  Py_VISIT(h->context);
  Py_VISIT(h->source_traceback);
  Py_VISIT(h->repr);
  return 0;
}

int handle_clear(PyObject* self) {
  handle_object* h = as_handle(self);
  Py_CLEAR(h->callback);
  Py_CLEAR(h->args);
  Py_CLEAR(h->loop);
  // A context copy the handle kept untracked (make_handle()) is tracked
  // again before it is let go: it may outlive the handle, and CPython's own
  // deallocator of a context expects it tracked.
  track_context(h->context);
  Py_CLEAR(h->context);
  Py_CLEAR(h->source_traceback);
  Py_CLEAR(h->repr);
  return 0;
}

void handle_dealloc(PyObject* self) {
  PyTypeObject* tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  if (as_handle(self)->weakrefs != nullptr) {
    PyObject_ClearWeakRefs(self);
  }
  handle_clear(self);
  tp->tp_free(self);
  Py_DECREF(tp);
}

PyObject* handle_cancel(PyObject* self, PyObject*) {
  handle_object* h = as_handle(self);
  if (h->cancelled) {
    Py_RETURN_NONE;
  }
  if (h->loop == nullptr) {  // cleared by the garbage collector
    h->cancelled = true;
    Py_RETURN_NONE;
  }
  if (Py_TYPE(self) == reinterpret_cast<PyTypeObject*>(state_of(h->loop).timer_type)) {
    unschedule_timer(as_timer(self));
  }
  h->cancelled = true;
  if (state_of(h->loop).debug) {
    // Keeps callback and arguments for the "Executing <Handle...> took" log.
    PyObject* r = PyObject_Repr(self);
    if (r == nullptr) {
      return nullptr;
    }
    Py_XSETREF(h->repr, r);
  }
  Py_CLEAR(h->callback);
  Py_CLEAR(h->args);
  Py_RETURN_NONE;
}

PyObject* handle_cancelled(PyObject* self, PyObject*) {
  return PyBool_FromLong(as_handle(self)->cancelled);
}

PyObject* handle_get_context(PyObject* self, PyObject*) {
  track_context(as_handle(self)->context);  // shared from now on
  return Py_NewRef(as_handle(self)->context);
}

PyObject* handle_run_method(PyObject* self, PyObject*) {
  if (run_handle(as_handle(self)) < 0) {
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* handle_repr_info(PyObject* self, PyObject*) { return call_helper("_handle_repr_info", self); }

PyObject* handle_repr(PyObject* self) {
  handle_object* h = as_handle(self);
  if (h->repr != nullptr) {
    return Py_NewRef(h->repr);
  }
  return call_helper("_handle_repr", self);
}

PyObject* timer_when(PyObject* self, PyObject*) { return PyFloat_FromDouble(as_timer(self)->when); }

Py_hash_t timer_hash(PyObject* self) {
  PyObject* w = PyFloat_FromDouble(as_timer(self)->when);
  if (w == nullptr) {
    return -1;
  }
  Py_hash_t hash = PyObject_Hash(w);
  Py_DECREF(w);
  return hash;
}

/// asyncio.TimerHandle's comparisons: by deadline, equal when deadline,
/// callback, arguments and cancelled state are.
PyObject* timer_richcompare(PyObject* self, PyObject* other, int op) {
  if (Py_TYPE(other) != Py_TYPE(self)) {
    Py_RETURN_NOTIMPLEMENTED;
  }
  timer_handle_object* a = as_timer(self);
  timer_handle_object* b = as_timer(other);
  auto equal = [&]() -> int {
    if (a->when != b->when || a->base.cancelled != b->base.cancelled) {
      return 0;
    }
    PyObject* ca = a->base.callback != nullptr ? a->base.callback : Py_None;
    PyObject* cb = b->base.callback != nullptr ? b->base.callback : Py_None;
    int r = PyObject_RichCompareBool(ca, cb, Py_EQ);
    if (r != 1) {
      return r;
    }
    PyObject* aa = a->base.args != nullptr ? a->base.args : Py_None;
    PyObject* ab = b->base.args != nullptr ? b->base.args : Py_None;
    return PyObject_RichCompareBool(aa, ab, Py_EQ);
  };
  int r = 0;
  switch (op) {
    case Py_LT:
      return PyBool_FromLong(a->when < b->when);
    case Py_GT:
      return PyBool_FromLong(a->when > b->when);
    case Py_LE:
      if (a->when < b->when) {
        Py_RETURN_TRUE;
      }
      r = equal();
      break;
    case Py_GE:
      if (a->when > b->when) {
        Py_RETURN_TRUE;
      }
      r = equal();
      break;
    case Py_EQ:
      r = equal();
      break;
    case Py_NE:
      r = equal();
      if (r >= 0) {
        r = !r;
      }
      break;
    default:
      Py_RETURN_NOTIMPLEMENTED;
  }
  if (r < 0) {
    return nullptr;
  }
  return PyBool_FromLong(r);
}

PyObject* get_obj(PyObject* o) { return Py_NewRef(o != nullptr ? o : Py_None); }
PyObject* get_callback(PyObject* self, void*) { return get_obj(as_handle(self)->callback); }
PyObject* get_args(PyObject* self, void*) { return get_obj(as_handle(self)->args); }
PyObject* get_loop(PyObject* self, void*) { return get_obj(as_handle(self)->loop); }
PyObject* get_context(PyObject* self, void*) {
  track_context(as_handle(self)->context);  // shared from now on
  return get_obj(as_handle(self)->context);
}
PyObject* get_cancelled(PyObject* self, void*) { return PyBool_FromLong(as_handle(self)->cancelled); }
PyObject* get_repr(PyObject* self, void*) { return get_obj(as_handle(self)->repr); }
PyObject* get_source_traceback(PyObject* self, void*) {
  return get_obj(as_handle(self)->source_traceback);
}
int set_source_traceback(PyObject* self, PyObject* value, void*) {
  Py_XSETREF(as_handle(self)->source_traceback,
             value == nullptr || value == Py_None ? nullptr : Py_NewRef(value));
  return 0;
}
PyObject* get_when(PyObject* self, void*) { return PyFloat_FromDouble(as_timer(self)->when); }
PyObject* get_scheduled(PyObject* self, void*) {
  return PyBool_FromLong(runtime::timer_heap<timer_handle_object>::contains(*as_timer(self)));
}

PyMethodDef handle_methods[] = {
    {"cancel", handle_cancel, METH_NOARGS, "Cancel the callback; a no-op if it already ran or was cancelled."},
    {"cancelled", handle_cancelled, METH_NOARGS, "Whether cancel() was called."},
    {"get_context", handle_get_context, METH_NOARGS, "The contextvars.Context the callback runs in."},
    {"_run", handle_run_method, METH_NOARGS, nullptr},
    {"_repr_info", handle_repr_info, METH_NOARGS, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

PyMethodDef timer_methods[] = {
    {"cancel", handle_cancel, METH_NOARGS, "Cancel the timer; it leaves the timer heap at once."},
    {"cancelled", handle_cancelled, METH_NOARGS, "Whether cancel() was called."},
    {"get_context", handle_get_context, METH_NOARGS, "The contextvars.Context the callback runs in."},
    {"when", timer_when, METH_NOARGS, "The scheduled time, on the loop.time() clock."},
    {"_run", handle_run_method, METH_NOARGS, nullptr},
    {"_repr_info", handle_repr_info, METH_NOARGS, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

#define CADELOOP_HANDLE_GETSETS                                                         \
  {"_callback", get_callback, nullptr, nullptr, nullptr},                               \
      {"_args", get_args, nullptr, nullptr, nullptr},                                   \
      {"_loop", get_loop, nullptr, nullptr, nullptr},                                   \
      {"_context", get_context, nullptr, nullptr, nullptr},                             \
      {"_cancelled", get_cancelled, nullptr, nullptr, nullptr},                         \
      {"_repr", get_repr, nullptr, nullptr, nullptr},                                   \
  {                                                                                     \
    "_source_traceback", get_source_traceback, set_source_traceback, nullptr, nullptr \
  }

PyGetSetDef handle_getsets[] = {
    CADELOOP_HANDLE_GETSETS,
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyGetSetDef timer_getsets[] = {
    CADELOOP_HANDLE_GETSETS,
    {"_when", get_when, nullptr, nullptr, nullptr},
    {"_scheduled", get_scheduled, nullptr, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyMemberDef handle_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(handle_object, weakrefs), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr},
};

PyMemberDef timer_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(handle_object, weakrefs), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr},
};

PyType_Slot handle_slots[] = {
    {Py_tp_doc, const_cast<char*>("A callback scheduled on a cadeloop loop (asyncio.Handle semantics).")},
    {Py_tp_dealloc, reinterpret_cast<void*>(handle_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(handle_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(handle_clear)},
    {Py_tp_repr, reinterpret_cast<void*>(handle_repr)},
    {Py_tp_methods, handle_methods},
    {Py_tp_getset, handle_getsets},
    {Py_tp_members, handle_members},
    {0, nullptr},
};

PyType_Slot timer_slots[] = {
    {Py_tp_doc, const_cast<char*>("A timed callback on a cadeloop loop (asyncio.TimerHandle semantics).")},
    {Py_tp_dealloc, reinterpret_cast<void*>(handle_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(handle_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(handle_clear)},
    {Py_tp_repr, reinterpret_cast<void*>(handle_repr)},
    {Py_tp_hash, reinterpret_cast<void*>(timer_hash)},
    {Py_tp_richcompare, reinterpret_cast<void*>(timer_richcompare)},
    {Py_tp_methods, timer_methods},
    {Py_tp_getset, timer_getsets},
    {Py_tp_members, timer_members},
    {0, nullptr},
};

// Handles are made only by the loop, so neither type has tp_new.
PyType_Spec handle_spec = {
    "cadeloop._core.Handle", static_cast<int>(sizeof(handle_object)), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION, handle_slots};

PyType_Spec timer_spec = {
    "cadeloop._core.TimerHandle", static_cast<int>(sizeof(timer_handle_object)), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION, timer_slots};

}  // namespace

int add_handle_types(PyObject* module, PyObject** handle_type, PyObject** timer_type) {
  *handle_type = PyType_FromModuleAndSpec(module, &handle_spec, nullptr);
  if (*handle_type == nullptr) {
    return -1;
  }
  *timer_type = PyType_FromModuleAndSpec(module, &timer_spec, nullptr);
  if (*timer_type == nullptr) {
    return -1;
  }
  if (PyModule_AddObjectRef(module, "Handle", *handle_type) < 0 ||
      PyModule_AddObjectRef(module, "TimerHandle", *timer_type) < 0) {
    return -1;
  }
  return 0;
}

int run_handle(handle_object* h) {
  // The callback may cancel its own handle, which drops h->callback and
  // h->args: hold them (and the handle) for the length of the call.
  PyObject* self = Py_NewRef(reinterpret_cast<PyObject*>(h));
  PyObject* callback = Py_NewRef(h->callback != nullptr ? h->callback : Py_None);
  PyObject* args = h->args != nullptr ? Py_NewRef(h->args) : PyTuple_New(0);
  if (args == nullptr) {
    Py_DECREF(callback);
    Py_DECREF(self);
    return -1;
  }
  PyObject* context = Py_NewRef(h->context);
  PyObject* result = nullptr;
  if (PyContext_Enter(context) == 0) {
    result = PyObject_Vectorcall(callback, &PyTuple_GET_ITEM(args, 0),
                                 static_cast<std::size_t>(PyTuple_GET_SIZE(args)), nullptr);
    if (PyContext_Exit(context) < 0) {
      Py_CLEAR(result);
    }
  }
  Py_DECREF(context);
  Py_DECREF(args);
  Py_DECREF(callback);
  int rc = 0;
  if (result != nullptr) {
    Py_DECREF(result);
  } else if (PyErr_ExceptionMatches(PyExc_SystemExit) || PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
    rc = -1;
  } else {
    PyObject* exc = take_exception();
    PyObject* r = call_helper("_report_callback_error", self, exc != nullptr ? exc : Py_None);
    Py_XDECREF(exc);
    if (r == nullptr) {
      rc = -1;
    } else {
      Py_DECREF(r);
    }
  }
  Py_DECREF(self);
  return rc;
}

int traverse_held(const loop_state& st, PyObject* o, visitproc visit, void* arg) {
  if (is_own_handle(st, o) && Py_REFCNT(o) == 1 && !PyObject_GC_IsTracked(o)) {
    handle_object* h = as_handle(o);
    PyObject* ctx = h->context;
    if (ctx != nullptr && Py_REFCNT(ctx) == 1 && !PyObject_GC_IsTracked(ctx)) {
      // The handle's own untracked context copy: its variables' values are
      // the loop's edges too, as the handle's callback and arguments are.
      Py_VISIT(Py_TYPE(o));
      Py_VISIT(h->callback);
      Py_VISIT(h->args);
      Py_VISIT(h->loop);
      Py_VISIT(h->source_traceback);
      Py_VISIT(h->repr);
      return Py_TYPE(ctx)->tp_traverse(ctx, visit, arg);
    }
    return handle_traverse(o, visit, arg);
  }
  return visit(o, arg);
}

void unschedule_timer(timer_handle_object* t) {
  loop_state& st = state_of(t->base.loop);
  // The heap's reference is dropped after the heap is consistent again; the
  // caller holds its own, so this never frees t.
  if (st.timers.remove(t)) {
    release_handle(st, reinterpret_cast<PyObject*>(t));
  }
}

}  // namespace cadeloop::pyhost::loop
