// Private to tests/net/: net::http_server driven directly on the test's own
// thread (one io_context, a recording event_sink standing in for the I/O
// thread's rings, raw non-blocking TCP clients on 127.0.0.1), shared by the
// regression tests and the slow-client tests. Each test binary includes it
// from one source file, so the anonymous namespace is that binary's own.
#pragma once

#include "pump_until.hpp"

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
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using cadeloop::net::byte_buffer;
using cadeloop::net::connection_id;
using cadeloop::net::http_server;
using cadeloop::net::listen_spec;
using cadeloop::net::request_info;
using cadeloop::net::send_flags;
using cadeloop::net::server_counters;
using cadeloop::net::server_options;

// What the server told the app, in call order.
struct sink_event {
  enum class kind { request, body, disconnect, drained, peer_eof };
  kind what{};
  connection_id conn{};
  std::uint32_t request = 0;
  std::string target;
  cadeloop::net::socket_address client{};  // a request's peer and local addresses
  cadeloop::net::socket_address server{};
};

class recording_sink final : public cadeloop::net::event_sink {
 public:
  void on_request(connection_id conn, std::uint32_t request,
                  std::unique_ptr<cadeloop::http::request_head>&& head,
                  const request_info& info) override {
    events.push_back({sink_event::kind::request, conn, request, std::string{head->target()},
                      info.client, info.server});
  }
  void on_body(connection_id conn, std::uint32_t request, byte_buffer&&, bool) override {
    events.push_back({sink_event::kind::body, conn, request, {}});
  }
  void on_disconnect(connection_id conn) override {
    events.push_back({sink_event::kind::disconnect, conn, 0, {}});
  }
  void on_drained(connection_id conn, std::uint64_t) override {
    events.push_back({sink_event::kind::drained, conn, 0, {}});
  }
  void on_peer_eof(connection_id conn) override {
    events.push_back({sink_event::kind::peer_eof, conn, 0, {}});
  }

  [[nodiscard]] std::size_t count(sink_event::kind k) const {
    std::size_t n = 0;
    for (const sink_event& e : events) {
      n += e.what == k ? 1 : 0;
    }
    return n;
  }
  [[nodiscard]] std::vector<sink_event> requests() const {
    std::vector<sink_event> out;
    for (const sink_event& e : events) {
      if (e.what == sink_event::kind::request) {
        out.push_back(e);
      }
    }
    return out;
  }

  std::vector<sink_event> events;
};

// A raw TCP client; reads never block (the server runs on the same thread).
class raw_client {
 public:
  explicit raw_client(std::uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    // Completes from the listen backlog; the server accepts at the next pump.
    connected_ = ::connect(fd_, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0;
  }
  raw_client(const raw_client&) = delete;
  raw_client& operator=(const raw_client&) = delete;
  ~raw_client() {
    if (fd_ >= 0) {
      ::close(fd_);
    }
  }

  [[nodiscard]] bool connected() const noexcept { return connected_; }
  [[nodiscard]] int fd() const noexcept { return fd_; }
  // One send() for all of `bytes`, so the server reads them in one go.
  [[nodiscard]] bool send(const std::string& bytes) const {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  void shutdown_write() const { ::shutdown(fd_, SHUT_WR); }
  // Takes whatever has arrived.
  void poll() {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        in.append(buf, static_cast<std::size_t>(n));
        continue;
      }
      if (n == 0) {
        eof = true;
      } else if (errno == ECONNRESET) {
        reset = true;
      }
      return;
    }
  }

  std::string in;
  bool eof = false;
  bool reset = false;

 private:
  int fd_ = -1;
  bool connected_ = false;
};

std::string get_request(const std::string& target) {
  return "GET " + target + " HTTP/1.1\r\nHost: t\r\n\r\n";
}

// The response the test answers request `seq` with: its number in the body,
// so the order on the wire shows.
std::string response_for(std::uint32_t seq) {
  char body[32];
  std::snprintf(body, sizeof body, "r%u", static_cast<unsigned>(seq));
  return "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(std::string{body}.size()) +
         "\r\n\r\n" + body;
}

class direct_server_test : public ::testing::Test {
 protected:
  void start(const std::string& host = "127.0.0.1") {
    std::string error;
    auto l = cadeloop::net::open_listener(io, listen_spec::tcp(host, 0), error);
    ASSERT_NE(l, nullptr) << error;
    port = l->local_address().port;
    server = std::make_unique<http_server>(io, sink, opt, counters);
    server->add_listener(std::move(l));
  }

  void TearDown() override {
    server.reset();  // before io, as http_server requires
  }

  // One turn of the I/O thread: ready handlers, then the write pass.
  void pump() {
    io.restart();
    io.poll();
    server->flush_writes();
  }

  // Pumps until `pred` holds; false after `timeout`.
  bool pump_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 3s) {
    return cadeloop::test::pump_until([this] { pump(); }, pred, timeout, 1ms);
  }

  // The app finishes request `seq` of `conn` with one whole response.
  bool answer(connection_id conn, std::uint32_t seq, bool keep_alive = true) {
    send_flags f;
    f.end_of_response = true;
    f.keep_alive = keep_alive;
    return server->send(conn, seq, byte_buffer::copy_of(response_for(seq)), f);
  }

  boost::asio::io_context io;
  recording_sink sink;
  server_counters counters;
  server_options opt;
  std::unique_ptr<http_server> server;
  std::uint16_t port = 0;
};

}  // namespace
