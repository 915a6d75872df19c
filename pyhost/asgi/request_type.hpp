#pragma once
// Private to the bridge's files (bridge*.cpp, request_type.cpp): the parts of
// the Request and Ready types that more than one of them uses. Loop thread,
// GIL held, like everything of the bridge.

#include <cstring>

#include "asgi/bridge.hpp"

namespace cadeloop::pyhost::server {

/// An awaitable whose result is already known (cadeloop._core.Ready):
/// `await` returns `value` at once, without a Future and without suspending
/// the task. Made by the bridge; freed by whichever reference goes last.
struct ready_object {
  PyObject_HEAD PyObject* value;  // strong
};

/// A request's receive() and send(), bound to the request object per request
/// (PyCFunction_NewEx). Defined beside the bridge's receive (bridge_receive.cpp)
/// and send (bridge_send.cpp), so that each call reaches the bridge with no
/// extra call.
extern PyMethodDef receive_def;
extern PyMethodDef send_def;

/// The `headers` of an ASGI message as a new list of (bytes, bytes) tuples:
/// an empty list for NULL (absent), else every item of the iterable turned
/// into a 2-tuple of bytes. NULL with a TypeError naming `event` and the
/// item's index when the value is not such an iterable (bridge_send.cpp).
PyObject* header_pair_list(PyObject* headers, const char* event);

/// Whether the request's `TE` header lists `trailers` (bridge_extensions.cpp):
/// the client takes a trailer section after a chunked body.
bool accepts_trailers(const http::request_head& head) noexcept;

/// Whether `a` is a str equal to `interned` (a message's "type"). The app's
/// literal is rarely the same object ("http.response.start" is no identifier,
/// so CPython does not intern it): equal strs have the same length and, by
/// PEP 393, the same kind, so a memcmp decides without PyUnicode_Compare's
/// ordering walk.
inline bool str_equal(PyObject* a, PyObject* interned) {
  if (a == interned) {
    return true;
  }
  if (!PyUnicode_Check(a)) {
    return false;
  }
  const Py_ssize_t n = PyUnicode_GET_LENGTH(a);
  const int kind = PyUnicode_KIND(a);
  return n == PyUnicode_GET_LENGTH(interned) && kind == PyUnicode_KIND(interned) &&
         std::memcmp(PyUnicode_DATA(a), PyUnicode_DATA(interned),
                     static_cast<std::size_t>(n) * static_cast<std::size_t>(kind)) == 0;
}

/// The error of a receive()/send() whose bridge is gone; returns NULL.
inline PyObject* bridge_gone() {
  PyErr_SetString(PyExc_OSError, "the server is gone");
  return nullptr;
}

}  // namespace cadeloop::pyhost::server
