// cadeloop._core.Acceptor: the accept loop of a server's listening socket
// (what asyncio's BaseSelectorEventLoop._accept_connection and
// _accept_connection2 do, for plain TCP and Unix stream servers).
//
// An Acceptor is the reader callback cadeloop.Loop._start_serving registers
// for a listening socket, so the loop's fd table, _stop_serving (server.close())
// and the selector view treat it as asyncio's reader. Each readiness event:
//
// - accepts up to `backlog` connections with accept4(SOCK_NONBLOCK |
//   SOCK_CLOEXEC) (asyncio's accept() then setblocking(False)), stopping at
//   the first would-block, EINTR or ECONNABORTED, as asyncio does;
// - schedules for each, in a copy of the current context (as asyncio's
//   create_task of _accept_connection2 copies it), one callback that calls
//   the protocol factory and makes the transport (cadeloop's _SocketTransport,
//   in one pass: what asyncio's __init__ chain sets, server._attach(),
//   TCP_NODELAY, connection_made scheduled, reading started). The callback is
//   a plain callback, not a Task: no Task and no waiter future per
//   connection. The fd is the acceptor's until then (closed if the acceptor
//   goes away first);
// - makes no socket.socket: the transport makes it, and the TransportSocket
//   of its extra info, when something asks (_SocketTransport._sock, _extra);
//   a connection closed before that has its fd closed by the C++ close path
//   (loop_transport.cpp), which also leaves epoll with the close. Accepted
//   transports are not in loop._transports: the fd table tells which
//   transport owns an fd (Loop._ensure_fd_no_transport);
// - on EMFILE, ENFILE, ENOBUFS or ENOMEM calls back into Python
//   (Loop._cadeloop_accept_paused): asyncio's exception-handler report, the
//   reader removed, and _start_serving again after ACCEPT_RETRY_DELAY (and,
//   as asyncio's loop does, the next accept of the batch is tried all the
//   same, up to `backlog` reports); any other accept error is raised (the
//   handle reports it, as asyncio's).
//
// In debug mode an event is handed to asyncio's own _accept_connection (its
// debug logs and reports). Loop thread only.
#include "loop/loop_accept.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <deque>
#include <new>
#include <utility>

#include "loop/loop_methods.hpp"
#include "loop/loop_type.hpp"

namespace cadeloop::pyhost::loop {

namespace {

struct acceptor_object {
  PyObject_HEAD PyObject* loop;  // the LoopCore (strong)
  PyObject* protocol_factory;    // strong
  PyObject* sock;                // the listening socket.socket (strong)
  PyObject* server;              // asyncio.Server or None (strong)
  PyObject* transport_type;      // cadeloop._loop._SocketTransport (strong)
  PyObject* socket_type;         // socket.socket (strong)
  PyObject* connect;             // this acceptor's _connect, bound once (strong; a cycle)
  PyObject* str_peername;        // interned "peername" (strong)
  PyObject* plan;                // the one-pass transport constructor's plan, or None (strong)
  PyObject* names[16];           // interned attribute names of that constructor (strong)
  PyObject* sockargs;  // (family, type | SOCK_NONBLOCK, proto) of accepted sockets (strong)
  // Accepted fds whose _connect has not run yet, oldest first (owned: closed
  // if the acceptor goes away before their callback runs).
  std::deque<int>* pending;
  int family;
  int type;
  int proto;
  Py_ssize_t backlog;
  bool inline_server;  // the server's _attach/_detach are asyncio's (done in C++)
};

acceptor_object* as_acceptor(PyObject* o) {
  return reinterpret_cast<acceptor_object*>(o);
}

bool accept_would_block(int err) {
  // asyncio: BlockingIOError, InterruptedError, ConnectionAbortedError end the batch.
  return err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED;
}

bool out_of_resources(int err) {
  return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
}

/// The transport could not be made: asyncio's _accept_connection2 drops the
/// error, and reports it to the exception handler in debug mode only.
PyObject* creation_failed(acceptor_object* a, PyObject* protocol, PyObject* transport) {
  if (PyErr_ExceptionMatches(PyExc_SystemExit) || PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
    return nullptr;
  }
  PyObject* exc = take_exception();
  PyObject* result = nullptr;
  if (!state_of(a->loop).debug) {
    result = Py_NewRef(Py_None);
  } else {
    PyObject* context =
        Py_BuildValue("{s:s,s:O}", "message", "Error on transport creation for incoming connection",
                      "exception", exc != nullptr ? exc : Py_None);
    if (context != nullptr && protocol != nullptr &&
        PyDict_SetItemString(context, "protocol", protocol) < 0) {
      Py_CLEAR(context);
    }
    if (context != nullptr && transport != nullptr &&
        PyDict_SetItemString(context, "transport", transport) < 0) {
      Py_CLEAR(context);
    }
    if (context != nullptr) {
      result = PyObject_CallMethod(a->loop, "call_exception_handler", "O", context);
      Py_DECREF(context);
    }
  }
  Py_XDECREF(exc);
  return result;
}

// The plan (from _loop.accepted_transport_plan): (transport class,
// TransportSocket, the listener's sockname or None, TCP_NODELAY?, does
// Server._attach take the transport?, the name of the method asyncio's
// __init__ binds as _write_ready or None, BufferedProtocol).
enum plan_item : Py_ssize_t {
  plan_class,
  plan_transport_socket,
  plan_sockname,
  plan_nodelay,
  plan_attach_transport,
  plan_write_ready,
  plan_buffered,
  plan_size
};

enum name_item : std::size_t {
  nm_write,
  nm_writelines,
  nm_sockargs,
  nm_sock_fd,
  nm_protocol,
  nm_protocol_connected,
  nm_server,
  nm_attach,
  nm_call_soon,
  nm_connection_made,
  nm_start_reading,
  nm_release,
  nm_extra,
  nm_loop,
  nm_core,
  nm_sockname,
  nm_count
};

static_assert(nm_count == sizeof(acceptor_object::names) / sizeof(PyObject*));

constexpr const char* name_text[nm_count] = {
    "write",           "writelines",    "_cadeloop_sockargs",
    "_sock_fd",        "_protocol",     "_protocol_connected",
    "_server",         "_attach",       "call_soon",
    "connection_made", "start_reading", "release",
    "_cadeloop_extra", "_loop",         "_core",
    "sockname"};

/// Sets the attributes of a new transport, in asyncio's order, as its
/// __init__ chain would (see accepted_transport_plan in _loop.py).
bool fill_transport(acceptor_object* a, PyObject* self, PyObject* core, int fd, PyObject* protocol,
                    PyObject* peername) {
  PyObject* const* nm = a->names;
  PyObject* plan = a->plan;
  PyObject* extra = PyDict_New();
  if (extra == nullptr) {
    return false;
  }
  // peername and sockname; _SocketTransport._extra adds "socket" (asyncio's
  // TransportSocket of the socket.socket, both made on first use).
  bool ok = PyDict_SetItem(extra, a->str_peername, peername) == 0;
  if (ok) {
    PyObject* sockname = PyTuple_GET_ITEM(plan, plan_sockname);
    if (sockname == Py_None) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
        sockname = socket_address(ss, len);
        if (sockname == nullptr) {
          if (!PyErr_ExceptionMatches(PyExc_OSError)) {
            ok = false;
          } else {
            PyErr_Clear();
            sockname = Py_NewRef(Py_None);
          }
        }
      } else {
        sockname = Py_NewRef(Py_None);  // asyncio: None when getsockname() fails
      }
    } else {
      Py_INCREF(sockname);
    }
    ok = ok && PyDict_SetItem(extra, nm[nm_sockname], sockname) == 0;
    Py_XDECREF(sockname);
  }
  PyObject* dict = ok ? PyObject_GenericGetDict(self, nullptr) : nullptr;
  ok = dict != nullptr && PyDict_SetItem(dict, nm[nm_extra], extra) == 0 &&
       PyObject_SetAttr(self, nm[nm_loop], a->loop) == 0;  // a slot of _FlowControlMixin
  Py_DECREF(extra);
  if (!ok) {
    Py_XDECREF(dict);
    return false;
  }
  const int buffered = PyObject_IsInstance(protocol, PyTuple_GET_ITEM(plan, plan_buffered));
  PyObject* fd_obj = PyLong_FromLong(fd);
  PyObject* write = PyObject_GetAttr(core, nm[nm_write]);
  PyObject* writelines = PyObject_GetAttr(core, nm[nm_writelines]);
  ok = buffered >= 0 && fd_obj != nullptr && write != nullptr && writelines != nullptr &&
       PyDict_SetItem(dict, nm[nm_core], core) == 0 &&
       PyDict_SetItem(dict, nm[nm_write], write) == 0 &&
       PyDict_SetItem(dict, nm[nm_writelines], writelines) == 0 &&
       PyDict_SetItem(dict, nm[nm_sockargs], a->sockargs) == 0 &&
       PyDict_SetItem(dict, nm[nm_sock_fd], fd_obj) == 0 &&
       PyDict_SetItem(dict, nm[nm_protocol], protocol) == 0 &&
       PyDict_SetItem(dict, nm[nm_protocol_connected], Py_True) == 0;
  Py_XDECREF(write);
  Py_XDECREF(writelines);
  if (ok) {
    // The core's set_protocol(protocol, buffered).
    auto* tc = reinterpret_cast<transport_object*>(core);
    Py_XSETREF(tc->protocol, Py_NewRef(protocol));
    tc->buffered = buffered != 0;
    ok = PyDict_SetItem(dict, nm[nm_server], a->server) == 0;
  }
  if (ok && a->server != Py_None) {
    const bool with_transport = PyObject_IsTrue(PyTuple_GET_ITEM(plan, plan_attach_transport)) == 1;
    if (a->inline_server) {
      ok = server_attach(a->loop, a->server, self, with_transport);
    } else {
      PyObject* r = with_transport ? PyObject_CallMethodOneArg(a->server, nm[nm_attach], self)
                                   : PyObject_CallMethodNoArgs(a->server, nm[nm_attach]);
      ok = r != nullptr;
      Py_XDECREF(r);
    }
  }
  // Not in loop._transports: the fd table says which transport owns the fd
  // (Loop._ensure_fd_no_transport, _fd_transport), with no weak reference.
  Py_XDECREF(fd_obj);
  // _read_ready_cb and _write_ready are _SocketTransport's properties (bound
  // methods of the transport in its own dict would make it a cycle).
  Py_DECREF(dict);
  if (ok && PyObject_IsTrue(PyTuple_GET_ITEM(plan, plan_nodelay))) {
    const int one = 1;
    if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0) {
      PyErr_SetFromErrno(PyExc_OSError);
      ok = false;
    }
  }
  if (ok) {
    // asyncio: call_soon(protocol.connection_made, self), then
    // call_soon(self._add_reader, fd, self._read_ready), which is the core's
    // start_reading (not if connection_made closed or paused the transport).
    PyObject* made = PyObject_GetAttr(protocol, nm[nm_connection_made]);
    PyObject* r = made == nullptr
                      ? nullptr
                      : PyObject_CallMethodObjArgs(a->loop, nm[nm_call_soon], made, self, nullptr);
    Py_XDECREF(made);
    ok = r != nullptr;
    Py_XDECREF(r);
  }
  if (ok) {
    PyObject* start = PyObject_GetAttr(core, nm[nm_start_reading]);
    PyObject* r = start == nullptr
                      ? nullptr
                      : PyObject_CallMethodObjArgs(a->loop, nm[nm_call_soon], start, nullptr);
    Py_XDECREF(start);
    ok = r != nullptr;
    Py_XDECREF(r);
  }
  return ok;
}

/// The transport of an accepted connection, made in one pass (the plan's
/// class, not its __init__); nullptr with an exception if it could not be made.
PyObject* make_accepted_transport(acceptor_object* a, int fd, PyObject* protocol,
                                  PyObject* peername) {
  auto* cls = reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(a->plan, plan_class));
  PyObject* no_args = PyTuple_New(0);
  if (no_args == nullptr) {
    return nullptr;
  }
  PyObject* self = PyBaseObject_Type.tp_new(cls, no_args, nullptr);
  Py_DECREF(no_args);
  if (self == nullptr) {
    return nullptr;
  }
  // The loop's _make_transport_core(self, fd).
  PyObject* core = state_of(a->loop).closed
                       ? PyErr_Format(PyExc_RuntimeError, "Event loop is closed")
                       : new_transport(a->loop, self, fd);
  if (core == nullptr) {
    Py_DECREF(self);
    return nullptr;
  }
  // connection_lost and fatal read errors in C++ (the plan is only made when
  // asyncio's close path is the one _SocketTransport's does in one frame).
  auto* tc = reinterpret_cast<transport_object*>(core);
  tc->native_close = true;
  tc->detach_transport = PyObject_IsTrue(PyTuple_GET_ITEM(a->plan, plan_attach_transport)) == 1;
  tc->fd_private = true;  // until _SocketTransport makes its socket.socket
  tc->inline_server = a->inline_server;
  if (!fill_transport(a, self, core, fd, protocol, peername)) {
    // Out of the loop's fd table; the caller closes the socket (asyncio's
    // __init__ raising, as cadeloop's _SocketTransport handles it).
    PyObject* exc = take_exception();
    PyObject* r = PyObject_CallMethodNoArgs(core, a->names[nm_release]);
    Py_XDECREF(r);
    if (r == nullptr) {
      PyErr_Clear();
    }
    restore_exception(exc);
    Py_DECREF(core);
    Py_DECREF(self);
    return nullptr;
  }
  Py_DECREF(core);
  return self;
}

/// socket.socket(family, type | SOCK_NONBLOCK, proto, fd): an accepted
/// connection's socket object (non-blocking, no system call); it owns fd.
PyObject* socket_object(acceptor_object* a, int fd) {
  PyObject* fd_obj = PyLong_FromLong(fd);
  if (fd_obj == nullptr) {
    return nullptr;
  }
  PyObject* argv[4] = {PyTuple_GET_ITEM(a->sockargs, 0), PyTuple_GET_ITEM(a->sockargs, 1),
                       PyTuple_GET_ITEM(a->sockargs, 2), fd_obj};
  PyObject* conn = PyObject_Vectorcall(a->socket_type, argv, 4, nullptr);
  Py_DECREF(fd_obj);
  return conn;
}

/// An accepted fd no transport took: dropped as asyncio drops its socket
/// object (closed by the object's finalizer, with its ResourceWarning).
void drop_fd(acceptor_object* a, int fd) {
  PyObject* exc = take_exception();
  PyObject* conn = socket_object(a, fd);
  if (conn == nullptr) {
    PyErr_Clear();
    ::close(fd);
  } else {
    Py_DECREF(conn);
  }
  restore_exception(exc);
}

/// Takes fd out of the acceptor's pending fds; false if it is not there.
bool take_pending(acceptor_object* a, int fd) {
  std::deque<int>& q = *a->pending;
  if (!q.empty() && q.front() == fd) {
    q.pop_front();
    return true;
  }
  for (auto it = q.begin(); it != q.end(); ++it) {
    if (*it == fd) {
      q.erase(it);
      return true;
    }
  }
  return false;
}

/// _connect(fd, addr): one accepted connection, in its own context copy:
/// the protocol factory, then the transport (asyncio's order and context).
/// The transport makes its socket.socket when something asks for it.
PyObject* acceptor_connect(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  acceptor_object* a = as_acceptor(self);
  if (nargs != 2 || !PyLong_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "_connect(fd, addr)");
    return nullptr;
  }
  const long fd_long = PyLong_AsLong(args[0]);
  if (fd_long == -1 && PyErr_Occurred()) {
    return nullptr;
  }
  const int fd = static_cast<int>(fd_long);
  if (!take_pending(a, fd)) {
    PyErr_Format(PyExc_RuntimeError, "_connect(): fd %d is no connection this acceptor accepted",
                 fd);
    return nullptr;
  }
  PyObject* protocol = PyObject_CallNoArgs(a->protocol_factory);
  if (protocol == nullptr) {
    PyObject* r = creation_failed(a, nullptr, nullptr);
    drop_fd(a, fd);
    return r;
  }
  // _SocketTransport(loop, sock, protocol, waiter, extra, server): no waiter,
  // nothing awaits the connection (asyncio's waiter only resumed its task).
  PyObject* transport = nullptr;
  if (a->plan != Py_None) {
    transport = make_accepted_transport(a, fd, protocol, args[1]);
    if (transport == nullptr) {
      PyObject* r = creation_failed(a, protocol, nullptr);
      Py_DECREF(protocol);
      drop_fd(a, fd);
      return r;
    }
  } else {
    PyObject* conn = socket_object(a, fd);
    if (conn == nullptr) {
      ::close(fd);
      Py_DECREF(protocol);
      return nullptr;
    }
    PyObject* extra = PyDict_New();
    if (extra == nullptr || PyDict_SetItem(extra, a->str_peername, args[1]) < 0) {
      Py_XDECREF(extra);
      Py_DECREF(conn);
      Py_DECREF(protocol);
      return nullptr;
    }
    PyObject* call[6] = {a->loop, conn, protocol, Py_None, extra, a->server};
    transport = PyObject_Vectorcall(a->transport_type, call, 6, nullptr);
    Py_DECREF(extra);
    if (transport == nullptr) {
      PyObject* r = creation_failed(a, protocol, nullptr);
      Py_DECREF(protocol);
      Py_DECREF(conn);  // closed by its finalizer, as asyncio's
      return r;
    }
    Py_DECREF(conn);
  }
  Py_DECREF(transport);
  Py_DECREF(protocol);
  Py_RETURN_NONE;
}

PyMethodDef connect_def = {
    "_connect", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(acceptor_connect)),
    METH_FASTCALL, "One accepted connection: the protocol factory, then the transport."};

/// Schedules _connect(fd, addr) in a copy of the current context.
bool schedule_connect(acceptor_object* a, loop_state& st, PyObject* conn, PyObject* addr) {
  PyObject* argv[2] = {conn, addr};
  call_args ca;
  ca.callback = a->connect;
  ca.args = argv;
  ca.nargs = 2;
  PyObject* h = make_handle(a->loop, st, st.handle_type, ca);
  if (h == nullptr) {
    return false;
  }
  if (!st.gil_xthread.empty() || !st.xthread.empty()) {
    drain_xthread(st);
  }
  st.ready.push_back(h);
  return true;
}

/// Out of descriptors or memory: asyncio's report and retry, in Python.
PyObject* pause_accepting(acceptor_object* a, int err) {
  errno = err;
  PyErr_SetFromErrno(PyExc_OSError);
  PyObject* exc = take_exception();
  if (exc == nullptr) {
    return nullptr;
  }
  PyObject* r = PyObject_CallMethod(a->loop, "_cadeloop_accept_paused", "OOOOn", exc,
                                    a->protocol_factory, a->sock, a->server, a->backlog);
  Py_DECREF(exc);
  return r;
}

/// The reader callback: one readiness event of the listening socket.
PyObject* acceptor_call(PyObject* self, PyObject*, PyObject*) {
  acceptor_object* a = as_acceptor(self);
  loop_state& st = state_of(a->loop);
  if (st.debug) {
    return PyObject_CallMethod(a->loop, "_cadeloop_accept_python", "OOOn", a->protocol_factory,
                               a->sock, a->server, a->backlog);
  }
  const int fd = PyObject_AsFileDescriptor(a->sock);
  if (fd < 0) {
    if (!PyErr_Occurred()) {
      errno = EBADF;  // a closed socket.socket: what its accept() raises
      PyErr_SetFromErrno(PyExc_OSError);
    }
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < a->backlog; ++i) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    const int conn_fd =
        ::accept4(fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (conn_fd < 0) {
      const int err = errno;
      if (accept_would_block(err)) {
        break;
      }
      if (out_of_resources(err)) {
        // asyncio reports, removes the reader, schedules the retry and then
        // goes on accepting (up to the backlog): the same, report by report.
        PyObject* r = pause_accepting(a, err);
        if (r == nullptr) {
          return nullptr;
        }
        Py_DECREF(r);
        continue;
      }
      errno = err;
      return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyObject* addr = socket_address(ss, len);
    if (addr == nullptr) {
      ::close(conn_fd);
      return nullptr;
    }
    PyObject* conn = PyLong_FromLong(conn_fd);
    if (conn == nullptr) {
      ::close(conn_fd);
      Py_DECREF(addr);
      return nullptr;
    }
    try {
      a->pending->push_back(conn_fd);
    } catch (const std::bad_alloc&) {
      ::close(conn_fd);
      Py_DECREF(conn);
      Py_DECREF(addr);
      return PyErr_NoMemory();
    }
    ++st.accepted;
    const bool ok = schedule_connect(a, st, conn, addr);
    Py_DECREF(conn);
    Py_DECREF(addr);
    if (!ok) {
      take_pending(a, conn_fd);
      ::close(conn_fd);
      return nullptr;
    }
  }
  Py_RETURN_NONE;
}

int acceptor_traverse(PyObject* self, visitproc visit, void* arg) {
  acceptor_object* a = as_acceptor(self);
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(a->loop);
  Py_VISIT(a->protocol_factory);
  Py_VISIT(a->sock);
  Py_VISIT(a->server);
  Py_VISIT(a->transport_type);
  Py_VISIT(a->socket_type);
  Py_VISIT(a->connect);
  Py_VISIT(a->plan);
  Py_VISIT(a->sockargs);
  return 0;
}

int acceptor_clear(PyObject* self) {
  acceptor_object* a = as_acceptor(self);
  Py_CLEAR(a->connect);
  Py_CLEAR(a->plan);
  Py_CLEAR(a->sockargs);
  Py_CLEAR(a->protocol_factory);
  Py_CLEAR(a->sock);
  Py_CLEAR(a->server);
  Py_CLEAR(a->transport_type);
  Py_CLEAR(a->socket_type);
  Py_CLEAR(a->loop);
  return 0;
}

void acceptor_dealloc(PyObject* self) {
  PyTypeObject* tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  acceptor_clear(self);
  Py_CLEAR(as_acceptor(self)->str_peername);
  for (PyObject*& name : as_acceptor(self)->names) {
    Py_CLEAR(name);
  }
  if (std::deque<int>* pending = std::exchange(as_acceptor(self)->pending, nullptr)) {
    for (const int fd : *pending) {
      ::close(fd);  // accepted, but the loop went away before their _connect ran
    }
    delete pending;
  }
  tp->tp_free(self);
  Py_DECREF(tp);
}

/// Acceptor(loop, protocol_factory, sock, server, backlog, transport_type,
/// socket_type, family, type, proto[, plan[, inline_server]]).
PyObject* acceptor_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject* loop = nullptr;
  PyObject* factory = nullptr;
  PyObject* sock = nullptr;
  PyObject* server = nullptr;
  Py_ssize_t backlog = 0;
  PyObject* transport_type = nullptr;
  PyObject* socket_type = nullptr;
  int family = 0;
  int sock_type = 0;
  int proto = 0;
  PyObject* plan = Py_None;
  int inline_server = 0;
  if (kwargs != nullptr && PyDict_GET_SIZE(kwargs) != 0) {
    PyErr_SetString(PyExc_TypeError, "Acceptor() takes positional arguments only");
    return nullptr;
  }
  if (!PyArg_ParseTuple(args, "OOOOnOOiii|Op", &loop, &factory, &sock, &server, &backlog,
                        &transport_type, &socket_type, &family, &sock_type, &proto, &plan,
                        &inline_server)) {
    return nullptr;
  }
  if (plan != Py_None && (!PyTuple_Check(plan) || PyTuple_GET_SIZE(plan) != plan_size ||
                          !PyType_Check(PyTuple_GET_ITEM(plan, plan_class)))) {
    PyErr_SetString(PyExc_TypeError, "Acceptor(): plan must be None or a 7-tuple");
    return nullptr;
  }
  PyObject* core_type =
      PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(loop)), "_transport_type");
  if (core_type == nullptr) {
    return nullptr;  // not a LoopCore
  }
  Py_DECREF(core_type);
  PyObject* peername = PyUnicode_InternFromString("peername");
  if (peername == nullptr) {
    return nullptr;
  }
  PyObject* self = type->tp_alloc(type, 0);
  if (self == nullptr) {
    Py_DECREF(peername);
    return nullptr;
  }
  acceptor_object* a = as_acceptor(self);
  a->loop = Py_NewRef(loop);
  a->protocol_factory = Py_NewRef(factory);
  a->sock = Py_NewRef(sock);
  a->server = Py_NewRef(server);
  a->transport_type = Py_NewRef(transport_type);
  a->socket_type = Py_NewRef(socket_type);
  a->str_peername = peername;
  a->plan = Py_NewRef(plan);
  for (std::size_t i = 0; i < nm_count; ++i) {
    a->names[i] = PyUnicode_InternFromString(name_text[i]);
    if (a->names[i] == nullptr) {
      Py_DECREF(self);
      return nullptr;
    }
  }
  a->pending = new (std::nothrow) std::deque<int>();
  a->sockargs = Py_BuildValue("(iii)", family, sock_type | SOCK_NONBLOCK, proto);
  if (a->pending == nullptr || a->sockargs == nullptr) {
    Py_DECREF(self);
    return a->sockargs == nullptr ? nullptr : PyErr_NoMemory();
  }
  a->inline_server = inline_server != 0 && server != Py_None;
  a->family = family;
  a->type = sock_type;
  a->proto = proto;
  a->backlog = backlog;
  a->connect = PyCFunction_New(&connect_def, self);
  if (a->connect == nullptr) {
    Py_DECREF(self);
    return nullptr;
  }
  return self;
}

PyObject* acceptor_repr(PyObject* self) {
  return PyUnicode_FromFormat("<cadeloop accept loop of %R>", as_acceptor(self)->sock);
}

PyType_Slot acceptor_slots[] = {
    {Py_tp_doc, const_cast<char*>("The accept loop of a listening socket; made by cadeloop.Loop.")},
    {Py_tp_new, reinterpret_cast<void*>(acceptor_new)},
    {Py_tp_call, reinterpret_cast<void*>(acceptor_call)},
    {Py_tp_repr, reinterpret_cast<void*>(acceptor_repr)},
    {Py_tp_dealloc, reinterpret_cast<void*>(acceptor_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(acceptor_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(acceptor_clear)},
    {0, nullptr},
};

PyType_Spec acceptor_spec = {"cadeloop._core.Acceptor", static_cast<int>(sizeof(acceptor_object)),
                             0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, acceptor_slots};

PyObject* inet_address(const sockaddr_storage& ss) {
  const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
  char host[INET_ADDRSTRLEN];
  if (::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host) == nullptr) {
    return PyErr_SetFromErrno(PyExc_OSError);
  }
  return Py_BuildValue("(si)", host, static_cast<int>(ntohs(a->sin_port)));
}

PyObject* inet6_address(const sockaddr_storage& ss) {
  const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
  char host[NI_MAXHOST];
  // As the socket module: getnameinfo(NI_NUMERICHOST) names a scope too.
  const int rc = ::getnameinfo(reinterpret_cast<const sockaddr*>(a), sizeof(sockaddr_in6), host,
                               sizeof host, nullptr, 0, NI_NUMERICHOST);
  if (rc != 0) {
    PyErr_SetString(PyExc_OSError, gai_strerror(rc));
    return nullptr;
  }
  return Py_BuildValue("(siII)", host, static_cast<int>(ntohs(a->sin6_port)),
                       static_cast<unsigned int>(ntohl(a->sin6_flowinfo)),
                       static_cast<unsigned int>(a->sin6_scope_id));
}

PyObject* unix_address(const sockaddr_storage& ss, socklen_t len) {
  const auto* a = reinterpret_cast<const sockaddr_un*>(&ss);
  const std::size_t path_len = len > static_cast<socklen_t>(offsetof(sockaddr_un, sun_path))
                                   ? len - offsetof(sockaddr_un, sun_path)
                                   : 0;
  if (path_len > 0 && a->sun_path[0] == '\0') {
    return PyBytes_FromStringAndSize(a->sun_path, static_cast<Py_ssize_t>(path_len));
  }
  return PyUnicode_DecodeFSDefaultAndSize(
      a->sun_path, static_cast<Py_ssize_t>(::strnlen(a->sun_path, path_len)));
}

}  // namespace

PyObject* socket_address(const sockaddr_storage& ss, socklen_t len) {
  if (len == 0) {
    Py_RETURN_NONE;
  }
  if (ss.ss_family == AF_INET && len >= static_cast<socklen_t>(sizeof(sockaddr_in))) {
    return inet_address(ss);
  }
  if (ss.ss_family == AF_INET6 && len >= static_cast<socklen_t>(sizeof(sockaddr_in6))) {
    return inet6_address(ss);
  }
  if (ss.ss_family == AF_UNIX) {
    return unix_address(ss, len);
  }
  PyErr_SetString(PyExc_OSError, "unsupported address family");
  return nullptr;
}

int add_accept_stats(const loop_state& st, PyObject* stats) {
  PyObject* n = PyLong_FromUnsignedLongLong(st.accepted);
  if (n == nullptr) {
    return -1;
  }
  const int rc = PyDict_SetItemString(stats, "accepted", n);
  Py_DECREF(n);
  return rc;
}

int add_acceptor_type(PyObject* module) {
  return add_type_from_spec(module, acceptor_spec);
}

}  // namespace cadeloop::pyhost::loop
