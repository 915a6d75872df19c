#pragma once

// JSON string escaping, shared by the access log (net/access_log.cpp) and the
// stats endpoint's /stats document (runtime/stats/stats_render.cpp).
// Header-only: it is small, and the access log calls it per field on the
// I/O thread's path.

#include <cstddef>
#include <string>
#include <string_view>

namespace cadeloop::net {

namespace json_detail {

/// The length of the well-formed UTF-8 sequence at the start of `s` (not
/// empty), or 0: no overlong forms, no surrogates, nothing above U+10FFFF.
[[nodiscard]] inline std::size_t utf8_sequence(std::string_view s) noexcept {
  const auto b0 = static_cast<unsigned char>(s[0]);
  std::size_t n = 0;
  unsigned char lo = 0x80;
  unsigned char hi = 0xbf;
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    n = 2;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    n = 3;
    lo = b0 == 0xe0 ? 0xa0 : 0x80;
    hi = b0 == 0xed ? 0x9f : 0xbf;
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    n = 4;
    lo = b0 == 0xf0 ? 0x90 : 0x80;
    hi = b0 == 0xf4 ? 0x8f : 0xbf;
  } else {
    return 0;
  }
  if (s.size() < n) {
    return 0;
  }
  for (std::size_t i = 1; i < n; ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xbf)) {
      return 0;
    }
  }
  return n;
}

}  // namespace json_detail

/// Appends `v` as a JSON string, quotes included. Well-formed UTF-8 passes
/// through; '"' and '\' are backslash-escaped; control characters, DEL and
/// bytes that are not well-formed UTF-8 become \u00XX (lower-case hex, the
/// byte's Latin-1 reading), so the output is always valid JSON and valid
/// UTF-8 whatever `v` holds. Any thread; pure.
inline void append_json_string(std::string& out, std::string_view v) {
  constexpr char hex[] = "0123456789abcdef";
  out += '"';
  while (!v.empty()) {
    const auto c = static_cast<unsigned char>(v[0]);
    if (c >= 0x80) {
      const std::size_t n = json_detail::utf8_sequence(v);
      if (n != 0) {
        out.append(v.substr(0, n));
        v.remove_prefix(n);
        continue;
      }
    }
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      out += "\\u00";
      out += hex[c >> 4];
      out += hex[c & 0xf];
    } else {
      out += static_cast<char>(c);
    }
    v.remove_prefix(1);
  }
  out += '"';
}

}  // namespace cadeloop::net
