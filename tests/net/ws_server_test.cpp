// WebSockets in net::http_server, end to end on loopback with raw frames,
// organised like Autobahn's case categories: opening handshake, framing,
// pings and pongs, reserved bits and opcodes, fragmentation, UTF-8, close
// handling, limits and flow control, timers, drain. (Compression is in
// ws_deflate_server_test.cpp.)

#include "ws_test_client.hpp"

#include <cadeloop/http/websocket.hpp>

#include <string>

namespace {

using namespace ws_test;
using cadeloop::http::ws_event_kind;

// ---------------------------------------------------------------- handshake

TEST_F(ws_server_test, GoodHandshakeReachesTheAppAndAcceptWrites101) {
  start();
  ws_client c{port};
  const connection_id conn =
      open_ws(c, "Sec-WebSocket-Protocol: chat, superchat\r\n", "chat", "X-Extra: yes\r\n");
  ASSERT_EQ(sink.requests.size(), 1u);
  EXPECT_EQ(sink.requests[0].target, "/chat?x=1");
  // RFC 6455 4.2.2's example key and accept value.
  EXPECT_NE(c.head.find("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"),
            std::string::npos)
      << c.head;
  EXPECT_NE(c.head.find("Sec-WebSocket-Protocol: chat\r\n"), std::string::npos);
  EXPECT_NE(c.head.find("X-Extra: yes\r\n"), std::string::npos);
  EXPECT_NE(c.head.find("Upgrade: websocket\r\n"), std::string::npos);
  EXPECT_EQ(counters.ws_open.get(), 1u);
  EXPECT_EQ(counters.ws_upgrades_accepted.get(), 1u);
  EXPECT_EQ(counters.requests_in_flight.get(), 0u);
  ASSERT_TRUE(server->ws_send(conn, byte_buffer::copy_of("hello"), true, false));
  ASSERT_TRUE(frames_until(c, 1));
  EXPECT_EQ(c.frames[0].kind, ws_event_kind::text);
  EXPECT_EQ(c.frames[0].payload, "hello");
}

TEST_F(ws_server_test, FramesSentWithTheHeadAreKeptUntilAccept) {
  start();
  ws_client c{port};
  ASSERT_TRUE(c.send(ws_client::handshake() + ws_client::frame(0x1, "early")));
  ASSERT_TRUE(pump_until([&] { return sink.requests.size() == 1; }));
  for (int i = 0; i < 10; ++i) {
    pump();
  }
  EXPECT_TRUE(sink.messages.empty()) << "a message before the accept";
  ASSERT_TRUE(server->ws_accept(sink.requests[0].conn, 0, {}, {}));
  ASSERT_TRUE(pump_until([&] { return sink.messages.size() == 1; }));
  EXPECT_EQ(sink.messages[0].data, "early");
}

struct bad_handshake {
  const char* name;
  std::string request;
  const char* status;
};

TEST_F(ws_server_test, BadHandshakesAreRefusedAndNeverReachTheApp) {
  const std::string key = "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
  const std::vector<bad_handshake> cases = {
      {"version 8", ws_client::handshake({}, "8"), "HTTP/1.1 426 "},
      {"no version",
       "GET / HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" + key + "\r\n",
       "HTTP/1.1 426 "},
      {"key of 8 bytes", ws_client::handshake({}, "13", "AAAAAAAAAAA="), "HTTP/1.1 400 "},
      {"no key",
       "GET / HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
       "Sec-WebSocket-Version: 13\r\n\r\n",
       "HTTP/1.1 400 "},
      {"two keys", ws_client::handshake(key), "HTTP/1.1 400 "},
      {"bad subprotocol list", ws_client::handshake("Sec-WebSocket-Protocol: a b\r\n"),
       "HTTP/1.1 400 "},
  };
  start();
  for (const bad_handshake& t : cases) {
    SCOPED_TRACE(t.name);
    ws_client c{port};
    ASSERT_TRUE(c.send(t.request));
    ASSERT_TRUE(until_closed(c)) << c.raw;
    EXPECT_TRUE(c.raw.starts_with(t.status)) << c.raw;
    if (std::string{t.status} == "HTTP/1.1 426 ") {
      EXPECT_NE(c.raw.find("Sec-WebSocket-Version: 13\r\n"), std::string::npos) << c.raw;
    }
  }
  EXPECT_TRUE(sink.requests.empty()) << "a refused handshake reached the app";
  EXPECT_TRUE(sink.disconnects.empty());
  EXPECT_EQ(counters.ws_upgrades_rejected.get(), cases.size());
}

TEST_F(ws_server_test, WithWebSocketsOffTheUpgradeIsAnOrdinaryRequest) {
  opt.ws.enabled = false;
  start();
  ws_client c{port};
  ASSERT_TRUE(c.send(ws_client::handshake()));
  ASSERT_TRUE(pump_until([&] { return sink.requests.size() == 1; }));
  EXPECT_FALSE(sink.requests[0].websocket);
  EXPECT_FALSE(server->ws_accept(sink.requests[0].conn, 0, {}, {}));
  cadeloop::net::send_flags f;
  f.end_of_response = true;
  f.status = 404;
  ASSERT_TRUE(
      server->send(sink.requests[0].conn, 0,
                   byte_buffer::copy_of("HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"), f));
  ASSERT_TRUE(until_closed(c));
  EXPECT_TRUE(c.raw.starts_with("HTTP/1.1 404 ")) << c.raw;
}

TEST_F(ws_server_test, AppDeniesWithAnHttpResponseAndTheConnectionCloses) {
  start();
  ws_client c{port};
  ASSERT_TRUE(c.send(ws_client::handshake()));
  ASSERT_TRUE(pump_until([&] { return sink.requests.size() == 1; }));
  cadeloop::net::send_flags f;
  f.end_of_response = true;
  f.status = 403;
  ASSERT_TRUE(
      server->send(sink.requests[0].conn, 0,
                   byte_buffer::copy_of("HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n"), f));
  ASSERT_TRUE(until_closed(c));
  EXPECT_TRUE(c.raw.starts_with("HTTP/1.1 403 ")) << c.raw;
  ASSERT_TRUE(pump_until([&] { return sink.disconnects.size() == 1; }));
  c.close();
  ASSERT_TRUE(pump_until([&] { return server->connection_count() == 0; }));
  EXPECT_TRUE(sink.closes.empty());
  EXPECT_EQ(counters.ws_upgrades_not_accepted.get(), 1u);
  EXPECT_EQ(counters.ws_open.get(), 0u);
}

TEST_F(ws_server_test, AcceptWithAHeaderTheHandshakeOwnsIsRefusedWith500) {
  start();
  ws_client c{port};
  ASSERT_TRUE(c.send(ws_client::handshake()));
  ASSERT_TRUE(pump_until([&] { return sink.requests.size() == 1; }));
  EXPECT_FALSE(server->ws_accept(sink.requests[0].conn, 0, {}, "Sec-WebSocket-Accept: x\r\n"));
  ASSERT_TRUE(until_closed(c));
  EXPECT_TRUE(c.raw.starts_with("HTTP/1.1 500 ")) << c.raw;
}

// ---------------------------------------------------------------- framing

TEST_F(ws_server_test, TextAndBinaryOfEveryLengthEncodingEchoBack) {
  echo = true;
  start();
  ws_client c{port};
  open_ws(c);
  const std::vector<std::size_t> sizes = {0, 1, 125, 126, 300, 65535, 65536, 70000};
  std::string all;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    std::string p(sizes[i], static_cast<char>('a' + i));
    all += ws_client::frame(i % 2 == 0 ? 0x1 : 0x2, p);
  }
  ASSERT_TRUE(c.send(all));
  ASSERT_TRUE(frames_until(c, sizes.size()));
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(c.frames[i].kind, i % 2 == 0 ? ws_event_kind::text : ws_event_kind::binary);
    EXPECT_EQ(c.frames[i].payload, std::string(sizes[i], static_cast<char>('a' + i)));
  }
  EXPECT_EQ(counters.ws_messages_in.get(), sizes.size());
  EXPECT_EQ(counters.ws_messages_out.get(), sizes.size());
}

// Each of these breaks RFC 6455 and must get a close frame with `code`,
// then the TCP close, and the app must hear `code`.
struct violation {
  const char* name;
  std::string bytes;
  std::uint16_t code;
};

TEST_F(ws_server_test, ProtocolViolationsCloseWithTheirCode) {
  const std::string invalid_utf8 = "\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80";
  const std::vector<violation> cases = {
      {"unmasked client frame", ws_client::frame(0x1, "hi", true, 0, false), 1002},
      {"ping of 126 bytes", ws_client::frame(0x9, std::string(126, 'p')), 1002},
      {"fragmented ping", ws_client::frame(0x9, "p", false), 1002},
      {"RSV1 without an extension", ws_client::frame(0x1, "hi", true, 0x40), 1002},
      {"RSV2", ws_client::frame(0x1, "hi", true, 0x20), 1002},
      {"RSV3", ws_client::frame(0x2, "hi", true, 0x10), 1002},
      {"reserved data opcode 3", ws_client::frame(0x3, "x"), 1002},
      {"reserved control opcode 0xB", ws_client::frame(0xB, "x"), 1002},
      {"continuation without a start", ws_client::frame(0x0, "x"), 1002},
      {"new message inside a fragmented one",
       ws_client::frame(0x1, "a", false) + ws_client::frame(0x1, "b"), 1002},
      {"invalid UTF-8 in one frame", ws_client::frame(0x1, invalid_utf8), 1007},
      {"invalid UTF-8 across fragments",
       ws_client::frame(0x1, invalid_utf8.substr(0, 5), false) +
           ws_client::frame(0x0, invalid_utf8.substr(5)),
       1007},
      {"text ending inside a character", ws_client::frame(0x1, "\xce"), 1007},
      {"close code 999", ws_client::close_frame(999), 1002},
      {"close code 1005 on the wire", ws_client::close_frame(1005), 1002},
      {"close code 1006 on the wire", ws_client::close_frame(1006), 1002},
      {"close with a 1-byte payload", ws_client::frame(0x8, "x"), 1002},
      {"close reason not UTF-8", ws_client::close_frame(1000, "\xff"), 1007},
  };
  start();
  for (const violation& t : cases) {
    SCOPED_TRACE(t.name);
    sink.closes.clear();
    ws_client c{port};
    const connection_id conn = open_ws(c);
    ASSERT_TRUE(c.send(t.bytes));
    ASSERT_TRUE(until_closed(c));
    EXPECT_EQ(close_code_seen(c), t.code);
    ASSERT_TRUE(pump_until([&] { return !sink.closes.empty(); }));
    EXPECT_EQ(sink.closes[0].conn, conn);
    EXPECT_EQ(sink.closes[0].code, t.code);
    EXPECT_TRUE(sink.messages.empty());
  }
  EXPECT_EQ(counters.ws_closes_by_class[1].get(), cases.size());
  EXPECT_EQ(counters.ws_open.get(), 0u);
}

// ---------------------------------------------------------------- pings

TEST_F(ws_server_test, PingIsAnsweredWithItsPayloadWithoutTheApp) {
  start();
  ws_client c{port};
  open_ws(c);
  ASSERT_TRUE(c.send(ws_client::frame(0x9, std::string(125, 'x')) + ws_client::frame(0x9, "")));
  ASSERT_TRUE(frames_until(c, 2));
  EXPECT_EQ(c.frames[0].kind, ws_event_kind::pong);
  EXPECT_EQ(c.frames[0].payload, std::string(125, 'x'));
  EXPECT_EQ(c.frames[1].kind, ws_event_kind::pong);
  EXPECT_EQ(c.frames[1].payload, "");
  EXPECT_TRUE(sink.messages.empty());
}

TEST_F(ws_server_test, FragmentsWithAnInterleavedPingAssembleIntoOneMessage) {
  start();
  ws_client c{port};
  open_ws(c);
  // "κόσμε" split inside characters, with a ping between the fragments.
  const std::string text = "\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5";
  ASSERT_TRUE(c.send(
      ws_client::frame(0x1, text.substr(0, 3), false) + ws_client::frame(0x9, "mid") +
      ws_client::frame(0x0, text.substr(3, 4), false) + ws_client::frame(0x0, text.substr(7))));
  ASSERT_TRUE(pump_until([&] { return sink.messages.size() == 1; }));
  EXPECT_EQ(sink.messages[0].data, text);
  EXPECT_TRUE(sink.messages[0].text);
  ASSERT_TRUE(frames_until(c, 1));
  EXPECT_EQ(c.frames[0].kind, ws_event_kind::pong);
  EXPECT_EQ(c.frames[0].payload, "mid");
}

TEST_F(ws_server_test, ServerPingsAnIdleClientAndDropsOneThatNeverAnswers) {
  opt.ws.ping_interval = 50ms;
  opt.ws.ping_timeout = 100ms;
  start();
  ws_client c{port};
  const connection_id conn = open_ws(c);
  ASSERT_TRUE(frames_until(c, 1));
  EXPECT_EQ(c.frames[0].kind, ws_event_kind::ping);
  // Answering keeps it open through more intervals.
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(c.send(ws_client::frame(0xA, c.frames.back().payload)));
    ASSERT_TRUE(frames_until(c, static_cast<std::size_t>(i) + 2));
    EXPECT_EQ(c.frames.back().kind, ws_event_kind::ping);
  }
  EXPECT_TRUE(sink.closes.empty());
  // Silence after a ping: dropped, 1006 to the app.
  ASSERT_TRUE(until_closed(c));
  ASSERT_TRUE(pump_until([&] { return sink.closes.size() == 1; }));
  EXPECT_EQ(sink.closes[0].conn, conn);
  EXPECT_EQ(sink.closes[0].code, 1006);
  EXPECT_EQ(counters.ws_closes_by_class[2].get(), 1u);
}

// ---------------------------------------------------------------- close

TEST_F(ws_server_test, ClientCloseIsEchoedAndReportedWithItsReason) {
  start();
  ws_client c{port};
  const connection_id conn = open_ws(c);
  ASSERT_TRUE(c.send(ws_client::close_frame(4001, "bye now")));
  ASSERT_TRUE(until_closed(c));
  EXPECT_EQ(close_code_seen(c), 4001);
  ASSERT_TRUE(pump_until([&] { return sink.disconnects.size() == 1; }));
  ASSERT_EQ(sink.closes.size(), 1u);
  EXPECT_EQ(sink.closes[0].conn, conn);
  EXPECT_EQ(sink.closes[0].code, 4001);
  EXPECT_EQ(sink.closes[0].reason, "bye now");
  EXPECT_FALSE(server->ws_send(conn, byte_buffer::copy_of("late"), true, false));
}

TEST_F(ws_server_test, EmptyCloseIsReportedAs1005AndAnsweredEmpty) {
  start();
  ws_client c{port};
  open_ws(c);
  ASSERT_TRUE(c.send(ws_client::frame(0x8, "")));
  ASSERT_TRUE(until_closed(c));
  ASSERT_FALSE(c.frames.empty());
  EXPECT_EQ(c.frames.back().kind, ws_event_kind::close);
  EXPECT_EQ(c.frames.back().code, 1005) << "the echo must be an empty close";
  ASSERT_TRUE(pump_until([&] { return sink.closes.size() == 1; }));
  EXPECT_EQ(sink.closes[0].code, 1005);
}

TEST_F(ws_server_test, DroppedConnectionIsReportedAs1006ThenDisconnect) {
  start();
  ws_client c{port};
  const connection_id conn = open_ws(c);
  c.close();
  ASSERT_TRUE(pump_until([&] { return sink.disconnects.size() == 1; }));
  ASSERT_EQ(sink.closes.size(), 1u);
  EXPECT_EQ(sink.closes[0].code, 1006);
  EXPECT_TRUE(sink.disconnects[0] == conn);
  EXPECT_EQ(counters.ws_open.get(), 0u);
  EXPECT_EQ(server->connection_count(), 0u);
}

TEST_F(ws_server_test, AppCloseWaitsForTheClientsClose) {
  start();
  ws_client c{port};
  const connection_id conn = open_ws(c);
  ASSERT_TRUE(server->ws_close(conn, 4002, "done"));
  ASSERT_TRUE(frames_until(c, 1));
  EXPECT_EQ(c.frames[0].kind, ws_event_kind::close);
  EXPECT_EQ(c.frames[0].code, 4002);
  EXPECT_EQ(c.frames[0].payload, "done");
  for (int i = 0; i < 20; ++i) {
    pump();
  }
  c.poll();
  EXPECT_FALSE(c.eof) << "closed before the client answered";
  EXPECT_TRUE(sink.closes.empty());
  EXPECT_FALSE(server->ws_send(conn, byte_buffer::copy_of("x"), true, false))
      << "nothing may follow a close frame";
  ASSERT_TRUE(c.send(ws_client::close_frame(4002)));
  ASSERT_TRUE(until_closed(c));
  ASSERT_TRUE(pump_until([&] { return sink.closes.size() == 1; }));
  EXPECT_EQ(sink.closes[0].code, 4002);
}

TEST_F(ws_server_test, AppCloseGivesUpAfterTheCloseTimeout) {
  opt.ws.close_timeout = 100ms;
  start();
  ws_client c{port};
  const connection_id conn = open_ws(c);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(server->ws_close(conn, 1000, {}));
  ASSERT_TRUE(until_closed(c));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 90ms);
  ASSERT_TRUE(pump_until([&] { return sink.closes.size() == 1; }));
  EXPECT_EQ(sink.closes[0].code, 1000);
}

// ---------------------------------------------------------------- limits

TEST_F(ws_server_test, MessageOverTheLimitCloses1009) {
  opt.ws.max_message = 1000;
  start();
  ws_client c{port};
  open_ws(c);
  // Fragments: each fits, the sum does not.
  ASSERT_TRUE(c.send(ws_client::frame(0x2, std::string(600, 'a'), false) +
                     ws_client::frame(0x0, std::string(600, 'b'))));
  ASSERT_TRUE(until_closed(c));
  EXPECT_EQ(close_code_seen(c), 1009);
  ASSERT_TRUE(pump_until([&] { return sink.closes.size() == 1; }));
  EXPECT_EQ(sink.closes[0].code, 1009);
  EXPECT_TRUE(sink.messages.empty());
}

TEST_F(ws_server_test, ReadingStopsAtMaxQueueUntilTheAppConsumes) {
  opt.ws.max_queue = 2;
  start();
  ws_client c{port};
  const connection_id conn = open_ws(c);
  std::string many;
  for (int i = 0; i < 5; ++i) {
    many += ws_client::frame(0x1, "m" + std::to_string(i));
  }
  ASSERT_TRUE(c.send(many));
  ASSERT_TRUE(pump_until([&] { return sink.messages.size() == 2; }));
  for (int i = 0; i < 20; ++i) {
    pump();
  }
  EXPECT_EQ(sink.messages.size(), 2u) << "read past max_queue";
  ASSERT_TRUE(server->ws_consumed(conn));
  ASSERT_TRUE(pump_until([&] { return sink.messages.size() == 3; }));
  for (int i = 0; i < 20; ++i) {
    pump();
  }
  EXPECT_EQ(sink.messages.size(), 3u);
  ASSERT_TRUE(server->ws_consumed(conn));
  ASSERT_TRUE(server->ws_consumed(conn));
  ASSERT_TRUE(server->ws_consumed(conn));
  ASSERT_TRUE(pump_until([&] { return sink.messages.size() == 5; }));
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(sink.messages[static_cast<std::size_t>(i)].data, "m" + std::to_string(i));
  }
}

TEST_F(ws_server_test, FastSenderIsToldWhenTheSlowClientDrained) {
  opt.drain_low_mark = 64 * 1024;
  start();
  ws_client c{port, 16 * 1024};
  const connection_id conn = open_ws(c);
  const std::string big(1024 * 1024, 'z');
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(server->ws_send(conn, byte_buffer::copy_of(big), false, i == 7));
  }
  for (int i = 0; i < 20; ++i) {
    pump();
  }
  EXPECT_EQ(sink.drained, 0) << "drained while megabytes are unsent";
  EXPECT_GT(counters.unsent_bytes.get(), 64u * 1024u);
  ASSERT_TRUE(pump_until(
      [&] {
        c.poll();
        return sink.drained == 1;
      },
      20s));
  ASSERT_TRUE(pump_until(
      [&] {
        c.poll();
        return c.frames.size() == 8;
      },
      20s))
      << c.frames.size() << " frames, " << c.raw.size() << " bytes, unsent "
      << counters.unsent_bytes.get()
      << (c.frames.empty() ? std::string{} : c.frames.back().payload);
  EXPECT_EQ(c.frames[7].payload.size(), big.size());
}

// ---------------------------------------------------------------- drain

TEST_F(ws_server_test, DrainClosesOpenWebSocketsWith1012) {
  start();
  ws_client a{port};
  ws_client b{port};
  open_ws(a);
  open_ws(b);
  server->begin_drain();
  ASSERT_TRUE(frames_until(a, 1));
  ASSERT_TRUE(frames_until(b, 1));
  EXPECT_EQ(close_code_seen(a), 1012);
  EXPECT_EQ(close_code_seen(b), 1012);
  ASSERT_TRUE(a.send(ws_client::close_frame(1012)));
  ASSERT_TRUE(b.send(ws_client::close_frame(1012)));
  ASSERT_TRUE(until_closed(a));
  ASSERT_TRUE(until_closed(b));
  ASSERT_TRUE(pump_until([&] { return sink.disconnects.size() == 2; }));
  ASSERT_EQ(sink.closes.size(), 2u);
  EXPECT_EQ(sink.closes[0].code, 1012);
  EXPECT_EQ(counters.ws_open.get(), 0u);
}

TEST_F(ws_server_test, AbortAllReports1006) {
  start();
  ws_client a{port};
  open_ws(a);
  server->abort_all();
  ASSERT_EQ(sink.closes.size(), 1u);
  EXPECT_EQ(sink.closes[0].code, 1006);
  EXPECT_EQ(sink.disconnects.size(), 1u);
}

}  // namespace

// ---------------------------------------------------------------- access log

namespace {

TEST_F(ws_server_test, AccessLogWritesTheUpgradeAndTheClose) {
  char path[] = "/tmp/ws_access_logXXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  opt.access_log.enabled = true;
  opt.access_log.file = path;
  opt.access_log.format = "{method} {target} {status} {bytes}";
  start();
  {
    ws_client c{port};
    const connection_id conn = open_ws(c);
    ASSERT_TRUE(server->ws_send(conn, byte_buffer::copy_of("12345"), true, false));
    ASSERT_TRUE(c.send(ws_client::close_frame(1001)));
    ASSERT_TRUE(until_closed(c));
    ASSERT_TRUE(pump_until([&] { return sink.closes.size() == 1; }));
  }
  server.reset();  // flushes its batch
  ASSERT_TRUE(cadeloop::net::flush_access_logs(5s));
  std::string text;
  if (FILE* f = std::fopen(path, "r")) {
    char buf[4096];
    const std::size_t n = std::fread(buf, 1, sizeof buf, f);
    text.assign(buf, n);
    std::fclose(f);
  }
  ::unlink(path);
  EXPECT_NE(text.find("GET /chat?x=1 101 "), std::string::npos) << text;
  EXPECT_NE(text.find("GET /chat?x=1 1001 5\n"), std::string::npos) << text;
}

}  // namespace
