#pragma once

// Private to config/: pieces settings.cpp shares with toml.cpp.

#include <string>
#include <string_view>

namespace cadeloop::config {

/// `unknown setting "max_bdy" (did you mean "max_body"?)`.
std::string unknown_setting_line(std::string_view name);

}  // namespace cadeloop::config
