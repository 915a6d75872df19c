// net::http_server against slow and hostile clients, driven directly on the
// test's thread (as http_server_regress_test.cpp does): a request body that
// stalls or trickles (body_timeout, body_min_rate), output a client does not
// read (write_timeout), and the pair's memory budget (cuts at a send's
// arrival, 503 for new requests).

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
};

class recording_sink final : public cadeloop::net::event_sink {
 public:
  void on_request(connection_id conn, std::uint32_t request,
                  std::unique_ptr<cadeloop::http::request_head>&& head,
                  const request_info&) override {
    events.push_back({sink_event::kind::request, conn, request, std::string{head->target()}});
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

class slow_client_test : public ::testing::Test {
 protected:
  void start() {
    std::string error;
    auto l = cadeloop::net::open_listener(io, listen_spec::tcp("127.0.0.1", 0), error);
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
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      pump();
      if (pred()) {
        return true;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        return false;
      }
      std::this_thread::sleep_for(1ms);
    }
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

// ---------------------------------------------------------------- tests

using kind = sink_event::kind;

TEST_F(slow_client_test, StalledBodyGets408AndTheAppADisconnect) {
  opt.body_timeout = 200ms;
  start();
  raw_client c{port};
  ASSERT_TRUE(c.send("POST /u HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nab"));
  ASSERT_TRUE(pump_until([&] { return sink.count(kind::body) == 1; }));
  ASSERT_TRUE(pump_until([&] {
    c.poll();
    return c.eof || c.reset;
  }));
  EXPECT_EQ(c.in.rfind("HTTP/1.1 408 ", 0), 0u) << c.in;
  EXPECT_EQ(sink.count(kind::disconnect), 1u);
  EXPECT_EQ(counters.body_timeouts.get(), 1u);
  EXPECT_EQ(counters.requests_in_flight.get(), 0u);
}

TEST_F(slow_client_test, EachBodyByteMovesTheDeadline) {
  opt.body_timeout = 300ms;
  opt.body_min_rate = 0;
  start();
  raw_client c{port};
  ASSERT_TRUE(c.send("POST /u HTTP/1.1\r\nHost: t\r\nContent-Length: 6\r\n\r\n"));
  ASSERT_TRUE(pump_until([&] { return sink.count(kind::request) == 1; }));
  for (int i = 0; i < 6; ++i) {
    const auto until = std::chrono::steady_clock::now() + 150ms;
    pump_until([&] { return std::chrono::steady_clock::now() >= until; });
    ASSERT_TRUE(c.send("x"));
  }
  ASSERT_TRUE(pump_until([&] { return sink.count(kind::body) >= 1; }));
  c.poll();
  EXPECT_FALSE(c.eof);
  EXPECT_EQ(counters.body_timeouts.get(), 0u);
  EXPECT_EQ(sink.count(kind::disconnect), 0u);
}

TEST_F(slow_client_test, ABodyBelowTheMinimumRateIsCut) {
  opt.body_timeout = 300ms;
  opt.body_min_rate = 1000;  // bytes per second; the client sends about 10
  start();
  raw_client c{port};
  ASSERT_TRUE(c.send("POST /u HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n"));
  ASSERT_TRUE(pump_until([&] { return sink.count(kind::request) == 1; }));
  bool cut = false;
  for (int i = 0; i < 20 && !cut; ++i) {
    const auto until = std::chrono::steady_clock::now() + 100ms;
    pump_until([&] { return std::chrono::steady_clock::now() >= until; });
    (void)c.send("x");
    c.poll();
    cut = c.eof || c.reset || !c.in.empty();
  }
  EXPECT_TRUE(cut) << "not cut while the client kept sending";
  ASSERT_TRUE(pump_until([&] {
    c.poll();
    return c.eof || c.reset;
  }));
  EXPECT_EQ(c.in.rfind("HTTP/1.1 408 ", 0), 0u) << c.in;
  EXPECT_EQ(counters.body_timeouts.get(), 1u);
}

// A client that reads nothing: the app's bytes stay unsent until write_timeout.
TEST_F(slow_client_test, OutputNotReadForTheWriteTimeoutClosesTheConnection) {
  opt.write_timeout = 300ms;
  start();
  raw_client c{port};
  ASSERT_TRUE(c.send(get_request("/big")));
  ASSERT_TRUE(pump_until([&] { return sink.count(kind::request) == 1; }));
  const connection_id id = sink.requests()[0].conn;
  std::string big = "HTTP/1.1 200 OK\r\nContent-Length: 67108864\r\n\r\n";
  big.append(std::size_t{16} << 20, 'x');
  ASSERT_TRUE(server->send(id, 0, byte_buffer::copy_of(big), send_flags{}));
  ASSERT_TRUE(pump_until([&] { return sink.count(kind::disconnect) == 1; }, 5s));
  EXPECT_EQ(counters.write_timeouts.get(), 1u);
  EXPECT_EQ(counters.unsent_bytes.get(), 0u);
}

// Over the memory budget as a send arrives: the connection stalled the
// longest is cut at once, without waiting for a write event.
TEST_F(slow_client_test, TheMemoryBudgetCutsTheSlowestWhenASendArrives) {
  opt.memory_budget = std::uint64_t{4} << 20;
  start();
  raw_client a{port};
  raw_client b{port};
  ASSERT_TRUE(a.send(get_request("/a")));
  ASSERT_TRUE(pump_until([&] { return sink.count(kind::request) == 1; }));
  ASSERT_TRUE(b.send(get_request("/b")));
  ASSERT_TRUE(pump_until([&] { return sink.count(kind::request) == 2; }));
  const connection_id ia = sink.requests()[0].conn;
  const connection_id ib = sink.requests()[1].conn;
  std::string head = "HTTP/1.1 200 OK\r\nContent-Length: 67108864\r\n\r\n";
  std::string chunk(std::size_t{3} << 20, 'x');
  // No pump between the sends: nothing is written, so only the arrival check can act.
  ASSERT_TRUE(server->send(ia, 0, byte_buffer::copy_of(head + chunk), send_flags{}));
  EXPECT_EQ(counters.budget_cuts.get(), 0u);
  ASSERT_TRUE(server->send(ib, 0, byte_buffer::copy_of(head + chunk), send_flags{}));
  // a has waited longer than b: a goes first, and that is enough.
  EXPECT_EQ(sink.count(kind::disconnect), 1u);
  EXPECT_EQ(sink.events.back().conn, ia);
  EXPECT_EQ(counters.budget_cuts.get(), 1u);
  EXPECT_LE(counters.unsent_bytes.get(), opt.memory_budget);
}

// Body bytes the app has not read count too: over the budget, a new request
// is answered 503 and never reaches the app.
TEST_F(slow_client_test, ANewRequestOverTheMemoryBudgetGets503) {
  opt.memory_budget = std::uint64_t{1} << 20;
  opt.body_window = std::uint64_t{8} << 20;
  start();
  raw_client a{port};
  const std::size_t n = std::size_t{2} << 20;
  ASSERT_TRUE(a.send("POST /u HTTP/1.1\r\nHost: t\r\nContent-Length: " + std::to_string(n) +
                     "\r\n\r\n" + std::string(n, 'y')));
  ASSERT_TRUE(pump_until([&] { return counters.bytes_in.get() > n; }));
  raw_client b{port};
  ASSERT_TRUE(b.send(get_request("/b")));
  ASSERT_TRUE(pump_until([&] {
    b.poll();
    return b.eof || b.reset;
  }));
  EXPECT_EQ(b.in.rfind("HTTP/1.1 503 ", 0), 0u) << b.in;
  EXPECT_EQ(sink.requests().size(), 1u);
  EXPECT_EQ(counters.budget_refusals.get(), 1u);
}

}  // namespace
