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

/// Core pairs in own-GIL sub-interpreters (interp_start, ...), the registry
/// the main thread stops them through, and set_parent_death_signal.
void register_interp(pybind11::module_& m);

/// The settings table and its resolver: cadeloop._core.settings_table,
/// check_setting, format_setting, resolve_settings and SettingError.
void register_config(pybind11::module_& m);

/// The stats endpoint: cadeloop._core.StatsEndpoint.
void register_stats(pybind11::module_& m);

/// The native server log: cadeloop._core.log, set_log_level and log_level.
void register_log(pybind11::module_& m);

}  // namespace cadeloop::pyhost
