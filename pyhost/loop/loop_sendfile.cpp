// LoopCore._sock_sendfile_native: the sendfile(2) path of loop.sock_sendfile
// and (through asyncio's _sendfile_native, which drains the transport's
// buffer and pauses its reading around it) of loop.sendfile, in C++.
//
// asyncio's version (unix_events) calls os.sendfile once per writable event
// and re-registers its writer after each call; here one SendfileOp sends as
// much as the socket takes (up to a slice per pass, so one fast peer cannot
// hold the loop), and stays the fd's writer while it waits for EAGAIN to
// clear. What a caller sees is asyncio's: the result (bytes sent), the file
// position at the end (the fd's offset set to offset + bytes sent, with
// lseek, when anything was sent), SendfileNotAvailableError when the file is
// not one sendfile(2) can read (sock_sendfile then takes asyncio's fallback),
// ConnectionError for a peer gone mid-way, cancellation (the writer removed
// by the future's done callback). Loop thread only.
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <utility>

#include "loop/loop_methods.hpp"

namespace cadeloop::pyhost::loop {

namespace {

/// The most one writable event sends before the loop runs other callbacks.
constexpr long long max_slice_bytes = 8LL << 20;
/// sendfile(2) moves at most this much per call (0x7ffff000 on Linux).
constexpr long long max_call_bytes = 0x7ffff000LL;

/// One sock_sendfile in progress: the writer of the socket's fd while it
/// waits, and the done callback of its future (cancellation).
struct sendfile_op {
  PyObject_HEAD PyObject* loop;  // strong
  PyObject* fut;                 // strong
  PyObject* sock;                // strong
  int sock_fd;
  int file_fd;
  long long offset;  // where the next sendfile reads
  long long count;   // 0: to the end of the file
  long long blocksize;
  long long total_sent;
  long long calls;
  bool registered;  // the fd's writer
  bool finished;
};

PyObject* exceptions_attr(const char* name) {
  PyObject* mod = PyImport_ImportModule("asyncio.exceptions");
  if (mod == nullptr) {
    return nullptr;
  }
  PyObject* r = PyObject_GetAttrString(mod, name);
  Py_DECREF(mod);
  return r;
}

/// Raises asyncio.SendfileNotAvailableError(message), with `context` (stolen,
/// may be NULL) as its __context__.
void raise_not_available(const char* message, PyObject* context) {
  PyObject* cls = exceptions_attr("SendfileNotAvailableError");
  PyObject* exc = cls != nullptr ? PyObject_CallFunction(cls, "s", message) : nullptr;
  Py_XDECREF(cls);
  raise_in_context(exc, context);
}

bool call_fut(PyObject* fut, const char* method, PyObject* arg) {
  PyObject* r = PyObject_CallMethod(fut, method, "O", arg);
  Py_XDECREF(r);
  return r != nullptr;
}

/// The file position asyncio leaves: at the next byte to send, once anything was sent.
bool update_filepos(sendfile_op* op) {
  if (op->total_sent > 0 && ::lseek(op->file_fd, op->offset, SEEK_SET) < 0) {
    PyErr_SetFromErrno(PyExc_OSError);
    return false;
  }
  return true;
}

/// Leaves the fd table (if the op is the fd's writer).
bool unregister(sendfile_op* op) {
  if (!op->registered) {
    return true;
  }
  op->registered = false;
  PyObject* fd = PyLong_FromLong(op->sock_fd);
  PyObject* r = fd != nullptr ? remove_interest(op->loop, fd, true) : nullptr;
  Py_XDECREF(fd);
  Py_XDECREF(r);
  return r != nullptr;
}

/// Ends the op: out of the fd table, the file position set, then the future.
bool finish(sendfile_op* op, PyObject* exc /* stolen, or NULL for the result */) {
  op->finished = true;
  bool ok = unregister(op) && update_filepos(op);
  if (!ok) {
    Py_XDECREF(exc);
    return false;
  }
  if (exc != nullptr) {
    ok = call_fut(op->fut, "set_exception", exc);
    Py_DECREF(exc);
    return ok;
  }
  PyObject* total = PyLong_FromLongLong(op->total_sent);
  if (total == nullptr) {
    return false;
  }
  ok = call_fut(op->fut, "set_result", total);
  Py_DECREF(total);
  return ok;
}

/// The exception a failed sendfile(2) (errno `err`) gives the future, as
/// asyncio maps it. New reference, or NULL with an exception raised.
PyObject* failure(sendfile_op* op, int err, bool first_call) {
  errno = err;
  PyErr_SetFromErrno(PyExc_OSError);
  PyObject* exc = take_exception();
  if (exc == nullptr) {
    return nullptr;
  }
  if (!first_call && err == ENOTCONN &&
      !Py_IS_TYPE(exc, reinterpret_cast<PyTypeObject*>(PyExc_ConnectionError))) {
    // A peer gone mid-way: ConnectionError on every POSIX system.
    PyObject* normal =
        PyObject_CallFunction(PyExc_ConnectionError, "si", "socket is not connected", ENOTCONN);
    if (normal == nullptr) {
      Py_DECREF(exc);
      return nullptr;
    }
    PyException_SetCause(normal, exc);
    exc = normal;
  }
  if (op->total_sent == 0) {
    // Most likely a file sendfile(2) cannot read: asyncio's fallback then.
    Py_DECREF(exc);
    PyObject* cls = exceptions_attr("SendfileNotAvailableError");
    PyObject* na =
        cls != nullptr ? PyObject_CallFunction(cls, "s", "os.sendfile call failed") : nullptr;
    Py_XDECREF(cls);
    return na;
  }
  return exc;
}

/// Sends until the socket is full, the count or the file is done, or an
/// error; waits for writable as the fd's writer. Returns false with an
/// exception set (raised out of the callback, as asyncio's would be).
bool step(sendfile_op* op) {
  if (op->finished) {
    return true;
  }
  PyObject* c = PyObject_CallMethod(op->fut, "cancelled", nullptr);
  const int cancelled = c != nullptr ? PyObject_IsTrue(c) : -1;
  Py_XDECREF(c);
  if (cancelled != 0) {
    if (cancelled < 0) {
      return false;
    }
    op->finished = true;
    return unregister(op) && update_filepos(op);
  }
  long long slice = 0;
  for (;;) {
    if (op->count != 0) {
      op->blocksize = op->count - op->total_sent;
      if (op->blocksize <= 0) {
        return finish(op, nullptr);
      }
    }
    const auto want = static_cast<std::size_t>(std::min(op->blocksize, max_call_bytes));
    off_t off = static_cast<off_t>(op->offset);
    ssize_t n = 0;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS n = ::sendfile(op->sock_fd, op->file_fd, &off, want);
    err = errno;
    Py_END_ALLOW_THREADS const bool first_call = op->calls == 0;
    ++op->calls;
    if (n < 0) {
      if (err == EINTR) {
        if (PyErr_CheckSignals() < 0) {
          return false;
        }
        continue;
      }
      if (err == EAGAIN || err == EWOULDBLOCK) {
        break;
      }
      PyObject* exc = failure(op, err, first_call);
      return exc != nullptr && finish(op, exc);
    }
    if (n == 0) {
      return finish(op, nullptr);  // the end of the file
    }
    op->offset += n;
    op->total_sent += n;
    slice += n;
    if (slice >= max_slice_bytes) {
      break;  // the rest from the next pass's writable event
    }
  }
  if (!op->registered) {
    PyObject* fd = PyLong_FromLong(op->sock_fd);
    if (fd == nullptr) {
      return false;
    }
    PyObject* args[2] = {fd, reinterpret_cast<PyObject*>(op)};
    PyObject* h = loop_add_writer(op->loop, args, 2);
    Py_DECREF(fd);
    if (h == nullptr) {
      return false;
    }
    Py_DECREF(h);
    op->registered = true;
  }
  return true;
}

/// op(): the socket is writable (the fd's writer). op(fut): the future is
/// done; if it was cancelled, the writer leaves (asyncio's cancellation
/// callback, which looks the fd up again: -1 once the socket is closed).
PyObject* op_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  auto* op = reinterpret_cast<sendfile_op*>(self);
  if (kwargs != nullptr && PyDict_GET_SIZE(kwargs) != 0) {
    PyErr_SetString(PyExc_TypeError, "SendfileOp takes no keyword arguments");
    return nullptr;
  }
  if (PyTuple_GET_SIZE(args) == 0) {
    Py_INCREF(self);
    const bool ok = step(op);
    Py_DECREF(self);
    if (!ok) {
      return nullptr;
    }
    Py_RETURN_NONE;
  }
  PyObject* c = PyObject_CallMethod(op->fut, "cancelled", nullptr);
  const int cancelled = c != nullptr ? PyObject_IsTrue(c) : -1;
  Py_XDECREF(c);
  if (cancelled < 0) {
    return nullptr;
  }
  if (cancelled > 0 && op->registered) {
    PyObject* fd = PyObject_CallMethod(op->sock, "fileno", nullptr);
    if (fd == nullptr) {
      return nullptr;
    }
    const long n = PyLong_AsLong(fd);
    Py_DECREF(fd);
    if (n == -1 && PyErr_Occurred()) {
      return nullptr;
    }
    if (n != -1 && !unregister(op)) {
      return nullptr;
    }
  }
  Py_RETURN_NONE;
}

int op_traverse(PyObject* self, visitproc visit, void* arg) {
  auto* op = reinterpret_cast<sendfile_op*>(self);
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(op->loop);
  Py_VISIT(op->fut);
  Py_VISIT(op->sock);
  return 0;
}

int op_clear(PyObject* self) {
  auto* op = reinterpret_cast<sendfile_op*>(self);
  Py_CLEAR(op->loop);
  Py_CLEAR(op->fut);
  Py_CLEAR(op->sock);
  return 0;
}

void op_dealloc(PyObject* self) {
  PyTypeObject* tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  op_clear(self);
  tp->tp_free(self);
  Py_DECREF(tp);
}

PyType_Slot op_slots[] = {
    {Py_tp_doc, const_cast<char*>("One loop.sock_sendfile in progress (sendfile(2)).")},
    {Py_tp_call, reinterpret_cast<void*>(op_call)},
    {Py_tp_traverse, reinterpret_cast<void*>(op_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(op_clear)},
    {Py_tp_dealloc, reinterpret_cast<void*>(op_dealloc)},
    {0, nullptr},
};

PyType_Spec op_spec = {"cadeloop._core.SendfileOp", static_cast<int>(sizeof(sendfile_op)), 0,
                       Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, op_slots};

/// file.fileno() and its size, as asyncio's checks take them; -1 with
/// SendfileNotAvailableError("not a regular file") (or another exception).
int file_fd_of(PyObject* file, long long& size) {
  PyObject* r = PyObject_CallMethod(file, "fileno", nullptr);
  if (r == nullptr) {
    PyObject* exc = take_exception();
    PyObject* io = PyImport_ImportModule("io");
    PyObject* unsupported =
        io != nullptr ? PyObject_GetAttrString(io, "UnsupportedOperation") : nullptr;
    Py_XDECREF(io);
    if (unsupported == nullptr) {
      Py_XDECREF(exc);
      return -1;
    }
    const bool expected = PyErr_GivenExceptionMatches(exc, PyExc_AttributeError) != 0 ||
                          PyErr_GivenExceptionMatches(exc, unsupported) != 0;
    Py_DECREF(unsupported);
    if (expected) {
      raise_not_available("not a regular file", exc);
    } else {
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc);
      Py_DECREF(exc);
    }
    return -1;
  }
  if (!PyLong_Check(r)) {
    // os.fstat's own error for what is not an fd.
    PyObject* os = PyImport_ImportModule("os");
    PyObject* s = os != nullptr ? PyObject_CallMethod(os, "fstat", "O", r) : nullptr;
    Py_XDECREF(os);
    Py_DECREF(r);
    Py_XDECREF(s);
    if (s != nullptr) {
      PyErr_SetString(PyExc_TypeError, "file.fileno() must return an int");
    } else if (PyErr_ExceptionMatches(PyExc_OSError)) {
      raise_not_available("not a regular file", take_exception());
    }
    return -1;
  }
  const long fd = PyLong_AsLong(r);
  Py_DECREF(r);
  if (fd == -1 && PyErr_Occurred()) {
    return -1;
  }
  struct stat sb {};
  if (fd < 0 || fd > INT32_MAX || ::fstat(static_cast<int>(fd), &sb) < 0) {
    PyErr_SetFromErrno(PyExc_OSError);
    raise_not_available("not a regular file", take_exception());
    return -1;
  }
  size = static_cast<long long>(sb.st_size);
  return static_cast<int>(fd);
}

}  // namespace

PyObject* new_sendfile_op_type(PyObject* module) {
  return PyType_FromModuleAndSpec(module, &op_spec, nullptr);
}

/// _sock_sendfile_native(sock, file, offset, count) -> awaitable of the bytes
/// sent. Raises SendfileNotAvailableError where asyncio's does (sock_sendfile
/// then falls back to reading and sending).
PyObject* loop_sock_sendfile_native(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "_sock_sendfile_native(sock, file, offset, count)");
    return nullptr;
  }
  PyObject* sock = args[0];
  // asyncio asks its own module's os for sendfile (a test replaces it).
  {
    PyObject* ue = PyImport_ImportModule("asyncio.unix_events");
    PyObject* os = ue != nullptr ? PyObject_GetAttrString(ue, "os") : nullptr;
    Py_XDECREF(ue);
    if (os == nullptr) {
      return nullptr;
    }
    const int has = PyObject_HasAttrString(os, "sendfile");
    Py_DECREF(os);
    if (has == 0) {
      raise_not_available("os.sendfile() is not available", nullptr);
      return nullptr;
    }
  }
  long long fsize = 0;
  const int file_fd = file_fd_of(args[1], fsize);
  if (file_fd < 0) {
    return nullptr;
  }
  const long long offset = PyLong_AsLongLong(args[2]);
  if (offset == -1 && PyErr_Occurred()) {
    return nullptr;
  }
  long long count = 0;
  if (args[3] != Py_None) {
    count = PyLong_AsLongLong(args[3]);
    if (count == -1 && PyErr_Occurred()) {
      return nullptr;
    }
  }
  PyObject* fut = PyObject_CallMethod(self, "create_future", nullptr);
  if (fut == nullptr) {
    return nullptr;
  }
  const long long blocksize = count != 0 ? count : fsize;
  if (blocksize == 0) {  // an empty file
    PyObject* zero = PyLong_FromLong(0);
    const bool ok = zero != nullptr && call_fut(fut, "set_result", zero);
    Py_XDECREF(zero);
    if (!ok) {
      Py_DECREF(fut);
      return nullptr;
    }
    return fut;
  }
  const int sock_fd = PyObject_AsFileDescriptor(sock);
  if (sock_fd < 0) {
    Py_DECREF(fut);
    return nullptr;
  }
  PyObject* type = PyObject_GetAttrString(self, "_sendfile_op_type");
  if (type == nullptr) {
    Py_DECREF(fut);
    return nullptr;
  }
  auto* op = PyObject_GC_New(sendfile_op, reinterpret_cast<PyTypeObject*>(type));
  Py_DECREF(type);
  if (op == nullptr) {
    Py_DECREF(fut);
    return nullptr;
  }
  op->loop = Py_NewRef(self);
  op->fut = Py_NewRef(fut);
  op->sock = Py_NewRef(sock);
  op->sock_fd = sock_fd;
  op->file_fd = file_fd;
  op->offset = offset;
  op->count = count;
  op->blocksize = blocksize;
  op->total_sent = 0;
  op->calls = 0;
  op->registered = false;
  op->finished = false;
  PyObject_GC_Track(op);
  bool ok = step(op);
  if (ok && op->registered) {
    // Once it waits: a cancelled future takes the writer out of the fd table.
    ok = call_fut(fut, "add_done_callback", reinterpret_cast<PyObject*>(op));
  }
  Py_DECREF(op);
  if (!ok) {
    Py_DECREF(fut);
    return nullptr;
  }
  return fut;
}

}  // namespace cadeloop::pyhost::loop
