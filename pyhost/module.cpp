// cadeloop._core: one short module file; each area registers its own bindings.
//
// The module declares itself safe for own-GIL sub-interpreters. That promise
// holds only while no Python object lives in a C++ static: every Python
// object the bindings keep belongs to module state of the interpreter that
// imported it.
#include "register.hpp"

PYBIND11_MODULE(_core, m, pybind11::mod_gil_not_used(),
                pybind11::multiple_interpreters::per_interpreter_gil()) {
  m.doc() = "cadeloop's native core";
  cadeloop::pyhost::register_info(m);
}
