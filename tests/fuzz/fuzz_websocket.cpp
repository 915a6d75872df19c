// libFuzzer target for the WebSocket frame parser (server role).
//
// 1. Split invariance: the raw input is parsed whole, in pieces whose sizes
//    come from the input, and (for short inputs) one byte at a time; the event
//    sequences must be identical.
// 2. Round trip: the input is read as a program of messages, which the client
//    encoder turns into masked frames (fragmented, with control frames in
//    between); the server parser must give back exactly those messages.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "cadeloop/http/websocket.hpp"

namespace {

using namespace cadeloop::http;

struct recorded {
  ws_event_kind kind;
  std::uint16_t code;
  std::string payload;
  bool operator==(const recorded&) const = default;
};

[[noreturn]] void fail(const char* what, std::size_t a, std::size_t b) {
  std::fprintf(stderr, "fuzz_websocket: %s (%zu vs %zu)\n", what, a, b);
  std::abort();
}

void compare(const char* what, const std::vector<recorded>& want,
             const std::vector<recorded>& got) {
  if (want.size() != got.size()) {
    fail(what, want.size(), got.size());
  }
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (!(want[i] == got[i])) {
      std::fprintf(stderr, "event %zu: kind %d/%d code %u/%u payload %zu/%zu bytes\n", i,
                   static_cast<int>(want[i].kind), static_cast<int>(got[i].kind), want[i].code,
                   got[i].code, want[i].payload.size(), got[i].payload.size());
      fail(what, i, i);
    }
  }
}

// Feeds `input` in pieces of `piece(i)` bytes (i counts pieces; 0 = the rest).
template <class PieceSize>
std::vector<recorded> parse(std::string_view input, const ws_parser_options& options,
                            PieceSize piece) {
  ws_parser parser{options};
  std::vector<recorded> events;
  for (std::size_t i = 0; !input.empty(); ++i) {
    std::size_t n = piece(i);
    if (n == 0 || n > input.size()) {
      n = input.size();
    }
    parser.feed(input.substr(0, n), [&](const ws_event& e) {
      events.push_back({e.kind, e.code, std::string{e.payload}});
    });
    input.remove_prefix(n);
  }
  return events;
}

void check_split_invariance(std::string_view input) {
  for (const std::size_t max_message : {std::size_t{1} << 20, std::size_t{100}}) {
    const ws_parser_options options{.role = ws_role::server, .max_message = max_message};
    const auto whole = parse(input, options, [](std::size_t) { return std::size_t{0}; });
    const auto pieces = parse(input, options, [&](std::size_t i) {
      return static_cast<std::size_t>(static_cast<unsigned char>(input[(i * 7) % input.size()]) %
                                      64) +
             1;
    });
    compare("input-derived split differs from whole", whole, pieces);
    if (input.size() <= 4096) {
      const auto bytes = parse(input, options, [](std::size_t) { return std::size_t{1}; });
      compare("byte-at-a-time differs from whole", whole, bytes);
    }
  }
}

// Reads bytes from the input for the round-trip program; zeros once used up.
class program_reader {
 public:
  explicit program_reader(std::string_view data) : data_(data) {}
  [[nodiscard]] bool more() const { return at_ < data_.size(); }
  std::uint8_t byte() { return at_ < data_.size() ? static_cast<std::uint8_t>(data_[at_++]) : 0; }

 private:
  std::string_view data_;
  std::size_t at_ = 0;
};

// UTF-8 encoding of one scalar value, written here independently of the
// validator under test.
void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string make_text(program_reader& in, std::size_t chars) {
  std::string s;
  for (std::size_t i = 0; i < chars; ++i) {
    const std::uint8_t kind = in.byte();
    std::uint32_t cp = 0;
    if ((kind & 3U) != 0) {
      cp = kind & 0x7FU;  // mostly ASCII, as real text is
    } else {
      cp = ((static_cast<std::uint32_t>(in.byte()) << 16) |
            (static_cast<std::uint32_t>(in.byte()) << 8) | in.byte()) %
           0x110000U;
      if (cp >= 0xD800 && cp <= 0xDFFF) {
        cp -= 0x800;  // surrogates are not scalar values
      }
    }
    append_utf8(s, cp);
  }
  return s;
}

std::string make_bytes(program_reader& in, std::size_t size) {
  std::string s(size, '\0');
  const std::uint8_t seed = in.byte();
  for (std::size_t i = 0; i < size; ++i) {
    s[i] = static_cast<char>(static_cast<std::uint8_t>(seed + i * 31) ^ (i < 8 ? in.byte() : 0));
  }
  return s;
}

void check_roundtrip(std::string_view input) {
  program_reader in{input};
  const ws_mask_key key{in.byte(), in.byte(), in.byte(), in.byte()};
  std::string stream;
  std::vector<recorded> expected;
  static constexpr std::uint16_t close_codes[] = {1000, 1001, 1002, 1003, 1007, 1008, 1009,
                                                  1010, 1011, 1012, 1013, 1014, 3000, 4999};
  bool closed = false;
  for (int step = 0; step < 32 && in.more() && !closed; ++step) {
    const std::uint8_t op = in.byte();
    switch (op % 6) {
      case 0:
      case 1: {
        const bool is_text = op % 6 == 0;
        const std::size_t size = in.byte() * (((op & 0x40U) != 0) ? 64U : 1U);
        const std::string payload = is_text ? make_text(in, size) : make_bytes(in, size);
        const std::size_t fragment = in.byte() % 16;
        const std::uint8_t interleave = in.byte();
        if (fragment == 0 || payload.size() <= fragment) {
          encode_ws_frame(stream, is_text ? ws_opcode::text : ws_opcode::binary, payload, true,
                          &key);
        } else {
          // Fragments by hand, with pings and pongs between some of them.
          std::string_view rest = payload;
          ws_opcode frame_op = is_text ? ws_opcode::text : ws_opcode::binary;
          for (unsigned k = 0; !rest.empty(); ++k) {
            const std::size_t n = std::min(fragment, rest.size());
            encode_ws_frame(stream, frame_op, rest.substr(0, n), n == rest.size(), &key);
            rest.remove_prefix(n);
            frame_op = ws_opcode::continuation;
            if (!rest.empty() && ((interleave >> (k % 8)) & 1U) != 0) {
              const std::string p = make_bytes(in, in.byte() % 126);
              const bool is_ping = (k & 1U) == 0;
              if (!encode_ws_control(stream, is_ping ? ws_opcode::ping : ws_opcode::pong, p, &key)
                       .ok()) {
                fail("control frame refused", p.size(), 125);
              }
              expected.push_back({is_ping ? ws_event_kind::ping : ws_event_kind::pong, 0, p});
            }
          }
        }
        expected.push_back({is_text ? ws_event_kind::text : ws_event_kind::binary, 0, payload});
        break;
      }
      case 2:
      case 3: {
        const bool is_ping = op % 6 == 2;
        const std::string p = make_bytes(in, in.byte() % 126);
        if (!encode_ws_control(stream, is_ping ? ws_opcode::ping : ws_opcode::pong, p, &key).ok()) {
          fail("control frame refused", p.size(), 125);
        }
        expected.push_back({is_ping ? ws_event_kind::ping : ws_event_kind::pong, 0, p});
        break;
      }
      case 4: {
        const std::uint16_t code = close_codes[in.byte() % std::size(close_codes)];
        std::string reason = make_text(in, in.byte() % 40);
        if (reason.size() > 123) {
          reason.resize(0);
        }
        if (!encode_ws_close(stream, code, reason, &key).ok()) {
          fail("close frame refused", code, 0);
        }
        expected.push_back({ws_event_kind::close, code, reason});
        closed = true;
        break;
      }
      default: {
        encode_ws_close(stream, ws_close_code::no_status, {}, &key);
        expected.push_back({ws_event_kind::close, ws_close_code::no_status, {}});
        closed = true;
        break;
      }
    }
  }
  const ws_parser_options options{.role = ws_role::server, .max_message = std::size_t{1} << 24};
  compare("round trip (whole) differs", expected,
          parse(stream, options, [](std::size_t) { return std::size_t{0}; }));
  compare("round trip (split) differs", expected, parse(stream, options, [&](std::size_t i) {
            return static_cast<std::size_t>(static_cast<unsigned char>(input[i % input.size()])) +
                   1;
          }));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) {
    return 0;
  }
  const std::string_view input{reinterpret_cast<const char*>(data), size};
  check_split_invariance(input);
  check_roundtrip(input);
  return 0;
}
