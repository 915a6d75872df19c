// permessage-deflate through http_server on loopback: what the 101 answers
// to each offer, compressed messages from a zlib client decompressed for the
// app, the app's messages compressed (RSV1) and readable by plain zlib, the
// RSV1 rules, a decompression bomb closed with 1009, and the setting off.

#include "../http/zlib_reference.hpp"
#include "ws_test_client.hpp"

#include <string>

namespace {

using namespace ws_test;
using cadeloop::http::ws_event_kind;

std::string ext(const std::string& offer) {
  return "Sec-WebSocket-Extensions: " + offer + "\r\n";
}

std::string text_of(std::size_t n) {
  std::string s;
  while (s.size() < n) {
    s += "{\"price\":" + std::to_string(s.size() % 1013) + ",\"symbol\":\"CADE\"} ";
  }
  s.resize(n);
  return s;
}

TEST_F(ws_server_test, DeflateIsNegotiatedIn101) {
  start();
  ws_client a{port};
  open_ws(a, ext("permessage-deflate; client_max_window_bits"));
  EXPECT_NE(a.head.find("Sec-WebSocket-Extensions: permessage-deflate; "
                        "server_no_context_takeover; client_max_window_bits=12\r\n"),
            std::string::npos)
      << a.head;
  ws_client b{port};
  open_ws(b, ext("permessage-deflate; server_max_window_bits=8, permessage-deflate; "
                 "client_no_context_takeover; server_max_window_bits=11"));
  EXPECT_NE(b.head.find("Sec-WebSocket-Extensions: permessage-deflate; "
                        "server_no_context_takeover; client_no_context_takeover; "
                        "server_max_window_bits=11\r\n"),
            std::string::npos)
      << b.head;
  ws_client none{port};
  open_ws(none, ext("permessage-deflate; server_max_window_bits=8"));
  EXPECT_EQ(none.head.find("Sec-WebSocket-Extensions"), std::string::npos) << none.head;
}

TEST_F(ws_server_test, DeflateOffIgnoresOffersAndRsv1IsThenAnError) {
  opt.ws.per_message_deflate = false;
  start();
  ws_client c{port};
  open_ws(c, ext("permessage-deflate"));
  EXPECT_EQ(c.head.find("Sec-WebSocket-Extensions"), std::string::npos) << c.head;
  ASSERT_TRUE(c.send(ws_client::frame(0x1, zlib_reference::compress("hello"), true, 0x40)));
  ASSERT_TRUE(until_closed(c));
  EXPECT_EQ(close_code_seen(c), 1002);
}

TEST_F(ws_server_test, CompressedEchoRoundTrip) {
  echo = true;
  start();
  ws_client c{port};
  open_ws(c, ext("permessage-deflate; client_no_context_takeover"));
  const std::string big = text_of(20000);
  const std::string small = "hi";
  ASSERT_TRUE(c.send(ws_client::frame(0x1, zlib_reference::compress(big), true, 0x40) +
                     ws_client::frame(0x1, small) +
                     ws_client::frame(0x2, zlib_reference::compress(small), true, 0x40)));
  ASSERT_TRUE(frames_until(c, 3));
  ASSERT_EQ(sink.messages.size(), 3u);
  EXPECT_EQ(sink.messages[0].data, big);
  EXPECT_TRUE(sink.messages[0].text);
  EXPECT_EQ(sink.messages[1].data, small);
  EXPECT_EQ(sink.messages[2].data, small);
  // The big echo comes back compressed, readable by plain zlib; tiny ones plain.
  EXPECT_TRUE(c.frames[0].compressed);
  EXPECT_LT(c.frames[0].payload.size(), big.size() / 4);
  bool ok = false;
  EXPECT_EQ(zlib_reference::decompress(c.frames[0].payload, ok), big);
  EXPECT_TRUE(ok);
  EXPECT_FALSE(c.frames[1].compressed);
  EXPECT_EQ(c.frames[1].payload, small);
  EXPECT_EQ(counters.ws_bytes_in.get(), big.size() + 2 * small.size());
}

TEST_F(ws_server_test, ClientContextTakeoverAcrossMessagesAndFragments) {
  start();
  ws_client c{port};
  open_ws(c, ext("permessage-deflate"));
  z_stream client{};
  deflateInit2(&client, 6, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY);
  const std::string msg = text_of(5000);
  const std::string first = zlib_reference::compress(msg, &client);
  const std::string second = zlib_reference::compress(msg, &client);
  deflateEnd(&client);
  // The second message in two fragments: RSV1 on the first only.
  ASSERT_TRUE(c.send(ws_client::frame(0x1, first, true, 0x40) +
                     ws_client::frame(0x1, second.substr(0, 3), false, 0x40) +
                     ws_client::frame(0x0, second.substr(3))));
  ASSERT_TRUE(pump_until([&] { return sink.messages.size() == 2; }));
  EXPECT_EQ(sink.messages[0].data, msg);
  EXPECT_EQ(sink.messages[1].data, msg);
}

TEST_F(ws_server_test, DeflateViolationsCloseWithTheirCode) {
  opt.ws.max_message = 1U << 20;
  struct deflate_case {
    const char* name;
    std::string bytes;
    std::uint16_t code;
  };
  const std::string zeros(16U << 20, '\0');
  const std::vector<deflate_case> cases = {
      {"decompression bomb", ws_client::frame(0x2, zlib_reference::compress(zeros), true, 0x40),
       1009},
      {"RSV1 on a continuation",
       ws_client::frame(0x1, "a", false) + ws_client::frame(0x0, "b", true, 0x40), 1002},
      {"RSV1 on a ping", ws_client::frame(0x9, "p", true, 0x40), 1002},
      {"not deflate data", ws_client::frame(0x2, "\xff\xff\xff\xff", true, 0x40), 1007},
      {"compressed text not UTF-8",
       ws_client::frame(0x1, zlib_reference::compress("\xc3\x28"), true, 0x40), 1007},
  };
  start();
  for (const deflate_case& t : cases) {
    SCOPED_TRACE(t.name);
    sink.closes.clear();
    ws_client c{port};
    open_ws(c, ext("permessage-deflate"));
    ASSERT_TRUE(c.send(t.bytes));
    ASSERT_TRUE(until_closed(c));
    EXPECT_EQ(close_code_seen(c), t.code);
    ASSERT_TRUE(pump_until([&] { return !sink.closes.empty(); }));
    EXPECT_EQ(sink.closes[0].code, t.code);
  }
  EXPECT_TRUE(sink.messages.empty());
}

}  // namespace
