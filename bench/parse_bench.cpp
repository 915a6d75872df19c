// Request parser throughput: one typical browser GET (414 bytes, 12 header
// fields) per feed, and 16 of them pipelined in one buffer. The parser
// is reused across iterations, as a connection reuses it across requests.
//
//   ./parse_bench --benchmark_repetitions=10 --benchmark_report_aggregates_only=true

#include <cadeloop/http/request_parser.hpp>

#include <benchmark/benchmark.h>
#include <llhttp.h>

#include <cstdlib>
#include <string>
#include <string_view>

namespace {

using cadeloop::http::feed_result;
using cadeloop::http::feed_status;
using cadeloop::http::request_parser;

constexpr std::string_view browser_get =
    "GET /products/shoes?page=2 HTTP/1.1\r\n"
    "Host: www.example.com\r\n"
    "User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Firefox/120.0\r\n"
    "Accept: text/html,*/*;q=0.8\r\n"
    "Accept-Language: en-US,en;q=0.5\r\n"
    "Accept-Encoding: gzip, br\r\n"
    "Referer: https://www.example.com/\r\n"
    "Connection: keep-alive\r\n"
    "Cookie: session=abc123\r\n"
    "Upgrade-Insecure-Requests: 1\r\n"
    "Sec-Fetch-Dest: document\r\n"
    "Sec-Fetch-Mode: navigate\r\n"
    "Sec-Fetch-Site: same-origin\r\n"
    "\r\n";

void parse_or_die(request_parser& parser, std::string_view input, std::size_t expected_events) {
  const feed_result r = parser.feed(input);
  if (r.status != feed_status::ok || parser.events().size() != expected_events) {
    std::abort();  // the benchmark would measure the wrong thing
  }
  benchmark::DoNotOptimize(parser.events().data());
}

void bm_browser_get(benchmark::State& state) {
  request_parser parser;
  for (auto _ : state) {
    parse_or_die(parser, browser_get, 2);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(browser_get.size()));
  state.counters["request_bytes"] = static_cast<double>(browser_get.size());
}
BENCHMARK(bm_browser_get);

void bm_browser_get_pipelined_16(benchmark::State& state) {
  std::string buffer;
  for (int i = 0; i < 16; ++i) {
    buffer += browser_get;
  }
  request_parser parser;
  for (auto _ : state) {
    parse_or_die(parser, buffer, 32);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(buffer.size()));
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * 16);
}
BENCHMARK(bm_browser_get_pipelined_16);

// The same request cut in two feeds inside a header line: the head's first
// part is kept in its arena at the end of the first feed and the field scan
// reads the whole head from there. The cut-head path, for comparison.
void bm_browser_get_split(benchmark::State& state) {
  request_parser parser;
  const std::string_view first = browser_get.substr(0, 100);
  const std::string_view rest = browser_get.substr(100);
  for (auto _ : state) {
    parse_or_die(parser, first, 0);
    parse_or_die(parser, rest, 2);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(browser_get.size()));
}
BENCHMARK(bm_browser_get_split);

// Floor for comparison: llhttp alone on the same bytes, no callbacks at all.
void bm_llhttp_alone(benchmark::State& state) {
  llhttp_settings_t settings;
  llhttp_settings_init(&settings);
  llhttp_t parser;
  llhttp_init(&parser, HTTP_REQUEST, &settings);
  for (auto _ : state) {
    if (llhttp_execute(&parser, browser_get.data(), browser_get.size()) != HPE_OK) {
      std::abort();
    }
  }
}
BENCHMARK(bm_llhttp_alone);

}  // namespace
