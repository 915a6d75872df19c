#pragma once
// Private to app_task.cpp and app_task_type.cpp: the layout of the native
// request task (app_task.hpp) and what both files call. Loop thread, GIL held.

#include <Python.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "asgi/app_task.hpp"

namespace cadeloop::pyhost::server {

struct app_task_env {
  std::size_t refs = 1;
  PyObject* type = nullptr;       // RequestTask
  PyObject* iter_type = nullptr;  // what `await task` iterates
  PyObject* loop = nullptr;
  PyObject* call_soon = nullptr;  // loop.call_soon
  PyObject* cancelled_error = nullptr;
  PyObject* invalid_state_error = nullptr;
  PyObject* current_tasks = nullptr;  // asyncio's {loop: current task}
  PyObject* eager_tasks = nullptr;    // 3.12+: asyncio's set of tasks in their eager first step
  PyObject* weak_tasks = nullptr;     // the data set of asyncio's all-tasks WeakSet
  PyObject* context_kw = nullptr;     // ("context",)
  PyObject* s_add_done_callback = nullptr;
  PyObject* s_cancel = nullptr;
  PyObject* s_blocking = nullptr;
  PyObject* s_get_loop = nullptr;
  PyObject* s_loop = nullptr;
  PyObject* s_result = nullptr;
  PyObject* s_throw = nullptr;
  PyObject* s_value = nullptr;
  std::uint64_t next_id = 0;

  void clear() noexcept {
    for (PyObject** o :
         {&type, &iter_type, &loop, &call_soon, &cancelled_error, &invalid_state_error,
          &current_tasks, &eager_tasks, &weak_tasks, &context_kw, &s_add_done_callback, &s_cancel,
          &s_blocking, &s_get_loop, &s_loop, &s_result, &s_throw, &s_value}) {
      Py_CLEAR(*o);
    }
  }
};

namespace task_detail {

enum class task_state : std::uint8_t { pending, cancelled, finished };

struct app_task {
  PyObject_HEAD app_task_env* env;
  PyObject* coro;
  PyObject* context;
  PyObject* result;
  PyObject* exception;
  PyObject* cancel_msg;
  PyObject* cancelled_exc;  // the CancelledError the coroutine let out, for result()
  PyObject* fut_waiter;     // the future the coroutine waits for
  PyObject* name;           // made on first get_name()
  PyObject* callbacks;      // list of (fn, context) tuples, NULL when none
  PyObject* owner;          // told at the end, then released
  app_task_done_fn on_done;
  PyObject* registry_ref;  // our weakref in env->weak_tasks
  PyObject* weakrefs;
  PyObject* dict;
  std::uint64_t id;
  int cancels_requested;
  task_state state;
  bool must_cancel;
  bool blocking;  // _asyncio_future_blocking
  bool log_traceback;
  bool in_eager_set;
};

struct task_iter {
  PyObject_HEAD app_task* task;  // strong; NULL once the await ended
};

inline app_task* as_task(PyObject* o) {
  return reinterpret_cast<app_task*>(o);
}

/// loop.call_soon(fn, [arg], context=context); 0 or -1.
int call_soon(app_task_env* env, PyObject* fn, PyObject* arg, PyObject* context);
/// The CancelledError result() raises: the one the coroutine let out, else a
/// new one carrying the cancel message.
PyObject* make_cancelled_error(app_task* t);
/// Out of asyncio.all_tasks().
void unregister(app_task* t);

}  // namespace task_detail
}  // namespace cadeloop::pyhost::server
