// Private to http/: byte-level helpers of the request parser (ASCII case
// folding a word or 16 bytes at a time, case-insensitive name comparison,
// short searches for one byte, whitespace trimming). Header-only so the
// parser's hot paths inline them.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace cadeloop::http::detail {

// ASCII lower case of every byte (other bytes unchanged).
inline constexpr std::array<char, 256> lower_table = [] {
  std::array<char, 256> t{};
  for (std::size_t i = 0; i < t.size(); ++i) {
    const auto c = static_cast<unsigned char>(i);
    t[i] = static_cast<char>(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
  }
  return t;
}();

// Lower-cases the ASCII letters of a word of bytes (SWAR): for a byte
// b < 0x80, b + (0x80 - 'A') sets its top bit iff b >= 'A', and
// b + (0x7f - 'Z') sets it iff b > 'Z'; bytes >= 0x80 are left alone.
template <class Word>
inline Word lower_word(Word x) noexcept {
  constexpr Word ones = static_cast<Word>(~Word{0}) / 0xff;
  constexpr Word high = ones * 0x80;
  const Word low7 = x & static_cast<Word>(~high);
  const Word ge_a = static_cast<Word>(low7 + ones * (0x80 - 'A'));
  const Word gt_z = static_cast<Word>(low7 + ones * (0x7f - 'Z'));
  const Word upper = ge_a & static_cast<Word>(~gt_z) & static_cast<Word>(~x) & high;
  return static_cast<Word>(x | (upper >> 2));
}

template <class Word>
inline void copy_lower_word(char* out, const char* in) noexcept {
  Word x;
  std::memcpy(&x, in, sizeof x);
  x = lower_word(x);
  std::memcpy(out, &x, sizeof x);
}

// Copies n bytes, lower-casing ASCII letters, a word at a time. The last word
// may overlap the previous one (it recomputes the same bytes), so nothing is
// read or written outside [in, in + n) and [out, out + n).
inline void copy_lower(char* out, const char* in, std::size_t n) noexcept {
  if (n >= 8) {
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      copy_lower_word<std::uint64_t>(out + i, in + i);
    }
    if (i < n) {
      copy_lower_word<std::uint64_t>(out + n - 8, in + n - 8);
    }
  } else if (n >= 4) {
    copy_lower_word<std::uint32_t>(out, in);
    copy_lower_word<std::uint32_t>(out + n - 4, in + n - 4);
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      out[i] = lower_table[static_cast<unsigned char>(in[i])];
    }
  }
}

// scan_head_fields: the head is not what it expects; parse it again with

#if defined(__SSE2__)
// 16 0xff then 16 zero bytes: the 16 bytes from index 16 - k select the first k.
inline constexpr std::array<std::uint8_t, 32> first_bytes_mask = [] {
  std::array<std::uint8_t, 32> t{};
  for (std::size_t i = 0; i < 16; ++i) {
    t[i] = 0xff;
  }
  return t;
}();
#endif

#if defined(__GNUC__)
// 16 bytes as one value (GCC and Clang vector extension: SSE2 on x86-64,
// NEON on AArch64, plain words elsewhere).
using byte16 = std::uint8_t __attribute__((vector_size(16)));
using sbyte16 = std::int8_t __attribute__((vector_size(16)));

// 16 zero bytes then 16 0xff: the 16 bytes from index k select the last k.
inline constexpr std::array<std::uint8_t, 32> last_bytes_mask = [] {
  std::array<std::uint8_t, 32> t{};
  for (std::size_t i = 16; i < t.size(); ++i) {
    t[i] = 0xff;
  }
  return t;
}();

// Lower-cases the ASCII letters among the 16 bytes at p that `mine` selects.
inline void lower16(char* p, byte16 mine) noexcept {
  byte16 v;
  std::memcpy(&v, p, sizeof v);
  // v - 'A' + 0x80 is below 0x80 + 26 as a signed byte exactly for 'A'..'Z'.
  const auto shifted =
      std::bit_cast<sbyte16>(static_cast<byte16>(v + static_cast<std::uint8_t>(0x80 - 'A')));
  const auto upper = std::bit_cast<byte16>(shifted < static_cast<std::int8_t>(-128 + 26));
  v |= upper & mine & static_cast<std::uint8_t>(0x20);
  std::memcpy(p, &v, sizeof v);
}

// Lower-cases the header name of n bytes at buffer + off in place, 16 bytes
// at a time: a longer name in overlapping blocks, a shorter one as the end
// of the block that ends with it (the bytes before it are left as they are,
// so at least 16 bytes of the buffer must end with the name; when they
// don't, byte by byte).
inline void lower_name_in_place(char* buffer, std::size_t off, std::size_t n) noexcept {
  char* p = buffer + off;
  if (n <= 16 && off + n >= 16) {
    byte16 mine;
    std::memcpy(&mine, last_bytes_mask.data() + n, sizeof mine);
    lower16(p + n - 16, mine);
  } else if (n > 16) {
    const byte16 all = ~byte16{};
    for (std::size_t i = 0; i + 16 < n; i += 16) {
      lower16(p + i, all);
    }
    lower16(p + n - 16, all);
  } else {
    copy_lower(p, p, n);
  }
}
#else
inline void lower_name_in_place(char* buffer, std::size_t off, std::size_t n) noexcept {
  copy_lower(buffer + off, buffer + off, n);
}
#endif

template <class Word>
inline Word load_word(const char* p) noexcept {
  Word x;
  std::memcpy(&x, p, sizeof x);
  return x;
}

// Whether the n bytes at p (n >= 4) equal `lower` (n bytes, lower case),
// ignoring ASCII case. Compares whole words, the last one overlapping the
// previous, so nothing outside either range is read.
inline bool name_equals(const char* p, std::size_t n, const char* lower) noexcept {
  if (n < 8) {
    return (lower_word(load_word<std::uint32_t>(p)) == load_word<std::uint32_t>(lower)) &&
           (lower_word(load_word<std::uint32_t>(p + n - 4)) ==
            load_word<std::uint32_t>(lower + n - 4));
  }
  for (std::size_t i = 0; i + 8 < n; i += 8) {
    if (lower_word(load_word<std::uint64_t>(p + i)) != load_word<std::uint64_t>(lower + i)) {
      return false;
    }
  }
  return lower_word(load_word<std::uint64_t>(p + n - 8)) == load_word<std::uint64_t>(lower + n - 8);
}

inline constexpr bool is_ows(char c) noexcept {
  return c == ' ' || c == '\t';
}

// The first c in [p, end), or nullptr; `begin` <= p is where the readable
// bytes start. Lines of a request head are short, so a library memchr's
// set-up costs more than the search: 16 bytes at a time, the last block
// ending at `end` (bytes before p masked off) when 16 bytes of the buffer end
// there, byte by byte otherwise.
inline const char* find_byte(const char* begin, const char* p, const char* end, char c) noexcept {
#if defined(__SSE2__)
  const __m128i wanted = _mm_set1_epi8(c);
  while (end - p >= 16) {
    const __m128i block = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if (const int hits = _mm_movemask_epi8(_mm_cmpeq_epi8(block, wanted)); hits != 0) {
      return p + std::countr_zero(static_cast<unsigned>(hits));
    }
    p += 16;
  }
  if (p != end && end - begin >= 16) {
    const char* last = end - 16;
    const __m128i block = _mm_loadu_si128(reinterpret_cast<const __m128i*>(last));
    const auto hits =
        static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(block, wanted))) >> (p - last);
    return hits != 0 ? p + std::countr_zero(hits) : nullptr;
  }
#endif
  for (; p != end; ++p) {
    if (*p == c) {
      return p;
    }
  }
  return nullptr;
}

// ASCII case-insensitive comparison against an already lower-case literal.
inline bool equals_lower(std::string_view s, std::string_view lower) noexcept {
  if (s.size() != lower.size()) {
    return false;
  }
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (lower_table[static_cast<unsigned char>(s[i])] != lower[i]) {
      return false;
    }
  }
  return true;
}

// `s` without the optional whitespace (SP, HTAB) around it.
inline std::string_view trim_ows(std::string_view s) noexcept {
  while (!s.empty() && is_ows(s.front())) {
    s.remove_prefix(1);
  }
  while (!s.empty() && is_ows(s.back())) {
    s.remove_suffix(1);
  }
  return s;
}

}  // namespace cadeloop::http::detail
