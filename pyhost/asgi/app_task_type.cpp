// The Python face of cadeloop._core.RequestTask (app_task.hpp): the methods
// and attributes of asyncio's Future and Task that apps and libraries use,
// `await task`, and the type's registration in the module. The step itself
// is in app_task.cpp.
#include "asgi/app_task_object.hpp"  // Python.h first

#include <structmember.h>

#include "py_exception.hpp"

namespace cadeloop::pyhost::server {

namespace {

using namespace task_detail;

/// A state's name: asyncio's `_state` (PENDING, ...), or lower case for repr().
const char* state_name(task_state s, bool lower = false) {
  static constexpr const char* names[2][3] = {{"PENDING", "CANCELLED", "FINISHED"},
                                              {"pending", "cancelled", "finished"}};
  return names[lower ? 1 : 0][static_cast<int>(s)];
}

// --------------------------------------------------------------- methods

PyObject* task_result(PyObject* self, PyObject* /*unused*/) {
  app_task* t = as_task(self);
  if (t->state == task_state::cancelled) {
    PyObject* exc = make_cancelled_error(t);
    if (exc != nullptr) {
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc);
      Py_DECREF(exc);
    }
    return nullptr;
  }
  if (t->state != task_state::finished) {
    PyErr_SetString(t->env->invalid_state_error, "Result is not ready.");
    return nullptr;
  }
  t->log_traceback = false;
  if (t->exception != nullptr) {
    restore_exception(Py_NewRef(t->exception));
    return nullptr;
  }
  return Py_NewRef(t->result != nullptr ? t->result : Py_None);
}

PyObject* task_exception(PyObject* self, PyObject* /*unused*/) {
  app_task* t = as_task(self);
  if (t->state == task_state::cancelled) {
    return task_result(self, nullptr);
  }
  if (t->state != task_state::finished) {
    PyErr_SetString(t->env->invalid_state_error, "Exception is not set.");
    return nullptr;
  }
  t->log_traceback = false;
  return Py_NewRef(t->exception != nullptr ? t->exception : Py_None);
}

PyObject* task_done_m(PyObject* self, PyObject* /*unused*/) {
  return PyBool_FromLong(static_cast<long>(as_task(self)->state != task_state::pending));
}

PyObject* task_cancelled(PyObject* self, PyObject* /*unused*/) {
  return PyBool_FromLong(static_cast<long>(as_task(self)->state == task_state::cancelled));
}

PyObject* task_add_done_callback(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                                 PyObject* kwnames) {
  app_task* t = as_task(self);
  const Py_ssize_t nkw = kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0;
  if (nargs != 1 || nkw > 1 ||
      (nkw == 1 &&
       PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "context") != 0)) {
    PyErr_SetString(PyExc_TypeError, "add_done_callback(fn, /, *, context=None)");
    return nullptr;
  }
  PyObject* fn = args[0];
  PyObject* context = nkw == 1 && args[1] != Py_None ? Py_NewRef(args[1]) : PyContext_CopyCurrent();
  if (context == nullptr) {
    return nullptr;
  }
  int rc = 0;
  if (t->state != task_state::pending) {
    rc = call_soon(t->env, fn, self, context);
  } else {
    if (t->callbacks == nullptr) {
      t->callbacks = PyList_New(0);
    }
    PyObject* item = t->callbacks != nullptr ? PyTuple_Pack(2, fn, context) : nullptr;
    rc = item != nullptr ? PyList_Append(t->callbacks, item) : -1;
    Py_XDECREF(item);
  }
  Py_DECREF(context);
  if (rc < 0) {
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* task_remove_done_callback(PyObject* self, PyObject* fn) {
  app_task* t = as_task(self);
  if (t->callbacks == nullptr) {
    return PyLong_FromLong(0);
  }
  PyObject* kept = PyList_New(0);
  if (kept == nullptr) {
    return nullptr;
  }
  long removed = 0;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(t->callbacks); ++i) {
    PyObject* item = PyList_GET_ITEM(t->callbacks, i);
    const int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(item, 0), fn, Py_EQ);
    if (same < 0 || (same == 0 && PyList_Append(kept, item) < 0)) {
      Py_DECREF(kept);
      return nullptr;
    }
    removed += same;
  }
  if (PyList_GET_SIZE(kept) == 0) {
    Py_CLEAR(kept);
  }
  Py_XSETREF(t->callbacks, kept);
  return PyLong_FromLong(removed);
}

PyObject* task_cancel(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  app_task* t = as_task(self);
  const Py_ssize_t nkw = kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0;
  if (nargs + nkw > 1 ||
      (nkw == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "msg") != 0)) {
    PyErr_SetString(PyExc_TypeError, "cancel(msg=None)");
    return nullptr;
  }
  PyObject* msg = nargs + nkw == 1 ? args[0] : Py_None;
  t->log_traceback = false;
  if (t->state != task_state::pending) {
    Py_RETURN_FALSE;
  }
  ++t->cancels_requested;
  if (t->fut_waiter != nullptr) {
    PyObject* waiter = Py_NewRef(t->fut_waiter);
    PyObject* cancelled = PyObject_CallMethodOneArg(waiter, t->env->s_cancel, msg);
    Py_DECREF(waiter);
    if (cancelled == nullptr) {
      return nullptr;
    }
    const int yes = PyObject_IsTrue(cancelled);
    Py_DECREF(cancelled);
    if (yes < 0) {
      return nullptr;
    }
    if (yes > 0) {
      // The waiter stays: it may be a task that ignores the cancellation.
      Py_RETURN_TRUE;
    }
  }
  t->must_cancel = true;
  Py_XSETREF(t->cancel_msg, Py_NewRef(msg));
  Py_RETURN_TRUE;
}

PyObject* task_cancelling(PyObject* self, PyObject* /*unused*/) {
  return PyLong_FromLong(as_task(self)->cancels_requested);
}

PyObject* task_uncancel(PyObject* self, PyObject* /*unused*/) {
  app_task* t = as_task(self);
  if (t->cancels_requested > 0) {
    --t->cancels_requested;
#if PY_VERSION_HEX >= 0x030D0000
    if (t->cancels_requested == 0) {
      t->must_cancel = false;
    }
#endif
  }
  return PyLong_FromLong(t->cancels_requested);
}

PyObject* task_get_loop(PyObject* self, PyObject* /*unused*/) {
  return Py_NewRef(as_task(self)->env->loop);
}

PyObject* task_get_coro(PyObject* self, PyObject* /*unused*/) {
  PyObject* coro = as_task(self)->coro;
  return Py_NewRef(coro != nullptr ? coro : Py_None);
}

PyObject* task_get_context(PyObject* self, PyObject* /*unused*/) {
  return Py_NewRef(as_task(self)->context);
}

PyObject* task_get_name(PyObject* self, PyObject* /*unused*/) {
  app_task* t = as_task(self);
  if (t->name == nullptr) {
    t->name = PyUnicode_FromFormat("cadeloop-request-%llu", static_cast<unsigned long long>(t->id));
  }
  return Py_XNewRef(t->name);
}

PyObject* task_set_name(PyObject* self, PyObject* value) {
  PyObject* name = PyObject_Str(value);
  if (name == nullptr) {
    return nullptr;
  }
  Py_XSETREF(as_task(self)->name, name);
  Py_RETURN_NONE;
}

/// asyncio.base_tasks' get_stack/print_stack (they read only _coro), with
/// the keyword arguments of asyncio.Task's: limit, and file for print_stack.
PyObject* call_base_tasks(const char* function, PyObject* self, PyObject* args, PyObject* kwargs,
                          bool takes_file) {
  PyObject* limit = Py_None;
  PyObject* file = Py_None;
  if (PyTuple_GET_SIZE(args) != 0) {
    PyErr_SetString(PyExc_TypeError, "takes keyword arguments only");
    return nullptr;
  }
  if (kwargs != nullptr) {
    Py_ssize_t pos = 0;
    PyObject* key = nullptr;
    PyObject* value = nullptr;
    while (PyDict_Next(kwargs, &pos, &key, &value) != 0) {
      if (PyUnicode_CompareWithASCIIString(key, "limit") == 0) {
        limit = value;
      } else if (takes_file && PyUnicode_CompareWithASCIIString(key, "file") == 0) {
        file = value;
      } else {
        PyErr_Format(PyExc_TypeError, "unexpected keyword argument %R", key);
        return nullptr;
      }
    }
  }
  PyObject* module = PyImport_ImportModule("asyncio.base_tasks");
  PyObject* fn = module != nullptr ? PyObject_GetAttrString(module, function) : nullptr;
  Py_XDECREF(module);
  if (fn == nullptr) {
    return nullptr;
  }
  PyObject* res = takes_file ? PyObject_CallFunctionObjArgs(fn, self, limit, file, nullptr)
                             : PyObject_CallFunctionObjArgs(fn, self, limit, nullptr);
  Py_DECREF(fn);
  return res;
}

PyObject* task_get_stack(PyObject* self, PyObject* args, PyObject* kwargs) {
  return call_base_tasks("_task_get_stack", self, args, kwargs, false);
}

PyObject* task_print_stack(PyObject* self, PyObject* args, PyObject* kwargs) {
  return call_base_tasks("_task_print_stack", self, args, kwargs, true);
}

PyObject* task_set_result(PyObject* /*self*/, PyObject* /*unused*/) {
  PyErr_SetString(PyExc_RuntimeError, "Task does not support set_result() operation");
  return nullptr;
}

PyObject* task_set_exception(PyObject* /*self*/, PyObject* /*unused*/) {
  PyErr_SetString(PyExc_RuntimeError, "Task does not support set_exception() operation");
  return nullptr;
}

PyObject* task_await(PyObject* self) {
  auto* it =
      PyObject_GC_New(task_iter, reinterpret_cast<PyTypeObject*>(as_task(self)->env->iter_type));
  if (it == nullptr) {
    return nullptr;
  }
  it->task = as_task(Py_NewRef(self));
  PyObject_GC_Track(it);
  return reinterpret_cast<PyObject*>(it);
}

PyObject* task_repr(PyObject* self) {
  app_task* t = as_task(self);
  PyObject* name = task_get_name(self, nullptr);
  if (name == nullptr) {
    return nullptr;
  }
  const char* state = state_name(t->state, true);
  PyObject* coro = t->coro != nullptr ? t->coro : Py_None;
  PyObject* repr =
      PyUnicode_FromFormat("<%s %s name=%R coro=%R>", Py_TYPE(self)->tp_name, state, name, coro);
  Py_DECREF(name);
  return repr;
}

// Attributes of asyncio's pure-Python Future and Task that libraries read.
PyObject* get_blocking(PyObject* self, void* /*unused*/) {
  return PyBool_FromLong(static_cast<long>(as_task(self)->blocking));
}

/// A setter's value as a bool in `out`: 0, or -1 (an error set) when the
/// attribute is deleted or the value has no truth.
int truth_of(PyObject* value, bool& out) {
  if (value == nullptr) {
    PyErr_SetString(PyExc_AttributeError, "cannot delete attribute");
    return -1;
  }
  const int yes = PyObject_IsTrue(value);
  if (yes < 0) {
    return -1;
  }
  out = yes != 0;
  return 0;
}

int set_blocking(PyObject* self, PyObject* value, void* /*unused*/) {
  return truth_of(value, as_task(self)->blocking);
}

PyObject* get_log_traceback(PyObject* self, void* /*unused*/) {
  return PyBool_FromLong(static_cast<long>(as_task(self)->log_traceback));
}

int set_log_traceback(PyObject* self, PyObject* value, void* /*unused*/) {
  bool yes = false;
  if (truth_of(value, yes) < 0) {
    return -1;
  }
  if (yes) {
    PyErr_SetString(PyExc_ValueError, "_log_traceback can only be set to False");
    return -1;
  }
  as_task(self)->log_traceback = false;
  return 0;
}

PyObject* or_none(PyObject* o) {
  return Py_NewRef(o != nullptr ? o : Py_None);
}

PyObject* get_loop_attr(PyObject* self, void* /*unused*/) {
  return Py_NewRef(as_task(self)->env->loop);
}
PyObject* get_state(PyObject* self, void* /*unused*/) {
  return PyUnicode_FromString(state_name(as_task(self)->state));
}
PyObject* get_result_attr(PyObject* self, void* /*unused*/) {
  return or_none(as_task(self)->result);
}
PyObject* get_exception_attr(PyObject* self, void* /*unused*/) {
  return or_none(as_task(self)->exception);
}
PyObject* get_callbacks(PyObject* self, void* /*unused*/) {
  PyObject* cbs = as_task(self)->callbacks;
  return cbs != nullptr ? PyList_GetSlice(cbs, 0, PyList_GET_SIZE(cbs)) : Py_NewRef(Py_None);
}
PyObject* get_none(PyObject* /*self*/, void* /*unused*/) {
  Py_RETURN_NONE;
}
PyObject* get_cancel_message(PyObject* self, void* /*unused*/) {
  return or_none(as_task(self)->cancel_msg);
}
int set_cancel_message(PyObject* self, PyObject* value, void* /*unused*/) {
  if (value == nullptr) {
    PyErr_SetString(PyExc_AttributeError, "cannot delete attribute");
    return -1;
  }
  Py_XSETREF(as_task(self)->cancel_msg, Py_NewRef(value));
  return 0;
}
PyObject* get_fut_waiter(PyObject* self, void* /*unused*/) {
  return or_none(as_task(self)->fut_waiter);
}
PyObject* get_must_cancel(PyObject* self, void* /*unused*/) {
  return PyBool_FromLong(static_cast<long>(as_task(self)->must_cancel));
}
PyObject* get_coro_attr(PyObject* self, void* /*unused*/) {
  return or_none(as_task(self)->coro);
}
PyObject* get_cancels_requested(PyObject* self, void* /*unused*/) {
  return PyLong_FromLong(as_task(self)->cancels_requested);
}

PyGetSetDef task_getset[] = {
    {"_asyncio_future_blocking", get_blocking, set_blocking, nullptr, nullptr},
    {"_log_traceback", get_log_traceback, set_log_traceback, nullptr, nullptr},
    {"_loop", get_loop_attr, nullptr, nullptr, nullptr},
    {"_state", get_state, nullptr, nullptr, nullptr},
    {"_result", get_result_attr, nullptr, nullptr, nullptr},
    {"_exception", get_exception_attr, nullptr, nullptr, nullptr},
    {"_callbacks", get_callbacks, nullptr, nullptr, nullptr},
    {"_source_traceback", get_none, nullptr, nullptr, nullptr},
    {"_cancel_message", get_cancel_message, set_cancel_message, nullptr, nullptr},
    {"_fut_waiter", get_fut_waiter, nullptr, nullptr, nullptr},
    {"_must_cancel", get_must_cancel, nullptr, nullptr, nullptr},
    {"_coro", get_coro_attr, nullptr, nullptr, nullptr},
    {"_num_cancels_requested", get_cancels_requested, nullptr, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyMethodDef task_methods[] = {
    {"result", task_result, METH_NOARGS, "The coroutine's result (or its exception raised)."},
    {"exception", task_exception, METH_NOARGS, "The coroutine's exception, or None."},
    {"done", task_done_m, METH_NOARGS, "Whether the task ended."},
    {"cancelled", task_cancelled, METH_NOARGS, "Whether the task was cancelled."},
    {"add_done_callback",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(task_add_done_callback)),
     METH_FASTCALL | METH_KEYWORDS, "Calls fn(task) soon after the task ends."},
    {"remove_done_callback", task_remove_done_callback, METH_O,
     "Removes fn from the done callbacks; returns how many were removed."},
    {"cancel", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(task_cancel)),
     METH_FASTCALL | METH_KEYWORDS, "Asks the task to end with CancelledError."},
    {"cancelling", task_cancelling, METH_NOARGS, "Pending cancel() requests."},
    {"uncancel", task_uncancel, METH_NOARGS, "Takes back one cancel() request."},
    {"get_loop", task_get_loop, METH_NOARGS, "The task's loop."},
    {"get_coro", task_get_coro, METH_NOARGS, "The app's coroutine."},
    {"get_context", task_get_context, METH_NOARGS, "The Context the task runs in."},
    {"get_name", task_get_name, METH_NOARGS, "The task's name."},
    {"set_name", task_set_name, METH_O, "Renames the task."},
    {"get_stack", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(task_get_stack)),
     METH_VARARGS | METH_KEYWORDS, "The coroutine's frames (asyncio.Task.get_stack)."},
    {"print_stack", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(task_print_stack)),
     METH_VARARGS | METH_KEYWORDS, "Prints the coroutine's stack (asyncio.Task.print_stack)."},
    {"set_result", task_set_result, METH_O, "Not supported, as for asyncio.Task."},
    {"set_exception", task_set_exception, METH_O, "Not supported, as for asyncio.Task."},
    {"__class_getitem__", Py_GenericAlias, METH_O | METH_CLASS, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

PyMemberDef task_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(app_task, weakrefs), READONLY, nullptr},
    {"__dictoffset__", T_PYSSIZET, offsetof(app_task, dict), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr},
};

int task_traverse(PyObject* self, visitproc visit, void* arg) {
  app_task* t = as_task(self);
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(t->coro);
  Py_VISIT(t->context);
  Py_VISIT(t->result);
  Py_VISIT(t->exception);
  Py_VISIT(t->cancel_msg);
  Py_VISIT(t->cancelled_exc);
  Py_VISIT(t->fut_waiter);
  Py_VISIT(t->name);
  Py_VISIT(t->callbacks);
  Py_VISIT(t->owner);
  Py_VISIT(t->dict);
  return 0;
}

int task_clear(PyObject* self) {
  app_task* t = as_task(self);
  Py_CLEAR(t->coro);
  Py_CLEAR(t->context);
  Py_CLEAR(t->result);
  Py_CLEAR(t->exception);
  Py_CLEAR(t->cancel_msg);
  Py_CLEAR(t->cancelled_exc);
  Py_CLEAR(t->fut_waiter);
  Py_CLEAR(t->name);
  Py_CLEAR(t->callbacks);
  Py_CLEAR(t->owner);
  Py_CLEAR(t->dict);
  return 0;
}

void task_dealloc(PyObject* self) {
  PyTypeObject* tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  app_task* t = as_task(self);
  PyObject* error = take_exception();
  unregister(t);
  restore_exception(error);
  if (t->weakrefs != nullptr) {
    PyObject_ClearWeakRefs(self);
  }
  task_clear(self);
  app_task_env_release(t->env);
  tp->tp_free(self);
  Py_DECREF(tp);
}

PyType_Slot task_slots[] = {
    {Py_tp_doc, const_cast<char*>("The task a request's ASGI app runs in (an asyncio.Task for "
                                  "what apps and libraries use of one).")},
    {Py_tp_dealloc, reinterpret_cast<void*>(task_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(task_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(task_clear)},
    {Py_tp_repr, reinterpret_cast<void*>(task_repr)},
    {Py_tp_methods, task_methods},
    {Py_tp_getset, task_getset},
    {Py_tp_members, task_members},
    {Py_am_await, reinterpret_cast<void*>(task_await)},
    {Py_tp_iter, reinterpret_cast<void*>(task_await)},
    {0, nullptr},
};

PyType_Spec task_spec = {"cadeloop._core.RequestTask", static_cast<int>(sizeof(app_task)), 0,
                         Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, task_slots};

// --------------------------------------------------------------- await

PySendResult iter_send(PyObject* self, PyObject* /*arg*/, PyObject** result) {
  auto* it = reinterpret_cast<task_iter*>(self);
  *result = nullptr;
  app_task* t = it->task;
  if (t == nullptr) {
    return PYGEN_ERROR;
  }
  if (t->state == task_state::pending) {
    if (!t->blocking) {
      t->blocking = true;
      *result = Py_NewRef(reinterpret_cast<PyObject*>(t));
      return PYGEN_NEXT;
    }
    PyErr_SetString(PyExc_RuntimeError, "await wasn't used with future");
    return PYGEN_ERROR;
  }
  it->task = nullptr;
  PyObject* res = task_result(reinterpret_cast<PyObject*>(t), nullptr);
  Py_DECREF(t);
  if (res == nullptr) {
    return PYGEN_ERROR;
  }
  *result = res;
  return PYGEN_RETURN;
}

PyObject* iter_next(PyObject* self) {
  PyObject* result = nullptr;
  switch (iter_send(self, Py_None, &result)) {
    case PYGEN_NEXT:
      return result;
    case PYGEN_RETURN:
      if (result != Py_None) {
        PyObject* args = PyTuple_Pack(1, result);
        if (args != nullptr) {
          PyErr_SetObject(PyExc_StopIteration, args);
          Py_DECREF(args);
        }
      }
      Py_DECREF(result);
      return nullptr;
    case PYGEN_ERROR:
      break;
  }
  return nullptr;
}

PyObject* iter_self(PyObject* self) {
  return Py_NewRef(self);
}

int iter_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(reinterpret_cast<PyObject*>(reinterpret_cast<task_iter*>(self)->task));
  return 0;
}

int iter_clear(PyObject* self) {
  auto* it = reinterpret_cast<task_iter*>(self);
  PyObject* t = reinterpret_cast<PyObject*>(it->task);
  it->task = nullptr;
  Py_XDECREF(t);
  return 0;
}

void iter_dealloc(PyObject* self) {
  PyTypeObject* tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  iter_clear(self);
  tp->tp_free(self);
  Py_DECREF(tp);
}

PyType_Slot iter_slots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(iter_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(iter_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(iter_clear)},
    {Py_tp_iter, reinterpret_cast<void*>(iter_self)},
    {Py_tp_iternext, reinterpret_cast<void*>(iter_next)},
    {Py_am_send, reinterpret_cast<void*>(iter_send)},
    {0, nullptr},
};

PyType_Spec iter_spec = {"cadeloop._core._RequestTaskAwait", static_cast<int>(sizeof(task_iter)), 0,
                         Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, iter_slots};

}  // namespace

int add_app_task_type(PyObject* module) {
  PyObject* task_type = PyType_FromModuleAndSpec(module, &task_spec, nullptr);
  PyObject* iter_type = PyType_FromModuleAndSpec(module, &iter_spec, nullptr);
  const bool ok = task_type != nullptr && iter_type != nullptr &&
                  PyModule_AddObjectRef(module, "RequestTask", task_type) == 0 &&
                  PyModule_AddObjectRef(module, "_RequestTaskAwait", iter_type) == 0;
  Py_XDECREF(task_type);
  Py_XDECREF(iter_type);
  return ok ? 0 : -1;
}

}  // namespace cadeloop::pyhost::server
