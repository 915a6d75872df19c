// date_cache: the IMF-fixdate for the Date header, formatted once per second
// and reused by every response of an I/O thread.

#include "cadeloop/http/date_cache.hpp"

#include <time.h>

#include <chrono>
#include <utility>

namespace cadeloop::http {

namespace {

constexpr std::string_view day_names = "SunMonTueWedThuFriSat";
constexpr std::string_view month_names = "JanFebMarAprMayJunJulAugSepOctNovDec";

void put2(char* at, unsigned v) noexcept {
  at[0] = static_cast<char>('0' + v / 10);
  at[1] = static_cast<char>('0' + v % 10);
}

}  // namespace

void format_imf_fixdate(std::int64_t unix_seconds,
                        std::array<char, imf_fixdate_size>& out) noexcept {
  using namespace std::chrono;
  // The Date header has exactly four year digits; clamping keeps the output
  // well formed instead of writing garbage for absurd clocks.
  constexpr std::int64_t min_seconds = -62167219200;  // 0000-01-01T00:00:00Z
  constexpr std::int64_t max_seconds = 253402300799;  // 9999-12-31T23:59:59Z
  if (unix_seconds < min_seconds) {
    unix_seconds = min_seconds;
  } else if (unix_seconds > max_seconds) {
    unix_seconds = max_seconds;
  }
  const sys_seconds tp{seconds{unix_seconds}};
  const sys_days day = floor<days>(tp);
  const year_month_day ymd{day};
  const weekday wd{day};
  const auto second_of_day = static_cast<unsigned>((tp - day).count());
  const auto year = static_cast<unsigned>(static_cast<int>(ymd.year()));

  char* p = out.data();
  const std::size_t wdi = wd.c_encoding() * 3;
  p[0] = day_names[wdi];
  p[1] = day_names[wdi + 1];
  p[2] = day_names[wdi + 2];
  p[3] = ',';
  p[4] = ' ';
  put2(p + 5, static_cast<unsigned>(ymd.day()));
  p[7] = ' ';
  const std::size_t mi = (static_cast<unsigned>(ymd.month()) - 1) * 3;
  p[8] = month_names[mi];
  p[9] = month_names[mi + 1];
  p[10] = month_names[mi + 2];
  p[11] = ' ';
  put2(p + 12, year / 100);
  put2(p + 14, year % 100);
  p[16] = ' ';
  put2(p + 17, second_of_day / 3600);
  p[19] = ':';
  put2(p + 20, second_of_day / 60 % 60);
  p[22] = ':';
  put2(p + 23, second_of_day % 60);
  p[25] = ' ';
  p[26] = 'G';
  p[27] = 'M';
  p[28] = 'T';
}

std::int64_t date_cache::system_seconds() noexcept {
  // The coarse clock is read without touching the TSC (several times cheaper
  // than CLOCK_REALTIME, and this runs once per response); its resolution of
  // a few milliseconds is far finer than the one-second Date header needs.
  timespec ts{};
  if (clock_gettime(CLOCK_REALTIME_COARSE, &ts) == 0) {
    return static_cast<std::int64_t>(ts.tv_sec);
  }
  using namespace std::chrono;
  return duration_cast<seconds>(system_clock::now().time_since_epoch()).count();
}

date_cache::date_cache() : date_cache(clock_function{&date_cache::system_seconds}) {}

date_cache::date_cache(clock_function clock) : clock_(std::move(clock)) {}

std::string_view date_cache::value() {
  const std::int64_t now = clock_();
  if (!valid_ || now != cached_second_) {
    format_imf_fixdate(now, text_);
    cached_second_ = now;
    valid_ = true;
    ++format_count_;
  }
  return {text_.data(), text_.size()};
}

std::string_view date_cache::closing_lines(std::string_view server, std::string_view extra) {
  const std::string_view date = value();
  if (lines_of_ != format_count_ || server != lines_server_ || extra != lines_extra_) {
    lines_server_.assign(server);
    lines_extra_.assign(extra);
    lines_.assign("Date: ");
    lines_.append(date);
    lines_.append("\r\n");
    if (!server.empty()) {
      lines_.append("Server: ");
      lines_.append(server);
      lines_.append("\r\n");
    }
    lines_.append(extra);
    lines_.append("\r\n");
    lines_of_ = format_count_;
  }
  return lines_;
}

}  // namespace cadeloop::http
