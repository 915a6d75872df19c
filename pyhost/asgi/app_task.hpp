#pragma once
// The task a request's app runs in (cadeloop._core.RequestTask): a native
// stand-in for asyncio.Task that drives the app's coroutine itself. Its first
// step runs at once (eagerly, on every Python), the task is the loop's
// current task while a step runs, it sits in asyncio.all_tasks(), and it has
// the Future and Task interface apps and libraries use (cancel, uncancel,
// cancelling, done callbacks, result, get_coro, _fut_waiter, ...). What it
// saves against asyncio.Task: the per-task loop calls and registry work, and
// on 3.11 the loop iteration between a request's arrival and its first step.
// When the coroutine ends the owner is told directly, in the same step, not
// through a done callback scheduled on the loop.
//
// Loop thread, GIL held, like everything of the bridge.

#include <Python.h>

#include <cstdint>

namespace cadeloop::pyhost::server {

/// Told once when a task ends (a result, an exception, or cancelled), inside
/// the step that ended it, after the task stopped being the current task.
/// `owner` is the object given to app_task_new; it is released afterwards.
using app_task_done_fn = void (*)(PyObject* owner, PyObject* task);

/// What the tasks of one loop share: the loop, asyncio's exception types,
/// its current-task dict and all-tasks registry. Reference counted (the
/// bridge and every task hold one); GIL held.
struct app_task_env;

/// The env of `loop` for tasks of `type` (the module's RequestTask), or
/// NULL with a Python error set.
app_task_env* app_task_env_new(PyObject* type, PyObject* loop);
void app_task_env_release(app_task_env* env) noexcept;

/// A new pending task of `coro` (borrowed), registered in all_tasks(), its
/// Context a copy of the current one; not started. NULL with an error set.
PyObject* app_task_new(app_task_env* env, PyObject* coro, PyObject* owner,
                       app_task_done_fn on_done);

/// Runs the task's first step now (in its Context). 0, or -1 with the error
/// that must stop the loop (KeyboardInterrupt, SystemExit) or an internal one.
int app_task_start(PyObject* task);

/// How an ended task ended: None (a result), its exception, or the
/// CancelledError its result() would raise. A new reference; marks the
/// exception retrieved. NULL only when making the CancelledError failed.
PyObject* app_task_outcome(PyObject* task);

/// Adds the RequestTask type (and its iterator type) to `module`.
int add_app_task_type(PyObject* module);

}  // namespace cadeloop::pyhost::server
