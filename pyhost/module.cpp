// cadeloop._core: one short module file; each area registers its own bindings.
//
// The module declares itself safe for own-GIL sub-interpreters. That promise
// holds only while no Python object lives in a C++ static: every Python
// object the bindings keep belongs to module state of the interpreter that
// imported it.
//
// It does not claim to run without the GIL (free-threaded builds): the loop
// core relies on the GIL to serialise access to its Python-facing state.
#include "register.hpp"

PYBIND11_MODULE(_core, m, pybind11::multiple_interpreters::per_interpreter_gil()) {
  m.doc() = "cadeloop's native core";
  cadeloop::pyhost::register_info(m);
  cadeloop::pyhost::register_loop(m);
  cadeloop::pyhost::register_server(m);
  cadeloop::pyhost::register_config(m);
  cadeloop::pyhost::register_interp(m);
  cadeloop::pyhost::register_stats(m);
  cadeloop::pyhost::register_log(m);
}
