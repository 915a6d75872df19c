// cadeloop._core.RequestTask: the task a request's app runs in (see
// app_task.hpp). The step follows asyncio.Task's documented behaviour: a
// coroutine that yields an asyncio-compatible future waits for it (its done
// callback wakes the task in the task's Context), a bare yield gives the loop
// one turn, a cancel() cancels the awaited future or is thrown into the
// coroutine at its next step, a CancelledError the coroutine lets out cancels
// the task, and the bad yields asyncio refuses are refused here with the same
// RuntimeError thrown into the coroutine at the next step.
#include "asgi/app_task_object.hpp"

#include <cstddef>
#include <new>

#include "py_exception.hpp"

namespace cadeloop::pyhost::server {

namespace task_detail {

int call_soon(app_task_env* env, PyObject* fn, PyObject* arg, PyObject* context) {
  PyObject* handle = nullptr;
  if (arg != nullptr) {
    PyObject* args[] = {fn, arg, context};
    handle = PyObject_Vectorcall(env->call_soon, args, 2, env->context_kw);
  } else {
    PyObject* args[] = {fn, context};
    handle = PyObject_Vectorcall(env->call_soon, args, 1, env->context_kw);
  }
  if (handle == nullptr) {
    return -1;
  }
  Py_DECREF(handle);
  return 0;
}

PyObject* make_cancelled_error(app_task* t) {
  if (t->cancelled_exc != nullptr) {
    PyObject* exc = t->cancelled_exc;
    t->cancelled_exc = nullptr;
    return exc;
  }
  if (t->cancel_msg == nullptr || t->cancel_msg == Py_None) {
    return PyObject_CallNoArgs(t->env->cancelled_error);
  }
  return PyObject_CallOneArg(t->env->cancelled_error, t->cancel_msg);
}

void unregister(app_task* t) {
  PyObject* self = reinterpret_cast<PyObject*>(t);
  if (t->in_eager_set) {
    t->in_eager_set = false;
    if (PySet_Discard(t->env->eager_tasks, self) < 0) {
      PyErr_WriteUnraisable(self);
    }
  }
  if (t->registry_ref != nullptr) {
    if (PySet_Discard(t->env->weak_tasks, t->registry_ref) < 0) {
      PyErr_WriteUnraisable(self);
    }
    Py_CLEAR(t->registry_ref);
  }
}

}  // namespace task_detail

namespace {

using namespace task_detail;

int get_optional_attr(PyObject* o, PyObject* name, PyObject** out) {
#if PY_VERSION_HEX >= 0x030D0000
  return PyObject_GetOptionalAttr(o, name, out);
#else
  *out = PyObject_GetAttr(o, name);
  if (*out != nullptr) {
    return 1;
  }
  if (PyErr_ExceptionMatches(PyExc_AttributeError) != 0) {
    PyErr_Clear();
    return 0;
  }
  return -1;
#endif
}

// --------------------------------------------------------------- registry

/// In asyncio.all_tasks() from now on: asyncio's WeakSet of tasks holds a
/// weak reference (no callback: the task takes it out itself).
int register_weakly(app_task* t) {
  if (t->registry_ref != nullptr || t->env->weak_tasks == nullptr) {
    return 0;
  }
  PyObject* ref = PyWeakref_NewRef(reinterpret_cast<PyObject*>(t), nullptr);
  if (ref == nullptr || PySet_Add(t->env->weak_tasks, ref) < 0) {
    Py_XDECREF(ref);
    return -1;
  }
  t->registry_ref = ref;
  return 0;
}

// --------------------------------------------------------------- future part

int schedule_callbacks(app_task* t) {
  PyObject* callbacks = t->callbacks;
  if (callbacks == nullptr) {
    return 0;
  }
  t->callbacks = nullptr;
  int rc = 0;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(callbacks) && rc == 0; ++i) {
    PyObject* item = PyList_GET_ITEM(callbacks, i);
    rc = call_soon(t->env, PyTuple_GET_ITEM(item, 0), reinterpret_cast<PyObject*>(t),
                   PyTuple_GET_ITEM(item, 1));
  }
  Py_DECREF(callbacks);
  return rc;
}

int finish_result(app_task* t, PyObject* value) {  // steals value
  t->result = value;
  t->state = task_state::finished;
  return schedule_callbacks(t);
}

int finish_exception(app_task* t, PyObject* exc) {  // borrows exc
  if (PyErr_GivenExceptionMatches(exc, PyExc_StopIteration) != 0) {
    // As asyncio does: a StopIteration cannot be a task's exception.
    PyErr_SetString(PyExc_TypeError,
                    "StopIteration interacts badly with generators and cannot be raised into a "
                    "Future");
    PyObject* type_error = take_exception();
    if (type_error == nullptr) {
      return -1;
    }
    PyException_SetCause(type_error, Py_NewRef(exc));
    PyException_SetContext(type_error, Py_NewRef(exc));
    t->exception = type_error;
  } else {
    t->exception = Py_NewRef(exc);
  }
  t->state = task_state::finished;
  t->log_traceback = true;
  return schedule_callbacks(t);
}

int finish_cancelled(app_task* t, PyObject* msg) {
  t->log_traceback = false;
  Py_XINCREF(msg);
  Py_XSETREF(t->cancel_msg, msg);
  t->state = task_state::cancelled;
  return schedule_callbacks(t);
}

// --------------------------------------------------------------- step

PyObject* step(app_task* t, PyObject* exc, bool enter_context);

PyObject* task_wakeup(PyObject* self, PyObject* future) {
  app_task* t = as_task(self);
  PyObject* res = PyObject_CallMethodNoArgs(future, t->env->s_result);
  if (res != nullptr) {
    Py_DECREF(res);
    return step(t, nullptr, false);
  }
  PyObject* exc = take_exception();
  PyObject* out = step(t, exc, false);
  Py_XDECREF(exc);
  return out;
}

PyObject* task_step_soon(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return step(as_task(self), nargs > 0 && args[0] != Py_None ? args[0] : nullptr, false);
}

PyMethodDef wakeup_def = {"task_wakeup",
                          reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(task_wakeup)),
                          METH_O, nullptr};
PyMethodDef step_def = {"task_step",
                        reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(task_step_soon)),
                        METH_FASTCALL, nullptr};

/// The next step soon, in the task's Context; `exc` (or NULL) thrown in.
int step_soon(app_task* t, PyObject* exc) {
  PyObject* fn = PyCFunction_New(&step_def, reinterpret_cast<PyObject*>(t));
  if (fn == nullptr) {
    return -1;
  }
  const int rc = call_soon(t->env, fn, exc, t->context);
  Py_DECREF(fn);
  return rc;
}

/// A RuntimeError with `text` thrown into the coroutine at its next step.
int error_soon(app_task* t, PyObject* text) {  // steals text
  if (text == nullptr) {
    return -1;
  }
  PyObject* exc = PyObject_CallOneArg(PyExc_RuntimeError, text);
  Py_DECREF(text);
  if (exc == nullptr) {
    return -1;
  }
  const int rc = step_soon(t, exc);
  Py_DECREF(exc);
  return rc;
}

/// asyncio.futures._get_loop(fut).
PyObject* future_loop(app_task_env* env, PyObject* fut) {
  if (Py_TYPE(fut) == reinterpret_cast<PyTypeObject*>(env->type)) {
    return Py_NewRef(as_task(fut)->env->loop);
  }
  PyObject* get_loop = nullptr;
  const int found = get_optional_attr(fut, env->s_get_loop, &get_loop);
  if (found < 0) {
    return nullptr;
  }
  if (found > 0) {
    PyObject* loop = PyObject_CallNoArgs(get_loop);
    Py_DECREF(get_loop);
    return loop;
  }
  return PyObject_GetAttr(fut, env->s_loop);
}

/// What the coroutine yielded (`result`, borrowed) decides how it goes on.
int on_yield(app_task* t, PyObject* result) {
  PyObject* self = reinterpret_cast<PyObject*>(t);
  app_task_env* env = t->env;
  if (result == Py_None) {
    return step_soon(t, nullptr);  // a bare yield: one turn of the loop
  }
  PyObject* blocking_attr = nullptr;
  if (get_optional_attr(result, env->s_blocking, &blocking_attr) < 0) {
    return -1;
  }
  if (blocking_attr == nullptr || blocking_attr == Py_None) {
    Py_XDECREF(blocking_attr);
    if (PyGen_Check(result)) {
      return error_soon(
          t, PyUnicode_FromFormat("yield was used instead of yield from for generator in task %R "
                                  "with %R",
                                  self, result));
    }
    return error_soon(t, PyUnicode_FromFormat("Task got bad yield: %R", result));
  }
  const int blocking = PyObject_IsTrue(blocking_attr);
  Py_DECREF(blocking_attr);
  if (blocking < 0) {
    return -1;
  }
  PyObject* loop = future_loop(env, result);
  if (loop == nullptr) {
    return -1;
  }
  Py_DECREF(loop);  // compared by identity only
  if (loop != env->loop) {
    return error_soon(t, PyUnicode_FromFormat("Task %R got Future %R attached to a different loop",
                                              self, result));
  }
  if (blocking == 0) {
    return error_soon(
        t, PyUnicode_FromFormat("yield was used instead of yield from in task %R with %R", self,
                                result));
  }
  if (result == self) {
    return error_soon(t, PyUnicode_FromFormat("Task cannot await on itself: %R", self));
  }
  if (PyObject_SetAttr(result, env->s_blocking, Py_False) < 0) {
    return -1;
  }
  PyObject* wakeup = PyCFunction_New(&wakeup_def, self);
  if (wakeup == nullptr) {
    return -1;
  }
  PyObject* args[] = {result, wakeup, t->context};
  PyObject* added = PyObject_VectorcallMethod(env->s_add_done_callback, args, 2, env->context_kw);
  Py_DECREF(wakeup);
  if (added == nullptr) {
    return -1;
  }
  Py_DECREF(added);
  Py_XSETREF(t->fut_waiter, Py_NewRef(result));
  if (t->must_cancel) {
    PyObject* msg = t->cancel_msg != nullptr ? t->cancel_msg : Py_None;
    PyObject* cancelled = PyObject_CallMethodOneArg(result, env->s_cancel, msg);
    if (cancelled == nullptr) {
      return -1;
    }
    const int yes = PyObject_IsTrue(cancelled);
    Py_DECREF(cancelled);
    if (yes < 0) {
      return -1;
    }
    if (yes > 0) {
      t->must_cancel = false;
    }
  }
  return 0;
}

/// Tells the owner the task ended (once) and takes it out of all_tasks().
void ended(app_task* t) {
  unregister(t);
  PyObject* owner = t->owner;
  if (owner != nullptr) {
    t->owner = nullptr;
    t->on_done(owner, reinterpret_cast<PyObject*>(t));
    Py_DECREF(owner);
  }
}

/// One step of the coroutine: send None, or throw `exc` (borrowed) in. The
/// task is the loop's current task meanwhile; `enter_context` enters the
/// task's Context (a step the loop runs is already in it).
PyObject* step(app_task* t, PyObject* exc, bool enter_context) {
  PyObject* self = reinterpret_cast<PyObject*>(t);
  app_task_env* env = t->env;
  if (t->state != task_state::pending) {
    PyErr_Format(env->invalid_state_error, "step(): already done: %R %R", self,
                 exc != nullptr ? exc : Py_None);
    return nullptr;
  }
  PyObject* own_exc = nullptr;
  if (t->must_cancel) {
    if (exc != nullptr && PyErr_GivenExceptionMatches(exc, env->cancelled_error) == 0) {
      exc = nullptr;
    }
    if (exc == nullptr) {
      own_exc = make_cancelled_error(t);
      if (own_exc == nullptr) {
        return nullptr;
      }
      exc = own_exc;
    }
    t->must_cancel = false;
  }
  Py_CLEAR(t->fut_waiter);
  if (enter_context && PyContext_Enter(t->context) < 0) {
    Py_XDECREF(own_exc);
    return nullptr;
  }
  // The current task: swapped in, and the previous one (an eager start from
  // inside another task's step) back afterwards.
  PyObject* previous = PyDict_GetItemWithError(env->current_tasks, env->loop);
  Py_XINCREF(previous);
  if ((previous == nullptr && PyErr_Occurred() != nullptr) ||
      PyDict_SetItem(env->current_tasks, env->loop, self) < 0) {
    Py_XDECREF(previous);
    Py_XDECREF(own_exc);
    if (enter_context) {
      PyObject* error = take_exception();
      (void)PyContext_Exit(t->context);
      restore_exception(error);
    }
    return nullptr;
  }
  PyObject* result = nullptr;
  PySendResult status = PYGEN_ERROR;
  Py_INCREF(self);  // the step may drop the last other reference
  if (exc == nullptr) {
    status = PyIter_Send(t->coro, Py_None, &result);
  } else {
    result = PyObject_CallMethodOneArg(t->coro, env->s_throw, exc);
    status = result != nullptr ? PYGEN_NEXT : PYGEN_ERROR;
  }
  Py_XDECREF(own_exc);
  PyObject* raised = status == PYGEN_ERROR ? take_exception() : nullptr;
  int restored = previous != nullptr ? PyDict_SetItem(env->current_tasks, env->loop, previous)
                                     : PyDict_DelItem(env->current_tasks, env->loop);
  Py_XDECREF(previous);
  if (enter_context && PyContext_Exit(t->context) < 0) {
    restored = -1;
  }
  if (restored < 0) {
    PyErr_WriteUnraisable(self);
  }
  if (raised != nullptr && PyErr_GivenExceptionMatches(raised, PyExc_StopIteration) != 0) {
    // A throw() the coroutine answered by returning.
    result = PyObject_GetAttr(raised, env->s_value);
    Py_CLEAR(raised);
    status = result != nullptr ? PYGEN_RETURN : PYGEN_ERROR;
    raised = result == nullptr ? take_exception() : nullptr;
  }
  int rc = 0;
  bool fatal = false;
  if (status == PYGEN_RETURN) {
    if (t->must_cancel) {
      // Cancelled right before the coroutine returned.
      t->must_cancel = false;
      Py_DECREF(result);
      rc = finish_cancelled(t, t->cancel_msg);
    } else {
      rc = finish_result(t, result);
    }
  } else if (status == PYGEN_ERROR) {
    if (raised == nullptr) {
      raised = PyObject_CallNoArgs(PyExc_SystemError);  // an error without an exception
    }
    if (raised != nullptr && PyErr_GivenExceptionMatches(raised, env->cancelled_error) != 0) {
      t->cancelled_exc = raised;
      raised = nullptr;
      rc = finish_cancelled(t, nullptr);
    } else if (raised != nullptr) {
      fatal = PyErr_GivenExceptionMatches(raised, PyExc_KeyboardInterrupt) != 0 ||
              PyErr_GivenExceptionMatches(raised, PyExc_SystemExit) != 0;
      rc = finish_exception(t, raised);
    } else {
      rc = -1;
    }
  } else {
    rc = on_yield(t, result);
    Py_DECREF(result);
    if (rc == 0 && t->in_eager_set) {
      // Past its first step: from the eager set to the weak registry.
      t->in_eager_set = false;
      rc = PySet_Discard(env->eager_tasks, self) < 0 || register_weakly(t) < 0 ? -1 : 0;
    }
  }
  if (t->state != task_state::pending) {
    PyObject* error = rc < 0 ? take_exception() : nullptr;
    ended(t);
    restore_exception(error);
  }
  Py_DECREF(self);
  if (fatal && rc == 0) {
    restore_exception(raised);  // KeyboardInterrupt, SystemExit: the loop stops
    return nullptr;
  }
  Py_XDECREF(raised);
  if (rc < 0) {
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* asyncio_attr(const char* module_name, const char* name) {
  PyObject* module = PyImport_ImportModule(module_name);
  if (module == nullptr) {
    return nullptr;
  }
  PyObject* value = PyObject_GetAttrString(module, name);
  Py_DECREF(module);
  return value;
}

}  // namespace

// --------------------------------------------------------------- interface

using task_detail::as_task;

app_task_env* app_task_env_new(PyObject* type, PyObject* loop) {
  auto* env = new (std::nothrow) app_task_env();
  if (env == nullptr) {
    PyErr_NoMemory();
    return nullptr;
  }
  env->type = Py_NewRef(type);
  PyObject* module = PyType_GetModule(reinterpret_cast<PyTypeObject*>(type));
  env->iter_type =
      module != nullptr ? PyObject_GetAttrString(module, "_RequestTaskAwait") : nullptr;
  env->loop = Py_NewRef(loop);
  env->call_soon = PyObject_GetAttrString(loop, "call_soon");
  env->cancelled_error = asyncio_attr("asyncio", "CancelledError");
  env->invalid_state_error = asyncio_attr("asyncio", "InvalidStateError");
  env->current_tasks = asyncio_attr("_asyncio", "_current_tasks");
#if PY_VERSION_HEX >= 0x030C0000
  env->eager_tasks = asyncio_attr("_asyncio", "_eager_tasks");
  PyObject* weak_set = asyncio_attr("_asyncio", "_scheduled_tasks");
#else
  PyObject* weak_set = asyncio_attr("_asyncio", "_all_tasks");
#endif
  env->weak_tasks = weak_set != nullptr ? PyObject_GetAttrString(weak_set, "data") : nullptr;
  Py_XDECREF(weak_set);
  env->context_kw = Py_BuildValue("(s)", "context");
  env->s_add_done_callback = PyUnicode_InternFromString("add_done_callback");
  env->s_cancel = PyUnicode_InternFromString("cancel");
  env->s_blocking = PyUnicode_InternFromString("_asyncio_future_blocking");
  env->s_get_loop = PyUnicode_InternFromString("get_loop");
  env->s_loop = PyUnicode_InternFromString("_loop");
  env->s_result = PyUnicode_InternFromString("result");
  env->s_throw = PyUnicode_InternFromString("throw");
  env->s_value = PyUnicode_InternFromString("value");
  const bool ok = env->iter_type != nullptr && env->call_soon != nullptr &&
                  env->cancelled_error != nullptr && env->invalid_state_error != nullptr &&
                  env->current_tasks != nullptr && PyDict_Check(env->current_tasks) &&
#if PY_VERSION_HEX >= 0x030C0000
                  env->eager_tasks != nullptr && PySet_Check(env->eager_tasks) &&
#endif
                  env->weak_tasks != nullptr && PySet_Check(env->weak_tasks) &&
                  env->context_kw != nullptr && env->s_add_done_callback != nullptr &&
                  env->s_cancel != nullptr && env->s_blocking != nullptr &&
                  env->s_get_loop != nullptr && env->s_loop != nullptr &&
                  env->s_result != nullptr && env->s_throw != nullptr && env->s_value != nullptr;
  if (!ok) {
    if (PyErr_Occurred() == nullptr) {
      PyErr_SetString(PyExc_RuntimeError,
                      "this Python's asyncio has no _current_tasks dict or tasks registry set");
    }
    app_task_env_release(env);
    return nullptr;
  }
  return env;
}

void app_task_env_release(app_task_env* env) noexcept {
  if (env != nullptr && --env->refs == 0) {
    env->clear();
    delete env;
  }
}

PyObject* app_task_new(app_task_env* env, PyObject* coro, PyObject* owner,
                       app_task_done_fn on_done) {
  auto* t = PyObject_GC_New(app_task, reinterpret_cast<PyTypeObject*>(env->type));
  if (t == nullptr) {
    return nullptr;
  }
  ++env->refs;
  t->env = env;
  t->coro = Py_NewRef(coro);
  t->context = nullptr;
  t->result = t->exception = t->cancel_msg = t->cancelled_exc = nullptr;
  t->fut_waiter = t->name = t->callbacks = nullptr;
  t->owner = Py_XNewRef(owner);
  t->on_done = on_done;
  t->registry_ref = t->weakrefs = t->dict = nullptr;
  t->id = ++env->next_id;
  t->cancels_requested = 0;
  t->state = task_state::pending;
  t->must_cancel = t->blocking = t->log_traceback = t->in_eager_set = false;
  PyObject* self = reinterpret_cast<PyObject*>(t);
  PyObject_GC_Track(self);
  t->context = PyContext_CopyCurrent();
  if (t->context == nullptr) {
    Py_DECREF(self);
    return nullptr;
  }
#if PY_VERSION_HEX >= 0x030C0000
  if (PySet_Add(env->eager_tasks, self) < 0) {
    Py_DECREF(self);
    return nullptr;
  }
  t->in_eager_set = true;
#else
  if (register_weakly(t) < 0) {
    Py_DECREF(self);
    return nullptr;
  }
#endif
  return self;
}

int app_task_start(PyObject* task) {
  PyObject* res = step(as_task(task), nullptr, true);
  if (res == nullptr) {
    return -1;
  }
  Py_DECREF(res);
  return 0;
}

PyObject* app_task_outcome(PyObject* task) {
  app_task* t = as_task(task);
  if (t->state == task_state::cancelled) {
    return make_cancelled_error(t);
  }
  t->log_traceback = false;
  return Py_NewRef(t->exception != nullptr ? t->exception : Py_None);
}

}  // namespace cadeloop::pyhost::server
