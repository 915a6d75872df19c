// A WebSocket test rig for net::http_server driven on the test's thread: a
// sink that records what the app would see (requests, messages, closes,
// disconnects), a raw non-blocking TCP client that sends hand-made frames
// (masked or not, any bits) and parses the server's frames with the codec's
// client-role parser, and a fixture that pumps the io_context as the I/O
// thread does.
#pragma once

#include "pump_until.hpp"

#include <cadeloop/http/websocket.hpp>
#include <cadeloop/net/http_server.hpp>
#include <cadeloop/net/listener.hpp>

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ws_test {

using namespace std::chrono_literals;
using cadeloop::net::byte_buffer;
using cadeloop::net::connection_id;

struct ws_request {
  connection_id conn{};
  std::uint32_t seq = 0;
  bool websocket = false;
  std::string target;
};
struct ws_message {
  connection_id conn{};
  std::string data;
  bool text = false;
};
struct ws_closed {
  connection_id conn{};
  std::uint16_t code = 0;
  std::string reason;
};

class ws_sink final : public cadeloop::net::event_sink {
 public:
  void on_request(connection_id conn, std::uint32_t request,
                  std::unique_ptr<cadeloop::http::request_head>&& head,
                  const cadeloop::net::request_info& info) override {
    requests.push_back({conn, request, info.websocket, std::string{head->target()}});
  }
  void on_body(connection_id, std::uint32_t, byte_buffer&&, bool) override {}
  void on_disconnect(connection_id conn) override {
    // Nothing may name a connection after its disconnect.
    disconnects.push_back(conn);
  }
  void on_drained(connection_id, std::uint64_t) override { ++drained; }
  void on_ws_message(connection_id conn, byte_buffer&& payload, bool text) override {
    EXPECT_TRUE(closes.empty() || closes.back().conn != conn) << "a message after the close";
    messages.push_back({conn, std::string{payload.view()}, text});
  }
  void on_ws_close(connection_id conn, std::uint16_t code, std::string&& reason) override {
    for (const ws_closed& c : closes) {
      EXPECT_FALSE(c.conn == conn) << "on_ws_close twice";
    }
    for (const connection_id& d : disconnects) {
      EXPECT_FALSE(d == conn) << "on_ws_close after on_disconnect";
    }
    closes.push_back({conn, code, std::move(reason)});
  }

  std::vector<ws_request> requests;
  std::vector<ws_message> messages;
  std::vector<ws_closed> closes;
  std::vector<connection_id> disconnects;
  int drained = 0;
};

// One frame as the client saw it.
struct frame_seen {
  cadeloop::http::ws_event_kind kind{};
  std::uint16_t code = 0;
  std::string payload;
  bool compressed = false;
};

class ws_client {
 public:
  // `receive_buffer` (0: the default) is set before connecting, so the TCP
  // window stays that small and a fast server has to wait for the reader.
  explicit ws_client(std::uint16_t port, int receive_buffer = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (receive_buffer != 0) {
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0;
  }
  ws_client(const ws_client&) = delete;
  ws_client& operator=(const ws_client&) = delete;
  ~ws_client() { close(); }

  void close() {
    if (fd_ >= 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  [[nodiscard]] bool connected() const noexcept { return connected_; }
  bool send(const std::string& bytes) const {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }

  static std::string handshake(const std::string& extra = {}, const std::string& version = "13",
                               const std::string& key = "dGhlIHNhbXBsZSBub25jZQ==") {
    return "GET /chat?x=1 HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: " +
           key + "\r\nSec-WebSocket-Version: " + version + "\r\n" + extra + "\r\n";
  }

  // A frame with every bit under the test's control.
  static std::string frame(std::uint8_t opcode, const std::string& payload, bool fin = true,
                           std::uint8_t rsv = 0, bool masked = true) {
    std::string out;
    const cadeloop::http::ws_mask_key key{0x11, 0x22, 0x33, 0x44};
    cadeloop::http::encode_ws_frame(out, static_cast<cadeloop::http::ws_opcode>(opcode), payload,
                                    fin, masked ? &key : nullptr);
    out[0] = static_cast<char>(static_cast<unsigned char>(out[0]) | rsv);
    return out;
  }
  static std::string close_frame(std::uint16_t code, const std::string& reason = {}) {
    std::string p;
    p.push_back(static_cast<char>(code >> 8));
    p.push_back(static_cast<char>(code & 0xFF));
    return frame(0x8, p + reason);
  }

  // Takes whatever has arrived; splits off the HTTP head and parses frames.
  void poll() {
    char buf[65536];
    for (;;) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        raw.append(buf, static_cast<std::size_t>(n));
        continue;
      }
      if (n == 0) {
        eof = true;
      } else if (errno == ECONNRESET) {
        reset = true;
        eof = true;
      }
      break;
    }
    if (head.empty()) {
      const std::size_t end = raw.find("\r\n\r\n");
      if (end == std::string::npos) {
        return;
      }
      head = raw.substr(0, end + 4);
      at_ = end + 4;
    }
    if (!head.starts_with("HTTP/1.1 101")) {
      return;
    }
    std::string_view rest{raw.data() + at_, raw.size() - at_};
    while (const cadeloop::http::ws_event* e = parser_.next(rest)) {
      frames.push_back({e->kind, e->code, std::string{e->payload}, e->compressed});
    }
    at_ = raw.size() - rest.size();
  }

  std::string raw;
  std::string head;
  std::vector<frame_seen> frames;
  bool eof = false;
  bool reset = false;

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::size_t at_ = 0;
  cadeloop::http::ws_parser parser_{
      {.role = cadeloop::http::ws_role::client, .max_message = 1U << 26, .allowed_rsv = 0x40}};
};

class ws_server_test : public ::testing::Test {
 protected:
  void start() {
    std::string error;
    auto l =
        cadeloop::net::open_listener(io, cadeloop::net::listen_spec::tcp("127.0.0.1", 0), error);
    ASSERT_NE(l, nullptr) << error;
    port = l->local_address().port;
    server = std::make_unique<cadeloop::net::http_server>(io, sink, opt, counters);
    server->add_listener(std::move(l));
  }
  void TearDown() override { server.reset(); }

  // One turn of the I/O thread, then the app's echo (as the app would, in
  // a later turn): every new message sent back and reported consumed.
  void pump() {
    io.restart();
    io.poll();
    server->flush_writes();
    if (echo) {
      while (echoed < sink.messages.size()) {
        const ws_message& m = sink.messages[echoed++];
        server->ws_send(m.conn, byte_buffer::copy_of(m.data), m.text, false);
        server->ws_consumed(m.conn);
      }
      server->flush_writes();
    }
  }
  bool pump_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 3s) {
    return cadeloop::test::pump_until([this] { pump(); }, pred, timeout, 1ms);
  }
  // Pumps until the client saw `n` frames (or its connection ended).
  bool frames_until(ws_client& c, std::size_t n) {
    return pump_until([&] {
      c.poll();
      return c.frames.size() >= n;
    });
  }
  bool until_closed(ws_client& c) {
    return pump_until([&] {
      c.poll();
      return c.eof;
    });
  }

  // Connects, upgrades and accepts; returns the connection (client ready).
  connection_id open_ws(ws_client& c, const std::string& extra = {}, std::string_view sub = {},
                        std::string_view headers = {}) {
    EXPECT_TRUE(c.connected());
    const std::size_t before = sink.requests.size();
    EXPECT_TRUE(c.send(ws_client::handshake(extra)));
    EXPECT_TRUE(pump_until([&] { return sink.requests.size() > before; }));
    if (sink.requests.size() <= before) {
      return {};
    }
    const ws_request r = sink.requests.back();
    EXPECT_TRUE(r.websocket);
    EXPECT_TRUE(server->ws_accept(r.conn, r.seq, sub, headers));
    EXPECT_TRUE(pump_until([&] {
      c.poll();
      return !c.head.empty();
    }));
    EXPECT_TRUE(c.head.starts_with("HTTP/1.1 101 ")) << c.head;
    return r.conn;
  }

  // The code of the close frame the client got (0 when none).
  static std::uint16_t close_code_seen(const ws_client& c) {
    for (const frame_seen& f : c.frames) {
      if (f.kind == cadeloop::http::ws_event_kind::close) {
        return f.code;
      }
    }
    return 0;
  }

  boost::asio::io_context io;
  ws_sink sink;
  cadeloop::net::server_counters counters;
  cadeloop::net::server_options opt;
  std::unique_ptr<cadeloop::net::http_server> server;
  std::uint16_t port = 0;
  bool echo = false;
  std::size_t echoed = 0;
};

}  // namespace ws_test
