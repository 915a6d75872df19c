#pragma once

// Python values <-> the settings table's values (config/), shared by the
// bindings that take settings from Python: bind_config.cpp (cadeloop.config)
// and asgi/server_core.cpp (ServerCore's options). Every function runs on a
// Python thread holding the GIL.

#include <pybind11/pybind11.h>

#include <cadeloop/config/settings.hpp>

namespace cadeloop::pyhost {

/// A Python value as a typed input of the table: None, bool, int (one that
/// fits int64), float, str; anything else is `foreign`, shown by its repr.
config::typed_input typed_input_from(const pybind11::handle& obj);

/// A value of the table as a Python object (None, bool, int, float, str).
pybind11::object to_python(const config::value& v);

/// Raises cadeloop._core.SettingError(line) with `.kind` set (throws
/// pybind11::error_already_set).
[[noreturn]] void raise_setting_error(const config::setting_error& e);

}  // namespace cadeloop::pyhost
