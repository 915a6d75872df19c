// cadeloop._core.LoopCore, the type: the C++ scheduling core of
// cadeloop.Loop (Python), which inherits from it and from asyncio's selector
// loop, whose Python code supplies the cold paths. This file holds the
// type's life (tp_new, traverse, clear, dealloc, _release_core), its flags
// and stats, its method table and register_loop(). The methods themselves
// are in loop_schedule.cpp, loop_fd_table.cpp and loop_pass.cpp (see
// loop_methods.hpp); Handle and TimerHandle in loop_handle.cpp, the socket
// transport core in loop_transport.cpp.
#include <new>
#include <system_error>
#include <utility>
#include <vector>

#include "loop/loop_accept.hpp"
#include "loop/loop_methods.hpp"
#include "register.hpp"

namespace cadeloop::pyhost {

namespace loop {

namespace {

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
  drop.insert(drop.end(), st.gil_xthread.begin(), st.gil_xthread.end());
  st.gil_xthread.clear();
  for (PyObject* o : st.flush_list) {
    reinterpret_cast<transport_object*>(o)->in_flush_list = false;
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
      reinterpret_cast<transport_object*>(e.transport)->attached = false;
      --st.connections;
      drop.push_back(std::exchange(e.transport, nullptr));
    }
    e.events = 0;
  }
  st.fds_registered = 0;
  release_signals(st, drop);
  if (st.source != nullptr) {
    (void)st.poller.remove(st.source->fd());
    st.source = nullptr;
    drop.push_back(std::exchange(st.source_owner, nullptr));
  }
  for (PyObject* o : drop) {
    release_handle(st, o);
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
  PyObject* stats = Py_BuildValue("{s:s,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:n,s:n,s:n,s:K,s:K,s:K,s:K}",
                       "backend", "epoll", "ticks", static_cast<unsigned long long>(st.ticks),
                       "polls", static_cast<unsigned long long>(st.polls), "polls_elided",
                       static_cast<unsigned long long>(st.polls_elided), "callbacks_dispatched",
                       static_cast<unsigned long long>(st.callbacks_dispatched), "timers_fired",
                       static_cast<unsigned long long>(st.timers_fired), "xthread_items",
                       static_cast<unsigned long long>(st.xthread_items), "wakeups_sent",
                       static_cast<unsigned long long>(st.parker.wakeups_sent()), "spins",
                       static_cast<unsigned long long>(st.spins), "spin_hits",
                       static_cast<unsigned long long>(st.spin_hits), "parks",
                       static_cast<unsigned long long>(st.parks), "ready_len",
                       static_cast<Py_ssize_t>(st.ready.size()), "timers_len",
                       static_cast<Py_ssize_t>(st.timers.size()), "fds_registered",
                       static_cast<Py_ssize_t>(st.fds_registered), "bytes_received",
                       static_cast<unsigned long long>(st.bytes_received), "bytes_sent",
                       static_cast<unsigned long long>(st.bytes_sent), "sends_posted",
                       static_cast<unsigned long long>(st.sends_posted), "connections",
                       static_cast<unsigned long long>(st.connections));
  // the accept loop of servers (loop_accept.cpp)
  if (stats != nullptr && add_accept_stats(st, stats) < 0) {
    Py_CLEAR(stats);
  }
  return stats;
}

PyObject* get_flag(bool v) {
  return PyBool_FromLong(v);
}
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
PyObject* get_closed(PyObject* self, void*) {
  return get_flag(state_of(self).closed);
}
int set_closed(PyObject* self, PyObject* v, void*) {
  return set_flag(state_of(self).closed, v);
}
PyObject* get_stopping(PyObject* self, void*) {
  return get_flag(state_of(self).stopping);
}
int set_stopping(PyObject* self, PyObject* v, void*) {
  return set_flag(state_of(self).stopping, v);
}
PyObject* get_debug(PyObject* self, void*) {
  return get_flag(state_of(self).debug);
}
PyObject* get_task_factory(PyObject* self, void*) {
  PyObject* f = state_of(self).task_factory;
  return Py_NewRef(f != nullptr ? f : Py_None);
}
int set_task_factory(PyObject* self, PyObject* value, void*) {
  Py_XSETREF(state_of(self).task_factory,
             value == nullptr || value == Py_None ? nullptr : Py_NewRef(value));
  return 0;
}
int set_debug(PyObject* self, PyObject* v, void*) {
  return set_flag(state_of(self).debug, v);
}

PyObject* loop_new(PyTypeObject* type, PyObject*, PyObject*) {
  PyObject* handle_type = PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "_handle_type");
  if (handle_type == nullptr) {
    return nullptr;
  }
  PyObject* timer_type =
      PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "_timer_handle_type");
  if (timer_type == nullptr) {
    Py_DECREF(handle_type);
    return nullptr;
  }
  PyObject* transport_type =
      PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "_transport_type");
  PyObject* names[3] = {PyUnicode_InternFromString("data_received"),
                        PyUnicode_InternFromString("get_buffer"),
                        PyUnicode_InternFromString("buffer_updated")};
  PyObject* self = nullptr;
  if (transport_type != nullptr && names[0] != nullptr && names[1] != nullptr &&
      names[2] != nullptr) {
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
    st->time_override = type_overrides_time(type);
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
    if (const int rc = traverse_held(*st, o, visit, arg); rc != 0) {
      return rc;
    }
  }
  for (PyObject* o : st->gil_xthread) {
    if (const int rc = traverse_held(*st, o, visit, arg); rc != 0) {
      return rc;
    }
  }
  int rc = 0;
  st->timers.for_each([&](timer_handle_object* t) {
    if (rc == 0) {
      rc = traverse_held(*st, reinterpret_cast<PyObject*>(t), visit, arg);
    }
  });
  if (rc != 0) {
    return rc;
  }
  for (const fd_entry& e : st->fds) {
    if (e.reader != nullptr && (rc = traverse_held(*st, e.reader, visit, arg)) != 0) {
      return rc;
    }
    if (e.writer != nullptr && (rc = traverse_held(*st, e.writer, visit, arg)) != 0) {
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
  Py_VISIT(st->sock_support);
  Py_VISIT(st->transport_support);
  Py_VISIT(st->signal_handlers);
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
    Py_CLEAR(lo->state->sock_support);
    Py_CLEAR(lo->state->transport_support);
    delete std::exchange(lo->state, nullptr);
  }
  tp->tp_free(self);
  Py_DECREF(tp);
}

PyMethodDef loop_methods[] = {
    {"call_soon", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(loop_call_soon)),
     METH_FASTCALL | METH_KEYWORDS,
     "call_soon(callback, *args, context=None) -> Handle: run callback on the next pass. Loop "
     "thread."},
    {"call_soon_threadsafe",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(loop_call_soon_threadsafe)),
     METH_FASTCALL | METH_KEYWORDS,
     "call_soon_threadsafe(callback, *args, context=None) -> Handle. Any thread of this "
     "interpreter; "
     "wakes the loop (one eventfd write) only if it is parked."},
    {"call_later", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(loop_call_later)),
     METH_FASTCALL | METH_KEYWORDS,
     "call_later(delay, callback, *args, context=None) -> TimerHandle."},
    {"call_at", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(loop_call_at)),
     METH_FASTCALL | METH_KEYWORDS, "call_at(when, callback, *args, context=None) -> TimerHandle."},
    {"time", loop_time, METH_NOARGS, "The loop's clock (CLOCK_MONOTONIC, as time.monotonic())."},
    {"get_debug", loop_get_debug, METH_NOARGS, "Whether the loop is in debug mode. Any thread."},
    {"create_future", loop_create_future, METH_NOARGS,
     "A new asyncio.Future bound to this loop. Loop thread."},
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
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(loop_make_transport_core)),
     METH_FASTCALL, nullptr},
    {"_release_core", loop_release_core, METH_NOARGS, nullptr},
    {"_core_stats", loop_core_stats, METH_NOARGS, nullptr},
    {"_set_spin", loop_set_spin, METH_VARARGS, nullptr},
    {"_attach_source", loop_attach_source, METH_O, nullptr},
    {"_detach_source", loop_detach_source, METH_NOARGS, nullptr},
    // pipes and subprocesses (loop_process.cpp)
    {"_watch_child", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(loop_watch_child)),
     METH_FASTCALL, nullptr},
    // sock_* (loop_sock.cpp)
    {"_native_sock_recv",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(loop_sock_recv)), METH_FASTCALL,
     nullptr},
    {"_native_sock_recv_into",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(loop_sock_recv_into)),
     METH_FASTCALL, nullptr},
    {"_native_sock_recvfrom",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(loop_sock_recvfrom)), METH_FASTCALL,
     nullptr},
    {"_native_sock_recvfrom_into",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(loop_sock_recvfrom_into)),
     METH_FASTCALL, nullptr},
    {"_native_sock_sendall",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(loop_sock_sendall)), METH_FASTCALL,
     nullptr},
    {"_native_sock_sendto",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(loop_sock_sendto)), METH_FASTCALL,
     nullptr},
    {"_native_sock_connect",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(loop_sock_connect)), METH_FASTCALL,
     nullptr},
    {"_native_sock_accept",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(loop_sock_accept)), METH_FASTCALL,
     nullptr},
    {"_sock_stats", loop_sock_stats, METH_NOARGS, nullptr},
    // sigtime: signal handlers (loop_signal.cpp), sendfile(2) (loop_sendfile.cpp)
    {"add_signal_handler",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(loop_add_signal_handler)),
     METH_FASTCALL,
     "add_signal_handler(sig, callback, *args): run callback(*args) on the loop when sig "
     "arrives. Main thread of the main interpreter only."},
    {"remove_signal_handler", loop_remove_signal_handler, METH_O,
     "remove_signal_handler(sig) -> bool: restore the default handler of sig."},
    {"_read_from_self", loop_read_from_self, METH_NOARGS, nullptr},
    {"_close_signal_pipe", loop_close_signal_pipe, METH_NOARGS, nullptr},
    {"_sock_sendfile_native",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(loop_sock_sendfile_native)),
     METH_FASTCALL, nullptr},
    // churn: accepted transports (loop_transport.cpp)
    {"_fd_transport", loop_fd_transport, METH_O, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef loop_getsets[] = {
    {"_closed", get_closed, set_closed, nullptr, nullptr},
    {"_stopping", get_stopping, set_stopping, nullptr, nullptr},
    {"_debug", get_debug, set_debug, nullptr, nullptr},
    {"_task_factory", get_task_factory, set_task_factory, nullptr, nullptr},
    {"_signal_handlers", loop_get_signal_handlers, loop_set_signal_handlers, nullptr, nullptr},
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
    {Py_tp_setattro, reinterpret_cast<void*>(loop_setattro)},
    {0, nullptr},
};

PyType_Spec loop_spec = {"cadeloop._core.LoopCore", static_cast<int>(sizeof(loop_object)), 0,
                         Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, loop_slots};

}  // namespace

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
      loop::add_transport_type(module, &transport_type) < 0 ||
      loop::add_datagram_type(module) < 0 || loop::add_pipe_type(module) < 0 ||
      loop::add_acceptor_type(module) < 0) {
    Py_XDECREF(handle_type);
    Py_XDECREF(timer_type);
    Py_XDECREF(transport_type);
    throw pybind11::error_already_set();
  }
  PyObject* loop_type = PyType_FromModuleAndSpec(module, &loop::loop_spec, nullptr);
  PyObject* sendfile_op_type = loop::new_sendfile_op_type(module);
  bool ok = loop_type != nullptr && sendfile_op_type != nullptr &&
            PyObject_SetAttrString(loop_type, "_sendfile_op_type", sendfile_op_type) == 0 &&
            PyObject_SetAttrString(loop_type, "_handle_type", handle_type) == 0 &&
            PyObject_SetAttrString(loop_type, "_timer_handle_type", timer_type) == 0 &&
            PyObject_SetAttrString(loop_type, "_transport_type", transport_type) == 0 &&
            loop::add_sock_call_type(module, loop_type) == 0 &&
            PyModule_AddObjectRef(module, "LoopCore", loop_type) == 0;
  Py_XDECREF(loop_type);
  Py_XDECREF(sendfile_op_type);
  Py_DECREF(handle_type);
  Py_DECREF(timer_type);
  Py_DECREF(transport_type);
  if (!ok) {
    throw pybind11::error_already_set();
  }
}

}  // namespace cadeloop::pyhost
