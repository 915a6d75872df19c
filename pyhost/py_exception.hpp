#pragma once

// Private to pyhost: taking the exception being raised, on every supported Python.

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

}  // namespace cadeloop::pyhost
