// WebSocket messages through a real core pair: the upgrade reaches the app
// thread flagged `info.websocket`, app_side::ws_accept writes the 101 with the
// subprotocol and extra headers, a client frame arrives as one ws_message,
// ws_send echoes it, and the client's close arrives as ws_close (code and
// reason) before the disconnect. A raw TCP client writes the frames by hand.

#include "fake_app.hpp"
#include "pair_fixture.hpp"
#include "test_client.hpp"

#include <cadeloop/runtime/core_pair.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using cadeloop::net::byte_buffer;
using cadeloop::runtime::inbound_kind;
using cadeloop::runtime::inbound_message;
using cadeloop::test::eventually;
using cadeloop::test::fake_app;

/// A masked client frame (RFC 6455 section 5.2) with a payload under 126 bytes.
std::string client_frame(std::uint8_t opcode, const std::string& payload) {
  const char mask[4] = {0x11, 0x22, 0x33, 0x44};
  std::string f;
  f.push_back(static_cast<char>(0x80 | opcode));
  f.push_back(static_cast<char>(0x80 | payload.size()));
  f.append(mask, 4);
  for (std::size_t i = 0; i < payload.size(); ++i) {
    f.push_back(static_cast<char>(payload[i] ^ mask[i % 4]));
  }
  return f;
}

struct ws_log {
  std::mutex m;
  std::vector<std::string>
      events;  // "request ws", "message text hello", "close 4001 bye", "disconnect"

  void add(std::string e) {
    std::lock_guard lock{m};
    events.push_back(std::move(e));
  }
  std::vector<std::string> copy() {
    std::lock_guard lock{m};
    return events;
  }
};

class ws_pair_test : public cadeloop::test::pair_fixture {};

TEST_F(ws_pair_test, upgrade_message_echo_and_close_cross_the_rings) {
  ws_log log;
  start([&log](fake_app& fa, inbound_message& m) {
    auto& side = fa.side();
    switch (m.kind) {
      case inbound_kind::request:
        log.add(m.info.websocket ? "request ws" : "request http");
        side.ws_accept(m.conn, m.request, "chat", "x-test: 1\r\n");
        return true;
      case inbound_kind::ws_message: {
        log.add(std::string{"message "}
                    .append(m.text ? "text " : "binary ")
                    .append(m.body.data(), m.body.size()));
        side.ws_consumed(m.conn);
        side.ws_send(m.conn, byte_buffer::copy_of({m.body.data(), m.body.size()}), m.text, false);
        return true;
      }
      case inbound_kind::ws_close:
        log.add(std::string{"close "}
                    .append(std::to_string(m.code))
                    .append(" ")
                    .append(m.body.data(), m.body.size()));
        return true;
      case inbound_kind::disconnect:
        log.add("disconnect");
        return true;
      default:
        return true;
    }
  });
  auto c = client();
  ASSERT_TRUE(
      c.send("GET /chat HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
             "Sec-WebSocket-Protocol: superchat, chat\r\n\r\n"));
  const auto r = c.read_response();
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.status, 101);
  EXPECT_EQ(r.header("sec-websocket-accept"), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
  EXPECT_EQ(r.header("sec-websocket-protocol"), "chat");
  EXPECT_EQ(r.header("x-test"), "1");

  ASSERT_TRUE(c.send(client_frame(0x1, "hello")));
  const std::string echo = std::string{"\x81\x05", 2} + "hello";
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (c.buffered().size() < echo.size() && c.fill(deadline)) {
  }
  ASSERT_GE(c.buffered().size(), echo.size());
  EXPECT_EQ(c.buffered().substr(0, echo.size()), echo);
  c.buffered().erase(0, echo.size());

  ASSERT_TRUE(c.send(client_frame(0x8, std::string{"\x0f\xa1", 2} + "bye")));
  const std::string close_echo{"\x88\x02\x0f\xa1", 4};
  while (c.buffered().size() < close_echo.size() && c.fill(deadline)) {
  }
  EXPECT_EQ(c.buffered().substr(0, close_echo.size()), close_echo);

  ASSERT_TRUE(eventually([&log] {
    const auto e = log.copy();
    return !e.empty() && e.back() == "disconnect";
  }));
  const std::vector<std::string> want{"request ws", "message text hello", "close 4001 bye",
                                      "disconnect"};
  EXPECT_EQ(log.copy(), want);
}

}  // namespace
