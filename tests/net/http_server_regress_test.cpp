// Regression tests for net::http_server driven directly, on the test's own
// thread: one io_context, a recording event_sink standing in for the I/O
// thread's rings, and raw non-blocking TCP clients on 127.0.0.1. The test
// plays the app: it answers through http_server::send in the order it
// chooses, and pumps the context (plus flush_writes, as the I/O thread does)
// until what the client sees settles.

#include "direct_server_fixture.hpp"

namespace {

using http_server_regress = direct_server_test;

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
  ASSERT_EQ(sink.requests().size(), 1u)
      << "the drain closed a connection holding an unread request";
  EXPECT_EQ(sink.requests()[0].target, "/sent-before-the-drain");
  ASSERT_TRUE(answer(sink.requests()[0].conn, sink.requests()[0].request, false));
  ASSERT_TRUE(pump_until([&] {
    client.poll();
    return client.eof || client.reset;
  }));
  EXPECT_FALSE(client.reset);
  EXPECT_NE(client.in.find("r0"), std::string::npos) << client.in;
}
