// Readiness of our own for plain connections (net/conn_poller.hpp): each
// socket is registered once, edge-triggered, so an edge that comes while
// reading is paused must be remembered and read as soon as reading resumes,
// with no new byte arriving to announce it; and a FIN that came with the
// last bytes must still be seen after a short read of those bytes.
// http_server driven directly on the test's thread (direct_server_fixture).

#include "direct_server_fixture.hpp"

namespace {

class edge_readiness_test : public direct_server_test {
 protected:
  void SetUp() override {
    opt.max_pipelined = 1;  // one request in flight: reading pauses until it is answered
    opt.keepalive_idle = 30s;
    opt.request_line_timeout = 30s;
    start();
  }
  void idle(std::chrono::milliseconds how_long) {
    const auto until = std::chrono::steady_clock::now() + how_long;
    while (std::chrono::steady_clock::now() < until) {
      pump();
      std::this_thread::sleep_for(1ms);
    }
  }
};

// The second request arrives while the first holds the only credit: its edge
// is reported while reading is paused. Answering the first must read it.
TEST_F(edge_readiness_test, BytesThatArrivedWhileReadingWasPausedAreReadWhenItResumes) {
  raw_client c{port};
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.send(get_request("/first")));
  ASSERT_TRUE(pump_until([&] { return sink.requests().size() == 1; }));
  const connection_id conn = sink.requests().front().conn;

  ASSERT_TRUE(c.send(get_request("/second")));
  idle(100ms);
  ASSERT_EQ(sink.requests().size(), 1u) << "reading must stay paused while the credit is spent";

  // Nothing more is sent from here on.
  ASSERT_TRUE(answer(conn, 0));
  ASSERT_TRUE(pump_until([&] { return sink.requests().size() == 2; }))
      << "the bytes that came during the pause were never read";
  EXPECT_EQ(sink.requests()[1].target, "/second");
  ASSERT_TRUE(answer(conn, 1));
  ASSERT_TRUE(pump_until([&] {
    c.poll();
    return c.in.size() >= (response_for(0) + response_for(1)).size();
  }));
  EXPECT_EQ(c.in, response_for(0) + response_for(1));
  EXPECT_FALSE(c.eof);
}

// The client's FIN alone arrives while reading is paused: once the request
// is answered, the server reads the EOF and closes.
TEST_F(edge_readiness_test, AFinThatArrivedWhileReadingWasPausedClosesAfterTheAnswer) {
  raw_client c{port};
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.send(get_request("/only")));
  ASSERT_TRUE(pump_until([&] { return sink.requests().size() == 1; }));
  const connection_id conn = sink.requests().front().conn;
  c.shutdown_write();
  idle(100ms);
  ASSERT_TRUE(answer(conn, 0));
  ASSERT_TRUE(pump_until([&] {
    c.poll();
    return c.eof || c.reset;
  })) << "the server never saw the FIN that came during the pause; got: "
      << c.in;
  EXPECT_FALSE(c.reset);
  EXPECT_EQ(c.in, response_for(0));
  ASSERT_TRUE(pump_until([&] { return sink.count(sink_event::kind::disconnect) == 1; }));
  EXPECT_EQ(server->connection_count(), 0u);
}

// A request and the FIN behind it arrive together during the pause: one
// edge. The read of the request comes back short, yet the FIN is pending:
// after answering it the server must still read the EOF and close.
TEST_F(edge_readiness_test, AFinThatCameWithTheLastBytesIsSeenAfterAShortRead) {
  raw_client c{port};
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.send(get_request("/first")));
  ASSERT_TRUE(pump_until([&] { return sink.requests().size() == 1; }));
  const connection_id conn = sink.requests().front().conn;
  ASSERT_TRUE(c.send(get_request("/last")));
  c.shutdown_write();
  idle(100ms);
  ASSERT_TRUE(answer(conn, 0));
  ASSERT_TRUE(pump_until([&] { return sink.requests().size() == 2; }));
  EXPECT_EQ(sink.requests()[1].target, "/last");
  ASSERT_TRUE(answer(conn, 1));
  ASSERT_TRUE(pump_until([&] {
    c.poll();
    return c.eof || c.reset;
  })) << "the FIN behind the last request was never read; got: "
      << c.in;
  EXPECT_FALSE(c.reset);
  EXPECT_EQ(c.in, response_for(0) + response_for(1));
  EXPECT_EQ(server->connection_count(), 0u);
}

// Reading waits on an idle keep-alive connection when a request and the FIN
// behind it arrive before the server looks: one readiness event for both.
// The read of the request is short, yet the FIN must still be seen: once the
// request is answered, the server closes.
TEST_F(edge_readiness_test, AFinThatCameWithARequestOnAnIdleConnectionIsSeen) {
  raw_client c{port};
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.send(get_request("/warm")));
  ASSERT_TRUE(pump_until([&] { return sink.requests().size() == 1; }));
  const connection_id conn = sink.requests().front().conn;
  ASSERT_TRUE(answer(conn, 0));
  ASSERT_TRUE(pump_until([&] {
    c.poll();
    return c.in == response_for(0);
  }));
  idle(20ms);  // reading waits again, for the next request
  // Both arrive before the next pump.
  ASSERT_TRUE(c.send(get_request("/and-bye")));
  c.shutdown_write();
  std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(pump_until([&] { return sink.requests().size() == 2; }));
  ASSERT_TRUE(answer(conn, 1));
  ASSERT_TRUE(pump_until([&] {
    c.poll();
    return c.eof || c.reset;
  })) << "the FIN that came with the request was never read; got: "
      << c.in;
  EXPECT_EQ(c.in, response_for(0) + response_for(1));
  EXPECT_EQ(server->connection_count(), 0u);
}

}  // namespace
