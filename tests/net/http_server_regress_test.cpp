// Regression tests for net::http_server driven directly, on the test's own
// thread: one io_context, a recording event_sink standing in for the I/O
// thread's rings, and raw non-blocking TCP clients on 127.0.0.1. The test
// plays the app: it answers through http_server::send in the order it
// chooses, and pumps the context (plus flush_writes, as the I/O thread does)
// until what the client sees settles.

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

class http_server_regress : public ::testing::Test {
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

// ---------------------------------------------------------------- half close

// A client that sends its requests and then shuts its sending side must get
// every response before the server closes: peer EOF with requests in flight
// means "answer, then close", not "drop". Two pipelined requests, answered
// newest first after the EOF was seen, so the close has to wait for both.
TEST_F(http_server_regress, HalfClosedClientGetsEveryResponseInFlightBeforeTheClose) {
  start();
  raw_client c{port};
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.send(get_request("/a") + get_request("/b")));
  c.shutdown_write();

  ASSERT_TRUE(pump_until([&] { return sink.count(sink_event::kind::peer_eof) == 1; }))
      << "the server must report the client's EOF while requests are in flight";
  const std::vector<sink_event> reqs = sink.requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].target, "/a");
  EXPECT_EQ(reqs[1].target, "/b");
  const connection_id conn = reqs[0].conn;

  // Nothing is written or closed while the app is still working.
  for (int i = 0; i < 20; ++i) {
    pump();
    std::this_thread::sleep_for(1ms);
  }
  c.poll();
  EXPECT_EQ(c.in, "");
  EXPECT_FALSE(c.eof) << "closed before the responses in flight were written";
  EXPECT_EQ(sink.count(sink_event::kind::disconnect), 0u);

  ASSERT_TRUE(answer(conn, 1));
  pump();
  c.poll();
  EXPECT_EQ(c.in, "") << "a later response must wait for the head of the line";
  EXPECT_FALSE(c.eof);
  ASSERT_TRUE(answer(conn, 0));

  ASSERT_TRUE(pump_until([&] {
    c.poll();
    return c.eof || c.reset;
  })) << "the server must close once both responses are written; got: "
      << c.in;
  EXPECT_FALSE(c.reset) << "a reset may destroy the responses before the client reads them";
  EXPECT_EQ(c.in, response_for(0) + response_for(1));

  // The app learns EOF, then (once) the disconnect, and nothing after it.
  ASSERT_TRUE(pump_until([&] { return sink.count(sink_event::kind::disconnect) == 1; }));
  ASSERT_FALSE(sink.events.empty());
  EXPECT_EQ(sink.events.back().what, sink_event::kind::disconnect);
  EXPECT_EQ(sink.events.back().conn, conn);
  EXPECT_EQ(sink.count(sink_event::kind::peer_eof), 1u);
  EXPECT_EQ(server->connection_count(), 0u);
  EXPECT_EQ(counters.requests_in_flight.get(), 0u);
  EXPECT_EQ(counters.unsent_bytes.get(), 0u);
}

// ---------------------------------------------------------------- pipelining

// Each round the client sends exactly `max_pipelined` requests in one write,
// so the parser spends its credit on the last byte of the input and pauses
// with nothing kept. The app then finishes the responses out of order (later
// ones before the head of the line). finish_hol() must write them in request
// order and, the credit being back with no bytes kept, clear the pause so
// the next round is read at all; without that the connection stalls after
// the first round (nothing is read again until the idle timeout).
TEST_F(http_server_regress, PipelinedResponsesFinishedOutOfOrderAreWrittenInOrderAndNothingStalls) {
  opt.max_pipelined = 3;
  opt.keepalive_idle = 30s;  // a stall must show as a stall, not as an idle close
  start();
  raw_client c{port};
  ASSERT_TRUE(c.connected());

  // Orders (as indexes into the round) in which the app finishes each round.
  const std::vector<std::vector<std::uint32_t>> orders = {
      {2, 1, 0},  // all later ones first: one finish_hol() writes all three
      {2, 0, 1},  // the last one first, then the head, then the middle
      {1, 2, 0},
      {0, 1, 2},  // in order
  };
  std::string expected;
  std::uint32_t base = 0;
  for (const std::vector<std::uint32_t>& order : orders) {
    SCOPED_TRACE("round starting at request " + std::to_string(base));
    std::string batch;
    for (std::uint32_t i = 0; i < 3; ++i) {
      batch += get_request("/p" + std::to_string(base + i));
    }
    ASSERT_TRUE(c.send(batch));
    ASSERT_TRUE(pump_until([&] { return sink.requests().size() == base + 3; }))
        << "stalled: the server read " << sink.requests().size() << " of " << base + 3
        << " requests after the previous round was answered";
    const std::vector<sink_event> reqs = sink.requests();
    const connection_id conn = reqs.front().conn;
    for (std::uint32_t i = 0; i < 3; ++i) {
      EXPECT_EQ(reqs[base + i].request, base + i);
      EXPECT_EQ(reqs[base + i].target, "/p" + std::to_string(base + i));
    }

    std::string written_before;
    for (std::size_t k = 0; k < order.size(); ++k) {
      ASSERT_TRUE(answer(conn, base + order[k]));
      pump();
      c.poll();
      // Whatever is on the wire so far is a prefix of the in-order answer.
      std::string want = expected;
      for (std::uint32_t i = 0; i < 3; ++i) {
        want += response_for(base + i);
      }
      ASSERT_EQ(want.compare(0, c.in.size(), c.in), 0) << "out of order on the wire: " << c.in;
    }
    for (std::uint32_t i = 0; i < 3; ++i) {
      expected += response_for(base + i);
    }
    ASSERT_TRUE(pump_until([&] {
      c.poll();
      return c.in.size() >= expected.size() || c.eof;
    })) << "responses stalled; got: "
        << c.in;
    EXPECT_EQ(c.in, expected);
    EXPECT_FALSE(c.eof);
    base += 3;
  }

  // A request after the last round is still read and answered: the
  // connection is neither stalled nor closed.
  ASSERT_TRUE(c.send(get_request("/last")));
  ASSERT_TRUE(pump_until([&] { return sink.requests().size() == base + 1; }))
      << "stalled after the last round";
  ASSERT_TRUE(answer(sink.requests().back().conn, base));
  expected += response_for(base);
  ASSERT_TRUE(pump_until([&] {
    c.poll();
    return c.in.size() >= expected.size();
  }));
  EXPECT_EQ(c.in, expected);
  EXPECT_EQ(counters.requests_in_flight.get(), 0u);
  EXPECT_EQ(counters.unsent_bytes.get(), 0u);
  EXPECT_EQ(sink.count(sink_event::kind::disconnect), 0u);
}

// More requests than the credit in one write: the parser pauses with bytes
// kept, and finish_hol() must parse them as soon as the head of the line
// is answered (out of order again), until every request is answered.
TEST_F(http_server_regress, PipelinedRequestsBeyondTheCapAreParsedFromKeptBytes) {
  opt.max_pipelined = 2;
  opt.keepalive_idle = 30s;
  start();
  raw_client c{port};
  ASSERT_TRUE(c.connected());
  constexpr std::uint32_t total = 7;
  std::string all;
  for (std::uint32_t i = 0; i < total; ++i) {
    all += get_request("/k" + std::to_string(i));
  }
  ASSERT_TRUE(c.send(all));
  std::string expected;
  std::uint32_t answered = 0;
  while (answered < total) {
    const std::uint32_t want = std::min(answered + 2, total);
    ASSERT_TRUE(pump_until([&] { return sink.requests().size() == want; }))
        << "stalled at " << sink.requests().size() << " requests, " << answered << " answered";
    pump();
    EXPECT_EQ(sink.requests().size(), want) << "the parser must stop at the in-flight cap";
    const connection_id conn = sink.requests().front().conn;
    // Newest first.
    for (std::uint32_t seq = want; seq-- > answered;) {
      ASSERT_TRUE(answer(conn, seq));
    }
    for (std::uint32_t seq = answered; seq < want; ++seq) {
      expected += response_for(seq);
    }
    answered = want;
  }
  ASSERT_TRUE(pump_until([&] {
    c.poll();
    return c.in.size() >= expected.size() || c.eof;
  }));
  EXPECT_EQ(c.in, expected);
  EXPECT_FALSE(c.eof);
  EXPECT_EQ(counters.requests_in_flight.get(), 0u);
}

}  // namespace

// ---------------------------------------------------------------- drain

// A connection accepted just before a drain whose request already sits in
// the kernel, unread, when the drain begins: the drain must not close it as
// idle; the request is read, handed to the app and answered.
TEST_F(http_server_regress, DrainAnswersARequestThatArrivedBeforeItWasRead) {
  start();
  raw_client client{port};
  ASSERT_TRUE(client.connected());
  ASSERT_TRUE(pump_until([&] { return server->connection_count() == 1; })) << "the server accepts";
  ASSERT_TRUE(client.send(get_request("/sent-before-the-drain")));
  // No pump: the server has not looked at the socket since the bytes arrived.
  server->begin_drain();
  ASSERT_TRUE(pump_until([&] {
    client.poll();
    return sink.requests().size() == 1 || client.eof || client.reset;
  })) << "neither a request nor a close";
  ASSERT_EQ(sink.requests().size(), 1u) << "the drain closed a connection holding an unread request";
  EXPECT_EQ(sink.requests()[0].target, "/sent-before-the-drain");
  ASSERT_TRUE(answer(sink.requests()[0].conn, sink.requests()[0].request, false));
  ASSERT_TRUE(pump_until([&] {
    client.poll();
    return client.eof || client.reset;
  }));
  EXPECT_FALSE(client.reset);
  EXPECT_NE(client.in.find("r0"), std::string::npos) << client.in;
}
