// One pass of LoopCore (asyncio's _run_once, in C++): drain the cross-thread
// queue and the attached loop_source, decide the poll timeout, spin or park
// (check before park against both the queue and the source), poll epoll,
// queue what it reported and the due timers, then run exactly the callbacks
// that were ready; flush the pass's writes and let the source publish. Also
// run_forever's inner loop, the spin setting and attaching a source. Every
// helper of the pass is in this file so that it inlines into the pass.
#include <algorithm>
#include <cmath>
#include <utility>

#include "cadeloop/runtime/cpu_relax.hpp"
#include "loop/loop_methods.hpp"

namespace cadeloop::pyhost::loop {

namespace {

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
    if (ev.data.u64 == source_sockets_token) {
      if (st.source != nullptr) {
        st.source->sockets_ready();
      }
      continue;
    }
    const auto fd = static_cast<std::size_t>(ev.data.u64);
    if (fd >= st.fds.size() || st.fds[fd].events == 0) {
      continue;  // unregistered since the poll
    }
    if (PyObject* to = st.fds[fd].transport; to != nullptr) {
      // The transport runs from the ready queue like a reader handle would,
      // once per pass however many events it got.
      auto* t = reinterpret_cast<transport_object*>(to);
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
      const std::uint32_t others =
          writer ? ~static_cast<std::uint32_t>(EPOLLIN) : ~static_cast<std::uint32_t>(EPOLLOUT);
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
/// (if there are fds) poll without blocking, for up to spin_us; in solo mode
/// the source serves its sockets itself (no Python runs there), which saves
/// the loop's own poll of their descriptor. Returns the number of poll
/// events found (>= 0), -1 for "work arrived in the queue", -2 for "the
/// source published work".
int spin(loop_state& st, int timeout_ms, std::uint32_t spin_us) {
  const double budget = std::min(static_cast<double>(spin_us) * 1e-6,
                                 timeout_ms < 0 ? max_poll_seconds : timeout_ms * 1e-3);
  const double deadline = monotonic_now() + budget;
  int found = 0;
  st.ready_pushed.store(false, std::memory_order_relaxed);
  Py_BEGIN_ALLOW_THREADS for (unsigned i = 0;; ++i) {
    if (!st.xthread.empty() || st.ready_pushed.load(std::memory_order_acquire)) {
      found = -1;
      break;
    }
    // The source's sockets every 4th round (a request is taken within about
    // a quarter of a microsecond of its arrival; the spin burns the CPU
    // either way), the loop's own descriptors every 16th.
    if (st.source_sockets_watched && i % 4 == 3 && st.source->serve_sockets_nogil()) {
      found = -2;
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
  Py_END_ALLOW_THREADS return found;
}

/// Solo mode: the source's sockets descriptor is in the poller exactly while
/// the source asks for it. Asked after try_park() announced a sleep, so a
/// hand-over that comes later wakes the loop through the source's parker.
void sync_source_sockets(loop_state& st) {
  const bool want = st.source->wants_sockets_fd();
  if (want == st.source_sockets_watched) {
    return;
  }
  const int fd = st.source->sockets_fd();
  if (want) {
    st.source_sockets_watched =
        fd >= 0 && !st.poller.add(fd, runtime::poller::readable, source_sockets_token);
  } else {
    (void)st.poller.remove(fd);
    st.source_sockets_watched = false;
  }
}

/// The spin before a park: the loop's own spin_us, or, while the source's
/// sockets are watched (solo mode), the source's (always adaptive: it only
/// pays while requests follow each other closely).
std::uint32_t spin_budget_us(const loop_state& st) {
  if (st.spin_us != 0) {
    return st.spin_us;
  }
  return st.source_sockets_watched ? st.source->sockets_spin_us() : 0;
}

bool should_spin(loop_state& st, std::uint32_t spin_us) {
  if (spin_us == 0) {
    return false;
  }
  const bool adaptive = st.adaptive_spin || st.spin_us == 0;
  if (!adaptive || st.spin_misses_in_row < 8) {
    return true;
  }
  // Adaptive: after a run of fruitless spins, spin only every 16th park to
  // notice when traffic comes back.
  return ++st.parks_since_probe % 16 == 0;
}

}  // namespace

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
  if (!st.flush_list.empty() && flush_transports(st) < 0) {
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
    double now = 0;
    if (!loop_clock(self, st, now)) {
      return nullptr;
    }
    const double delay = st.timers.top_when() - now;
    timeout_ms = delay <= 0 ? 0 : timeout_ms_for(delay);
  }

  int n = 0;
  bool parked = false;
  bool source_found = false;  // the spin's own serving of the source's sockets found work
  if (const std::uint32_t spin_us = spin_budget_us(st);
      timeout_ms != 0 && should_spin(st, spin_us)) {
    ++st.spins;
    n = spin(st, timeout_ms, spin_us);
    if (n != 0) {
      ++st.spin_hits;
      st.spin_misses_in_row = 0;
      if (n < 0) {
        source_found = n == -2;
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
    // gil_xthread is read under the GIL this thread holds: a Python
    // producer that ran while Python code of this pass let the GIL go is
    // seen here.
    bool may_sleep =
        st.parker.try_park([&] { return !st.xthread.empty() || !st.gil_xthread.empty(); });
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
  if (st.source != nullptr) {
    sync_source_sockets(st);
  }
  if (parked) {
    Py_BEGIN_ALLOW_THREADS n = st.poller.wait(st.events, timeout_ms);
    Py_END_ALLOW_THREADS++ st.polls;
  } else if (timeout_ms == 0 && n == 0) {
    if (st.fds_registered == 0 && (!st.source_sockets_watched || source_found)) {
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
  double now = 0;
  if (!loop_clock(self, st, now)) {
    return nullptr;
  }
  const double end_time = now + 1e-9;
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
      rc = transport_run_ready(st, reinterpret_cast<transport_object*>(item));
    } else if (is_own_handle(st, item)) {
      auto* h = reinterpret_cast<handle_object*>(item);
      if (!h->cancelled) {
        ++st.callbacks_dispatched;
        if (st.debug) {
          PyObject* r = PyObject_CallMethod(self, "_cadeloop_run_debug", "O", item);
          rc = r == nullptr ? -1 : 0;
          Py_XDECREF(r);
        } else {
          rc = run_handle(h);
        }
      }
    } else {
      // A handle made by asyncio's Python code (signal handlers).
      ++st.callbacks_dispatched;
      PyObject* r = PyObject_CallMethod(self, "_cadeloop_run_foreign", "O", item);
      rc = r == nullptr ? -1 : 0;
      Py_XDECREF(r);
    }
    release_handle(st, item);
    if (rc < 0) {
      return nullptr;
    }
  }
  // The writes this pass made go out now, one send per transport, before
  // the next poll.
  if (!st.flush_list.empty() && flush_transports(st) < 0) {
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
    PyErr_SetString(PyExc_RuntimeError,
                    st.closed ? "Event loop is closed" : "a source is already attached");
    return nullptr;
  }
  if (const std::error_code ec = st.poller.add(src->fd(), runtime::poller::readable, source_token);
      ec) {
    return os_error(ec);
  }
  PyObject* owner = static_cast<PyObject*>(PyCapsule_GetContext(capsule));
  st.source = src;
  st.source_owner = Py_NewRef(owner != nullptr ? owner : capsule);
  src->attached(true);
  Py_RETURN_NONE;
}

/// _detach_source(): the attached source leaves the loop (no-op if none). Loop thread.
PyObject* loop_detach_source(PyObject* self, PyObject*) {
  loop_state& st = state_of(self);
  if (st.source != nullptr) {
    st.source->attached(false);
    if (st.source_sockets_watched) {
      (void)st.poller.remove(st.source->sockets_fd());
      st.source_sockets_watched = false;
    }
    (void)st.poller.remove(st.source->fd());
    st.source = nullptr;
    Py_XDECREF(std::exchange(st.source_owner, nullptr));  // last: a finaliser may re-enter the loop
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

// --- loop.time replaced on the instance ----------------------------------------
// asyncio's timers run on self.time(): a test that sets loop.time = fake (or a
// subclass overriding time()) moves them. LoopCore's tp_setattro notes when
// `time` is set or deleted on the instance, so the pass pays one flag test,
// and calls the replacement only while there is one.

bool overridden_time(PyObject* self, double& now) {
  PyObject* r = PyObject_CallMethod(self, "time", nullptr);
  if (r == nullptr) {
    return false;
  }
  now = PyFloat_AsDouble(r);
  Py_DECREF(r);
  return !(now == -1.0 && PyErr_Occurred());
}

bool type_overrides_time(PyTypeObject* type) {
  PyObject* f = PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "time");
  if (f == nullptr) {
    PyErr_Clear();
    return false;
  }
  const bool own = PyObject_TypeCheck(f, &PyMethodDescr_Type) != 0 &&
                   reinterpret_cast<PyMethodDescrObject*>(f)->d_method->ml_meth == loop_time;
  Py_DECREF(f);
  return !own;
}

int loop_setattro(PyObject* self, PyObject* name, PyObject* value) {
  const int rc = PyObject_GenericSetAttr(self, name, value);
  if (rc == 0 && PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, "time") == 0) {
    state_of(self).time_override = value != nullptr || type_overrides_time(Py_TYPE(self));
  }
  return rc;
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

}  // namespace cadeloop::pyhost::loop
