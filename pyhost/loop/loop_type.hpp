#pragma once

// Private to the loop: making one of its Python types from its spec and
// adding it to cadeloop._core.

#include <Python.h>

namespace cadeloop::pyhost::loop {

/// Makes the type of `spec`, bound to `module` (its methods find the module's
/// state), and adds it to `module` under the last part of the spec's name.
/// 0, or -1 with an exception set. Import of cadeloop._core only.
inline int add_type_from_spec(PyObject* module, PyType_Spec& spec) {
  PyObject* type = PyType_FromModuleAndSpec(module, &spec, nullptr);
  if (type == nullptr) {
    return -1;
  }
  const int rc = PyModule_AddType(module, reinterpret_cast<PyTypeObject*>(type));
  Py_DECREF(type);
  return rc;
}

}  // namespace cadeloop::pyhost::loop
