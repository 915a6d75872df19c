// Build and runtime facts about this module and the interpreter it runs in.
#include <Python.h>

#include "register.hpp"

namespace cadeloop::pyhost {

namespace py = pybind11;

namespace {

/// True when this CPython can run sub-interpreters with their own GIL
/// (PEP 684, 3.12+), and was built that way (not a free-threaded build,
/// where there is no GIL to own).
bool own_gil_supported() {
#if PY_VERSION_HEX >= 0x030C0000 && !defined(Py_GIL_DISABLED)
  return true;
#else
  return false;
#endif
}

/// True when the calling thread runs in the main interpreter.
/// Thread: any thread holding its interpreter's GIL.
bool in_main_interpreter() {
  return PyInterpreterState_Get() == PyInterpreterState_Main();
}

}  // namespace

void register_info(py::module_& m) {
  m.attr("__version__") = CADELOOP_VERSION;
  m.attr("PY_VERSION_BUILT") = PY_VERSION;
  m.def("own_gil_supported", &own_gil_supported,
        "Whether this Python can run own-GIL sub-interpreters (3.12+).");
  m.def("in_main_interpreter", &in_main_interpreter,
        "Whether the caller runs in the main interpreter.");
}

}  // namespace cadeloop::pyhost
