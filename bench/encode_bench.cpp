// Encoding costs on the I/O thread: a small complete response, a chunked
// body part (copied and zero-copy framing only), and parsing masked
// WebSocket frames.
#include <benchmark/benchmark.h>

#include <string>

#include "cadeloop/http/response_encoder.hpp"
#include "cadeloop/http/websocket.hpp"

namespace {

using namespace cadeloop::http;

const header_field app_headers[] = {{"content-type", "text/plain; charset=utf-8"},
                                    {"x-request-id", "4f2c9a7e"},
                                    {"cache-control", "no-store"}};

// 200 with three app headers and a 13-byte body known up front; Date (from
// the cache, system clock) and Server are added.
void bm_small_response(benchmark::State& state) {
  date_cache dates;
  response_encoder enc{dates};
  std::string out;
  out.reserve(1024);
  for (auto _ : state) {
    out.clear();
    enc.start({});
    (void)enc.write_head({200, app_headers, 13}, out);
    (void)enc.write_body("Hello, world!", out);
    (void)enc.finish({}, out);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(out.size()));
}
BENCHMARK(bm_small_response);

// One chunked body part copied into the output: size line, bytes, CRLF.
void bm_chunked_part(benchmark::State& state) {
  date_cache dates;
  response_encoder enc{dates};
  std::string out;
  out.reserve(8192);
  const std::string part(static_cast<std::size_t>(state.range(0)), 'x');
  enc.start({});
  (void)enc.write_head({.status = 200, .headers = app_headers}, out);
  for (auto _ : state) {
    out.clear();
    (void)enc.write_body(part, out);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
}
BENCHMARK(bm_chunked_part)->Arg(13)->Arg(4096);

// Only the framing of a chunked part (the body would be sent with writev).
void bm_chunked_part_framing(benchmark::State& state) {
  date_cache dates;
  response_encoder enc{dates};
  std::string out;
  out.reserve(64);
  enc.start({});
  (void)enc.write_head({.status = 200, .headers = app_headers}, out);
  for (auto _ : state) {
    out.clear();
    const body_part_framing f = enc.frame_body_part(65536, out);
    benchmark::DoNotOptimize(f);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
}
BENCHMARK(bm_chunked_part_framing);

// Parsing (and unmasking) one masked binary frame of the given size.
void bm_ws_parse_masked(benchmark::State& state) {
  const ws_mask_key key{0x37, 0xfa, 0x21, 0x3d};
  std::string frame;
  encode_ws_frame(frame, ws_opcode::binary,
                  std::string(static_cast<std::size_t>(state.range(0)), 'q'), true, &key);
  ws_parser parser;
  for (auto _ : state) {
    std::string_view input = frame;
    const ws_event* e = parser.next(input);
    benchmark::DoNotOptimize(e);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(bm_ws_parse_masked)->Arg(16)->Arg(65536);

}  // namespace
