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

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "cadeloop/runtime/parker.hpp"
#include "cadeloop/runtime/poller.hpp"
#include "cadeloop/runtime/timer_heap.hpp"
#include "cadeloop/runtime/xthread_queue.hpp"
#include "loop/loop_source.hpp"
#include "py_exception.hpp"

namespace cadeloop::pyhost::loop {

/// asyncio.Handle's shape: a callback, its arguments and the context to run
/// it in. Created and run on the loop thread (call_soon_threadsafe creates
/// one on its caller's thread, under the same interpreter's GIL).
struct handle_object {
  PyObject_HEAD PyObject* callback;  // NULL once cancelled
  PyObject* args;                    // tuple; NULL once cancelled
  PyObject* loop;                    // the LoopCore that made it (strong)
  PyObject* context;                 // contextvars.Context
  PyObject* source_traceback;        // list in debug mode, else NULL
  PyObject* repr;                    // kept at cancel() in debug mode
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
/// handle (either may be absent), the C++ socket transport that owns the fd
/// (if any), and the epoll mask registered for all of them.
struct fd_entry {
  PyObject* reader = nullptr;
  PyObject* writer = nullptr;
  PyObject* transport = nullptr;  // a transport_object; strong
  std::uint32_t events = 0;
};

/// One queued write: a bytes object (the caller's, or a copy of a mutable
/// buffer) and how much of it is already sent.
struct write_chunk {
  PyObject* bytes;  // strong
  Py_ssize_t offset;
};

/// The C++ half of cadeloop's socket transport (cadeloop._loop._SocketTransport
/// is the Python half): the read path straight from epoll to the protocol,
/// the write buffer with one send per transport per loop pass, and the flow
/// control flags. Created, used and destroyed on the loop thread.
struct transport_object {
  PyObject_HEAD PyObject* loop;  // the LoopCore (strong)
  PyObject* owner;               // the Python transport (strong until release())
  PyObject* protocol;            // strong until release()
  PyObject* empty_waiter;        // asyncio's sendfile waiter, or NULL
  // The contextvars.Context the protocol's callbacks run in, as asyncio's
  // reader and writer handles would hold it: reads run in a copy of the
  // context current when reading started or resumed (the transport's
  // creation, for a new connection); what a deferred flush calls back
  // (resume_writing, connection_lost after close) runs in a copy of the
  // context of the write() that found the buffer empty. Strong, or NULL.
  PyObject* read_context;
  PyObject* write_context;
  int fd;
  bool buffered;       // the protocol is an asyncio.BufferedProtocol
  bool attached;       // in the loop's fd table
  bool want_read;      // reading: not paused, not closing, not at EOF
  bool want_write;     // EPOLLOUT wanted: data left after a send
  bool in_flush_list;  // queued for the end-of-pass flush
  bool queued;         // in the ready queue with `pending` events
  bool paused;         // pause_reading() in effect
  bool closing;
  bool eof;                    // write_eof() called
  bool protocol_paused;        // pause_writing() was called on the protocol
  bool native_close;           // connection_lost and fatal read errors in C++
  bool detach_transport;       // Server._detach(transport) (3.13), else Server._detach()
  bool fd_private;             // an accepted fd no socket.socket was made for (yet)
  bool inline_server;          // its server's _attach/_detach are asyncio's: done in C++
  std::uint32_t pending;       // epoll events waiting in the ready queue
  std::uint64_t flushed_tick;  // the loop pass of the last send
  Py_ssize_t conn_lost;
  Py_ssize_t high_water;
  Py_ssize_t low_water;
  Py_ssize_t buffered_bytes;
  std::deque<write_chunk>* chunks;  // owned
};

/// The loop's state. Owned by its LoopCore object, touched only by the thread
/// running the loop, except `xthread` and `parker` (C++ producers), and
/// `gil_xthread` and `ready_pushed`, which call_soon_threadsafe appends to
/// from other threads while holding the GIL the loop thread needs to touch them.
struct loop_state {
  loop_state();

  runtime::poller poller;
  runtime::parker parker;
  runtime::xthread_queue<PyObject*> xthread;  // handles, strong references
  // call_soon_threadsafe from Python: its caller holds this interpreter's
  // GIL, which the loop thread holds whenever it touches this queue, so a
  // plain vector (no node per item, no atomic exchange). Moved onto `ready`
  // with `xthread`. `ready_pushed` is set by every such push: what a spin,
  // which runs without the GIL, watches besides `xthread`.
  std::vector<PyObject*> gil_xthread;  // handles, strong references
  std::atomic<bool> ready_pushed{false};
  std::deque<PyObject*> ready;                      // handles, strong references
  runtime::timer_heap<timer_handle_object> timers;  // each holds a reference
  std::vector<fd_entry> fds;                        // indexed by fd number
  std::size_t fds_registered = 0;
  std::vector<epoll_event> events;

  PyObject* handle_type = nullptr;        // strong
  PyObject* timer_type = nullptr;         // strong
  PyObject* transport_type = nullptr;     // strong
  PyObject* str_data_received = nullptr;  // interned names, strong
  PyObject* str_get_buffer = nullptr;
  PyObject* str_buffer_updated = nullptr;
  PyObject* str_context = nullptr;
  PyObject* str_future = nullptr;      // "Future"
  PyObject* str_task = nullptr;        // "Task"
  PyObject* kw_loop = nullptr;         // ("loop",) for Future(loop=...)
  PyObject* futures_module = nullptr;  // asyncio.futures (read at each call: tests patch it)
  PyObject* tasks_module = nullptr;    // asyncio.tasks
  PyObject* task_factory = nullptr;    // loop._task_factory, NULL for None

  // Transports with writes queued in this pass; each holds a reference and
  // is flushed (one send) before the next poll.
  std::vector<PyObject*> flush_list;
  std::vector<char> read_buffer;  // recv scratch for data_received protocols

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
  std::uint64_t bytes_received = 0;
  std::uint64_t bytes_sent = 0;
  std::uint64_t sends_posted = 0;
  std::uint64_t connections = 0;  // live transports in the fd table
  std::uint64_t accepted = 0;     // connections the C++ accept loop accepted

  // sock_* calls (loop_sock.cpp): calls the C++ path took, and those of them
  // that had to wait for their fd; and the names and types they use (a
  // tuple, strong, made at the first call).
  std::uint64_t sock_calls = 0;
  std::uint64_t sock_waits = 0;
  PyObject* sock_support = nullptr;
  // The names the C++ close path of socket transports uses (loop_transport.cpp;
  // a tuple, strong, made at the first close).
  PyObject* transport_support = nullptr;

  // A native source (the core pair's inbound ring) run in every pass; see
  // loop_source.hpp. Attached by _attach_source(capsule); source_owner keeps
  // the object that owns it alive while attached.
  loop_source* source = nullptr;
  PyObject* source_owner = nullptr;     // strong
  bool source_signalled = false;        // its fd was in the last poll's events
  bool source_sockets_watched = false;  // its sockets_fd() is in the poller

  // Signals (loop_signal.cpp): the socketpair Python's C signal handler
  // writes each signal number to (signal.set_wakeup_fd), made on the first
  // add_signal_handler and read by the reader _read_from_self; and asyncio's
  // _signal_handlers dict (signal -> Handle), strong, made on first use.
  int signal_read_fd = -1;
  int signal_write_fd = -1;
  PyObject* signal_handlers = nullptr;
  // loop.time replaced on the instance (or overridden by a subclass): the
  // pass and call_later then read self.time(), as asyncio's code does.
  bool time_override = false;
};

/// The C part of a LoopCore instance.
struct loop_object {
  PyObject_HEAD loop_state* state;  // owned; NULL only before tp_new finished
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

/// Creates the SocketTransportCore type for this interpreter and adds it to
/// `module`. Returns -1 with an exception set on failure.
int add_transport_type(PyObject* module, PyObject** transport_type);

/// Creates the DatagramTransportCore type (loop_datagram.cpp) for this
/// interpreter and adds it to `module`. Returns -1 with an exception set.
int add_datagram_type(PyObject* module);

/// A new transport core for `fd`, owned by the Python transport `owner`,
/// entered in the loop's fd table (with no interest yet). New reference.
PyObject* new_transport(PyObject* loop, PyObject* owner, int fd);

/// Runs the epoll events a transport found in the ready queue (read, then
/// flush on writable). Returns -1 only for what must stop the loop.
int transport_run_ready(loop_state& st, transport_object* t);

/// Flushes every transport written to in this pass: one send each.
/// Returns -1 only for what must stop the loop.
int flush_transports(loop_state& st);

/// Recomputes and applies the epoll interest of `fd` from its reader,
/// writer and transport. Returns false with an exception set on failure.
bool update_interest(loop_state& st, int fd);

/// The loop state behind a LoopCore object. Loop thread.
inline loop_state& state_of(PyObject* loop) {
  return *reinterpret_cast<loop_object*>(loop)->state;
}

/// Whether `o` is one of this loop's own handle types.
inline bool is_own_handle(const loop_state& st, PyObject* o) {
  PyObject* tp = reinterpret_cast<PyObject*>(Py_TYPE(o));
  return tp == st.handle_type || tp == st.timer_type;
}

/// The loop's tp_traverse step for an object it holds. A handle only the
/// loop holds (untracked, one reference) is traversed as part of the loop:
/// its callback, arguments, context and loop count as the loop's own edges,
/// so an abandoned loop whose queued callbacks lead back to it is still
/// found by the cycle collector. An untracked handle someone else also holds
/// is visited as an opaque object (kept alive, conservatively).
int traverse_held(const loop_state& st, PyObject* o, visitproc visit, void* arg);

/// Tracks a context copy a handle kept untracked (make_handle()): once
/// anything but that handle may hold it. No-op for NULL or a tracked one.
inline void track_context(PyObject* ctx) {
  if (ctx != nullptr && !PyObject_GC_IsTracked(ctx)) {
    PyObject_GC_Track(ctx);
  }
}

/// Drops a reference the loop held. The loop's own handles are made
/// untracked by the cycle collector: while the loop holds one (ready queue,
/// timer heap, fd table) it is reachable anyway, and most are freed the
/// moment the loop lets go, so tracking them only made every collection walk
/// hundreds of thousands of queued handles. A handle that outlives the
/// loop's custody (someone else still holds it, and may close a cycle
/// through it) is tracked from then on.
inline void release_handle(const loop_state& st, PyObject* o) {
  if (Py_REFCNT(o) > 1 && is_own_handle(st, o) && !PyObject_GC_IsTracked(o)) {
    PyObject_GC_Track(o);
    track_context(reinterpret_cast<handle_object*>(o)->context);
  }
  Py_DECREF(o);
}

}  // namespace cadeloop::pyhost::loop
