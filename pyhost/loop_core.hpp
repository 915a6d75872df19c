#pragma once
// Private to pyhost: the C structures behind cadeloop._core.LoopCore, Handle
// and TimerHandle. These are CPython C-API types rather than pybind11 classes
// because they are the hottest objects in an asyncio program (one Handle per
// call_soon, one call into the loop per Future callback); pybind11's argument
// dispatch would cost more than the work itself.
//
// Every type is a heap type created per interpreter by register_loop(), and
// every Python object the loop keeps hangs off a LoopCore instance, so nothing
// Python lives in a C++ static (own-GIL sub-interpreters, PEP 684).

#include <Python.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "cadeloop/runtime/parker.hpp"
#include "cadeloop/runtime/poller.hpp"
#include "cadeloop/runtime/timer_heap.hpp"
#include "cadeloop/runtime/xthread_queue.hpp"

namespace cadeloop::pyhost::loop {

/// asyncio.Handle's shape: a callback, its arguments and the context to run
/// it in. Created and run on the loop thread (call_soon_threadsafe creates
/// one on its caller's thread, under the same interpreter's GIL).
struct handle_object {
  PyObject_HEAD
  PyObject* callback;          // NULL once cancelled
  PyObject* args;              // tuple; NULL once cancelled
  PyObject* loop;              // the LoopCore that made it (strong)
  PyObject* context;           // contextvars.Context
  PyObject* source_traceback;  // list in debug mode, else NULL
  PyObject* repr;              // kept at cancel() in debug mode
  PyObject* weakrefs;
  bool cancelled;
};

/// asyncio.TimerHandle's shape, plus the heap position that lets cancel()
/// take it out of the timer heap without a search.
struct timer_handle_object {
  handle_object base;
  double when;
  std::uint64_t seq;
  std::size_t heap_index;
};

/// Interest in one fd, as the selector loop keeps it: a reader and a writer
/// handle (either may be absent) and the epoll mask registered for them.
struct fd_entry {
  PyObject* reader = nullptr;
  PyObject* writer = nullptr;
  std::uint32_t events = 0;
};

/// The loop's state. Owned by its LoopCore object, touched only by the thread
/// running the loop, except `xthread` and `parker` (call_soon_threadsafe).
struct loop_state {
  loop_state();

  runtime::poller poller;
  runtime::parker parker;
  runtime::xthread_queue<PyObject*> xthread;  // handles, strong references
  std::deque<PyObject*> ready;                // handles, strong references
  runtime::timer_heap<timer_handle_object> timers;  // each holds a reference
  std::vector<fd_entry> fds;                  // indexed by fd number
  std::size_t fds_registered = 0;
  std::vector<epoll_event> events;

  PyObject* handle_type = nullptr;  // strong
  PyObject* timer_type = nullptr;   // strong

  bool closed = false;
  bool stopping = false;
  bool debug = false;
  bool released = false;

  // spin before park
  std::uint32_t spin_us = 0;
  bool adaptive_spin = false;
  std::uint32_t spin_misses_in_row = 0;
  std::uint32_t parks_since_probe = 0;

  // stats; all written by the loop thread only
  std::uint64_t ticks = 0;
  std::uint64_t polls = 0;
  std::uint64_t polls_elided = 0;
  std::uint64_t callbacks_dispatched = 0;
  std::uint64_t timers_fired = 0;
  std::uint64_t xthread_items = 0;
  std::uint64_t spins = 0;
  std::uint64_t spin_hits = 0;
  std::uint64_t parks = 0;
};

/// The C part of a LoopCore instance.
struct loop_object {
  PyObject_HEAD
  loop_state* state;  // owned; NULL only before tp_new finished
};

/// Creates the Handle and TimerHandle types for this interpreter and adds
/// them to `module`. Returns -1 with an exception set on failure.
int add_handle_types(PyObject* module, PyObject** handle_type, PyObject** timer_type);

/// Runs a handle's callback in its context and reports an ordinary exception
/// to the loop's exception handler. Returns -1 only for what must stop the
/// loop (SystemExit, KeyboardInterrupt, or an error from the handler).
int run_handle(handle_object* h);

/// Takes a timer out of its loop's heap if it is there (cancel()).
void unschedule_timer(timer_handle_object* t);

/// Whether `o` is one of this loop's own handle types.
inline bool is_own_handle(const loop_state& st, PyObject* o) {
  PyObject* tp = reinterpret_cast<PyObject*>(Py_TYPE(o));
  return tp == st.handle_type || tp == st.timer_type;
}

}  // namespace cadeloop::pyhost::loop
