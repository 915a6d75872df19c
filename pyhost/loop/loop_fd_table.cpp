// LoopCore's fd table: the interest in each fd as the selector loop keeps it
// (a reader and a writer handle, or a C++ socket transport), applied to
// epoll as one mask per fd; add_reader/add_writer and their removal, the
// selector view (_fd_key, _fd_list), and the entry of a new transport core.
#include <algorithm>
#include <utility>

#include "loop/loop_methods.hpp"

namespace cadeloop::pyhost::loop {

namespace {

/// selectors.EVENT_READ / EVENT_WRITE, for the selector view.
constexpr long event_read = 1;
constexpr long event_write = 2;

/// The fd of an int or of an object with fileno(), as selectors accept them.
int fd_of(PyObject* fileobj) {
  const int fd = PyObject_AsFileDescriptor(fileobj);
  if (fd < 0 && !PyErr_Occurred()) {
    PyErr_Format(PyExc_ValueError, "Invalid file descriptor: %d", fd);
  }
  return fd;
}

/// Registers (or re-registers) `fd` with `events`; keeps fds_registered right.
bool apply_interest(loop_state& st, int fd, fd_entry& e, std::uint32_t events) {
  if (events == e.events) {
    return true;
  }
  std::error_code ec;
  if (events == 0) {
    ec = st.poller.remove(fd);
  } else if (e.events == 0) {
    ec = st.poller.add(fd, events, static_cast<std::uint64_t>(fd));
  } else {
    ec = st.poller.modify(fd, events, static_cast<std::uint64_t>(fd));
  }
  if (ec) {
    os_error(ec);
    return false;
  }
  if (e.events == 0 && events != 0) {
    ++st.fds_registered;
  } else if (e.events != 0 && events == 0) {
    --st.fds_registered;
  }
  e.events = events;
  return true;
}

/// The epoll mask `e` needs: its handles' and its transport's interest.
std::uint32_t desired_events(const fd_entry& e) {
  std::uint32_t events = 0;
  if (e.reader != nullptr) {
    events |= runtime::poller::readable;
  }
  if (e.writer != nullptr) {
    events |= runtime::poller::writable;
  }
  if (e.transport != nullptr) {
    const auto* t = reinterpret_cast<const transport_object*>(e.transport);
    if (t->want_read) {
      events |= runtime::poller::readable;
    }
    if (t->want_write) {
      events |= runtime::poller::writable;
    }
  }
  return events;
}

fd_entry* entry_for(loop_state& st, int fd, bool create) {
  const auto i = static_cast<std::size_t>(fd);
  if (i >= st.fds.size()) {
    if (!create) {
      return nullptr;
    }
    st.fds.resize(std::max(i + 1, st.fds.size() * 2));
  }
  return &st.fds[i];
}

/// Cancels a handle the loop no longer points at (the old reader/writer).
bool cancel_and_release(const loop_state& st, PyObject* handle) {
  PyObject* r = PyObject_CallMethod(handle, "cancel", nullptr);
  release_handle(st, handle);
  if (r == nullptr) {
    return false;
  }
  Py_DECREF(r);
  return true;
}

PyObject* add_interest(PyObject* self, PyObject* const* args, Py_ssize_t nargs, bool writer,
                       const char* name) {
  loop_state& st = state_of(self);
  if (nargs < 2) {
    PyErr_Format(PyExc_TypeError, "%s() needs an fd and a callback", name);
    return nullptr;
  }
  if (st.closed) {
    return closed_error();
  }
  const int fd = fd_of(args[0]);
  if (fd < 0) {
    return nullptr;
  }
  call_args a;
  a.callback = args[1];
  a.args = args + 2;
  a.nargs = nargs - 2;
  PyObject* h = make_handle(self, st, st.handle_type, a);
  if (h == nullptr) {
    return nullptr;
  }
  fd_entry* e = entry_for(st, fd, true);
  const std::uint32_t bit = writer ? runtime::poller::writable : runtime::poller::readable;
  if (!apply_interest(st, fd, *e, desired_events(*e) | bit)) {
    Py_DECREF(h);
    return nullptr;
  }
  PyObject*& slot = writer ? e->writer : e->reader;
  PyObject* old = std::exchange(slot, Py_NewRef(h));
  if (old != nullptr && !cancel_and_release(st, old)) {
    Py_DECREF(h);
    return nullptr;
  }
  return h;
}

}  // namespace

PyObject* remove_interest(PyObject* self, PyObject* fileobj, bool writer) {
  loop_state& st = state_of(self);
  if (st.closed) {
    Py_RETURN_FALSE;
  }
  const int fd = fd_of(fileobj);
  if (fd < 0) {
    return nullptr;
  }
  fd_entry* e = entry_for(st, fd, false);
  if (e == nullptr || e->events == 0) {
    Py_RETURN_FALSE;
  }
  PyObject*& slot = writer ? e->writer : e->reader;
  if (slot == nullptr && !writer && e->transport != nullptr) {
    // asyncio's transport code stops reading with loop._remove_reader(fd)
    // (at EOF when the protocol keeps the connection open).
    auto* t = reinterpret_cast<transport_object*>(e->transport);
    const bool was_reading = t->want_read;
    t->want_read = false;
    if (!apply_interest(st, fd, *e, desired_events(*e))) {
      return nullptr;
    }
    return PyBool_FromLong(was_reading);
  }
  PyObject* old = std::exchange(slot, nullptr);
  if (!apply_interest(st, fd, *e, desired_events(*e))) {
    slot = old;
    return nullptr;
  }
  if (old == nullptr) {
    Py_RETURN_FALSE;
  }
  if (!cancel_and_release(st, old)) {
    return nullptr;
  }
  Py_RETURN_TRUE;
}

PyObject* loop_add_reader(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return add_interest(self, args, nargs, false, "_add_reader");
}
PyObject* loop_add_writer(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return add_interest(self, args, nargs, true, "_add_writer");
}
PyObject* loop_remove_reader(PyObject* self, PyObject* fd) {
  return remove_interest(self, fd, false);
}
PyObject* loop_remove_writer(PyObject* self, PyObject* fd) {
  return remove_interest(self, fd, true);
}

/// _fd_key(fd) -> (events, reader, writer) or None: what the selector view
/// (loop._selector) reports for repr() and asyncio's transport checks.
PyObject* loop_fd_key(PyObject* self, PyObject* fileobj) {
  loop_state& st = state_of(self);
  const int fd = fd_of(fileobj);
  if (fd < 0) {
    return nullptr;
  }
  fd_entry* e = entry_for(st, fd, false);
  if (e == nullptr || e->events == 0) {
    Py_RETURN_NONE;
  }
  long mask = 0;
  if (e->events & runtime::poller::readable) {
    mask |= event_read;
  }
  if (e->events & runtime::poller::writable) {
    mask |= event_write;
  }
  return Py_BuildValue("(lOO)", mask, e->reader != nullptr ? e->reader : Py_None,
                       e->writer != nullptr ? e->writer : Py_None);
}

PyObject* loop_fd_list(PyObject* self, PyObject*) {
  loop_state& st = state_of(self);
  PyObject* out = PyList_New(0);
  if (out == nullptr) {
    return nullptr;
  }
  for (std::size_t i = 0; i < st.fds.size(); ++i) {
    if (st.fds[i].events == 0) {
      continue;
    }
    PyObject* n = PyLong_FromSize_t(i);
    if (n == nullptr || PyList_Append(out, n) < 0) {
      Py_XDECREF(n);
      Py_DECREF(out);
      return nullptr;
    }
    Py_DECREF(n);
  }
  return out;
}

bool update_interest(loop_state& st, int fd) {
  fd_entry* e = entry_for(st, fd, false);
  if (e == nullptr) {
    return true;
  }
  return apply_interest(st, fd, *e, desired_events(*e));
}

/// _make_transport_core(owner, fd): the C++ half of a socket transport.
PyObject* loop_make_transport_core(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  loop_state& st = state_of(self);
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "_make_transport_core(owner, fd)");
    return nullptr;
  }
  if (st.closed) {
    return closed_error();
  }
  const int fd = PyObject_AsFileDescriptor(args[1]);
  if (fd < 0) {
    return nullptr;
  }
  return new_transport(self, args[0], fd);
}

}  // namespace cadeloop::pyhost::loop
