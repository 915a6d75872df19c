// libFuzzer target for cadeloop::http::request_parser.
//
// Input layout: byte 0 picks limits and message credit, byte 1 seeds the cut
// points, the rest is the byte stream a client sends. The stream is fed whole,
// cut at input-derived points, and (when short) one byte at a time; every way
// must yield the same events and the same verdict. Any difference, a consumed
// count past the input, or a body view outside the fed buffer aborts.

#include <cadeloop/http/request_parser.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace cadeloop::http;

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "fuzz_request_parser: %s\n", what);
  std::abort();
}

void append_head(std::string& out, const request_head& h) {
  out += "H ";
  out += h.method_name();
  out += ' ';
  out += std::to_string(static_cast<int>(h.method()));
  out += ' ';
  out += h.target();
  out += ' ';
  out += h.path();
  out += ' ';
  out += h.query();
  out += ' ';
  out += std::to_string(h.version_major() * 10 + h.version_minor());
  out += h.keep_alive() ? " ka" : " close";
  out += ' ';
  out += std::to_string(static_cast<int>(h.framing()));
  out += ':';
  out += std::to_string(h.content_length());
  out += h.expect_continue() ? " expect" : "";
  out += h.websocket_upgrade() ? " ws" : "";
  for (const header_field f : h.headers()) {
    out += '\n';
    out += f.name;
    out += ": ";
    out += f.value;
  }
  out += '\n';
}

struct plan {
  request_limits limits{};
  std::uint32_t credit = request_parser::unlimited_credit;
};

// Feeds `input` in pieces ending at `cuts` (then the end), re-feeding
// unconsumed bytes like a connection does. Returns the normalised event trace:
// body pieces are merged, so only their concatenation counts.
std::string run(std::string_view input, const std::vector<std::size_t>& cuts, const plan& p) {
  request_parser parser{p.limits};
  parser.set_credit(p.credit);
  std::string trace;
  std::string pending;
  bool in_body = false;
  std::size_t from = 0;
  std::vector<std::size_t> ends = cuts;
  ends.push_back(input.size());
  for (const std::size_t to : ends) {
    pending.append(input.substr(from, to - from));
    from = to;
    for (;;) {
      const feed_result r = parser.feed(pending);
      if (r.consumed > pending.size()) {
        die("consumed more than the input");
      }
      for (const parse_event& ev : parser.events()) {
        switch (ev.kind) {
          case parse_event_kind::head:
            in_body = false;
            append_head(trace, *ev.head);
            break;
          case parse_event_kind::body:
            if (ev.body.data() < pending.data() || ev.body.data() + ev.body.size() > pending.data() + pending.size()) {
              die("body view outside the input");
            }
            if (!in_body) {
              trace += "B ";
              in_body = true;
            }
            trace += ev.body;
            break;
          case parse_event_kind::message_complete:
            in_body = false;
            trace += "\nC";
            if (ev.trailers != nullptr) {
              for (const header_field f : *ev.trailers) {
                trace += ' ';
                trace += f.name;
                trace += '=';
                trace += f.value;
              }
            }
            trace += '\n';
            break;
        }
      }
      pending.erase(0, r.consumed);
      switch (r.status) {
        case feed_status::ok:
          if (!pending.empty()) {
            die("ok but bytes left");
          }
          break;
        case feed_status::paused:
          if (parser.credit() != 0) {
            die("paused with credit left");
          }
          parser.add_credit(p.credit);
          if (!pending.empty()) {
            continue;
          }
          break;
        case feed_status::error:
          if (parser.error().status < 400 || parser.error().reason.empty()) {
            die("error without a status or reason");
          }
          return trace + "\nEND error " + std::to_string(parser.error().status);
        case feed_status::closing:
          return trace + "\nEND closing@" + std::to_string(parser.stream_offset());
        case feed_status::upgraded:
          return trace + "\nEND upgraded@" + std::to_string(parser.stream_offset());
      }
      break;
    }
  }
  return trace + "\nEND ok " + (parser.mid_message() ? "mid" : "idle");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) {
    return 0;
  }
  const std::uint8_t config = data[0];
  std::uint32_t seed = data[1];
  const std::string_view input{reinterpret_cast<const char*>(data + 2), size - 2};

  plan p;
  if ((config & 1u) != 0) {
    p.limits.max_url = 32 + (config >> 4);
    p.limits.max_header_bytes = 96 + 8u * (config >> 4);
    p.limits.max_headers = 4;
    p.limits.max_body = 64;
    p.limits.max_chunk_extension_bytes = 16;
  }
  static constexpr std::uint32_t credits[4] = {request_parser::unlimited_credit, 1, 2, 3};
  p.credit = credits[(config >> 1) & 3u];

  const std::string whole = run(input, {}, p);

  std::vector<std::size_t> cuts;
  std::size_t at = 0;
  for (;;) {
    seed = seed * 1103515245u + 12345u;
    at += 1 + (seed >> 16) % 23;
    if (at >= input.size()) {
      break;
    }
    cuts.push_back(at);
  }
  if (run(input, cuts, p) != whole) {
    std::fprintf(stderr, "whole:\n%s\n", whole.c_str());
    std::fprintf(stderr, "split:\n%s\n", run(input, cuts, p).c_str());
    die("split feed gave different events");
  }
  if (input.size() <= 512) {
    std::vector<std::size_t> bytes;
    for (std::size_t i = 1; i < input.size(); ++i) {
      bytes.push_back(i);
    }
    if (run(input, bytes, p) != whole) {
      std::fprintf(stderr, "whole:\n%s\n", whole.c_str());
      std::fprintf(stderr, "bytewise:\n%s\n", run(input, bytes, p).c_str());
      die("byte-at-a-time feed gave different events");
    }
  }
  return 0;
}
