// net::http_server against slow and hostile clients, driven directly on the
// test's thread (as http_server_regress_test.cpp does): a request body that
// stalls or trickles (body_timeout, body_min_rate), output a client does not
// read (write_timeout), and the pair's memory budget (cuts at a send's
// arrival, 503 for new requests).

#include "direct_server_fixture.hpp"

namespace {

using slow_client_test = direct_server_test;

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

// A client that stops reading while the app keeps sending small pieces: the
// write deadline counts from the stall, and a piece too small to be worth a
// list operation (it would go out in this pass if the socket took it) must not
// drop or push back the deadline of a socket that already refused bytes.
TEST_F(slow_client_test, SmallSendsToAStalledClientDoNotPushBackTheWriteDeadline) {
  opt.write_timeout = 300ms;
  start();
  raw_client c{port};
  ASSERT_TRUE(c.send(get_request("/s")));
  ASSERT_TRUE(pump_until([&] { return sink.count(kind::request) == 1; }));
  const connection_id id = sink.requests()[0].conn;
  ASSERT_TRUE(server->send(
      id, 0, byte_buffer::copy_of("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
      send_flags{}));
  // 4 KiB pieces whenever everything went out, until the kernel has taken
  // nothing for 150 ms (its send buffer grows for a while as it fills): then
  // a little is left unsent, a wait for writability is armed, and the write
  // deadline runs.
  const std::string piece = "1000\r\n" + std::string(4096, 'x') + "\r\n";
  std::uint64_t out = counters.bytes_out.get();
  auto last_progress = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - last_progress < 150ms) {
    ASSERT_EQ(sink.count(kind::disconnect), 0u);
    if (counters.unsent_bytes.get() == 0) {
      ASSERT_TRUE(server->send(id, 0, byte_buffer::copy_of(piece), send_flags{}));
    }
    pump();
    if (counters.bytes_out.get() != out) {
      out = counters.bytes_out.get();
      last_progress = std::chrono::steady_clock::now();
    }
  }
  ASSERT_GT(counters.unsent_bytes.get(), 0u);
  ASSERT_LT(counters.unsent_bytes.get(), 8192u);
  const auto stalled = last_progress;
  // 64 bytes every 20 ms: about 6 KiB in 2 s, all of it small.
  const std::string small = "40\r\n" + std::string(64, 'y') + "\r\n";
  while (sink.count(kind::disconnect) == 0 && std::chrono::steady_clock::now() - stalled < 2s) {
    ASSERT_TRUE(server->send(id, 0, byte_buffer::copy_of(small), send_flags{}));
    const auto until = std::chrono::steady_clock::now() + 20ms;
    pump_until([&] {
      return sink.count(kind::disconnect) != 0 || std::chrono::steady_clock::now() >= until;
    });
  }
  const auto took = std::chrono::steady_clock::now() - stalled;
  EXPECT_EQ(sink.count(kind::disconnect), 1u);
  EXPECT_EQ(counters.write_timeouts.get(), 1u);
  EXPECT_LT(took, 1s) << "cut "
                      << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                      << " ms after the stall, write_timeout 300 ms";
}

// A pipelined response the app finished early waits behind the head of the
// line; nothing can be written while the app works on the head, so the
// write deadline must not run for it: a head that takes longer than
// write_timeout is answered, then both responses go out in order.
TEST_F(slow_client_test, AResponseHeldBehindTheHeadOfTheLineRunsNoWriteDeadline) {
  opt.write_timeout = 200ms;
  start();
  raw_client c{port};
  ASSERT_TRUE(c.send(get_request("/slow") + get_request("/fast")));
  ASSERT_TRUE(pump_until([&] { return sink.requests().size() == 2; }));
  const connection_id id = sink.requests()[0].conn;
  ASSERT_TRUE(answer(id, 1));
  const auto until = std::chrono::steady_clock::now() + 700ms;
  pump_until([&] {
    return sink.count(kind::disconnect) != 0 || std::chrono::steady_clock::now() >= until;
  });
  EXPECT_EQ(sink.count(kind::disconnect), 0u);
  EXPECT_EQ(counters.write_timeouts.get(), 0u);
  ASSERT_TRUE(answer(id, 0));
  ASSERT_TRUE(pump_until([&] {
    c.poll();
    return c.in.size() >= (response_for(0) + response_for(1)).size() || c.eof || c.reset;
  }));
  EXPECT_EQ(c.in, response_for(0) + response_for(1));
  EXPECT_FALSE(c.eof);
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

// The sender itself is spared while its socket has not refused a write: a
// response staged whole in one pass (solo mode applies and writes in the
// same pass) goes out in this pass's writes; cutting the client that asked
// would serve nobody. Once its socket refused bytes, it is fair game.
TEST_F(slow_client_test, TheMemoryBudgetSparesASenderWhoseSocketHasNotRefusedAWrite) {
  opt.memory_budget = std::uint64_t{1} << 20;
  start();
  raw_client a{port};
  ASSERT_TRUE(a.send(get_request("/a")));
  ASSERT_TRUE(pump_until([&] { return sink.count(kind::request) == 1; }));
  const connection_id ia = sink.requests()[0].conn;
  std::string head = "HTTP/1.1 200 OK\r\nContent-Length: 67108864\r\n\r\n";
  std::string chunk(std::size_t{3} << 20, 'x');
  ASSERT_TRUE(server->send(ia, 0, byte_buffer::copy_of(head + chunk), send_flags{}));
  EXPECT_EQ(counters.budget_cuts.get(), 0u);
  EXPECT_EQ(sink.count(kind::disconnect), 0u);
  // Writes fill the socket (the client reads nothing) until it refuses
  // bytes and a wait for writability is armed; the next send over the
  // budget then cuts it.
  for (int i = 0; i < 32 && counters.budget_cuts.get() == 0; ++i) {
    server->flush_writes();
    if (!server->send(ia, 0, byte_buffer::copy_of(chunk), send_flags{})) {
      break;
    }
  }
  EXPECT_EQ(counters.budget_cuts.get(), 1u);
  EXPECT_EQ(sink.count(kind::disconnect), 1u);
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
