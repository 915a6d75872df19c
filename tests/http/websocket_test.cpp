#include "cadeloop/http/websocket.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

namespace cadeloop::http {
namespace {

using namespace std::string_literals;
using namespace std::string_view_literals;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

struct recorded {
  ws_event_kind kind;
  std::uint16_t code;
  std::string payload;
  bool operator==(const recorded&) const = default;
};

std::ostream& operator<<(std::ostream& os, const recorded& r) {
  static constexpr const char* names[] = {"text", "binary", "ping", "pong", "close", "error"};
  return os << "{" << names[static_cast<int>(r.kind)] << " " << r.code << " '" << r.payload << "'}";
}

recorded text(std::string p) {
  return {ws_event_kind::text, 0, std::move(p)};
}
recorded binary(std::string p) {
  return {ws_event_kind::binary, 0, std::move(p)};
}
recorded ping(std::string p) {
  return {ws_event_kind::ping, 0, std::move(p)};
}
recorded pong(std::string p) {
  return {ws_event_kind::pong, 0, std::move(p)};
}
recorded close_event(std::uint16_t code, std::string reason = {}) {
  return {ws_event_kind::close, code, std::move(reason)};
}
recorded error(std::uint16_t code) {
  return {ws_event_kind::error, code, {}};
}

// Feeds `input` in pieces whose sizes come from `next_size` (0 means the rest)
// and records the events; error reasons are dropped so tests compare codes.
std::vector<recorded> parse_pieces(std::string_view input, const ws_parser_options& options,
                                   const std::function<std::size_t()>& next_size) {
  ws_parser parser{options};
  std::vector<recorded> events;
  while (!input.empty()) {
    std::size_t n = next_size();
    if (n == 0 || n > input.size()) {
      n = input.size();
    }
    parser.feed(input.substr(0, n), [&](const ws_event& e) {
      events.push_back({e.kind, e.code,
                        e.kind == ws_event_kind::error ? std::string{} : std::string{e.payload}});
    });
    input.remove_prefix(n);
  }
  return events;
}

// Parses whole, and checks that byte-at-a-time, every two-piece split and a
// few random splits give exactly the same events.
std::vector<recorded> parse(std::string_view input, const ws_parser_options& options = {}) {
  const std::vector<recorded> whole = parse_pieces(input, options, [] { return std::size_t{0}; });
  const std::vector<recorded> bytes = parse_pieces(input, options, [] { return std::size_t{1}; });
  EXPECT_EQ(whole, bytes) << "byte-at-a-time differs";
  for (std::size_t cut = 1; cut < input.size() && cut < 300; ++cut) {
    bool first = true;
    const auto split = parse_pieces(input, options, [&] {
      const std::size_t n = first ? cut : 0;
      first = false;
      return n;
    });
    EXPECT_EQ(whole, split) << "split at " << cut << " differs";
  }
  std::mt19937 rng{12345};
  for (int round = 0; round < 20; ++round) {
    const auto random = parse_pieces(input, options, [&] { return std::size_t{1} + rng() % 17; });
    EXPECT_EQ(whole, random) << "random split differs";
  }
  return whole;
}

constexpr ws_mask_key key{0x37, 0xfa, 0x21, 0x3d};

// A masked client frame with arbitrary header bits, for malformed input.
std::string raw_frame(std::uint8_t b0, std::string_view payload, bool mask = true,
                      std::uint8_t len_override = 0xff) {
  std::string f;
  f.push_back(static_cast<char>(b0));
  std::uint8_t b1 = mask ? 0x80 : 0x00;
  if (len_override != 0xff) {
    b1 |= len_override;
  } else {
    b1 |= static_cast<std::uint8_t>(payload.size());
  }
  f.push_back(static_cast<char>(b1));
  if (mask) {
    f.append(reinterpret_cast<const char*>(key.data()), 4);
    const std::size_t at = f.size();
    f.resize(at + payload.size());
    ws_apply_mask(f.data() + at, payload.data(), payload.size(), key, 0);
  } else {
    f.append(payload);
  }
  return f;
}

std::string client_frame(ws_opcode op, std::string_view payload, bool fin = true) {
  std::string f;
  encode_ws_frame(f, op, payload, fin, &key);
  return f;
}

std::string close_payload(std::uint16_t code, std::string_view reason = {}) {
  std::string p{static_cast<char>(code >> 8), static_cast<char>(code & 0xff)};
  p.append(reason);
  return p;
}

// ---------------------------------------------------------------------------
// Handshake
// ---------------------------------------------------------------------------

TEST(WebSocketHandshake, AcceptKeyMatchesRfcExample) {
  const auto accept = ws_accept_key("dGhlIHNhbXBsZSBub25jZQ==");
  EXPECT_EQ(std::string_view(accept.data(), accept.size()), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
  // Keys too long for the stack buffer take the incremental path.
  const auto long_key = ws_accept_key(std::string(100, 'x'));
  EXPECT_EQ(std::string_view(long_key.data(), long_key.size()), "DJTE+uYDnPxiT+W6VvIG/iPUxv8=");
}

std::vector<header_field> good_headers() {
  return {{"host", "example.com"},
          {"upgrade", "WebSocket"},
          {"connection", "keep-alive, Upgrade"},
          {"sec-websocket-key", " dGhlIHNhbXBsZSBub25jZQ== "},
          {"sec-websocket-version", "13"}};
}

ws_handshake_result check(const std::vector<header_field>& headers, std::string_view method = "GET",
                          std::uint8_t minor = 1) {
  return validate_ws_handshake({method, 1, minor, headers});
}

std::vector<header_field> without(std::vector<header_field> h, std::string_view name) {
  std::erase_if(h, [&](const header_field& f) { return f.name == name; });
  return h;
}

std::vector<header_field> replaced(std::vector<header_field> h, std::string_view name,
                                   std::string_view value) {
  h = without(std::move(h), name);
  h.push_back({name, value});
  return h;
}

TEST(WebSocketHandshake, ValidRequestIsAccepted) {
  auto headers = good_headers();
  headers.push_back({"sec-websocket-protocol", "chat, superchat"});
  headers.push_back({"sec-websocket-protocol", " v2.json ,"});
  const ws_handshake_result r = check(headers);
  ASSERT_TRUE(r.ok()) << r.reason;
  EXPECT_EQ(r.status, 101U);
  EXPECT_EQ(r.key, "dGhlIHNhbXBsZSBub25jZQ==");
  EXPECT_EQ(r.subprotocols, (std::vector<std::string_view>{"chat", "superchat", "v2.json"}));
  EXPECT_TRUE(check(good_headers(), "GET", 2).ok()) << "HTTP/1.2 would do too";
}

TEST(WebSocketHandshake, MethodMustBeGet) {
  const ws_handshake_result r = check(good_headers(), "POST");
  EXPECT_EQ(r.status, 400U);
  EXPECT_EQ(r.reason, "WebSocket upgrade needs a GET request");
  EXPECT_EQ(check(good_headers(), "get").status, 400U);
}

TEST(WebSocketHandshake, HttpVersionMustBe11) {
  const ws_handshake_result r = check(good_headers(), "GET", 0);
  EXPECT_EQ(r.status, 400U);
  EXPECT_EQ(r.reason, "WebSocket upgrade needs HTTP/1.1");
  EXPECT_EQ(validate_ws_handshake({"GET", 2, 0, good_headers()}).status, 400U);
}

TEST(WebSocketHandshake, UpgradeMustListWebsocket) {
  EXPECT_EQ(check(without(good_headers(), "upgrade")).status, 400U);
  EXPECT_EQ(check(replaced(good_headers(), "upgrade", "h2c")).status, 400U);
  EXPECT_EQ(check(replaced(good_headers(), "upgrade", "websockets")).status, 400U);
  EXPECT_EQ(check(replaced(good_headers(), "upgrade", "h2c, websocket")).status, 101U);
  EXPECT_EQ(check(replaced(good_headers(), "upgrade", "h2c")).reason,
            "missing 'Upgrade: websocket'");
}

TEST(WebSocketHandshake, ConnectionMustListUpgrade) {
  EXPECT_EQ(check(without(good_headers(), "connection")).status, 400U);
  const ws_handshake_result r = check(replaced(good_headers(), "connection", "keep-alive"));
  EXPECT_EQ(r.status, 400U);
  EXPECT_EQ(r.reason, "missing 'Connection: upgrade'");
  EXPECT_EQ(check(replaced(good_headers(), "connection", "upgraded")).status, 400U);
  EXPECT_EQ(check(replaced(good_headers(), "connection", "UPGRADE")).status, 101U);
}

TEST(WebSocketHandshake, KeyMustBeBase64Of16Bytes) {
  for (const std::string_view bad :
       {std::string_view{""}, std::string_view{"dGhlIHNhbXBsZSBub25jZQ="},
        std::string_view{"dGhlIHNhbXBsZSBub25jZQ=="
                         "AA"},
        std::string_view{"dGhlIHNhbXBsZSBub25jZ*=="}, std::string_view{"AAAAAAAAAAAAAAAAAAAA"},
        std::string_view{"AAAAAAAAAAAAAAAAAAAAAA=A"},
        std::string_view{"AAAAAAAAAAAAAAAAAAAAAAAA"}}) {
    const ws_handshake_result r = check(replaced(good_headers(), "sec-websocket-key", bad));
    EXPECT_EQ(r.status, 400U) << bad;
    EXPECT_EQ(r.reason, "Sec-WebSocket-Key must be base64 of 16 bytes");
  }
  EXPECT_EQ(check(without(good_headers(), "sec-websocket-key")).status, 400U);
  auto twice = good_headers();
  twice.push_back({"sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="});
  EXPECT_EQ(check(twice).status, 400U);
}

TEST(WebSocketHandshake, VersionOtherThan13Gets426) {
  for (const std::string_view v : {"8", "12", "14", "13, 8", ""}) {
    const ws_handshake_result r = check(replaced(good_headers(), "sec-websocket-version", v));
    EXPECT_EQ(r.status, 426U) << v;
  }
  EXPECT_EQ(check(without(good_headers(), "sec-websocket-version")).status, 426U);
  auto twice = good_headers();
  twice.push_back({"sec-websocket-version", "13"});
  EXPECT_EQ(check(twice).status, 426U);
}

TEST(WebSocketHandshake, SubprotocolsMustBeTokens) {
  auto headers = good_headers();
  headers.push_back({"sec-websocket-protocol", "chat, bad proto"});
  const ws_handshake_result r = check(headers);
  EXPECT_EQ(r.status, 400U);
  EXPECT_EQ(r.reason, "Sec-WebSocket-Protocol must be a list of tokens");
  EXPECT_TRUE(r.subprotocols.empty());
}

TEST(WebSocketHandshake, AcceptResponseBytes) {
  std::string out;
  const header_field extra[] = {{"x-id", " 7 "}};
  ASSERT_TRUE(encode_ws_accept("dGhlIHNhbXBsZSBub25jZQ==", "chat", extra, out).ok());
  EXPECT_EQ(out,
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\nSec-WebSocket-Protocol: chat\r\n"
            "x-id: 7\r\n\r\n");
  out.clear();
  ASSERT_TRUE(encode_ws_accept("dGhlIHNhbXBsZSBub25jZQ==", "", {}, out).ok());
  EXPECT_EQ(out,
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n");
}

TEST(WebSocketHandshake, AcceptResponseRefusesBadHeaders) {
  const std::vector<std::pair<header_field, encode_errc>> cases = {
      {{"x id", "1"}, encode_errc::bad_header_name},
      {{"x-id", "1\r\nx-evil: 2"}, encode_errc::bad_header_value},
      {{"Sec-WebSocket-Protocol", "chat"}, encode_errc::forbidden_header},
      {{"sec-websocket-accept", "x"}, encode_errc::forbidden_header},
      {{"connection", "close"}, encode_errc::forbidden_header},
      {{"upgrade", "h2c"}, encode_errc::forbidden_header}};
  for (const auto& [field, code] : cases) {
    std::string out;
    const encode_status st = encode_ws_accept("dGhlIHNhbXBsZSBub25jZQ==", "", {&field, 1}, out);
    EXPECT_EQ(st.code, code) << field.name;
    EXPECT_EQ(st.header, field.name);
    EXPECT_EQ(out, "");
  }
  std::string out;
  EXPECT_EQ(encode_ws_accept("dGhlIHNhbXBsZSBub25jZQ==", "a b", {}, out).code,
            encode_errc::bad_header_value);
  EXPECT_EQ(out, "");
}

TEST(WebSocketHandshake, RejectionResponseBytes) {
  date_cache dates{[] { return std::int64_t{784111777}; }};
  std::string out;
  encode_ws_reject(check(replaced(good_headers(), "sec-websocket-version", "8")), dates, out);
  EXPECT_EQ(out,
            "HTTP/1.1 426 Upgrade Required\r\nContent-Type: text/plain; charset=utf-8\r\n"
            "Content-Length: 52\r\nConnection: close\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
            "Server: cadeloop\r\nSec-WebSocket-Version: 13\r\n\r\n"
            "unsupported Sec-WebSocket-Version (13 is supported)\n");
  out.clear();
  encode_ws_reject(check(good_headers(), "POST"), dates, out);
  EXPECT_EQ(out,
            "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
            "Content-Length: 38\r\nConnection: close\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
            "Server: cadeloop\r\n\r\nWebSocket upgrade needs a GET request\n");
}

// ---------------------------------------------------------------------------
// Frame parser
// ---------------------------------------------------------------------------

TEST(WebSocketParser, RfcExampleFrames) {
  // RFC 6455 5.7: a masked "Hello" and a masked pong.
  const std::string masked_hello = "\x81\x85\x37\xfa\x21\x3d\x7f\x9f\x4d\x51\x58"s;
  const std::string masked_pong = "\x8a\x85\x37\xfa\x21\x3d\x7f\x9f\x4d\x51\x58"s;
  EXPECT_EQ(parse(masked_hello + masked_pong),
            (std::vector<recorded>{text("Hello"), pong("Hello")}));
  // Unmasked fragments and ping, as a client receives them.
  const std::string fragments = "\x01\x03Hel\x80\x02lo\x89\x05Hello"s;
  EXPECT_EQ(parse(fragments, {.role = ws_role::client}),
            (std::vector<recorded>{text("Hello"), ping("Hello")}));
}

TEST(WebSocketParser, PayloadLengthEncodings) {
  for (const std::size_t size : {0UL, 1UL, 125UL, 126UL, 127UL, 65535UL, 65536UL, 70000UL}) {
    std::string payload(size, '\0');
    for (std::size_t i = 0; i < size; ++i) {
      payload[i] = static_cast<char>(i * 7 + 3);
    }
    ws_parser parser;
    std::vector<recorded> events;
    parser.feed(client_frame(ws_opcode::binary, payload), [&](const ws_event& e) {
      events.push_back({e.kind, e.code, std::string{e.payload}});
    });
    EXPECT_EQ(events, (std::vector<recorded>{binary(payload)})) << size;
  }
  // 256 bytes with a 16-bit length, 65536 with a 64-bit one (RFC 6455 5.7), unmasked.
  const std::string h16 = "\x82\x7e\x01\x00"s;
  const std::string h64 = "\x82\x7f\x00\x00\x00\x00\x00\x01\x00\x00"s;
  EXPECT_EQ(parse(h16 + std::string(256, 'a'), {.role = ws_role::client}),
            (std::vector<recorded>{binary(std::string(256, 'a'))}));
  ws_parser client{{.role = ws_role::client}};
  std::string input = h64 + std::string(65536, 'b');
  std::string_view view = input;
  const ws_event* e = client.next(view);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->kind, ws_event_kind::binary);
  EXPECT_EQ(e->payload.size(), 65536U);
}

TEST(WebSocketParser, ServerRejectsUnmaskedFrames) {
  EXPECT_EQ(parse(raw_frame(0x81, "hi", false)), (std::vector<recorded>{error(1002)}));
  EXPECT_EQ(parse(raw_frame(0x89, "", false)), (std::vector<recorded>{error(1002)}));
}

TEST(WebSocketParser, ClientRejectsMaskedFrames) {
  EXPECT_EQ(parse(raw_frame(0x81, "hi", true), {.role = ws_role::client}),
            (std::vector<recorded>{error(1002)}));
  EXPECT_EQ(parse(raw_frame(0x81, "hi", false), {.role = ws_role::client}),
            (std::vector<recorded>{text("hi")}));
}

TEST(WebSocketParser, RsvBitsNeedAnExtension) {
  for (const unsigned rsv_bit : {0x40U, 0x20U, 0x10U}) {
    const auto rsv = static_cast<std::uint8_t>(rsv_bit);
    EXPECT_EQ(parse(raw_frame(static_cast<std::uint8_t>(0x81 | rsv), "hi")),
              (std::vector<recorded>{error(1002)}))
        << rsv_bit;
    EXPECT_EQ(parse(raw_frame(static_cast<std::uint8_t>(0x81 | rsv), "hi"), {.allowed_rsv = rsv}),
              (std::vector<recorded>{text("hi")}));
  }
}

TEST(WebSocketParser, ReservedOpcodesAreRejected) {
  for (const unsigned op : {3U, 4U, 5U, 6U, 7U, 0xBU, 0xCU, 0xDU, 0xEU, 0xFU}) {
    EXPECT_EQ(parse(raw_frame(static_cast<std::uint8_t>(0x80 | op), "x")),
              (std::vector<recorded>{error(1002)}))
        << op;
  }
}

TEST(WebSocketParser, ControlFramesLimitedTo125Bytes) {
  EXPECT_EQ(parse(client_frame(ws_opcode::ping, std::string(125, 'p'))),
            (std::vector<recorded>{ping(std::string(125, 'p'))}));
  std::string too_long;
  encode_ws_frame(too_long, ws_opcode::ping, std::string(126, 'p'), true, &key);
  EXPECT_EQ(parse(too_long), (std::vector<recorded>{error(1002)}));
  // The error comes from the first two bytes alone.
  EXPECT_EQ(parse(too_long.substr(0, 2)), (std::vector<recorded>{error(1002)}));
}

TEST(WebSocketParser, ControlFramesMustNotBeFragmented) {
  EXPECT_EQ(parse(raw_frame(0x09, "p")), (std::vector<recorded>{error(1002)}));
  EXPECT_EQ(parse(raw_frame(0x0A, "p")), (std::vector<recorded>{error(1002)}));
  EXPECT_EQ(parse(raw_frame(0x08, close_payload(1000))), (std::vector<recorded>{error(1002)}));
}

TEST(WebSocketParser, ContinuationWithoutMessageIsRejected) {
  EXPECT_EQ(parse(client_frame(ws_opcode::continuation, "x")),
            (std::vector<recorded>{error(1002)}));
  // Also after a completed message.
  EXPECT_EQ(parse(client_frame(ws_opcode::text, "a") + client_frame(ws_opcode::continuation, "b")),
            (std::vector<recorded>{text("a"), error(1002)}));
}

TEST(WebSocketParser, NewDataFrameInsideFragmentedMessageIsRejected) {
  EXPECT_EQ(parse(client_frame(ws_opcode::text, "a", false) + client_frame(ws_opcode::text, "b")),
            (std::vector<recorded>{error(1002)}));
  EXPECT_EQ(
      parse(client_frame(ws_opcode::binary, "a", false) + client_frame(ws_opcode::binary, "b")),
      (std::vector<recorded>{error(1002)}));
}

TEST(WebSocketParser, ControlFramesBetweenFragments) {
  const std::string input =
      client_frame(ws_opcode::text, "Hel", false) + client_frame(ws_opcode::ping, "p1") +
      client_frame(ws_opcode::continuation, "lo, ", false) + client_frame(ws_opcode::pong, "") +
      client_frame(ws_opcode::continuation, "world") + client_frame(ws_opcode::binary, "\x00\xff"s);
  EXPECT_EQ(parse(input), (std::vector<recorded>{ping("p1"), pong(""), text("Hello, world"),
                                                 binary("\x00\xff"s)}));
}

TEST(WebSocketParser, SixtyFourBitLengthWithTopBitIsRejected) {
  const std::string frame = "\x82\xff\x80\x00\x00\x00\x00\x00\x00\x01\x37\xfa\x21\x3d"s;
  EXPECT_EQ(parse(frame), (std::vector<recorded>{error(1002)}));
  // Just below: 2^63-1 is a legal length (and too big for the limit).
  const std::string max = "\x82\xff\x7f\xff\xff\xff\xff\xff\xff\xff\x37\xfa\x21\x3d"s;
  EXPECT_EQ(parse(max), (std::vector<recorded>{error(1009)}));
}

TEST(WebSocketParser, CloseFrames) {
  EXPECT_EQ(parse(client_frame(ws_opcode::close, "")), (std::vector<recorded>{close_event(1005)}));
  EXPECT_EQ(parse(client_frame(ws_opcode::close, close_payload(1000, "bye"))),
            (std::vector<recorded>{close_event(1000, "bye")}));
  EXPECT_EQ(parse(client_frame(ws_opcode::close, close_payload(4999, "caf\xc3\xa9"))),
            (std::vector<recorded>{close_event(4999, "caf\xc3\xa9")}));
}

TEST(WebSocketParser, CloseWithOneBytePayloadIsRejected) {
  EXPECT_EQ(parse(client_frame(ws_opcode::close, "\x03")), (std::vector<recorded>{error(1002)}));
}

TEST(WebSocketParser, CloseCodesAreValidated) {
  for (const std::uint16_t code :
       std::initializer_list<std::uint16_t>{1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011,
                                            1012, 1013, 1014, 3000, 3999, 4000, 4999}) {
    EXPECT_EQ(parse(client_frame(ws_opcode::close, close_payload(code))),
              (std::vector<recorded>{close_event(code)}))
        << code;
  }
  for (const std::uint16_t code : std::initializer_list<std::uint16_t>{
           0, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535}) {
    EXPECT_EQ(parse(client_frame(ws_opcode::close, close_payload(code))),
              (std::vector<recorded>{error(1002)}))
        << code;
  }
}

TEST(WebSocketParser, CloseReasonMustBeUtf8) {
  EXPECT_EQ(parse(client_frame(ws_opcode::close, close_payload(1000, "\xff"))),
            (std::vector<recorded>{error(1007)}));
  EXPECT_EQ(parse(client_frame(ws_opcode::close, close_payload(1000, "\xc3"))),
            (std::vector<recorded>{error(1007)}));
}

TEST(WebSocketParser, NothingIsAcceptedAfterClose) {
  ws_parser parser;
  const std::string input =
      client_frame(ws_opcode::close, close_payload(1000)) + client_frame(ws_opcode::text, "late");
  std::string_view view = input;
  const ws_event* e = parser.next(view);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->kind, ws_event_kind::close);
  EXPECT_TRUE(parser.finished());
  const std::size_t left = view.size();
  EXPECT_EQ(parser.next(view), nullptr);
  EXPECT_EQ(view.size(), left);
  EXPECT_EQ(parse(input), (std::vector<recorded>{close_event(1000)}));
}

TEST(WebSocketParser, NothingIsAcceptedAfterError) {
  const std::string input = raw_frame(0x83, "x") + client_frame(ws_opcode::text, "late");
  ws_parser parser;
  std::string_view view = input;
  const ws_event* e = parser.next(view);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->kind, ws_event_kind::error);
  EXPECT_EQ(e->code, 1002);
  EXPECT_EQ(e->payload, "reserved opcode");
  EXPECT_EQ(parser.next(view), nullptr);
  EXPECT_TRUE(parser.finished());
  EXPECT_EQ(parse(input), (std::vector<recorded>{error(1002)}));
}

TEST(WebSocketParser, TextMessagesAcceptValidUtf8SplitAcrossFragments) {
  // "€" (E2 82 AC) and U+1F600 (F0 9F 98 80) split across frames.
  const std::string input = client_frame(ws_opcode::text, "a\xe2", false) +
                            client_frame(ws_opcode::continuation, "\x82", false) +
                            client_frame(ws_opcode::continuation, "\xac\xf0\x9f", false) +
                            client_frame(ws_opcode::continuation, "\x98\x80z");
  EXPECT_EQ(parse(input), (std::vector<recorded>{text("a\xe2\x82\xac\xf0\x9f\x98\x80z")}));
}

TEST(WebSocketParser, TextMessagesRejectInvalidUtf8) {
  for (const std::string_view bad :
       {"\xc0\x80"sv, "\xc1\xbf"sv, "\xe0\x80\x80"sv, "\xe0\x9f\xbf"sv, "\xf0\x80\x80\x80"sv,
        "\xf0\x8f\xbf\xbf"sv, "\xed\xa0\x80"sv, "\xed\xbf\xbf"sv, "\xf4\x90\x80\x80"sv, "\xf5"sv,
        "\xff"sv, "\x80"sv, "a\xbf"sv, "\xc3\x28"sv, "\xf5\x80\x80\x80"sv, "\xff\x80\x80\x80"sv,
        "\xf8\x88\x80\x80\x80"sv}) {
    EXPECT_EQ(parse(client_frame(ws_opcode::text, bad)), (std::vector<recorded>{error(1007)}))
        << testing::PrintToString(bad);
  }
}

TEST(WebSocketParser, TextMessageMustNotEndInsideACharacter) {
  EXPECT_EQ(parse(client_frame(ws_opcode::text, "ok\xe2\x82")),
            (std::vector<recorded>{error(1007)}));
  EXPECT_EQ(parse(client_frame(ws_opcode::text, "\xf0\x9f", false) +
                  client_frame(ws_opcode::continuation, "\x98")),
            (std::vector<recorded>{error(1007)}));
  // Binary messages are not UTF-8 checked.
  EXPECT_EQ(parse(client_frame(ws_opcode::binary, "\xe2\x82")),
            (std::vector<recorded>{binary("\xe2\x82")}));
}

TEST(WebSocketParser, InvalidUtf8FailsBeforeTheMessageEnds) {
  // Only the first 4 payload bytes of a 100-byte frame arrive: already fatal.
  std::string frame = client_frame(ws_opcode::text, "ab\xed\xa0" + std::string(96, 'x'));
  EXPECT_EQ(parse(frame.substr(0, 6 + 4)), (std::vector<recorded>{error(1007)}));
  // A bad first fragment fails before the final fragment is sent.
  EXPECT_EQ(parse(client_frame(ws_opcode::text, "\xf4\x90", false)),
            (std::vector<recorded>{error(1007)}));
}

TEST(WebSocketParser, MaxMessageIsCheckedAgainstTheHeader) {
  const ws_parser_options limit{.max_message = 10};
  EXPECT_EQ(parse(client_frame(ws_opcode::binary, std::string(10, 'a')), limit),
            (std::vector<recorded>{binary(std::string(10, 'a'))}));
  const std::string big = client_frame(ws_opcode::binary, std::string(11, 'a'));
  EXPECT_EQ(parse(big, limit), (std::vector<recorded>{error(1009)}));
  // The header alone is enough to refuse: no payload is awaited or buffered.
  EXPECT_EQ(parse(big.substr(0, 6), limit), (std::vector<recorded>{error(1009)}));
  // Across fragments the assembled size counts.
  const std::string fragmented = client_frame(ws_opcode::text, std::string(6, 'a'), false) +
                                 client_frame(ws_opcode::continuation, std::string(5, 'b'));
  EXPECT_EQ(parse(fragmented, limit), (std::vector<recorded>{error(1009)}));
  // Control frames do not count towards it, and a new message starts from zero.
  const std::string ok = client_frame(ws_opcode::text, std::string(6, 'a'), false) +
                         client_frame(ws_opcode::ping, std::string(20, 'p')) +
                         client_frame(ws_opcode::continuation, std::string(4, 'b')) +
                         client_frame(ws_opcode::text, std::string(10, 'c'));
  EXPECT_EQ(parse(ok, limit), (std::vector<recorded>{ping(std::string(20, 'p')), text("aaaaaabbbb"),
                                                     text(std::string(10, 'c'))}));
}

TEST(WebSocketParser, AnySplitGivesTheSameEvents) {
  // A long mixed stream, parsed whole and in every other way `parse` tries.
  std::string stream;
  encode_ws_message(stream, ws_opcode::text, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80!", 3, &key);
  encode_ws_frame(stream, ws_opcode::ping, "are you there", true, &key);
  encode_ws_message(stream, ws_opcode::binary, std::string(300, '\x5a'), 0, &key);
  encode_ws_frame(stream, ws_opcode::binary, "", false, &key);
  encode_ws_frame(stream, ws_opcode::pong, "yes", true, &key);
  encode_ws_frame(stream, ws_opcode::continuation, "tail", true, &key);
  encode_ws_message(stream, ws_opcode::text, "", 0, &key);
  (void)encode_ws_close(stream, 1001, "going", &key);
  const auto events = parse(stream);
  EXPECT_EQ(events, (std::vector<recorded>{text("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80!"),
                                           ping("are you there"), binary(std::string(300, '\x5a')),
                                           pong("yes"), binary("tail"), text(""),
                                           close_event(1001, "going")}));
}

TEST(WebSocketParser, PayloadViewStaysValidUntilNextCall) {
  ws_parser parser;
  const std::string input =
      client_frame(ws_opcode::text, "first") + client_frame(ws_opcode::text, "second");
  std::string_view view = input;
  const ws_event* a = parser.next(view);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->payload, "first");
  const ws_event* b = parser.next(view);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->payload, "second");
  EXPECT_TRUE(view.empty());
}

// ---------------------------------------------------------------------------
// UTF-8 validator and masking
// ---------------------------------------------------------------------------

TEST(Utf8Validator, Boundaries) {
  for (const std::string_view ok :
       {"\x7f"sv, "\xc2\x80"sv, "\xdf\xbf"sv, "\xe0\xa0\x80"sv, "\xed\x9f\xbf"sv, "\xee\x80\x80"sv,
        "\xef\xbf\xbf"sv, "\xf0\x90\x80\x80"sv, "\xf4\x8f\xbf\xbf"sv, ""sv,
        "plain ascii longer than eight bytes"sv}) {
    EXPECT_TRUE(is_valid_utf8(ok)) << testing::PrintToString(ok);
  }
  utf8_validator v;
  EXPECT_TRUE(v.feed("abc\xf0\x90"));
  EXPECT_FALSE(v.complete());
  EXPECT_TRUE(v.feed("\x80\x80"));
  EXPECT_TRUE(v.complete());
  EXPECT_FALSE(v.feed("12345678\xc0"));
  EXPECT_FALSE(v.feed("ok")) << "a rejection sticks";
}

TEST(Utf8Validator, InvalidByteAtEveryPositionOfAWord) {
  // The ASCII fast path reads eight bytes at a time; a bad byte in any lane
  // of such a word must still be seen.
  for (std::size_t at = 0; at < 16; ++at) {
    std::string s(24, 'a');
    s[at] = '\xff';
    EXPECT_FALSE(is_valid_utf8(s)) << at;
    EXPECT_EQ(parse(client_frame(ws_opcode::text, s)), (std::vector<recorded>{error(1007)})) << at;
  }
}

TEST(WebSocketMask, WordAtATimeMatchesBytewise) {
  std::mt19937 rng{7};
  for (std::size_t size = 0; size < 70; ++size) {
    for (std::size_t offset = 0; offset < 4; ++offset) {
      std::string src(size, '\0');
      for (char& c : src) {
        c = static_cast<char>(rng());
      }
      std::string dst(size, '\0');
      const std::size_t next = ws_apply_mask(dst.data(), src.data(), size, key, offset);
      EXPECT_EQ(next, (offset + size) % 4);
      for (std::size_t i = 0; i < size; ++i) {
        ASSERT_EQ(static_cast<unsigned char>(dst[i]),
                  static_cast<unsigned char>(src[i]) ^ key[(offset + i) % 4]);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Encoder
// ---------------------------------------------------------------------------

TEST(WebSocketEncoder, ServerFramesAreUnmasked) {
  std::string out;
  encode_ws_frame(out, ws_opcode::text, "Hello");
  EXPECT_EQ(out, "\x81\x05Hello"s);
  out.clear();
  encode_ws_frame_header(out, ws_opcode::binary, 256);
  EXPECT_EQ(out, "\x82\x7e\x01\x00"s);
  out.clear();
  encode_ws_frame_header(out, ws_opcode::binary, 65536);
  EXPECT_EQ(out, "\x82\x7f\x00\x00\x00\x00\x00\x01\x00\x00"s);
  out.clear();
  encode_ws_frame_header(out, ws_opcode::binary, 125, false);
  EXPECT_EQ(out, "\x02\x7d"s);
}

TEST(WebSocketEncoder, ClientFramesAreMasked) {
  std::string out;
  encode_ws_frame(out, ws_opcode::text, "Hello", true, &key);
  EXPECT_EQ(out, "\x81\x85\x37\xfa\x21\x3d\x7f\x9f\x4d\x51\x58"s);  // RFC 6455 5.7
}

TEST(WebSocketEncoder, MessagesAreFragmented) {
  std::string out;
  encode_ws_message(out, ws_opcode::text, "Hello", 3);
  EXPECT_EQ(out, "\x01\x03Hel\x80\x02lo"s);
  out.clear();
  encode_ws_message(out, ws_opcode::binary, "", 3);
  EXPECT_EQ(out, "\x82\x00"s);
}

TEST(WebSocketEncoder, ControlFrames) {
  std::string out;
  ASSERT_TRUE(encode_ws_control(out, ws_opcode::ping, "Hello").ok());
  EXPECT_EQ(out, "\x89\x05Hello"s);
  out.clear();
  ASSERT_TRUE(encode_ws_control(out, ws_opcode::pong, std::string(125, 'x')).ok());
  out.clear();
  EXPECT_EQ(encode_ws_control(out, ws_opcode::ping, std::string(126, 'x')).code,
            encode_errc::control_payload_too_long);
  EXPECT_EQ(out, "");
}

TEST(WebSocketEncoder, CloseFrames) {
  std::string out;
  ASSERT_TRUE(encode_ws_close(out, 1000, "bye").ok());
  EXPECT_EQ(out, "\x88\x05\x03\xe8"s + "bye");
  out.clear();
  ASSERT_TRUE(encode_ws_close(out, 1005).ok());
  EXPECT_EQ(out, "\x88\x00"s);
  out.clear();
  for (const std::uint16_t code : std::initializer_list<std::uint16_t>{0, 1004, 1006, 1015, 5000}) {
    EXPECT_EQ(encode_ws_close(out, code).code, encode_errc::bad_close_code) << code;
  }
  EXPECT_EQ(out, "");
  // A long reason is cut to 123 bytes, never inside a character.
  const std::string reason = std::string(122, 'r') + "\xc3\xa9" + "tail";
  ASSERT_TRUE(encode_ws_close(out, 1011, reason).ok());
  EXPECT_EQ(out, "\x88\x7c\x03\xf3"s + std::string(122, 'r'));
  out.clear();
  ASSERT_TRUE(encode_ws_close(out, 1011, std::string(200, 'r')).ok());
  EXPECT_EQ(out.size(), 2U + 125U);
}

TEST(WebSocketEncoder, RoundTripThroughTheParser) {
  std::string stream;
  encode_ws_message(stream, ws_opcode::binary, std::string(100000, 'q'), 4096, &key);
  ASSERT_TRUE(encode_ws_close(stream, 1000, "done", &key).ok());
  EXPECT_EQ(parse_pieces(stream, {}, [] { return std::size_t{1500}; }),
            (std::vector<recorded>{binary(std::string(100000, 'q')), close_event(1000, "done")}));
}

}  // namespace
}  // namespace cadeloop::http
