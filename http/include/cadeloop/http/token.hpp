#pragma once

#include <array>
#include <string_view>

namespace cadeloop::http {

/// Which bytes are RFC 9110 `tchar`: letters, digits and !#$%&'*+-.^_`|~.
/// One table for every token check of http/ and net/ (header names the
/// encoder writes, header names an access-log format names). Any thread.
inline constexpr std::array<bool, 256> token_chars = [] {
  std::array<bool, 256> t{};
  for (unsigned c = 0; c < t.size(); ++c) {
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    const bool digit = c >= '0' && c <= '9';
    const bool symbol =
        std::string_view{"!#$%&'*+-.^_`|~"}.find(static_cast<char>(c)) != std::string_view::npos;
    t[c] = alpha || digit || symbol;
  }
  return t;
}();

/// True when `c` is an RFC 9110 `tchar`. Any thread.
[[nodiscard]] constexpr bool is_token_char(char c) noexcept {
  return token_chars[static_cast<unsigned char>(c)];
}

/// True when `s` is a non-empty RFC 9110 token (1*tchar), as a header name
/// must be. Any thread.
[[nodiscard]] constexpr bool is_token(std::string_view s) noexcept {
  if (s.empty()) {
    return false;
  }
  for (const char c : s) {
    if (!is_token_char(c)) {
      return false;
    }
  }
  return true;
}

}  // namespace cadeloop::http
