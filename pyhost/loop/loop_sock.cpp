// LoopCore's low-level socket calls: the C halves of sock_recv,
// sock_recv_into, sock_recvfrom, sock_recvfrom_into, sock_sendall,
// sock_sendto, sock_connect and sock_accept (cadeloop.Loop's coroutines of
// those names await what these return).
//
// Each call first tries the system call at once and, when it is done,
// returns its result without touching the fd table. Only when the socket
// would block (EAGAIN, EINPROGRESS) does it make a future, enter a reader
// (writer) handle for the fd in the loop's fd table whose callback is a
// SockCall (this file) that retries the call when epoll reports the fd ready
// and resolves the future, and add the SockCall as the future's done
// callback, which removes the registration (unless another reader replaced
// it) when the future finishes or is cancelled: asyncio's selector loop
// does the same with Python callbacks, a functools.partial and its
// selector, so replacing, cancelling, closing the socket while a call waits
// and reusing its fd number behave as asyncio's.
//
// What the fast path does not cover is handed to asyncio's own Python code
// (BaseSelectorEventLoop.sock_*), whose coroutine is returned to be awaited:
// a socket that is not exactly socket.socket (an SSLSocket, a subclass, a
// mock), one with a timeout (a blocking socket: asyncio's call blocks, and
// in debug mode raises "the socket must be non-blocking"), sock_sendall of a
// buffer that is not bytes, bytearray or a 1-D byte memoryview, and
// sock_connect to an address asyncio would resolve (a host name).
#include "loop/loop_methods.hpp"  // Python.h first
#include "loop/loop_sock_syscalls.hpp"

#include <structmember.h>
#include <sys/socket.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace cadeloop::pyhost::loop {

namespace {

using sock_syscalls::clear_if_would_block;
using sock_syscalls::outcome;
using sock_syscalls::raw_recv;
using sock_syscalls::raw_recv_into;
using sock_syscalls::raw_send;
using sock_syscalls::would_block;

/// The operations, in the order of sock_names below.
enum class sock_op : std::uint8_t {
  recv,
  recv_into,
  recvfrom,
  recvfrom_into,
  sendall,
  sendto,
  connect,
  accept
};

/// asyncio's method names, by sock_op: what a handed-over call runs.
constexpr const char* sock_names[] = {"sock_recv",          "sock_recv_into", "sock_recvfrom",
                                      "sock_recvfrom_into", "sock_sendall",   "sock_sendto",
                                      "sock_connect",       "sock_accept"};

/// What a loop's sock calls need, kept per loop as one tuple (loop_state::
/// sock_support): interned method names and the types and functions they
/// compare with or call.
enum support_slot : Py_ssize_t {
  s_fileno,
  s_gettimeout,
  s_done,
  s_set_result,
  s_set_exception,
  s_add_done_callback,
  s_recv,
  s_recv_into,
  s_recvfrom,
  s_recvfrom_into,
  s_sendto,
  s_connect,
  s_accept,
  s_setblocking,
  s_getsockopt,
  s_transports,
  s_data,
  s_ensure_fd_no_transport,
  s_names_end,
  s_socket_type = s_names_end,  // socket.socket
  s_weak_dict_type,             // weakref.WeakValueDictionary
  s_selector_loop,              // asyncio.selector_events.BaseSelectorEventLoop
  s_call_type,                  // SockCall
  s_family_member,              // _socket.socket's family, type and proto members
  s_type_member,
  s_proto_member,
  s_count
};

constexpr const char* support_names[s_names_end] = {
    "fileno",        "gettimeout",    "done",
    "set_result",    "set_exception", "add_done_callback",
    "recv",          "recv_into",     "recvfrom",
    "recvfrom_into", "sendto",        "connect",
    "accept",        "setblocking",   "getsockopt",
    "_transports",   "data",          "_ensure_fd_no_transport"};

/// A waiting sock call: the fd's reader (writer) handle calls it with no
/// argument when the fd is ready, the future calls it with itself when done.
struct call_object {
  PyObject_HEAD vectorcallfunc vectorcall;
  PyObject* loop;    // strong, the LoopCore
  PyObject* future;  // strong until done
  PyObject* sock;    // strong until done
  PyObject* handle;  // the reader/writer handle in the fd table, strong until done
  PyObject* arg;     // recv: n; recv_into, recvfrom_into: buf; recvfrom: bufsize;
                     // sendto, connect: address; sendall: data
  PyObject* arg2;    // recvfrom_into: nbytes; sendto: data
  Py_buffer view;    // sendall: data's buffer while it waits (view.obj set)
  Py_ssize_t pos;    // sendall: bytes sent so far
  int fd;            // the fd registered
  sock_op op;
  bool raw;  // recv/recv_into: the system call itself, not the socket's method
};

PyObject* name(PyObject* sup, support_slot i) {
  return PyTuple_GET_ITEM(sup, i);
}

/// The loop's support tuple, made at its first sock call. Borrowed.
PyObject* support_of(PyObject* self, loop_state& st) {
  if (st.sock_support != nullptr) {
    return st.sock_support;
  }
  PyObject* sup = PyTuple_New(s_count);
  if (sup == nullptr) {
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < s_names_end; ++i) {
    PyObject* n = PyUnicode_InternFromString(support_names[i]);
    if (n == nullptr) {
      Py_DECREF(sup);
      return nullptr;
    }
    PyTuple_SET_ITEM(sup, i, n);
  }
  struct from_module {
    const char* module;
    const char* attr;
    support_slot slot;
  };
  const from_module wanted[] = {
      {"socket", "socket", s_socket_type},
      {"weakref", "WeakValueDictionary", s_weak_dict_type},
      {"asyncio.selector_events", "BaseSelectorEventLoop", s_selector_loop}};
  for (const from_module& w : wanted) {
    PyObject* m = PyImport_ImportModule(w.module);
    PyObject* v = m != nullptr ? PyObject_GetAttrString(m, w.attr) : nullptr;
    Py_XDECREF(m);
    if (v == nullptr) {
      Py_DECREF(sup);
      return nullptr;
    }
    PyTuple_SET_ITEM(sup, w.slot, v);
  }
  PyObject* call_type =
      PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(self)), "_sock_call_type");
  if (call_type == nullptr) {
    Py_DECREF(sup);
    return nullptr;
  }
  PyTuple_SET_ITEM(sup, s_call_type, call_type);
  // socket.socket wraps family and type in Python properties (enums); the
  // C socket's members give the same ints without a Python frame.
  PyObject* m = PyImport_ImportModule("_socket");
  PyObject* base = m != nullptr ? PyObject_GetAttrString(m, "socket") : nullptr;
  Py_XDECREF(m);
#if PY_VERSION_HEX >= 0x030C0000
  PyObject* dict =
      base != nullptr ? PyType_GetDict(reinterpret_cast<PyTypeObject*>(base)) : nullptr;
#else
  PyObject* dict =
      base != nullptr ? Py_XNewRef(reinterpret_cast<PyTypeObject*>(base)->tp_dict) : nullptr;
#endif
  Py_XDECREF(base);
  if (dict == nullptr) {
    Py_DECREF(sup);
    return nullptr;
  }
  const std::pair<const char*, support_slot> members[] = {
      {"family", s_family_member}, {"type", s_type_member}, {"proto", s_proto_member}};
  for (const auto& [attr, slot] : members) {
    PyObject* d = PyDict_GetItemString(dict, attr);
    if (d == nullptr || Py_TYPE(d)->tp_descr_get == nullptr) {
      Py_DECREF(dict);
      Py_DECREF(sup);
      PyErr_Format(PyExc_RuntimeError, "_socket.socket has no %s member", attr);
      return nullptr;
    }
    PyTuple_SET_ITEM(sup, slot, Py_NewRef(d));
  }
  Py_DECREF(dict);
  st.sock_support = sup;
  return sup;
}

/// sock.fileno() as an int; -1 with an exception set on failure (a closed
/// socket's -1 is returned as -1 with no exception: its call fails with EBADF).
int fileno_of(PyObject* sup, PyObject* sock, bool* failed) {
  PyObject* r = PyObject_CallMethodNoArgs(sock, name(sup, s_fileno));
  if (r == nullptr) {
    *failed = true;
    return -1;
  }
  const long fd = PyLong_AsLong(r);
  Py_DECREF(r);
  if (fd == -1 && PyErr_Occurred()) {
    *failed = true;
    return -1;
  }
  return static_cast<int>(fd);
}

/// Whether the native path takes `sock`: exactly a socket.socket, with a
/// timeout of 0.0 (non-blocking). 1 yes, 0 no (asyncio's code runs), -1 error.
int native_socket(PyObject* sup, PyObject* sock) {
  if (reinterpret_cast<PyObject*>(Py_TYPE(sock)) != PyTuple_GET_ITEM(sup, s_socket_type)) {
    return 0;
  }
  PyObject* t = PyObject_CallMethodNoArgs(sock, name(sup, s_gettimeout));
  if (t == nullptr) {
    return -1;
  }
  const bool nonblocking = PyFloat_CheckExact(t) && PyFloat_AS_DOUBLE(t) == 0.0;
  Py_DECREF(t);
  return nonblocking ? 1 : 0;
}

/// asyncio's own coroutine for this call (BaseSelectorEventLoop.sock_*).
PyObject* hand_over(PyObject* self, PyObject* sup, sock_op op, PyObject* const* args,
                    Py_ssize_t nargs) {
  PyObject* fn = PyObject_GetAttrString(PyTuple_GET_ITEM(sup, s_selector_loop),
                                        sock_names[static_cast<int>(op)]);
  if (fn == nullptr) {
    return nullptr;
  }
  PyObject* all[4] = {self, nullptr, nullptr, nullptr};
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    all[i + 1] = args[i];
  }
  PyObject* coro = PyObject_Vectorcall(fn, all, static_cast<std::size_t>(nargs + 1), nullptr);
  Py_DECREF(fn);
  return coro;
}

/// Turns the result of a socket method call into an outcome.
outcome method_outcome(PyObject* r, PyObject** result) {
  if (r != nullptr) {
    *result = r;
    return outcome::done;
  }
  return clear_if_would_block() ? outcome::wait : outcome::failed;
}

/// One attempt of a read-side call or sendto, connect's completion or an
/// accept: what asyncio's _sock_* callback does once. `first` is the attempt
/// sock_* makes at once (sendto's first attempt has no flags argument;
/// connect's first attempt is made by its caller).
outcome attempt(PyObject* sup, call_object* c, bool first, PyObject** result) {
  PyObject* sock = c->sock;
  switch (c->op) {
    case sock_op::recv: {
      if (c->raw) {
        bool failed = false;
        const int fd = fileno_of(sup, sock, &failed);
        if (failed) {
          return outcome::failed;
        }
        return raw_recv(fd, PyLong_AsSsize_t(c->arg), result);
      }
      return method_outcome(PyObject_CallMethodOneArg(sock, name(sup, s_recv), c->arg), result);
    }
    case sock_op::recv_into: {
      if (c->raw) {
        bool failed = false;
        const int fd = fileno_of(sup, sock, &failed);
        if (failed) {
          return outcome::failed;
        }
        outcome out = outcome::failed;
        if (raw_recv_into(fd, c->arg, result, &out) != 0) {
          return out;
        }
      }
      return method_outcome(PyObject_CallMethodOneArg(sock, name(sup, s_recv_into), c->arg),
                            result);
    }
    case sock_op::recvfrom:
      return method_outcome(PyObject_CallMethodOneArg(sock, name(sup, s_recvfrom), c->arg), result);
    case sock_op::recvfrom_into: {
      PyObject* args[3] = {sock, c->arg, c->arg2};
      return method_outcome(PyObject_VectorcallMethod(name(sup, s_recvfrom_into), args,
                                                      3 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr),
                            result);
    }
    case sock_op::sendto: {
      PyObject* zero = PyLong_FromLong(0);
      if (zero == nullptr) {
        return outcome::failed;
      }
      PyObject* args2[3] = {sock, c->arg, c->arg2};        // sendto(data, address)
      PyObject* args3[4] = {sock, c->arg, zero, c->arg2};  // sendto(data, 0, address)
      PyObject* r = first ? PyObject_VectorcallMethod(name(sup, s_sendto), args2, 3, nullptr)
                          : PyObject_VectorcallMethod(name(sup, s_sendto), args3, 4, nullptr);
      Py_DECREF(zero);
      return method_outcome(r, result);
    }
    case sock_op::connect: {
      // The connection finished (or failed): its outcome is SO_ERROR.
      bool failed = false;
      const int fd = fileno_of(sup, sock, &failed);
      if (failed) {
        return outcome::failed;
      }
      int err = 0;
      socklen_t len = sizeof err;
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) {
        const int e = errno;
        if (e == EINTR || would_block(e)) {
          return outcome::wait;
        }
        errno = e;
        PyErr_SetFromErrno(PyExc_OSError);
        return outcome::failed;
      }
      if (err != 0) {
        PyObject* exc = PyObject_CallFunction(
            PyExc_OSError, "iN", err, PyUnicode_FromFormat("Connect call failed %S", c->arg));
        if (exc != nullptr) {
          PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc);
          Py_DECREF(exc);
        }
        return clear_if_would_block() ? outcome::wait : outcome::failed;
      }
      *result = Py_NewRef(Py_None);
      return outcome::done;
    }
    case sock_op::accept: {
      PyObject* r = PyObject_CallMethodNoArgs(sock, name(sup, s_accept));
      if (r == nullptr) {
        return clear_if_would_block() ? outcome::wait : outcome::failed;
      }
      if (!PyTuple_CheckExact(r) || PyTuple_GET_SIZE(r) != 2) {
        Py_DECREF(r);
        PyErr_SetString(PyExc_TypeError, "socket.accept() did not return (conn, address)");
        return outcome::failed;
      }
      PyObject* ok =
          PyObject_CallMethodOneArg(PyTuple_GET_ITEM(r, 0), name(sup, s_setblocking), Py_False);
      if (ok == nullptr) {
        Py_DECREF(r);
        return clear_if_would_block() ? outcome::wait : outcome::failed;
      }
      Py_DECREF(ok);
      *result = r;
      return outcome::done;
    }
    case sock_op::sendall:
      break;  // send_more()
  }
  PyErr_SetString(PyExc_SystemError, "sock call: unexpected operation");
  return outcome::failed;
}

/// One send of what is left of a waiting sock_sendall; done once all is sent.
outcome send_more(PyObject* sup, call_object* c, PyObject** result) {
  bool failed = false;
  const int fd = fileno_of(sup, c->sock, &failed);
  if (failed) {
    return outcome::failed;
  }
  const Py_ssize_t n =
      raw_send(fd, static_cast<const char*>(c->view.buf) + c->pos, c->view.len - c->pos);
  if (n < 0) {
    return outcome::failed;
  }
  c->pos += n;
  if (c->pos == c->view.len) {
    *result = Py_NewRef(Py_None);
    return outcome::done;
  }
  return outcome::wait;
}

/// The loop's _ensure_fd_no_transport(fd): the fd is no transport's (a look
/// in the transports' dict), else asyncio's own check (it raises
/// RuntimeError for a transport that is not closing). 0, or -1 with the
/// exception set.
int ensure_no_transport(PyObject* self, PyObject* sup, PyObject* fdo) {
  PyObject* transports = PyObject_GetAttr(self, name(sup, s_transports));
  if (transports == nullptr) {
    return -1;
  }
  bool free = false;
  if (reinterpret_cast<PyObject*>(Py_TYPE(transports)) == PyTuple_GET_ITEM(sup, s_weak_dict_type)) {
    PyObject* data = PyObject_GetAttr(transports, name(sup, s_data));
    if (data == nullptr) {
      Py_DECREF(transports);
      return -1;
    }
    if (PyDict_CheckExact(data)) {
      free = PyDict_GetItemWithError(data, fdo) == nullptr && !fd_has_transport(self, fdo);
      if (PyErr_Occurred()) {
        Py_DECREF(data);
        Py_DECREF(transports);
        return -1;
      }
    }
    Py_DECREF(data);
  }
  Py_DECREF(transports);
  if (free) {
    return 0;
  }
  PyObject* r = PyObject_CallMethodOneArg(self, name(sup, s_ensure_fd_no_transport), fdo);
  if (r == nullptr) {
    return -1;
  }
  Py_DECREF(r);
  return 0;
}

/// Drops what a call holds but its loop (it is finished).
void release_call(call_object* c) {
  if (c->view.obj != nullptr) {
    PyBuffer_Release(&c->view);
  }
  Py_CLEAR(c->future);
  Py_CLEAR(c->sock);
  Py_CLEAR(c->arg);
  Py_CLEAR(c->arg2);
  Py_CLEAR(c->handle);
}

bool writes(sock_op op) {
  return op == sock_op::sendall || op == sock_op::sendto || op == sock_op::connect;
}

/// The fd is ready: retry the call and resolve the future, as asyncio's
/// _sock_recv & co. do (nothing if the future is already done).
PyObject* call_ready(call_object* c) {
  if (c->future == nullptr) {
    Py_RETURN_NONE;
  }
  loop_state& st = state_of(c->loop);
  PyObject* sup = st.sock_support;
  PyObject* fut = Py_NewRef(c->future);
  PyObject* done = PyObject_CallMethodNoArgs(fut, name(sup, s_done));
  if (done == nullptr) {
    Py_DECREF(fut);
    return nullptr;
  }
  const int is_done = PyObject_IsTrue(done);
  Py_DECREF(done);
  if (is_done != 0) {
    Py_DECREF(fut);
    return is_done < 0 ? nullptr : Py_NewRef(Py_None);
  }
  PyObject* result = nullptr;
  const outcome o =
      c->op == sock_op::sendall ? send_more(sup, c, &result) : attempt(sup, c, false, &result);
  PyObject* r = nullptr;
  if (o == outcome::wait) {
    r = Py_NewRef(Py_None);
  } else if (o == outcome::done) {
    r = PyObject_CallMethodOneArg(fut, name(sup, s_set_result), result);
    Py_DECREF(result);
  } else if (!PyErr_ExceptionMatches(PyExc_SystemExit) &&
             !PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
    PyObject* exc = take_exception();
    r = PyObject_CallMethodOneArg(fut, name(sup, s_set_exception), exc != nullptr ? exc : Py_None);
    Py_XDECREF(exc);
  }
  Py_DECREF(fut);
  if (r == nullptr) {
    return nullptr;
  }
  Py_DECREF(r);
  Py_RETURN_NONE;
}

/// The future is done (result, exception or cancelled): take the reader
/// (writer) out of the fd table unless another one replaced it, as asyncio's
/// _sock_read_done/_sock_write_done do with remove_reader/remove_writer.
PyObject* call_done(call_object* c) {
  PyObject* handle = c->handle;
  const int fd = c->fd;
  const bool writer = writes(c->op);
  c->handle = nullptr;
  release_call(c);
  if (handle == nullptr) {
    Py_RETURN_NONE;
  }
  const bool cancelled = reinterpret_cast<handle_object*>(handle)->cancelled;
  Py_DECREF(handle);
  if (cancelled) {
    Py_RETURN_NONE;
  }
  PyObject* fdo = PyLong_FromLong(fd);
  if (fdo == nullptr) {
    return nullptr;
  }
  PyObject* sup = state_of(c->loop).sock_support;
  PyObject* r = nullptr;
  if (ensure_no_transport(c->loop, sup, fdo) == 0) {
    r = remove_interest(c->loop, fdo, writer);
  }
  Py_DECREF(fdo);
  if (r == nullptr) {
    return nullptr;
  }
  Py_DECREF(r);
  Py_RETURN_NONE;
}

PyObject* call_vectorcall(PyObject* self, PyObject* const* args, std::size_t nargsf,
                          PyObject* kwnames) {
  auto* c = reinterpret_cast<call_object*>(self);
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0) {
    PyErr_SetString(PyExc_TypeError, "SockCall takes no keyword arguments");
    return nullptr;
  }
  PyObject* keep = Py_NewRef(self);
  PyObject* r = nullptr;
  if (nargs == 0) {
    r = call_ready(c);
  } else if (nargs == 1) {
    (void)args;
    r = call_done(c);
  } else {
    PyErr_SetString(PyExc_TypeError, "SockCall() takes at most one argument");
  }
  Py_DECREF(keep);
  return r;
}

int call_traverse(PyObject* self, visitproc visit, void* arg) {
  auto* c = reinterpret_cast<call_object*>(self);
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(c->loop);
  Py_VISIT(c->future);
  Py_VISIT(c->sock);
  Py_VISIT(c->handle);
  Py_VISIT(c->arg);
  Py_VISIT(c->arg2);
  Py_VISIT(c->view.obj);
  return 0;
}

int call_clear(PyObject* self) {
  auto* c = reinterpret_cast<call_object*>(self);
  release_call(c);
  Py_CLEAR(c->loop);
  return 0;
}

void call_dealloc(PyObject* self) {
  PyTypeObject* tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  call_clear(self);
  tp->tp_free(self);
  Py_DECREF(tp);
}

PyMemberDef call_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(call_object, vectorcall), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr},
};

PyType_Slot call_slots[] = {
    {Py_tp_doc, const_cast<char*>("A sock_* call of cadeloop.Loop waiting for its fd (internal).")},
    {Py_tp_dealloc, reinterpret_cast<void*>(call_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(call_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(call_clear)},
    {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
    {Py_tp_members, call_members},
    {0, nullptr},
};

PyType_Spec call_spec = {"cadeloop._core.SockCall", static_cast<int>(sizeof(call_object)), 0,
                         Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
                         call_slots};

/// The call would block: a future, the fd's reader (writer) handle calling
/// `proto` (filled by the caller) when ready, the future's done callback.
/// Takes over `proto`'s references. Returns the future, or NULL.
PyObject* wait_for_fd(PyObject* self, loop_state& st, PyObject* sup, call_object* proto) {
  PyObject* type = PyTuple_GET_ITEM(sup, s_call_type);
  auto* c = PyObject_GC_New(call_object, reinterpret_cast<PyTypeObject*>(type));
  if (c == nullptr) {
    release_call(proto);
    return nullptr;
  }
  c->vectorcall = call_vectorcall;
  c->loop = Py_NewRef(self);
  c->future = nullptr;
  c->sock = std::exchange(proto->sock, nullptr);
  c->handle = nullptr;
  c->arg = std::exchange(proto->arg, nullptr);
  c->arg2 = std::exchange(proto->arg2, nullptr);
  c->view = proto->view;
  proto->view.obj = nullptr;
  c->pos = proto->pos;
  c->fd = proto->fd;
  c->op = proto->op;
  c->raw = proto->raw;
  PyObject_GC_Track(reinterpret_cast<PyObject*>(c));
  PyObject* call = reinterpret_cast<PyObject*>(c);

  PyObject* fut = loop_create_future(self, nullptr);
  PyObject* fdo = fut != nullptr ? PyLong_FromLong(c->fd) : nullptr;
  if (fdo == nullptr || ensure_no_transport(self, sup, fdo) < 0) {
    Py_XDECREF(fdo);
    Py_XDECREF(fut);
    Py_DECREF(call);
    return nullptr;
  }
  PyObject* args[2] = {fdo, call};
  PyObject* h = writes(c->op) ? loop_add_writer(self, args, 2) : loop_add_reader(self, args, 2);
  Py_DECREF(fdo);
  if (h == nullptr) {
    Py_DECREF(fut);
    Py_DECREF(call);
    return nullptr;
  }
  c->handle = h;
  c->future = Py_NewRef(fut);
  PyObject* r = PyObject_CallMethodOneArg(fut, name(sup, s_add_done_callback), call);
  Py_DECREF(call);
  if (r == nullptr) {
    Py_DECREF(fut);
    return nullptr;
  }
  Py_DECREF(r);
  ++st.sock_waits;
  return fut;
}

/// A result sock_* returns as it is when its type is the one expected
/// (bytes, int, tuple, None: the coroutine returns it at once); anything
/// else (a subclass' method's odd value) in a done future, so that the
/// coroutine's "await" gives it back unchanged.
PyObject* finish(PyObject* self, PyObject* result, PyTypeObject* expected) {
  if (result == Py_None || Py_TYPE(result) == expected) {
    return result;
  }
  PyObject* fut = loop_create_future(self, nullptr);
  if (fut == nullptr) {
    Py_DECREF(result);
    return nullptr;
  }
  PyObject* r = PyObject_CallMethod(fut, "set_result", "O", result);
  Py_DECREF(result);
  if (r == nullptr) {
    Py_DECREF(fut);
    return nullptr;
  }
  Py_DECREF(r);
  return fut;
}

/// Whether `address` is what asyncio's _ensure_resolved passes through
/// without a look-up (a numeric host of the socket's family), and if so the
/// address it resolves to. New reference, NULL if not (no exception), or
/// NULL with an exception.
PyObject* numeric_address(PyObject* sup, PyObject* sock, int family, PyObject* address) {
  if (!PyTuple_CheckExact(address)) {
    return nullptr;
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(address);
  if (n < 2 || n > (family == AF_INET6 ? 4 : 2)) {
    return nullptr;
  }
  PyObject* host = PyTuple_GET_ITEM(address, 0);
  PyObject* port = PyTuple_GET_ITEM(address, 1);
  if (!PyUnicode_CheckExact(host) || !PyLong_CheckExact(port)) {
    return nullptr;
  }
  int type = 0;
  int proto = 0;
  for (const auto& [slot, out] :
       {std::pair{s_type_member, &type}, std::pair{s_proto_member, &proto}}) {
    PyObject* d = PyTuple_GET_ITEM(sup, slot);
    PyObject* v = Py_TYPE(d)->tp_descr_get(d, sock, reinterpret_cast<PyObject*>(Py_TYPE(sock)));
    if (v == nullptr) {
      return nullptr;
    }
    *out = static_cast<int>(PyLong_AsLong(v)) & ~(SOCK_NONBLOCK | SOCK_CLOEXEC);
    Py_DECREF(v);
  }
  if ((type != SOCK_STREAM && type != SOCK_DGRAM) ||
      (proto != 0 && proto != IPPROTO_TCP && proto != IPPROTO_UDP)) {
    return nullptr;
  }
  Py_ssize_t len = 0;
  const char* text = PyUnicode_AsUTF8AndSize(host, &len);
  if (text == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  if (std::strlen(text) != static_cast<std::size_t>(len) || std::strchr(text, '%') != nullptr) {
    return nullptr;
  }
  unsigned char buf[sizeof(in6_addr)];
  if (::inet_pton(family, text, buf) != 1) {
    return nullptr;
  }
  if (family == AF_INET) {
    return Py_NewRef(address);
  }
  PyObject* zero = PyLong_FromLong(0);
  if (zero == nullptr) {
    return nullptr;
  }
  PyObject* out = PyTuple_Pack(4, host, port, n > 2 ? PyTuple_GET_ITEM(address, 2) : zero,
                               n > 3 ? PyTuple_GET_ITEM(address, 3) : zero);
  Py_DECREF(zero);
  return out;
}

/// The shared body of the _native_sock_* methods.
PyObject* sock_call(PyObject* self, sock_op op, PyObject* const* args, Py_ssize_t nargs,
                    Py_ssize_t want) {
  loop_state& st = state_of(self);
  if (nargs != want) {
    PyErr_Format(PyExc_TypeError, "_native_%s() takes %zd arguments",
                 sock_names[static_cast<int>(op)], want);
    return nullptr;
  }
  PyObject* sup = support_of(self, st);
  if (sup == nullptr) {
    return nullptr;
  }
  PyObject* sock = args[0];
  const int native = native_socket(sup, sock);
  if (native < 0) {
    return nullptr;
  }
  if (native == 0 || (op == sock_op::sendall && !PyBytes_CheckExact(args[1]) &&
                      !PyByteArray_CheckExact(args[1]) && !PyMemoryView_Check(args[1]))) {
    return hand_over(self, sup, op, args, nargs);
  }
  call_object c{};
  c.sock = sock;
  c.op = op;
  c.arg = nargs > 1 ? args[1] : nullptr;
  c.arg2 = nargs > 2 ? args[2] : nullptr;
  PyObject* resolved = nullptr;
  if (op == sock_op::sendall && PyMemoryView_Check(args[1])) {
    const Py_buffer* mv = PyMemoryView_GET_BUFFER(args[1]);
    if (mv->itemsize != 1 || mv->ndim != 1 || !PyBuffer_IsContiguous(mv, 'C')) {
      return hand_over(self, sup, op, args, nargs);
    }
  }
  if (op == sock_op::connect) {
    PyObject* fam = PyTuple_GET_ITEM(sup, s_family_member);
    PyObject* v = Py_TYPE(fam)->tp_descr_get(fam, sock, reinterpret_cast<PyObject*>(Py_TYPE(sock)));
    if (v == nullptr) {
      return nullptr;
    }
    const long family = PyLong_AsLong(v);
    Py_DECREF(v);
    if (family == AF_INET || family == AF_INET6) {
      resolved = numeric_address(sup, sock, static_cast<int>(family), args[1]);
      if (resolved == nullptr) {
        return PyErr_Occurred() ? nullptr : hand_over(self, sup, op, args, nargs);
      }
      c.arg = resolved;
    }
  }
  ++st.sock_calls;
  bool failed = false;
  PyObject* result = nullptr;
  outcome o = outcome::failed;
  switch (op) {
    case sock_op::recv: {
      const Py_ssize_t n = PyLong_CheckExact(c.arg) ? PyLong_AsSsize_t(c.arg) : -1;
      if (n == -1) {
        PyErr_Clear();
      }
      c.raw = n > 0;
      o = attempt(sup, &c, true, &result);
      break;
    }
    case sock_op::recv_into:
      c.raw = true;
      o = attempt(sup, &c, true, &result);
      break;
    case sock_op::recvfrom:
    case sock_op::sendto:
    case sock_op::accept:
      o = attempt(sup, &c, true, &result);
      break;
    case sock_op::recvfrom_into: {
      // asyncio: if not nbytes: nbytes = len(buf)
      const int given = PyObject_IsTrue(c.arg2);
      if (given < 0) {
        return nullptr;
      }
      PyObject* nbytes = nullptr;
      if (given == 0) {
        const Py_ssize_t len = PyObject_Size(c.arg);
        nbytes = len < 0 ? nullptr : PyLong_FromSsize_t(len);
        if (nbytes == nullptr) {
          return nullptr;
        }
        c.arg2 = nbytes;
      }
      o = attempt(sup, &c, true, &result);
      if (o == outcome::wait) {
        c.arg2 = Py_NewRef(c.arg2);
      }
      Py_XDECREF(nbytes);
      break;
    }
    case sock_op::sendall: {
      c.fd = fileno_of(sup, sock, &failed);
      if (failed) {
        return nullptr;
      }
      if (PyObject_GetBuffer(c.arg, &c.view, PyBUF_SIMPLE) < 0) {
        return nullptr;
      }
      const Py_ssize_t n = raw_send(c.fd, static_cast<const char*>(c.view.buf), c.view.len);
      if (n < 0) {
        PyBuffer_Release(&c.view);
        return nullptr;
      }
      if (n == c.view.len) {
        PyBuffer_Release(&c.view);
        Py_RETURN_NONE;
      }
      c.pos = n;
      o = outcome::wait;
      break;
    }
    case sock_op::connect: {
      c.fd = fileno_of(sup, sock, &failed);
      if (failed) {
        Py_XDECREF(resolved);
        return nullptr;
      }
      PyObject* r = PyObject_CallMethodOneArg(sock, name(sup, s_connect), c.arg);
      o = r != nullptr ? outcome::done : (clear_if_would_block() ? outcome::wait : outcome::failed);
      if (r != nullptr) {
        Py_DECREF(r);
        result = Py_NewRef(Py_None);
      }
      break;
    }
  }
  if (o != outcome::wait) {
    Py_XDECREF(resolved);
    if (o == outcome::failed) {
      return nullptr;
    }
    switch (op) {
      case sock_op::recv:
        return finish(self, result, &PyBytes_Type);
      case sock_op::recv_into:
      case sock_op::sendto:
        return finish(self, result, &PyLong_Type);
      default:
        return finish(self, result, &PyTuple_Type);
    }
  }
  // Would block: the registration takes references of what it keeps.
  if (op != sock_op::sendall && op != sock_op::connect) {
    c.fd = fileno_of(sup, sock, &failed);
    if (failed) {
      if (op == sock_op::recvfrom_into) {
        Py_DECREF(c.arg2);  // the reference taken for the wait
      }
      return nullptr;
    }
  }
  c.sock = Py_NewRef(sock);
  c.arg = resolved != nullptr ? resolved : Py_XNewRef(c.arg);
  if (op != sock_op::recvfrom_into) {
    c.arg2 = Py_XNewRef(c.arg2);
  }
  return wait_for_fd(self, st, sup, &c);
}

}  // namespace

PyObject* loop_sock_recv(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return sock_call(self, sock_op::recv, args, nargs, 2);
}
PyObject* loop_sock_recv_into(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return sock_call(self, sock_op::recv_into, args, nargs, 2);
}
PyObject* loop_sock_recvfrom(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return sock_call(self, sock_op::recvfrom, args, nargs, 2);
}
PyObject* loop_sock_recvfrom_into(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return sock_call(self, sock_op::recvfrom_into, args, nargs, 3);
}
PyObject* loop_sock_sendall(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return sock_call(self, sock_op::sendall, args, nargs, 2);
}
PyObject* loop_sock_sendto(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return sock_call(self, sock_op::sendto, args, nargs, 3);
}
PyObject* loop_sock_connect(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return sock_call(self, sock_op::connect, args, nargs, 2);
}
PyObject* loop_sock_accept(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return sock_call(self, sock_op::accept, args, nargs, 1);
}

PyObject* loop_sock_stats(PyObject* self, PyObject*) {
  const loop_state& st = state_of(self);
  return Py_BuildValue("{s:K,s:K}", "sock_calls", static_cast<unsigned long long>(st.sock_calls),
                       "sock_waits", static_cast<unsigned long long>(st.sock_waits));
}

int add_sock_call_type(PyObject* module, PyObject* loop_type) {
  PyObject* type = PyType_FromModuleAndSpec(module, &call_spec, nullptr);
  if (type == nullptr) {
    return -1;
  }
  const int rc = PyObject_SetAttrString(loop_type, "_sock_call_type", type);
  Py_DECREF(type);
  return rc;
}

}  // namespace cadeloop::pyhost::loop
