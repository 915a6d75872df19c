// The close path of cadeloop's socket transports (SocketTransportCore's
// connection_lost and the fatal read error of a native_close transport), the
// loop's answer to "which transport owns this fd" (accepted transports are not
// in loop._transports) and asyncio's Server._attach/_detach done in C++.
//
// connection_lost(exc) is _SocketTransport._call_connection_lost, i.e.
// asyncio's _SelectorSocketTransport and _SelectorTransport ones, in their
// order and with their exceptions; an accepted connection whose socket.socket
// was never made has its fd closed here, and, when nothing else had that fd,
// leaves epoll with the close (no epoll_ctl).
#include "loop/loop_transport_close.hpp"

#include <unistd.h>

#include <cstddef>
#include <utility>

#include "loop/loop_methods.hpp"

namespace cadeloop::pyhost::loop {

namespace {

transport_object* as_transport(PyObject* o) {
  return reinterpret_cast<transport_object*>(o);
}

enum support_name : Py_ssize_t {
  sn_protocol_connected,
  sn_protocol,
  sn_connection_lost,
  sn_sock,
  sn_close,
  sn_loop,
  sn_server,
  sn_detach,
  sn_set_exception,
  sn_own_sock,
  sn_sockargs,
  sn_sockets,
  sn_clients,
  sn_pending_removals,
  sn_commit_removals,
  sn_data,
  sn_remove,
  sn_active_count,
  sn_wakeup,
  sn_count
};

constexpr const char* support_text[sn_count] = {"_protocol_connected",
                                                "_protocol",
                                                "connection_lost",
                                                "_sock",
                                                "close",
                                                "_loop",
                                                "_server",
                                                "_detach",
                                                "set_exception",
                                                "_cadeloop_sock",
                                                "_cadeloop_sockargs",
                                                "_sockets",
                                                "_clients",
                                                "_pending_removals",
                                                "_commit_removals",
                                                "data",
                                                "_remove",
                                                "_active_count",
                                                "_wakeup"};

/// The loop's tuple of the names the close path uses (made once). Borrowed.
PyObject* close_names(loop_state& st) {
  if (st.transport_support != nullptr) {
    return st.transport_support;
  }
  PyObject* names = PyTuple_New(sn_count);
  if (names == nullptr) {
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < sn_count; ++i) {
    PyObject* n = PyUnicode_InternFromString(support_text[i]);
    if (n == nullptr) {
      Py_DECREF(names);
      return nullptr;
    }
    PyTuple_SET_ITEM(names, i, n);
  }
  st.transport_support = names;
  return names;
}

/// Sets `exc` (taken) as the current exception, with `context` (taken) as
/// its __context__, as an exception raised in a finally block would have.
void raise_with_context(PyObject* exc, PyObject* context) {
  if (context != nullptr && exc != nullptr && exc != context) {
    PyException_SetContext(exc, context);  // steals context
  } else {
    Py_XDECREF(context);
  }
  if (exc != nullptr) {
    restore_exception(exc);
  }
}

/// WeakSet's own first step of add() and discard(): pending removals committed.
bool commit_removals(PyObject* clients, PyObject* names) {
  PyObject* pending = PyObject_GetAttr(clients, PyTuple_GET_ITEM(names, sn_pending_removals));
  const int any = pending != nullptr ? PyObject_IsTrue(pending) : -1;
  Py_XDECREF(pending);
  if (any <= 0) {
    return any == 0;
  }
  PyObject* r = PyObject_CallMethodNoArgs(clients, PyTuple_GET_ITEM(names, sn_commit_removals));
  Py_XDECREF(r);
  return r != nullptr;
}

/// server._clients.data (the WeakSet's set of weak references), committed.
PyObject* client_refs(PyObject* server, PyObject* names, PyObject** clients_out) {
  PyObject* clients = PyObject_GetAttr(server, PyTuple_GET_ITEM(names, sn_clients));
  if (clients == nullptr || !commit_removals(clients, names)) {
    Py_XDECREF(clients);
    return nullptr;
  }
  PyObject* data = PyObject_GetAttr(clients, PyTuple_GET_ITEM(names, sn_data));
  if (data != nullptr && !PySet_Check(data)) {
    Py_CLEAR(data);
    PyErr_SetString(PyExc_TypeError, "Server._clients.data is not a set");
  }
  if (data == nullptr) {
    Py_DECREF(clients);
    return nullptr;
  }
  *clients_out = clients;
  return data;
}

/// asyncio's Server._detach(transport) (3.13) or _detach() (3.11).
bool server_detach(transport_object* t, PyObject* server, PyObject* owner, PyObject* names) {
  auto n = [names](support_name i) { return PyTuple_GET_ITEM(names, i); };
  bool empty = false;
  if (t->detach_transport) {
    // self._clients.discard(transport); len(self._clients) == 0
    PyObject* clients = nullptr;
    PyObject* data = client_refs(server, names, &clients);
    if (data == nullptr) {
      return false;
    }
    PyObject* ref = PyWeakref_NewRef(owner, nullptr);
    const int rc = ref != nullptr ? PySet_Discard(data, ref) : -1;
    Py_XDECREF(ref);
    PyObject* pending = rc >= 0 ? PyObject_GetAttr(clients, n(sn_pending_removals)) : nullptr;
    const Py_ssize_t waiting = pending != nullptr ? PyObject_Length(pending) : -1;
    Py_XDECREF(pending);
    empty = waiting >= 0 && PySet_GET_SIZE(data) - waiting == 0;
    Py_DECREF(data);
    Py_DECREF(clients);
    if (waiting < 0) {
      return false;
    }
  } else {
    // assert self._active_count > 0; self._active_count -= 1
    PyObject* count = PyObject_GetAttr(server, n(sn_active_count));
    if (count == nullptr) {
      return false;
    }
    const long c = PyLong_AsLong(count);
    Py_DECREF(count);
    if (c == -1 && PyErr_Occurred()) {
      return false;
    }
    if (c <= 0) {
      PyErr_SetNone(PyExc_AssertionError);
      return false;
    }
    PyObject* less = PyLong_FromLong(c - 1);
    const int rc = less != nullptr ? PyObject_SetAttr(server, n(sn_active_count), less) : -1;
    Py_XDECREF(less);
    if (rc < 0) {
      return false;
    }
    empty = c - 1 == 0;
  }
  if (!empty) {
    return true;
  }
  PyObject* sockets = PyObject_GetAttr(server, n(sn_sockets));
  if (sockets == nullptr) {
    return false;
  }
  const bool stopped = sockets == Py_None;
  Py_DECREF(sockets);
  if (!stopped) {
    return true;
  }
  PyObject* r = PyObject_CallMethodNoArgs(server, n(sn_wakeup));
  Py_XDECREF(r);
  return r != nullptr;
}

/// asyncio's _SelectorTransport._call_connection_lost's finally block: the
/// socket closed, the transport's references dropped, the server told.
bool close_and_detach(transport_object* t, PyObject* owner, PyObject* names) {
  auto n = [names](support_name i) { return PyTuple_GET_ITEM(names, i); };
  // _SocketTransport keeps its socket.socket in its dict as _cadeloop_sock (its
  // _sock property); an accepted connection's is made on first use, and one
  // never made is closed here as its fd.
  PyObject* dict = PyObject_GenericGetDict(owner, nullptr);
  if (dict == nullptr) {
    return false;
  }
  PyObject* sock = PyDict_GetItemWithError(dict, n(sn_own_sock));  // borrowed
  if (sock == nullptr && PyErr_Occurred()) {
    Py_DECREF(dict);
    return false;
  }
  PyObject* r = nullptr;
  if (sock == nullptr && PyDict_GetItemWithError(dict, n(sn_sockargs)) != nullptr) {
    ::close(t->fd);  // out of the fd table already (detach)
    r = Py_NewRef(Py_None);
  } else if (sock == nullptr) {
    r = PyErr_Occurred() ? nullptr : PyObject_GetAttr(owner, n(sn_sock));  // AttributeError
    Py_XDECREF(r);
    r = nullptr;
  } else {
    Py_INCREF(sock);
    r = PyObject_CallMethodNoArgs(sock, n(sn_close));
    Py_DECREF(sock);
  }
  if (r == nullptr) {
    Py_DECREF(dict);
    return false;
  }
  Py_DECREF(r);
  const bool cleared = PyDict_SetItem(dict, n(sn_own_sock), Py_None) == 0;
  Py_DECREF(dict);
  if (!cleared || PyObject_SetAttr(owner, n(sn_protocol), Py_None) < 0 ||
      PyObject_SetAttr(owner, n(sn_loop), Py_None) < 0) {
    return false;
  }
  PyObject* server = PyObject_GetAttr(owner, n(sn_server));
  if (server == nullptr) {
    return false;
  }
  if (server != Py_None) {
    if (t->inline_server) {
      r = server_detach(t, server, owner, names) ? Py_NewRef(Py_None) : nullptr;
    } else {
      r = t->detach_transport ? PyObject_CallMethodOneArg(server, n(sn_detach), owner)
                              : PyObject_CallMethodNoArgs(server, n(sn_detach));
    }
    Py_DECREF(server);
    if (r == nullptr) {
      return false;
    }
    Py_DECREF(r);
    return PyObject_SetAttr(owner, n(sn_server), Py_None) == 0;
  }
  Py_DECREF(server);
  return true;
}

/// Out of the fd table with no epoll_ctl, for an accepted fd that nothing
/// but this transport has (no socket.socket made, no reader or writer
/// handle): close_and_detach closes it, which takes it out of epoll. False
/// (nothing done) otherwise.
bool leave_quietly(transport_object* t, PyObject* owner, PyObject* names) {
  if (!t->fd_private || !t->attached) {
    return false;
  }
  loop_state& st = state_of(t->loop);
  const auto i = static_cast<std::size_t>(t->fd);
  if (i >= st.fds.size() || st.fds[i].transport != reinterpret_cast<PyObject*>(t) ||
      st.fds[i].reader != nullptr || st.fds[i].writer != nullptr) {
    return false;
  }
  PyObject* dict = PyObject_GenericGetDict(owner, nullptr);
  if (dict == nullptr) {
    PyErr_Clear();
    return false;
  }
  const bool lazy =
      PyDict_GetItemWithError(dict, PyTuple_GET_ITEM(names, sn_own_sock)) == nullptr &&
      !PyErr_Occurred() &&
      PyDict_GetItemWithError(dict, PyTuple_GET_ITEM(names, sn_sockargs)) != nullptr;
  Py_DECREF(dict);
  if (!lazy) {
    PyErr_Clear();
    return false;
  }
  fd_entry& e = st.fds[i];
  t->attached = false;
  t->want_read = false;
  t->want_write = false;
  PyObject* mine = std::exchange(e.transport, nullptr);
  --st.connections;
  if (e.events != 0) {
    e.events = 0;
    --st.fds_registered;
  }
  Py_DECREF(mine);  // the caller holds the core too
  return true;
}

}  // namespace

/// connection_lost(exc): _SocketTransport._call_connection_lost, i.e.
/// asyncio's _SelectorSocketTransport and _SelectorTransport ones, in their
/// order: out of the fd table, protocol.connection_lost(exc) if connected,
/// the socket closed, server._detach, sendfile's waiter failed; then release().
PyObject* transport_connection_lost(PyObject* self, PyObject* exc) {
  transport_object* t = as_transport(self);
  if (t->owner == nullptr) {
    Py_RETURN_NONE;  // released already
  }
  PyObject* names = close_names(state_of(t->loop));
  if (names == nullptr) {
    return nullptr;
  }
  auto n = [names](support_name i) { return PyTuple_GET_ITEM(names, i); };
  Py_INCREF(self);
  PyObject* owner = Py_NewRef(t->owner);
  if (!leave_quietly(t, owner, names)) {
    detach(t);
  }
  bool ok = true;
  PyObject* connected = PyObject_GetAttr(owner, n(sn_protocol_connected));
  const int truth = connected != nullptr ? PyObject_IsTrue(connected) : -1;
  Py_XDECREF(connected);
  if (truth > 0) {
    PyObject* protocol = PyObject_GetAttr(owner, n(sn_protocol));
    PyObject* r = protocol != nullptr
                      ? PyObject_CallMethodOneArg(protocol, n(sn_connection_lost), exc)
                      : nullptr;
    Py_XDECREF(protocol);
    ok = r != nullptr;
    Py_XDECREF(r);
  } else if (truth < 0) {
    ok = false;
  }
  PyObject* pending = ok ? nullptr : take_exception();
  if (!close_and_detach(t, owner, names)) {
    raise_with_context(take_exception(), pending);
    ok = false;
  } else if (pending != nullptr) {
    restore_exception(pending);
  }
  if (ok && t->empty_waiter != nullptr) {
    PyObject* waiter = Py_NewRef(t->empty_waiter);
    PyObject* error =
        PyObject_CallFunction(PyExc_ConnectionError, "s", "Connection is closed by peer");
    PyObject* r =
        error != nullptr ? PyObject_CallMethodOneArg(waiter, n(sn_set_exception), error) : nullptr;
    Py_XDECREF(error);
    Py_DECREF(waiter);
    ok = r != nullptr;
    Py_XDECREF(r);
  }
  PyObject* failure = ok ? nullptr : take_exception();
  PyObject* r = transport_release(self, nullptr);
  Py_XDECREF(r);
  Py_DECREF(owner);
  Py_DECREF(self);
  if (failure != nullptr) {
    restore_exception(failure);
    return nullptr;
  }
  Py_RETURN_NONE;
}

namespace {

PyMethodDef lost_def = {"_connection_lost", transport_connection_lost, METH_O,
                        "connection_lost(exc) of a transport closed by a fatal error."};

}  // namespace

/// _SocketTransport._force_close(exc): the buffer dropped, reading stopped,
/// connection_lost scheduled (the C++ one) in a copy of the current context.
int force_close(transport_object* t, PyObject* exc) {
  if (t->conn_lost != 0) {
    return 0;
  }
  clear_chunks(t);
  t->want_write = false;
  t->closing = true;
  t->want_read = false;
  // An fd only this transport has stays in epoll until connection_lost closes
  // it, which takes it out with no epoll_ctl (a poll in between may report it
  // again; nothing reads it).
  if (!t->fd_private && !apply(t)) {
    return -1;
  }
  t->conn_lost += 1;
  PyObject* callback = PyCFunction_New(&lost_def, reinterpret_cast<PyObject*>(t));
  if (callback == nullptr) {
    return -1;
  }
  loop_state& st = state_of(t->loop);
  PyObject* argv[1] = {exc};
  call_args ca;
  ca.callback = callback;
  ca.args = argv;
  ca.nargs = 1;
  PyObject* h = make_handle(t->loop, st, st.handle_type, ca);
  Py_DECREF(callback);
  if (h == nullptr) {
    return -1;
  }
  if (!st.gil_xthread.empty() || !st.xthread.empty()) {
    drain_xthread(st);
  }
  st.ready.push_back(h);
  return 0;
}

namespace {

/// The core that owns `fdo` in the loop's fd table, or nullptr (never raises).
transport_object* fd_owner_core(PyObject* self, PyObject* fdo) {
  if (!PyLong_Check(fdo)) {
    return nullptr;
  }
  const long fd = PyLong_AsLong(fdo);
  if (fd < 0) {
    PyErr_Clear();
    return nullptr;
  }
  loop_state& st = state_of(self);
  const auto i = static_cast<std::size_t>(fd);
  if (st.released || i >= st.fds.size() || st.fds[i].transport == nullptr) {
    return nullptr;
  }
  transport_object* t = as_transport(st.fds[i].transport);
  return t->owner != nullptr ? t : nullptr;
}

}  // namespace

bool fd_has_transport(PyObject* self, PyObject* fdo) {
  return fd_owner_core(self, fdo) != nullptr;
}

bool server_attach(PyObject* self, PyObject* server, PyObject* transport, bool with_transport) {
  PyObject* names = close_names(state_of(self));
  if (names == nullptr) {
    return false;
  }
  // assert self._sockets is not None
  PyObject* sockets = PyObject_GetAttr(server, PyTuple_GET_ITEM(names, sn_sockets));
  if (sockets == nullptr) {
    return false;
  }
  const bool stopped = sockets == Py_None;
  Py_DECREF(sockets);
  if (stopped) {
    PyErr_SetNone(PyExc_AssertionError);
    return false;
  }
  if (with_transport) {
    // self._clients.add(transport): a weak reference with the WeakSet's callback
    PyObject* clients = nullptr;
    PyObject* data = client_refs(server, names, &clients);
    if (data == nullptr) {
      return false;
    }
    PyObject* remove = PyObject_GetAttr(clients, PyTuple_GET_ITEM(names, sn_remove));
    PyObject* ref = remove != nullptr ? PyWeakref_NewRef(transport, remove) : nullptr;
    const int rc = ref != nullptr ? PySet_Add(data, ref) : -1;
    Py_XDECREF(ref);
    Py_XDECREF(remove);
    Py_DECREF(data);
    Py_DECREF(clients);
    return rc == 0;
  }
  // self._active_count += 1
  PyObject* count = PyObject_GetAttr(server, PyTuple_GET_ITEM(names, sn_active_count));
  PyObject* one = PyLong_FromLong(1);
  PyObject* more = count != nullptr && one != nullptr ? PyNumber_Add(count, one) : nullptr;
  Py_XDECREF(one);
  Py_XDECREF(count);
  const int rc = more != nullptr
                     ? PyObject_SetAttr(server, PyTuple_GET_ITEM(names, sn_active_count), more)
                     : -1;
  Py_XDECREF(more);
  return rc == 0;
}

/// _fd_transport(fd): the transport whose core owns fd in the loop's table
/// (from its creation to its connection_lost), or None.
PyObject* loop_fd_transport(PyObject* self, PyObject* fdo) {
  transport_object* t = fd_owner_core(self, fdo);
  return Py_NewRef(t != nullptr ? t->owner : Py_None);
}

}  // namespace cadeloop::pyhost::loop
