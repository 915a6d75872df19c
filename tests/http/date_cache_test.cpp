#include "cadeloop/http/date_cache.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <regex>
#include <string>

namespace cadeloop::http {
namespace {

std::string formatted(std::int64_t t) {
  std::array<char, imf_fixdate_size> buf{};
  format_imf_fixdate(t, buf);
  return {buf.data(), buf.size()};
}

TEST(DateCache, FormatsKnownTimestampsAsImfFixdate) {
  EXPECT_EQ(formatted(784111777), "Sun, 06 Nov 1994 08:49:37 GMT");  // RFC 9110's example
  EXPECT_EQ(formatted(0), "Thu, 01 Jan 1970 00:00:00 GMT");
  EXPECT_EQ(formatted(951782400), "Tue, 29 Feb 2000 00:00:00 GMT");
  EXPECT_EQ(formatted(1700000000), "Tue, 14 Nov 2023 22:13:20 GMT");
  EXPECT_EQ(formatted(4107542400), "Mon, 01 Mar 2100 00:00:00 GMT");
  EXPECT_EQ(formatted(-1), "Wed, 31 Dec 1969 23:59:59 GMT");
}

TEST(DateCache, ClampsToFourDigitYears) {
  EXPECT_EQ(formatted(253402300799), "Fri, 31 Dec 9999 23:59:59 GMT");
  EXPECT_EQ(formatted(253402300799 + 86400 * 365), "Fri, 31 Dec 9999 23:59:59 GMT");
  EXPECT_EQ(formatted(-62167219200 - 1000), "Sat, 01 Jan 0000 00:00:00 GMT");
}

TEST(DateCache, ReformatsAtMostOncePerSecond) {
  std::int64_t now = 784111777;
  int clock_reads = 0;
  date_cache cache{[&] {
    ++clock_reads;
    return now;
  }};
  EXPECT_EQ(cache.value(), "Sun, 06 Nov 1994 08:49:37 GMT");
  EXPECT_EQ(cache.value(), "Sun, 06 Nov 1994 08:49:37 GMT");
  EXPECT_EQ(cache.value(), "Sun, 06 Nov 1994 08:49:37 GMT");
  EXPECT_EQ(cache.format_count(), 1U);
  EXPECT_EQ(clock_reads, 3);

  now += 1;
  EXPECT_EQ(cache.value(), "Sun, 06 Nov 1994 08:49:38 GMT");
  EXPECT_EQ(cache.value(), "Sun, 06 Nov 1994 08:49:38 GMT");
  EXPECT_EQ(cache.format_count(), 2U);

  // A clock stepped backwards is followed too, not ignored.
  now -= 10;
  EXPECT_EQ(cache.value(), "Sun, 06 Nov 1994 08:49:28 GMT");
  EXPECT_EQ(cache.format_count(), 3U);
}

TEST(DateCache, ClosingLinesFollowTheSecondTheServerAndTheExtraLines) {
  std::int64_t now = 784111777;
  date_cache cache{[&] { return now; }};
  EXPECT_EQ(cache.closing_lines("cadeloop", ""),
            "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\nServer: cadeloop\r\n\r\n");
  EXPECT_EQ(cache.closing_lines("cadeloop", ""),
            "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\nServer: cadeloop\r\n\r\n");
  now += 1;
  EXPECT_EQ(cache.closing_lines("cadeloop", ""),
            "Date: Sun, 06 Nov 1994 08:49:38 GMT\r\nServer: cadeloop\r\n\r\n");
  EXPECT_EQ(cache.closing_lines("", "X-A: 1\r\n"),
            "Date: Sun, 06 Nov 1994 08:49:38 GMT\r\nX-A: 1\r\n\r\n");  // no Server line
  EXPECT_EQ(cache.closing_lines("other", "X-A: 1\r\n"),
            "Date: Sun, 06 Nov 1994 08:49:38 GMT\r\nServer: other\r\nX-A: 1\r\n\r\n");
  std::string extra = "X-B: 2\r\n";
  EXPECT_EQ(cache.closing_lines("other", extra),
            "Date: Sun, 06 Nov 1994 08:49:38 GMT\r\nServer: other\r\nX-B: 2\r\n\r\n");
  extra[5] = '3';  // the same storage with other bytes: compared by content
  EXPECT_EQ(cache.closing_lines("other", extra),
            "Date: Sun, 06 Nov 1994 08:49:38 GMT\r\nServer: other\r\nX-B: 3\r\n\r\n");
  EXPECT_EQ(cache.format_count(), 2U);
}

TEST(DateCache, SystemSecondsFollowTheSystemClock) {
  using namespace std::chrono;
  const auto reference = duration_cast<seconds>(system_clock::now().time_since_epoch()).count();
  EXPECT_LE(std::abs(date_cache::system_seconds() - reference), 1);
}

TEST(DateCache, SystemClockGivesWellFormedValue) {
  date_cache cache;
  const std::string v{cache.value()};
  EXPECT_TRUE(std::regex_match(
      v,
      std::regex{
          R"((Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4} \d\d:\d\d:\d\d GMT)"}))
      << v;
}

}  // namespace
}  // namespace cadeloop::http
