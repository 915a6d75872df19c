#pragma once

#include <string_view>

namespace cadeloop::http {

/// One header field as views into storage owned by someone else (a request
/// arena, an encoder's caller). Plain data; any thread may hold it while the
/// storage lives.
struct header_field {
  std::string_view name;
  std::string_view value;
};

}  // namespace cadeloop::http
