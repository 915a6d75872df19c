#pragma once

// Private to pyhost: taking the exception being raised, raising it again, and
// raising one in the context of another, on every supported Python.

#include <Python.h>

namespace cadeloop::pyhost {

/// The current exception, normalised and with its traceback attached; clears
/// it. Returns a new reference, or NULL when none was set. Any thread holding
/// the interpreter's GIL.
inline PyObject* take_exception() {
#if PY_VERSION_HEX >= 0x030C0000
  return PyErr_GetRaisedException();
#else
  PyObject* type = nullptr;
  PyObject* value = nullptr;
  PyObject* tb = nullptr;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb != nullptr && value != nullptr) {
    PyException_SetTraceback(value, tb);
  }
  Py_XDECREF(type);
  Py_XDECREF(tb);
  return value;
#endif
}

/// Raises `exc` again, traceback and all: the inverse of take_exception().
/// Steals it; NULL raises nothing.
inline void restore_exception(PyObject* exc) {
  if (exc == nullptr) {
    return;
  }
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(exc);
#else
  PyErr_Restore(Py_NewRef(reinterpret_cast<PyObject*>(Py_TYPE(exc))), exc,
                PyException_GetTraceback(exc));
#endif
}

/// Raises `exc` with `context` as its __context__, as a `raise` inside an
/// `except` block would. Steals both: `exc` is a new exception instance, or
/// NULL when making it failed (that failure stays the exception set);
/// `context` may be NULL (none).
inline void raise_in_context(PyObject* exc, PyObject* context) {
  if (exc == nullptr) {
    Py_XDECREF(context);
    return;
  }
  if (context != nullptr) {
    PyException_SetContext(exc, context);
  }
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc);
  Py_DECREF(exc);
}

}  // namespace cadeloop::pyhost
