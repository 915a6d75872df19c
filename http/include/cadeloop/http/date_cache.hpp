#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace cadeloop::http {

/// Length of an RFC 9110 IMF-fixdate, e.g. "Sun, 06 Nov 1994 08:49:37 GMT".
inline constexpr std::size_t imf_fixdate_size = 29;

/// Writes `unix_seconds` (seconds since 1970-01-01T00:00:00Z, may be negative)
/// as an IMF-fixdate into `out`. Years outside 0..9999 are clamped to that
/// range, since the format has exactly four year digits. Pure; any thread.
void format_imf_fixdate(std::int64_t unix_seconds,
                        std::array<char, imf_fixdate_size>& out) noexcept;

/// The value of the `Date` response header, reformatted at most once per
/// second of the clock. One instance per I/O thread: it is not thread-safe
/// and needs no atomics. Constructed, used and destroyed by its owner thread.
class date_cache {
 public:
  /// Returns the current time in whole seconds since the Unix epoch.
  using clock_function = std::function<std::int64_t()>;

  /// A cache reading the system clock. Owner thread.
  date_cache();

  /// A cache reading `clock` (tests inject a fake one). Owner thread.
  explicit date_cache(clock_function clock);

  date_cache(const date_cache&) = delete;
  date_cache& operator=(const date_cache&) = delete;

  /// The current IMF-fixdate. Reads the clock and reformats only when the
  /// second has changed since the last call. The view stays valid until the
  /// next call to `value()` or the cache's destruction. Owner thread.
  std::string_view value();

  /// The last lines of a response head: "Date: <value()>\r\n", then
  /// "Server: <server>\r\n" unless `server` is empty, then `extra` (whole
  /// header lines), then the empty line's CRLF. Made again only when the
  /// second, `server` or `extra` changes. The view stays valid until the
  /// next call to `value()` or `closing_lines()`. Owner thread.
  std::string_view closing_lines(std::string_view server, std::string_view extra);

  /// How many times the value has been formatted (for tests and stats). Owner thread.
  [[nodiscard]] std::uint64_t format_count() const noexcept { return format_count_; }

  /// Seconds since the epoch read by the system clock. Any thread.
  static std::int64_t system_seconds() noexcept;

 private:
  clock_function clock_;
  std::int64_t cached_second_ = 0;
  bool valid_ = false;
  std::uint64_t format_count_ = 0;
  std::array<char, imf_fixdate_size> text_{};
  std::string lines_;           // closing_lines() as last made
  std::string lines_server_;    // ... for this server
  std::string lines_extra_;     // ... and these extra lines
  std::uint64_t lines_of_ = 0;  // ... and this format_count_ (0: none made)
};

}  // namespace cadeloop::http
