// cadeloop._core.PipeTransportCore: the hot half of cadeloop's pipe
// transports (cadeloop._loop_pipes._ReadPipeTransport and _WritePipeTransport
// are the Python halves, asyncio's unix pipe transports around them). The
// core holds the state asyncio's code and the hot paths share (the protocol,
// _closing, _conn_lost; the write pipe's bytearray buffer is asyncio's own
// object, which the core writes from and appends to), and three paths are C++:
//
// - read_ready(), the read pipe's reader callback: one read(2) of up to
//   max_size bytes per readiness event, as asyncio reads, straight to
//   protocol.data_received(data); at EOF or on an error it calls the Python
//   half (owner._cadeloop_read_eof(), owner._fatal_error(exc, ...)), which is
//   asyncio's code for those;
// - write(data), the write pipe's own method: when nothing is queued and the
//   pipe is open, one write(2) now, as asyncio's does; what the pipe does not
//   take is appended to the buffer here, and the Python half
//   (owner._cadeloop_write_queued()) adds the writer and pauses the protocol
//   above the high-water mark. A queued buffer, a closing or lost pipe, and
//   odd arguments go unchanged to asyncio's write (owner._cadeloop_write);
// - write_ready(), the write pipe's writer callback: one write(2) of the
//   buffer; what is sent leaves the buffer, and an emptied buffer or an error
//   goes to the Python half (owner._cadeloop_drained(),
//   owner._cadeloop_write_error(exc)), asyncio's code for those.
//
// Everything else (connection_made, pause/resume, close, abort, the write
// pipe's "reader closed" reader, connection_lost, repr) is asyncio's code.
// Loop thread only.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "loop/loop_core.hpp"
#include "loop/loop_type.hpp"

namespace cadeloop::pyhost::loop {

namespace {

struct pipe_object {
  PyObject_HEAD PyObject* loop;  // the LoopCore (strong)
  PyObject* owner;               // a weak reference to the Python transport (which holds the core)
  // The transport itself, strong until release() (connection_lost): as
  // asyncio's reader and writer handles hold their transport, the loop's
  // (our read_ready, write_ready) keep an open transport alive however its
  // user let go of it.
  PyObject* owner_ref;
  PyObject* protocol;           // the transport's _protocol (strong), or NULL for None
  PyObject* buffer;             // the write pipe's bytearray (strong), or NULL for a read pipe
  PyObject* str_data_received;  // interned, strong
  int fd;
  bool closing;
  Py_ssize_t conn_lost;
  Py_ssize_t max_size;
};

pipe_object* as_pipe(PyObject* o) {
  return reinterpret_cast<pipe_object*>(o);
}

bool would_block(int err) {
  return err == EAGAIN || err == EWOULDBLOCK || err == EINTR;
}

/// The Python transport, or NULL with RuntimeError once it is gone. New reference.
PyObject* owner_of(pipe_object* p) {
  PyObject* owner = nullptr;
#if PY_VERSION_HEX >= 0x030D0000
  if (PyWeakref_GetRef(p->owner, &owner) < 0) {
    return nullptr;
  }
#else
  owner = PyWeakref_GetObject(p->owner);
  owner = owner == Py_None ? nullptr : Py_NewRef(owner);
#endif
  if (owner == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "the pipe transport is gone");
  }
  return owner;
}

/// owner.<name>(arg), or owner.<name>() for a NULL arg.
PyObject* call_owner(pipe_object* p, const char* name, PyObject* arg) {
  PyObject* owner = owner_of(p);
  if (owner == nullptr) {
    return nullptr;
  }
  PyObject* r = arg == nullptr ? PyObject_CallMethod(owner, name, nullptr)
                               : PyObject_CallMethod(owner, name, "O", arg);
  Py_DECREF(owner);
  return r;
}

/// The OSError for `err` (as os.read/os.write raise it), taken. New reference.
PyObject* os_exception(int err) {
  errno = err;
  PyErr_SetFromErrno(PyExc_OSError);
  return take_exception();
}

/// owner._fatal_error(exc, message): asyncio's handling of a read or write error.
PyObject* fatal_error(pipe_object* p, PyObject* exc, const char* message) {
  PyObject* owner = owner_of(p);
  if (owner == nullptr) {
    return nullptr;
  }
  PyObject* r = PyObject_CallMethod(owner, "_fatal_error", "Os", exc, message);
  Py_DECREF(owner);
  return r;
}

PyObject* pipe_read_ready(PyObject* self, PyObject*) {
  pipe_object* p = as_pipe(self);
  loop_state& st = state_of(p->loop);
  const auto want = static_cast<std::size_t>(p->max_size);
  if (st.read_buffer.size() < want) {
    try {
      st.read_buffer.resize(want);
    } catch (const std::bad_alloc&) {
      return PyErr_NoMemory();
    }
  }
  const ssize_t n = ::read(p->fd, st.read_buffer.data(), want);
  if (n < 0) {
    const int err = errno;
    if (would_block(err)) {
      Py_RETURN_NONE;
    }
    PyObject* exc = os_exception(err);
    if (exc == nullptr) {
      return nullptr;
    }
    PyObject* r = fatal_error(p, exc, "Fatal read error on pipe transport");
    Py_DECREF(exc);
    return r;
  }
  if (n == 0) {
    return call_owner(p, "_cadeloop_read_eof", nullptr);
  }
  st.bytes_received += static_cast<std::uint64_t>(n);
  if (p->protocol == nullptr) {
    PyErr_SetString(PyExc_AttributeError, "'NoneType' object has no attribute 'data_received'");
    return nullptr;
  }
  PyObject* data = PyBytes_FromStringAndSize(st.read_buffer.data(), n);
  if (data == nullptr) {
    return nullptr;
  }
  PyObject* protocol = Py_NewRef(p->protocol);
  PyObject* call[2] = {protocol, data};
  PyObject* r = PyObject_VectorcallMethod(p->str_data_received, call,
                                          2 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  Py_DECREF(protocol);
  Py_DECREF(data);
  return r;
}

/// asyncio's write, for every case the fast path does not take.
PyObject* slow_write(pipe_object* p, PyObject* data) {
  return call_owner(p, "_cadeloop_write", data);
}

/// Appends `len` bytes at `buf` to the write buffer.
bool append_to_buffer(pipe_object* p, const char* buf, Py_ssize_t len) {
  const Py_ssize_t old = PyByteArray_GET_SIZE(p->buffer);
  if (PyByteArray_Resize(p->buffer, old + len) < 0) {
    return false;
  }
  std::memcpy(PyByteArray_AS_STRING(p->buffer) + old, buf, static_cast<std::size_t>(len));
  return true;
}

PyObject* pipe_write(PyObject* self, PyObject* data) {
  pipe_object* p = as_pipe(self);
  if (p->buffer == nullptr || p->conn_lost != 0 || p->closing ||
      PyByteArray_GET_SIZE(p->buffer) != 0 ||
      (!PyBytes_CheckExact(data) && !PyByteArray_Check(data) && !PyMemoryView_Check(data))) {
    return slow_write(p, data);
  }
  Py_buffer view{};
  if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
    PyErr_Clear();
    return slow_write(p, data);  // a non-contiguous memoryview: asyncio's
  }
  if (view.len == 0) {
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
  }
  const ssize_t n = ::write(p->fd, view.buf, static_cast<std::size_t>(view.len));
  const int err = errno;
  loop_state& st = state_of(p->loop);
  if (n == view.len) {
    PyBuffer_Release(&view);
    st.bytes_sent += static_cast<std::uint64_t>(n);
    ++st.sends_posted;
    Py_RETURN_NONE;
  }
  if (n < 0 && !would_block(err)) {
    PyBuffer_Release(&view);
    PyObject* exc = os_exception(err);
    if (exc == nullptr) {
      return nullptr;
    }
    ++p->conn_lost;
    PyObject* r = fatal_error(p, exc, "Fatal write error on pipe transport");
    Py_DECREF(exc);
    return r;
  }
  const Py_ssize_t sent = n > 0 ? static_cast<Py_ssize_t>(n) : 0;
  if (sent > 0) {
    st.bytes_sent += static_cast<std::uint64_t>(sent);
    ++st.sends_posted;
  }
  const bool ok = append_to_buffer(p, static_cast<const char*>(view.buf) + sent, view.len - sent);
  PyBuffer_Release(&view);
  if (!ok) {
    return nullptr;
  }
  return call_owner(p, "_cadeloop_write_queued", nullptr);
}

PyObject* pipe_write_ready(PyObject* self, PyObject*) {
  pipe_object* p = as_pipe(self);
  if (p->buffer == nullptr || PyByteArray_GET_SIZE(p->buffer) == 0) {
    Py_RETURN_NONE;
  }
  const Py_ssize_t len = PyByteArray_GET_SIZE(p->buffer);
  const ssize_t n = ::write(p->fd, PyByteArray_AS_STRING(p->buffer), static_cast<std::size_t>(len));
  if (n < 0) {
    const int err = errno;
    if (would_block(err)) {
      Py_RETURN_NONE;
    }
    PyObject* exc = os_exception(err);
    if (exc == nullptr) {
      return nullptr;
    }
    PyObject* r = call_owner(p, "_cadeloop_write_error", exc);
    Py_DECREF(exc);
    return r;
  }
  loop_state& st = state_of(p->loop);
  st.bytes_sent += static_cast<std::uint64_t>(n);
  ++st.sends_posted;
  if (n == len) {
    if (PyByteArray_Resize(p->buffer, 0) < 0) {
      return nullptr;
    }
    return call_owner(p, "_cadeloop_drained", nullptr);
  }
  if (n > 0 && PySequence_DelSlice(p->buffer, 0, n) < 0) {
    return nullptr;
  }
  Py_RETURN_NONE;
}

int pipe_clear(PyObject* self) {
  pipe_object* p = as_pipe(self);
  Py_CLEAR(p->owner_ref);
  Py_CLEAR(p->protocol);
  Py_CLEAR(p->buffer);
  return 0;
}

/// After connection_lost: drops the transport, the protocol and the buffer.
PyObject* pipe_release(PyObject* self, PyObject*) {
  pipe_clear(self);
  Py_RETURN_NONE;
}

/// attach(buffer): the write pipe's bytearray, once asyncio's __init__ made it.
PyObject* pipe_attach(PyObject* self, PyObject* buffer) {
  if (!PyByteArray_CheckExact(buffer)) {
    PyErr_SetString(PyExc_TypeError, "attach(buffer): a bytearray");
    return nullptr;
  }
  Py_XSETREF(as_pipe(self)->buffer, Py_NewRef(buffer));
  Py_RETURN_NONE;
}

PyObject* get_protocol(PyObject* self, void*) {
  PyObject* p = as_pipe(self)->protocol;
  return Py_NewRef(p != nullptr ? p : Py_None);
}

int set_protocol(PyObject* self, PyObject* value, void*) {
  Py_XSETREF(as_pipe(self)->protocol,
             value == nullptr || value == Py_None ? nullptr : Py_NewRef(value));
  return 0;
}

PyObject* get_closing(PyObject* self, void*) {
  return PyBool_FromLong(as_pipe(self)->closing);
}

int set_closing(PyObject* self, PyObject* value, void*) {
  if (value == nullptr) {
    PyErr_SetString(PyExc_AttributeError, "cannot delete closing");
    return -1;
  }
  const int v = PyObject_IsTrue(value);
  if (v < 0) {
    return -1;
  }
  as_pipe(self)->closing = v != 0;
  return 0;
}

PyObject* get_conn_lost(PyObject* self, void*) {
  return PyLong_FromSsize_t(as_pipe(self)->conn_lost);
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
  as_pipe(self)->conn_lost = v;
  return 0;
}

/// PipeTransportCore(loop, owner, fd, max_size).
PyObject* pipe_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject* loop = nullptr;
  PyObject* owner = nullptr;
  int fd = -1;
  Py_ssize_t max_size = 0;
  if (kwargs != nullptr && PyDict_GET_SIZE(kwargs) != 0) {
    PyErr_SetString(PyExc_TypeError, "PipeTransportCore() takes positional arguments only");
    return nullptr;
  }
  if (!PyArg_ParseTuple(args, "OOin", &loop, &owner, &fd, &max_size)) {
    return nullptr;
  }
  PyObject* core_type =
      PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(loop)), "_transport_type");
  if (core_type == nullptr) {
    return nullptr;  // not a LoopCore
  }
  Py_DECREF(core_type);
  if (fd < 0 || max_size <= 0) {
    PyErr_Format(PyExc_ValueError, "Invalid file descriptor or size: %d, %zd", fd, max_size);
    return nullptr;
  }
  PyObject* name = PyUnicode_InternFromString("data_received");
  if (name == nullptr) {
    return nullptr;
  }
  PyObject* self = type->tp_alloc(type, 0);
  if (self == nullptr) {
    Py_DECREF(name);
    return nullptr;
  }
  PyObject* weak = PyWeakref_NewRef(owner, nullptr);
  if (weak == nullptr) {
    Py_DECREF(self);
    Py_DECREF(name);
    return nullptr;
  }
  pipe_object* p = as_pipe(self);
  p->loop = Py_NewRef(loop);
  p->owner = weak;
  p->owner_ref = Py_NewRef(owner);
  p->protocol = nullptr;
  p->buffer = nullptr;
  p->str_data_received = name;
  p->fd = fd;
  p->closing = false;
  p->conn_lost = 0;
  p->max_size = max_size;
  return self;
}

int pipe_traverse(PyObject* self, visitproc visit, void* arg) {
  pipe_object* p = as_pipe(self);
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(p->loop);
  Py_VISIT(p->owner);
  Py_VISIT(p->owner_ref);
  Py_VISIT(p->protocol);
  Py_VISIT(p->buffer);
  return 0;
}

void pipe_dealloc(PyObject* self) {
  PyTypeObject* tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  pipe_object* p = as_pipe(self);
  pipe_clear(self);
  Py_CLEAR(p->owner);
  Py_CLEAR(p->loop);
  Py_CLEAR(p->str_data_received);
  tp->tp_free(self);
  Py_DECREF(tp);
}

PyMethodDef pipe_methods[] = {
    {"read_ready", pipe_read_ready, METH_NOARGS,
     "The read pipe's reader: one read, then data_received (EOF and errors: asyncio's code)."},
    {"write", pipe_write, METH_O,
     "write(data): asyncio's write pipe write, writing at once when nothing is queued."},
    {"write_ready", pipe_write_ready, METH_NOARGS,
     "The write pipe's writer: one write of the buffer."},
    {"attach", pipe_attach, METH_O, "attach(buffer): the write pipe's bytearray buffer."},
    {"release", pipe_release, METH_NOARGS, "Drop every reference; after connection_lost."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef pipe_getsets[] = {
    {"protocol", get_protocol, set_protocol, nullptr, nullptr},
    {"closing", get_closing, set_closing, nullptr, nullptr},
    {"conn_lost", get_conn_lost, set_conn_lost, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyType_Slot pipe_slots[] = {
    {Py_tp_doc,
     const_cast<char*>("The C++ half of a cadeloop pipe transport; made by cadeloop.Loop.")},
    {Py_tp_new, reinterpret_cast<void*>(pipe_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(pipe_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(pipe_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(pipe_clear)},
    {Py_tp_methods, pipe_methods},
    {Py_tp_getset, pipe_getsets},
    {0, nullptr},
};

PyType_Spec pipe_spec = {"cadeloop._core.PipeTransportCore", static_cast<int>(sizeof(pipe_object)),
                         0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, pipe_slots};

}  // namespace

int add_pipe_type(PyObject* module) {
  return add_type_from_spec(module, pipe_spec);
}

}  // namespace cadeloop::pyhost::loop
