#pragma once

#include <pybind11/pybind11.h>

namespace cadeloop::pyhost {

/// Each binding area adds its names to the module here; called once per
/// interpreter that imports cadeloop._core, on that interpreter's thread.
void register_info(pybind11::module_& m);

/// The event loop core: cadeloop._core.LoopCore, Handle, TimerHandle.
void register_loop(pybind11::module_& m);

}  // namespace cadeloop::pyhost
