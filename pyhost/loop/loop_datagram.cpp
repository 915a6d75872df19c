// cadeloop._core.DatagramTransportCore: the hot half of cadeloop's UDP
// transport (cadeloop._loop._DatagramTransport is the Python half, asyncio's
// selector datagram transport around it). Two paths are C++:
//
// - read_ready(), the reader callback of the transport's fd: one recvfrom()
//   per readiness event, as asyncio reads, straight to
//   protocol.datagram_received(data, addr) (addr as the socket module gives
//   it: a tuple for IPv4/IPv6; for AF_UNIX a str path, bytes for an abstract
//   name, None from an unbound peer), or protocol.error_received(exc)
//   for a socket error (an ICMP "port unreachable" on a connected socket);
// - sendto(data, addr=None), the transport's own method: when nothing is
//   queued, the connection is not lost and the call is an ordinary one
//   (bytes-like data, a numeric IPv4/IPv6 address, a Unix path or the
//   connected peer), one
//   send()/sendto() now; a socket error goes to error_received as asyncio's
//   does. Everything else (a would-block, a queued buffer, a DNS name, a wrong
//   address, a lost connection, an empty datagram, odd arguments) is passed
//   unchanged to asyncio's sendto (owner._cadeloop_sendto), whose checks,
//   errors, buffering and warnings are then asyncio's own.
//
// Closing, aborting, connection_lost, the write buffer and its flow control,
// extra info and repr stay asyncio's code. Loop thread only.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <new>

#include "loop/loop_accept.hpp"
#include "loop/loop_core.hpp"
#include "loop/loop_type.hpp"

namespace cadeloop::pyhost::loop {

namespace {

struct datagram_object {
  PyObject_HEAD
  PyObject* loop;      // the LoopCore (strong)
  PyObject* owner;     // a weak reference to the Python transport (which holds the core)
  // The transport itself, strong until release() (connection_lost): as
  // asyncio's reader handle holds its transport, the loop's reader (our
  // read_ready) keeps an open transport alive however its user let go of it.
  PyObject* owner_ref;
  PyObject* protocol;  // strong until release()
  PyObject* buffer;    // asyncio's write queue (a deque), once attached
  PyObject* address;   // the remote_addr given to create_datagram_endpoint, or NULL
  PyObject* str_datagram_received;  // interned, strong
  PyObject* str_error_received;
  int fd;
  int family;
  bool connected;  // the socket has a peer: asyncio sends with send()
  Py_ssize_t conn_lost;
  Py_ssize_t max_size;
};

datagram_object* as_datagram(PyObject* o) {
  return reinterpret_cast<datagram_object*>(o);
}

bool would_block(int err) {
  return err == EAGAIN || err == EWOULDBLOCK || err == EINTR;
}

/// protocol.error_received(OSError for `err`), as asyncio reports a socket
/// error of a datagram transport. The protocol's exception, if any, escapes
/// (as it does from asyncio's transport) to the handle that runs us.
PyObject* report_error(datagram_object* d, int err) {
  errno = err;
  PyErr_SetFromErrno(PyExc_OSError);
  PyObject* exc = take_exception();
  if (exc == nullptr) {
    return nullptr;
  }
  PyObject* protocol = d->protocol != nullptr ? Py_NewRef(d->protocol) : nullptr;
  PyObject* r = nullptr;
  if (protocol == nullptr) {
    r = Py_NewRef(Py_None);
  } else {
    PyObject* args[2] = {protocol, exc};
    r = PyObject_VectorcallMethod(d->str_error_received, args,
                                  2 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
    Py_DECREF(protocol);
  }
  Py_DECREF(exc);
  if (r == nullptr) {
    return nullptr;
  }
  Py_DECREF(r);
  Py_RETURN_NONE;
}

/// A Unix socket's path (str, or bytes; a leading NUL names Linux's abstract
/// namespace) into `ss`, as the socket module takes it; false for anything
/// else (left to asyncio's code and the socket module's errors).
bool parse_unix_address(PyObject* addr, sockaddr_storage& ss, socklen_t& len) {
  PyObject* path = nullptr;
  if (PyUnicode_CheckExact(addr)) {
    path = PyUnicode_EncodeFSDefault(addr);
    if (path == nullptr) {
      PyErr_Clear();
      return false;
    }
  } else if (PyBytes_CheckExact(addr)) {
    path = Py_NewRef(addr);
  } else {
    return false;
  }
  const char* p = PyBytes_AS_STRING(path);
  const auto n = static_cast<std::size_t>(PyBytes_GET_SIZE(path));
  auto* a = reinterpret_cast<sockaddr_un*>(&ss);
  const bool abstract = n > 0 && p[0] == '\0';
  if (n == 0 || n > sizeof a->sun_path || (!abstract && n == sizeof a->sun_path)) {
    Py_DECREF(path);
    return false;  // auto-bind or too long: the socket module's own answer
  }
  std::memset(&ss, 0, sizeof ss);
  a->sun_family = AF_UNIX;
  std::memcpy(a->sun_path, p, n);
  // A path counts its terminating NUL, as the socket module passes it.
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + n + (abstract ? 0 : 1));
  Py_DECREF(path);
  return true;
}

/// A numeric (host, port) for this socket's family, or a Unix path, as the
/// socket module would take it, into `ss`; false for anything else (left to
/// asyncio's code, which resolves names, checks ranges and raises its own
/// errors).
bool parse_address(int family, PyObject* addr, sockaddr_storage& ss, socklen_t& len) {
  if (family == AF_UNIX) {
    return parse_unix_address(addr, ss, len);
  }
  if (!PyTuple_CheckExact(addr) || PyTuple_GET_SIZE(addr) != 2) {
    return false;
  }
  PyObject* host = PyTuple_GET_ITEM(addr, 0);
  PyObject* port = PyTuple_GET_ITEM(addr, 1);
  if (!PyUnicode_CheckExact(host) || !PyLong_CheckExact(port)) {
    return false;
  }
  const long p = PyLong_AsLong(port);
  if (p < 0 || p > 65535) {
    PyErr_Clear();
    return false;
  }
  const char* h = PyUnicode_AsUTF8(host);
  if (h == nullptr) {
    PyErr_Clear();
    return false;
  }
  std::memset(&ss, 0, sizeof ss);
  if (family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    if (::inet_pton(AF_INET, h, &a->sin_addr) != 1) {
      return false;
    }
    a->sin_family = AF_INET;
    a->sin_port = htons(static_cast<std::uint16_t>(p));
    len = sizeof(sockaddr_in);
    return true;
  }
  if (family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    if (::inet_pton(AF_INET6, h, &a->sin6_addr) != 1) {
      return false;
    }
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(static_cast<std::uint16_t>(p));
    len = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}

/// The Python transport, or NULL with RuntimeError once it is gone. New reference.
PyObject* owner_of(datagram_object* d) {
  PyObject* owner = nullptr;
#if PY_VERSION_HEX >= 0x030D0000
  if (PyWeakref_GetRef(d->owner, &owner) < 0) {
    return nullptr;
  }
#else
  owner = PyWeakref_GetObject(d->owner);
  owner = owner == Py_None ? nullptr : Py_NewRef(owner);
#endif
  if (owner == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "the datagram transport is gone");
  }
  return owner;
}

/// asyncio's sendto, for every case the fast path does not take.
PyObject* slow_sendto(datagram_object* d, PyObject* const* args, Py_ssize_t nargs,
                      PyObject* kwnames) {
  PyObject* owner = owner_of(d);
  if (owner == nullptr) {
    return nullptr;
  }
  PyObject* method = PyObject_GetAttrString(owner, "_cadeloop_sendto");
  Py_DECREF(owner);
  if (method == nullptr) {
    return nullptr;
  }
  PyObject* r = PyObject_Vectorcall(method, args, static_cast<std::size_t>(nargs), kwnames);
  Py_DECREF(method);
  return r;
}

PyObject* datagram_sendto(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                          PyObject* kwnames) {
  datagram_object* d = as_datagram(self);
  if (kwnames != nullptr || nargs < 1 || nargs > 2 || d->conn_lost != 0 || d->buffer == nullptr) {
    return slow_sendto(d, args, nargs, kwnames);
  }
  const Py_ssize_t queued = PyObject_Size(d->buffer);
  if (queued != 0) {
    if (queued < 0) {
      return nullptr;
    }
    return slow_sendto(d, args, nargs, kwnames);
  }
  PyObject* data = args[0];
  PyObject* addr = nargs == 2 ? args[1] : Py_None;
  if (d->address != nullptr && addr != Py_None && addr != d->address) {
    return slow_sendto(d, args, nargs, kwnames);  // asyncio compares, or raises ValueError
  }
  sockaddr_storage ss{};
  socklen_t ss_len = 0;
  if (!d->connected) {
    if (d->address != nullptr) {
      addr = d->address;
    }
    if (!parse_address(d->family, addr, ss, ss_len)) {
      return slow_sendto(d, args, nargs, kwnames);
    }
  }
  if (!PyBytes_CheckExact(data) && !PyByteArray_Check(data) && !PyMemoryView_Check(data)) {
    return slow_sendto(d, args, nargs, kwnames);  // asyncio's TypeError
  }
  Py_buffer view{};
  if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
    PyErr_Clear();
    return slow_sendto(d, args, nargs, kwnames);
  }
  if (view.len == 0) {
    PyBuffer_Release(&view);
    return slow_sendto(d, args, nargs, kwnames);  // 3.11 drops it, 3.12+ sends it
  }
  ssize_t n = 0;
  if (d->connected) {
    n = ::send(d->fd, view.buf, static_cast<std::size_t>(view.len), 0);
  } else {
    n = ::sendto(d->fd, view.buf, static_cast<std::size_t>(view.len), 0,
                 reinterpret_cast<const sockaddr*>(&ss), ss_len);
  }
  const int err = errno;
  PyBuffer_Release(&view);
  if (n >= 0) {
    loop_state& st = state_of(d->loop);
    st.bytes_sent += static_cast<std::uint64_t>(n);
    ++st.sends_posted;
    Py_RETURN_NONE;
  }
  if (would_block(err)) {
    // asyncio tries once more, then queues and waits for the writer.
    return slow_sendto(d, args, nargs, kwnames);
  }
  return report_error(d, err);
}

PyObject* datagram_read_ready(PyObject* self, PyObject*) {
  datagram_object* d = as_datagram(self);
  if (d->conn_lost != 0 || d->protocol == nullptr) {
    Py_RETURN_NONE;
  }
  loop_state& st = state_of(d->loop);
  const auto want = static_cast<std::size_t>(d->max_size);
  if (st.read_buffer.size() < want) {
    try {
      st.read_buffer.resize(want);
    } catch (const std::bad_alloc&) {
      return PyErr_NoMemory();
    }
  }
  sockaddr_storage ss{};
  socklen_t ss_len = sizeof ss;
  const ssize_t n = ::recvfrom(d->fd, st.read_buffer.data(), want, 0,
                               reinterpret_cast<sockaddr*>(&ss), &ss_len);
  if (n < 0) {
    const int err = errno;
    if (would_block(err)) {
      Py_RETURN_NONE;
    }
    return report_error(d, err);
  }
  st.bytes_received += static_cast<std::uint64_t>(n);
  PyObject* data = PyBytes_FromStringAndSize(st.read_buffer.data(), n);
  if (data == nullptr) {
    return nullptr;
  }
  PyObject* addr = socket_address(ss, ss_len);
  if (addr == nullptr) {
    Py_DECREF(data);
    return nullptr;
  }
  PyObject* protocol = Py_NewRef(d->protocol);
  PyObject* call[3] = {protocol, data, addr};
  PyObject* r = PyObject_VectorcallMethod(d->str_datagram_received, call,
                                          3 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  Py_DECREF(protocol);
  Py_DECREF(data);
  Py_DECREF(addr);
  return r;
}

/// attach(buffer, address, connected): what asyncio's __init__ made, once it
/// made it; sendto's fast path starts here.
PyObject* datagram_attach(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "attach(buffer, address, connected)");
    return nullptr;
  }
  datagram_object* d = as_datagram(self);
  const int connected = PyObject_IsTrue(args[2]);
  if (connected < 0) {
    return nullptr;
  }
  Py_XSETREF(d->buffer, Py_NewRef(args[0]));
  Py_XSETREF(d->address, args[1] == Py_None ? nullptr : Py_NewRef(args[1]));
  d->connected = connected != 0;
  Py_RETURN_NONE;
}

PyObject* datagram_set_protocol(PyObject* self, PyObject* protocol) {
  datagram_object* d = as_datagram(self);
  Py_XSETREF(d->protocol, protocol == Py_None ? nullptr : Py_NewRef(protocol));
  Py_RETURN_NONE;
}

int datagram_clear(PyObject* self) {
  datagram_object* d = as_datagram(self);
  Py_CLEAR(d->owner_ref);
  Py_CLEAR(d->protocol);
  Py_CLEAR(d->buffer);
  Py_CLEAR(d->address);
  return 0;
}

/// After connection_lost: drops the transport and the protocol (sendto goes
/// to asyncio's code from then on, as the connection is lost).
PyObject* datagram_release(PyObject* self, PyObject*) {
  datagram_clear(self);
  Py_RETURN_NONE;
}

PyObject* get_conn_lost(PyObject* self, void*) {
  return PyLong_FromSsize_t(as_datagram(self)->conn_lost);
}

int set_conn_lost(PyObject* self, PyObject* value, void*) {
  if (value == nullptr) {
    PyErr_SetString(PyExc_AttributeError, "cannot delete conn_lost");
    return -1;
  }
  const Py_ssize_t v = PyLong_AsSsize_t(value);
  if (v == -1 && PyErr_Occurred()) {
    return -1;
  }
  as_datagram(self)->conn_lost = v;
  return 0;
}

/// DatagramTransportCore(loop, owner, fd, family, max_size).
PyObject* datagram_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject* loop = nullptr;
  PyObject* owner = nullptr;
  int fd = -1;
  int family = 0;
  Py_ssize_t max_size = 0;
  if (kwargs != nullptr && PyDict_GET_SIZE(kwargs) != 0) {
    PyErr_SetString(PyExc_TypeError, "DatagramTransportCore() takes positional arguments only");
    return nullptr;
  }
  if (!PyArg_ParseTuple(args, "OOiin", &loop, &owner, &fd, &family, &max_size)) {
    return nullptr;
  }
  PyObject* core_type = PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(loop)),
                                               "_transport_type");
  if (core_type == nullptr) {
    return nullptr;  // not a LoopCore
  }
  Py_DECREF(core_type);
  if (fd < 0 || max_size <= 0) {
    PyErr_Format(PyExc_ValueError, "Invalid file descriptor or size: %d, %zd", fd, max_size);
    return nullptr;
  }
  PyObject* names[2] = {PyUnicode_InternFromString("datagram_received"),
                        PyUnicode_InternFromString("error_received")};
  PyObject* self = nullptr;
  if (names[0] != nullptr && names[1] != nullptr) {
    self = type->tp_alloc(type, 0);
  }
  if (self == nullptr) {
    for (PyObject* n : names) {
      Py_XDECREF(n);
    }
    return nullptr;
  }
  PyObject* weak = PyWeakref_NewRef(owner, nullptr);
  if (weak == nullptr) {
    Py_DECREF(self);
    for (PyObject* n : names) {
      Py_DECREF(n);
    }
    return nullptr;
  }
  datagram_object* d = as_datagram(self);
  d->loop = Py_NewRef(loop);
  d->owner = weak;
  d->owner_ref = Py_NewRef(owner);
  d->protocol = nullptr;
  d->buffer = nullptr;
  d->address = nullptr;
  d->str_datagram_received = names[0];
  d->str_error_received = names[1];
  d->fd = fd;
  d->family = family;
  d->connected = false;
  d->conn_lost = 0;
  d->max_size = max_size;
  return self;
}

int datagram_traverse(PyObject* self, visitproc visit, void* arg) {
  datagram_object* d = as_datagram(self);
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(d->loop);
  Py_VISIT(d->owner);
  Py_VISIT(d->owner_ref);
  Py_VISIT(d->protocol);
  Py_VISIT(d->buffer);
  Py_VISIT(d->address);
  return 0;
}

void datagram_dealloc(PyObject* self) {
  PyTypeObject* tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  datagram_object* d = as_datagram(self);
  datagram_clear(self);
  Py_CLEAR(d->owner);
  Py_CLEAR(d->loop);
  Py_CLEAR(d->str_datagram_received);
  Py_CLEAR(d->str_error_received);
  tp->tp_free(self);
  Py_DECREF(tp);
}

PyMethodDef datagram_methods[] = {
    {"read_ready", datagram_read_ready, METH_NOARGS,
     "The fd's reader: one recvfrom, then datagram_received or error_received."},
    {"sendto", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(datagram_sendto)),
     METH_FASTCALL | METH_KEYWORDS,
     "sendto(data, addr=None): asyncio's DatagramTransport.sendto, sending at once when it can."},
    {"attach", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(datagram_attach)),
     METH_FASTCALL, "attach(buffer, address, connected): after asyncio's __init__."},
    {"set_protocol", datagram_set_protocol, METH_O, "The protocol datagrams go to."},
    {"release", datagram_release, METH_NOARGS, "Drop every reference; after connection_lost."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef datagram_getsets[] = {
    {"conn_lost", get_conn_lost, set_conn_lost, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyType_Slot datagram_slots[] = {
    {Py_tp_doc,
     const_cast<char*>("The C++ half of a cadeloop datagram transport; made by cadeloop.Loop.")},
    {Py_tp_new, reinterpret_cast<void*>(datagram_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(datagram_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(datagram_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(datagram_clear)},
    {Py_tp_methods, datagram_methods},
    {Py_tp_getset, datagram_getsets},
    {0, nullptr},
};

PyType_Spec datagram_spec = {"cadeloop._core.DatagramTransportCore",
                             static_cast<int>(sizeof(datagram_object)), 0,
                             Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, datagram_slots};

}  // namespace

int add_datagram_type(PyObject* module) {
  return add_type_from_spec(module, datagram_spec);
}

}  // namespace cadeloop::pyhost::loop
