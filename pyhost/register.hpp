#pragma once

#include <pybind11/pybind11.h>

namespace cadeloop::pyhost {

/// Each binding area adds its names to the module here; called once per
/// interpreter that imports cadeloop._core, on that interpreter's thread.
void register_info(pybind11::module_& m);

/// The event loop core: cadeloop._core.LoopCore, Handle, TimerHandle,
/// SocketTransportCore.
void register_loop(pybind11::module_& m);

/// The HTTP server: cadeloop._core.ServerCore (a core pair and its ASGI
/// bridge), Request, Ready and ClientDisconnected.
void register_server(pybind11::module_& m);

}  // namespace cadeloop::pyhost
