// Tests for the core pair's I/O side (issue: the core pair and the ASGI HTTP
// server): a real I/O thread on 127.0.0.1 (ephemeral port), a C++ fake app
// thread on the rings, raw-socket clients checking the bytes on the wire.

#include "fake_app.hpp"
#include "pair_fixture.hpp"
#include "test_client.hpp"

#include <cadeloop/runtime/core_pair.hpp>

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using cadeloop::net::connection_id;
using cadeloop::net::listen_spec;
using cadeloop::runtime::core_pair;
using cadeloop::runtime::inbound_kind;
using cadeloop::runtime::inbound_message;
using cadeloop::test::fake_app;
using cadeloop::test::get_request;
using cadeloop::test::http_response;
using cadeloop::test::seen;
using cadeloop::test::eventually;
using cadeloop::test::test_client;

// "#3": built with snprintf, since GCC 12 warns falsely (-Wrestrict) about
// short std::string concatenations once inlined.
std::string numbered(const char* prefix, std::uint64_t n) {
  char text[64];
  std::snprintf(text, sizeof text, "%s%llu", prefix, static_cast<unsigned long long>(n));
  return text;
}

// The request messages of a log, in order.
std::vector<seen> requests_of(const std::vector<seen>& log) {
  std::vector<seen> out;
  for (const seen& s : log) {
    if (s.kind == inbound_kind::request) {
      out.push_back(s);
    }
  }
  return out;
}

// Closes with a reset (SO_LINGER 0): the server's next read fails at once.
void reset_close(test_client& c) {
  linger l{1, 0};
  ::setsockopt(c.fd(), SOL_SOCKET, SO_LINGER, &l, sizeof l);
  c.close();
}

using core_pair_http = cadeloop::test::pair_fixture;

// ---------------------------------------------------------------- basics

TEST_F(core_pair_http, KeepAliveServesSeveralRequestsOnOneConnection) {
  start();
  test_client c = client();
  ASSERT_TRUE(c.connected());
  for (int i = 0; i < 3; ++i) {
    const std::string target = "/a" + std::to_string(i);
    ASSERT_TRUE(c.send(get_request(target)));
    const http_response r = c.read_response();
    ASSERT_TRUE(r.ok);
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.body, "ok " + target + " #" + std::to_string(i));
    EXPECT_EQ(r.header("connection"), "");
  }
  EXPECT_TRUE(c.silent_for(100ms));  // still open
  EXPECT_TRUE(eventually([&] { return pair->stats().responses == 3; }));
  const auto s = pair->stats();
  EXPECT_EQ(s.requests, 3u);
  EXPECT_EQ(s.connections_open, 1u);
  EXPECT_EQ(s.requests_in_flight, 0u);
  // The head events carried the client's address.
  const auto log = app->log();
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.front().client.host(), "127.0.0.1");
}

TEST_F(core_pair_http, WrittenResponseBlocksComeBackToTheAppThread) {
  // The fake app writes each response into side().take_buffer(), as the
  // bridge does: a small one is a block, which the I/O thread gives back
  // once it is written, for the next response to reuse.
  start();
  test_client c = client();
  ASSERT_TRUE(c.connected());
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(c.send(get_request("/b")));
    const http_response r = c.read_response();
    ASSERT_TRUE(r.ok);
    EXPECT_EQ(r.body, "ok /b #" + std::to_string(i));
  }
  // The app took one block per response and reused the given-back ones, so
  // at most a couple wait now; at least the last response's must be back.
  EXPECT_TRUE(eventually([&] { return app->side().blocks_returned() >= 1; }));
  EXPECT_LE(app->side().blocks_returned(), 3u);
  std::promise<bool> pooled;
  app->post([&](cadeloop::test::fake_app& a) { pooled.set_value(a.side().take_buffer(100).pooled()); });
  EXPECT_TRUE(pooled.get_future().get());
}

TEST_F(core_pair_http, PipelinedRequestsAreAnsweredInOrderAndCapped) {
  opt.server.max_pipelined = 2;
  auto held = std::make_shared<std::vector<std::pair<connection_id, std::uint32_t>>>();
  start([held](fake_app&, inbound_message& m) {
    if (m.kind == inbound_kind::request) {
      held->emplace_back(m.conn, m.request);
      return true;  // answered later, from a posted task
    }
    return false;
  });
  // The app answers whatever it holds, newest first: the wire must still
  // carry the responses in request order.
  auto answer_reversed = [held](fake_app& a) {
    for (auto it = held->rbegin(); it != held->rend(); ++it) {
      a.respond(it->first, it->second, 200, numbered("#", it->second));
    }
    held->clear();
  };
  test_client c = client();
  std::string five;
  for (int i = 0; i < 5; ++i) {
    five += get_request("/p" + std::to_string(i));
  }
  ASSERT_TRUE(c.send(five));
  ASSERT_TRUE(app->wait_count(inbound_kind::request, 2));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(app->count(inbound_kind::request), 2u) << "the parser must stop at the in-flight cap";
  app->post(answer_reversed);
  ASSERT_TRUE(app->wait_count(inbound_kind::request, 4));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(app->count(inbound_kind::request), 4u);
  app->post(answer_reversed);
  ASSERT_TRUE(app->wait_count(inbound_kind::request, 5));
  app->post(answer_reversed);
  for (int i = 0; i < 5; ++i) {
    const http_response r = c.read_response();
    ASSERT_TRUE(r.ok);
    EXPECT_EQ(r.body, numbered("#", static_cast<std::uint64_t>(i)));
  }
}

TEST_F(core_pair_http, Http10IsAnsweredAndClosed) {
  start();
  test_client c = client();
  ASSERT_TRUE(c.send("GET /old HTTP/1.0\r\n\r\n"));
  const http_response r = c.read_response();
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ok /old #0");
  EXPECT_TRUE(c.closed_by_server());

  // HTTP/1.0 with keep-alive stays open.
  test_client k = client();
  ASSERT_TRUE(k.send("GET /k HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
  ASSERT_TRUE(k.read_response().ok);
  ASSERT_TRUE(k.send("GET /k2 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
  const http_response r2 = k.read_response();
  ASSERT_TRUE(r2.ok);
  EXPECT_EQ(r2.body, "ok /k2 #1");
}

TEST_F(core_pair_http, HeadResponseCarriesNoBody) {
  start();
  test_client c = client();
  ASSERT_TRUE(c.send("HEAD /h HTTP/1.1\r\nHost: t\r\n\r\n"));
  const http_response r = c.read_response(true);
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.header("content-length"), std::to_string(std::string{"ok /h #0"}.size()));
  // No stray body bytes: the next response on the connection parses cleanly.
  ASSERT_TRUE(c.send(get_request("/g")));
  const http_response g = c.read_response();
  ASSERT_TRUE(g.ok);
  EXPECT_EQ(g.body, "ok /g #1");
}

TEST_F(core_pair_http, ChunkedUploadIsStreamedInPieces) {
  start();
  test_client c = client();
  ASSERT_TRUE(c.send("POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"));
  ASSERT_TRUE(app->wait_count(inbound_kind::request, 1));
  ASSERT_TRUE(c.send("5\r\nhello\r\n"));
  ASSERT_TRUE(app->wait_count(inbound_kind::body, 1));
  ASSERT_TRUE(c.send("6\r\n world\r\n"));
  ASSERT_TRUE(app->wait_count(inbound_kind::body, 2));
  ASSERT_TRUE(c.send("0\r\n\r\n"));
  const http_response r = c.read_response();
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.body, "got 11");
  std::vector<seen> bodies;
  for (const seen& s : app->log()) {
    if (s.kind == inbound_kind::body) {
      bodies.push_back(s);
    }
  }
  ASSERT_EQ(bodies.size(), 3u);
  EXPECT_EQ(bodies[0].size, 5u);
  EXPECT_TRUE(bodies[0].more_body);
  EXPECT_EQ(bodies[1].size, 6u);
  EXPECT_TRUE(bodies[1].more_body);
  EXPECT_EQ(bodies[2].size, 0u);
  EXPECT_FALSE(bodies[2].more_body);
}

TEST_F(core_pair_http, ExpectContinueIsLeftToTheApp) {
  start([](fake_app& a, inbound_message& m) {
    if (m.kind == inbound_kind::request && m.head->expect_continue()) {
      // The app asks for the body: it sends 100 Continue itself.
      std::string out;
      a.encoder().continue_line(a.ctx(m.conn, m.request), out);
      a.side().send(m.conn, m.request, cadeloop::net::byte_buffer::copy_of(out));
      return true;
    }
    return false;
  });
  test_client c = client();
  ASSERT_TRUE(c.send("POST /e HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"));
  const http_response cont = c.read_response();
  ASSERT_TRUE(cont.ok);
  EXPECT_EQ(cont.status, 100);
  ASSERT_TRUE(c.send("abcd"));
  const http_response r = c.read_response();
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "got 4");
}

TEST_F(core_pair_http, WakeupsPerRequestStayFarBelowOneUnderPipelinedLoad) {
  opt.server.max_pipelined = 64;
  start();
  test_client c = client();
  constexpr int total = 4000;
  std::string burst;
  for (int i = 0; i < total; ++i) {
    burst += get_request("/w");
  }
  std::thread writer{[&] { c.send(burst); }};
  for (int i = 0; i < total; ++i) {
    const http_response r = c.read_response();
    ASSERT_TRUE(r.ok) << i;
  }
  writer.join();
  const auto s = pair->stats();
  const double per_request =
      static_cast<double>(s.wakeups_to_app + s.wakeups_to_io) / static_cast<double>(s.requests);
  std::printf("pipelined load: %llu requests, %llu wakeups to the app, %llu to the I/O thread (%.3f per request), "
              "%llu I/O passes, %llu write calls\n",
              static_cast<unsigned long long>(s.requests), static_cast<unsigned long long>(s.wakeups_to_app),
              static_cast<unsigned long long>(s.wakeups_to_io), per_request,
              static_cast<unsigned long long>(s.io_passes), static_cast<unsigned long long>(s.write_calls));
  EXPECT_LT(per_request, 0.5);
  EXPECT_LT(s.write_calls, s.requests) << "responses of one pass share one write";
}

// ---------------------------------------------------------------- errors and timeouts

struct error_case {
  const char* name;
  std::string request;
  int status;
};

TEST_F(core_pair_http, ProtocolErrorsAreAnsweredWithTheirStatusAndClosed) {
  opt.server.limits.max_body = 1000;
  opt.server.limits.max_url = 64;
  opt.server.limits.max_headers = 10;
  start();
  std::string many_headers = "GET / HTTP/1.1\r\nHost: t\r\n";
  for (int i = 0; i < 20; ++i) {
    many_headers += "X-H" + std::to_string(i) + ": v\r\n";
  }
  many_headers += "\r\n";
  const std::vector<error_case> cases = {
      {"bad request line", "GARBAGE\r\n\r\n", 400},
      {"body over max_body", "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 2000\r\n\r\n", 413},
      {"target over max_url", get_request("/" + std::string(200, 'u')), 414},
      {"too many headers", many_headers, 431},
      {"unknown transfer coding", "POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501},
      {"HTTP/2.0 request line", "GET / HTTP/2.0\r\nHost: t\r\n\r\n", 505},
  };
  for (const error_case& e : cases) {
    SCOPED_TRACE(e.name);
    test_client c = client();
    ASSERT_TRUE(c.send(e.request));
    const http_response r = c.read_response();
    ASSERT_TRUE(r.ok);
    EXPECT_EQ(r.status, e.status);
    EXPECT_EQ(r.header("connection"), "close");
    EXPECT_TRUE(c.closed_by_server());
  }
  EXPECT_EQ(app->count(inbound_kind::request), 0u) << "refused requests never reach the app";
  EXPECT_EQ(pair->stats().protocol_errors, cases.size());

  // An error behind a good pipelined request: the good one is answered first.
  test_client p = client();
  ASSERT_TRUE(p.send(get_request("/fine") + "GET / HTTP/1.1\r\nHost : t\r\n\r\n"));
  const http_response first = p.read_response();
  ASSERT_TRUE(first.ok);
  EXPECT_EQ(first.body, "ok /fine #0");
  const http_response second = p.read_response();
  ASSERT_TRUE(second.ok);
  EXPECT_EQ(second.status, 400);
  EXPECT_TRUE(p.closed_by_server());
}

TEST_F(core_pair_http, TrickledHeadGets408) {
  opt.server.request_line_timeout = 300ms;
  start();
  test_client c = client();
  ASSERT_TRUE(c.send("GET / HTTP/1.1\r\nHo"));
  const auto began = std::chrono::steady_clock::now();
  // One byte every 50 ms: each is progress, none completes the head.
  while (c.silent_for(50ms) && std::chrono::steady_clock::now() - began < 3s) {
    ASSERT_TRUE(c.send("x"));
  }
  const http_response r = c.read_response();
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.status, 408);
  EXPECT_GE(std::chrono::steady_clock::now() - began, 250ms);
  EXPECT_TRUE(c.closed_by_server());
  EXPECT_EQ(pair->stats().timeouts, 1u);
}

TEST_F(core_pair_http, IdleKeepAliveIsClosedQuietly) {
  opt.server.keepalive_idle = 300ms;
  start();
  test_client c = client();
  ASSERT_TRUE(c.send(get_request("/")));
  ASSERT_TRUE(c.read_response().ok);
  EXPECT_TRUE(c.silent_for(150ms));
  EXPECT_TRUE(c.closed_by_server(3s));  // EOF, not a single byte
  EXPECT_TRUE(app->wait_count(inbound_kind::disconnect, 1));
}

// ---------------------------------------------------------------- backpressure

TEST_F(core_pair_http, SlowReaderKeepsUnsentBytesBoundedAndDrainedWaitsForTheClient) {
  constexpr std::uint64_t total = 16u << 20;
  constexpr std::uint64_t part = 64u << 10;
  constexpr std::uint64_t high_mark = 256u << 10;
  opt.server.drain_low_mark = 64u << 10;

  struct stream_state {
    connection_id conn{};
    std::uint32_t request = 0;
    std::uint64_t sent = 0;
    std::uint64_t since_notice = 0;
    bool waiting = false;
    bool active = false;
  };
  auto st = std::make_shared<stream_state>();
  auto sent_view = std::make_shared<std::atomic<std::uint64_t>>(0);
  auto pump = [st, sent_view](fake_app& a) {
    // The app side's rule: count bytes sent; past the high mark ask for a
    // drained notice and send nothing more until it comes.
    const std::string chunk(part, 'z');
    while (st->active && !st->waiting && st->sent < total) {
      std::string out;
      if (st->sent == 0) {
        a.encoder().start_sized(a.ctx(st->conn, st->request), 200, total, out);
      }
      a.encoder().part(chunk, out);
      st->sent += part;
      st->since_notice += out.size();
      cadeloop::runtime::send_options o;
      if (st->sent == total) {
        o.end_of_response = true;
        o.keep_alive = a.encoder().finish(out);
      }
      if (st->since_notice > high_mark && st->sent < total) {
        o.notify_drained = true;
        st->waiting = true;
      }
      a.side().send(st->conn, st->request, cadeloop::net::byte_buffer::copy_of(out), o);
    }
    sent_view->store(st->sent);
  };
  start([st, pump](fake_app& a, inbound_message& m) {
    if (m.kind == inbound_kind::request) {
      st->conn = m.conn;
      st->request = m.request;
      st->active = true;
      pump(a);
      return true;
    }
    if (m.kind == inbound_kind::drained) {
      st->since_notice = m.unsent;
      st->waiting = false;
      pump(a);
      return true;
    }
    return false;
  });

  // A small receive buffer so the kernel cannot swallow the response.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int small = 16 * 1024;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(pair->local_address().port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  test_client c{fd};
  ASSERT_TRUE(c.send(get_request("/big")));

  // The client does not read. The app stalls waiting for a notice, and the
  // I/O thread never holds much more than the high mark.
  std::uint64_t max_unsent = 0;
  std::uint64_t last_sent = 0;
  auto stable_since = std::chrono::steady_clock::now();
  const auto began = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - began < 5s) {
    max_unsent = std::max(max_unsent, pair->stats().unsent_bytes);
    const std::uint64_t now_sent = sent_view->load();
    if (now_sent != last_sent) {
      last_sent = now_sent;
      stable_since = std::chrono::steady_clock::now();
    } else if (std::chrono::steady_clock::now() - stable_since > 300ms) {
      break;
    }
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_LT(last_sent, total) << "the app must stall while the client does not read";
  const std::size_t drained_before = app->count(inbound_kind::drained);
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(app->count(inbound_kind::drained), drained_before) << "no drained notice while the client does not read";
  EXPECT_EQ(sent_view->load(), last_sent);
  EXPECT_LE(max_unsent, high_mark + part + 1024) << "unsent bytes must stay bounded";

  // The client reads: notices flow, the response completes byte-exactly.
  const http_response r = c.read_response(false, 30s);
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.body.size(), total);
  EXPECT_GT(app->count(inbound_kind::drained), drained_before);
  EXPECT_TRUE(eventually([&] { return pair->stats().unsent_bytes == 0; }));
}

TEST_F(core_pair_http, UnconsumedBodyStopsReadingUntilTheAppConsumes) {
  opt.server.body_window = 64u << 10;
  opt.server.read_buffer_size = 16u << 10;
  start();
  app->auto_consume = false;

  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int small = 32 * 1024;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(pair->local_address().port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  test_client c{fd};
  constexpr std::uint64_t body = 64u << 20;
  ASSERT_TRUE(c.send("POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: " + std::to_string(body) + "\r\n\r\n"));
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);

  // Send until the socket refuses for 300 ms in a row.
  const std::string block(64 * 1024, 'b');
  std::uint64_t pushed = 0;
  auto push_until_blocked = [&](std::uint64_t limit) {
    auto blocked_since = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - blocked_since < 300ms && pushed < limit) {
      const ssize_t n = ::send(fd, block.data(), std::min<std::uint64_t>(block.size(), body - pushed), MSG_NOSIGNAL);
      if (n > 0) {
        pushed += static_cast<std::uint64_t>(n);
        blocked_since = std::chrono::steady_clock::now();
      } else {
        std::this_thread::sleep_for(5ms);
      }
    }
  };
  push_until_blocked(body);
  EXPECT_LT(pushed, body) << "the client's send must block";
  const std::uint64_t read_by_server = pair->stats().bytes_in;
  const auto window_plus_one_read = opt.server.body_window + opt.server.read_buffer_size + 1024;
  EXPECT_LE(read_by_server, window_plus_one_read) << "the I/O thread must stop reading past the window";
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(pair->stats().bytes_in, read_by_server);

  // The app reports what it has consumed: reading resumes.
  app->auto_consume = true;
  app->post([](fake_app& f) {
    std::uint64_t got = 0;
    connection_id conn{};
    for (const seen& s : f.log()) {
      if (s.kind == inbound_kind::body) {
        got += s.size;
        conn = s.conn;
      }
    }
    f.side().consumed(conn, got);
  });
  const std::uint64_t before = pushed;
  push_until_blocked(before + (4u << 20));  // 4 MiB more get through
  EXPECT_GE(pushed, before + (4u << 20));
  EXPECT_GT(pair->stats().bytes_in, read_by_server);
}

// ---------------------------------------------------------------- connection names

TEST_F(core_pair_http, MessagesForAClosedConnectionAreDropped) {
  auto old = std::make_shared<std::pair<connection_id, std::uint32_t>>();
  start([old](fake_app&, inbound_message& m) {
    if (m.kind == inbound_kind::request && m.head->target() == "/hold") {
      *old = {m.conn, m.request};
      return true;
    }
    return false;
  });
  {
    test_client c = client();
    ASSERT_TRUE(c.send(get_request("/hold")));
    ASSERT_TRUE(app->wait_count(inbound_kind::request, 1));
    reset_close(c);  // the client goes away (reset) with its request unanswered
  }
  ASSERT_TRUE(app->wait_count(inbound_kind::disconnect, 1));

  // A new connection takes the same slot with a new generation.
  test_client fresh = client();
  ASSERT_TRUE(fresh.send(get_request("/hold")));
  ASSERT_TRUE(app->wait_count(inbound_kind::request, 2));
  const std::vector<seen> log = app->log();
  connection_id first{};
  connection_id second{};
  for (const seen& s : log) {
    if (s.kind == inbound_kind::request) {
      (first.valid() ? second : first) = s.conn;
    }
  }
  EXPECT_EQ(first.slot, second.slot);
  EXPECT_NE(first.generation, second.generation);

  // The app answers the old name: dropped, counted, nothing reaches the new client.
  const auto stale_before = pair->stats().stale_messages;
  app->post([first](fake_app& a) { a.respond(first, 0, 200, "stale bytes"); });
  ASSERT_TRUE(eventually([&] { return pair->stats().stale_messages > stale_before; }));
  EXPECT_TRUE(fresh.silent_for(100ms));
  app->post([second](fake_app& a) { a.respond(second, 0, 200, "fresh"); });
  const http_response r = fresh.read_response();
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.body, "fresh");
}

// ---------------------------------------------------------------- half close, EOF

TEST_F(core_pair_http, HalfClosedClientStillGetsItsResponseThenDisconnect) {
  start([](fake_app&, inbound_message& m) {
    return m.kind == inbound_kind::request && m.head->target() == "/h";
  });
  test_client c = client();
  ASSERT_TRUE(c.send(get_request("/h")));
  c.shutdown_write();
  ASSERT_TRUE(app->wait_count(inbound_kind::request, 1));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(app->count(inbound_kind::disconnect), 0u) << "the response in flight comes first";
  const connection_id conn = app->log().front().conn;
  app->post([conn](fake_app& a) { a.respond(conn, 0, 200, "late"); });
  const http_response r = c.read_response();
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.body, "late");
  EXPECT_TRUE(c.closed_by_server());
  ASSERT_TRUE(app->wait_count(inbound_kind::disconnect, 1));
  EXPECT_EQ(app->log().back().kind, inbound_kind::disconnect);
}

TEST_F(core_pair_http, EofInsideARequestDropsTheConnection) {
  start();
  test_client c = client();
  ASSERT_TRUE(c.send("POST /cut HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc"));
  ASSERT_TRUE(app->wait_count(inbound_kind::body, 1));
  c.shutdown_write();
  EXPECT_TRUE(c.closed_by_server());
  ASSERT_TRUE(app->wait_count(inbound_kind::disconnect, 1));
  const std::vector<seen> log = app->log();
  ASSERT_EQ(log.size(), 3u);
  EXPECT_EQ(log[1].size, 3u);
  EXPECT_TRUE(log[1].more_body);
}

// ---------------------------------------------------------------- budgets, stop

TEST_F(core_pair_http, AcceptingPausesWhileTheConnectionBudgetIsSpent) {
  opt.server.max_connections = 2;
  start();
  test_client a = client();
  test_client b = client();
  ASSERT_TRUE(a.send(get_request("/a")));
  ASSERT_TRUE(a.read_response().ok);
  ASSERT_TRUE(b.send(get_request("/b")));
  ASSERT_TRUE(b.read_response().ok);
  test_client c = client();  // sits in the kernel's backlog
  ASSERT_TRUE(c.send(get_request("/c")));
  EXPECT_TRUE(c.silent_for(200ms));
  EXPECT_GE(pair->stats().accept_pauses, 1u);
  a.close();
  const http_response r = c.read_response();
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.body, "ok /c #0");
}

TEST_F(core_pair_http, GracefulStopFinishesResponsesInFlight) {
  start([](fake_app&, inbound_message& m) {
    return m.kind == inbound_kind::request && m.head->target().starts_with("/slow");
  });
  test_client idle = client();
  ASSERT_TRUE(idle.send(get_request("/fast")));
  ASSERT_TRUE(idle.read_response().ok);
  test_client busy = client();
  ASSERT_TRUE(busy.send(get_request("/slow")));
  ASSERT_TRUE(app->wait_count(inbound_kind::request, 2));

  pair->request_stop();
  EXPECT_TRUE(idle.closed_by_server(2s)) << "idle keep-alive connections close when the drain starts";
  EXPECT_TRUE(eventually([&] { return !test_client::tcp(pair->local_address().port).connected(); }))
      << "the listener closes";

  // A request that arrives during the drain is flagged: the app answers it
  // with Connection: close.
  ASSERT_TRUE(busy.send(get_request("/slow-after")));
  const connection_id conn = requests_of(app->log())[1].conn;
  app->post([conn](fake_app& a) { a.respond(conn, 0, 200, "slow done"); });
  ASSERT_TRUE(app->wait_count(inbound_kind::request, 3));
  const seen after = requests_of(app->log())[2];
  EXPECT_EQ(after.target, "/slow-after");
  EXPECT_TRUE(after.server_closing);
  app->post([conn](fake_app& a) { a.respond(conn, 1, 200, "after done"); });

  const http_response r1 = busy.read_response();
  ASSERT_TRUE(r1.ok);
  EXPECT_EQ(r1.body, "slow done");
  const http_response r2 = busy.read_response();
  ASSERT_TRUE(r2.ok);
  EXPECT_EQ(r2.body, "after done");
  EXPECT_EQ(r2.header("connection"), "close");
  EXPECT_TRUE(busy.closed_by_server());

  auto joined = std::async(std::launch::async, [&] { pair->join(); });
  EXPECT_EQ(joined.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(pair->app().io_stopped());
  EXPECT_EQ(pair->stats().connections_open, 0u);
}

TEST_F(core_pair_http, GraceDeadlineClosesWhatIsLeft) {
  opt.grace = 300ms;
  start([](fake_app&, inbound_message& m) { return m.kind == inbound_kind::request; });  // never answers
  test_client c = client();
  ASSERT_TRUE(c.send(get_request("/never")));
  ASSERT_TRUE(app->wait_count(inbound_kind::request, 1));
  const auto began = std::chrono::steady_clock::now();
  pair->stop();
  const auto took = std::chrono::steady_clock::now() - began;
  EXPECT_GE(took, 250ms);
  EXPECT_LT(took, 3s);
  EXPECT_TRUE(c.closed_by_server());
  EXPECT_TRUE(app->wait_count(inbound_kind::disconnect, 1));
}

TEST_F(core_pair_http, AThousandConnectionsLeaveTheTableEmpty) {
  start();
  constexpr int waves = 10;
  constexpr int per_wave = 100;
  for (int w = 0; w < waves; ++w) {
    std::vector<test_client> clients;
    for (int i = 0; i < per_wave; ++i) {
      clients.push_back(client());
      ASSERT_TRUE(clients.back().connected());
      ASSERT_TRUE(clients.back().send(get_request("/n")));
    }
    for (test_client& c : clients) {
      const http_response r = c.read_response();
      ASSERT_TRUE(r.ok);
      EXPECT_EQ(r.status, 200);
    }
  }  // each wave's clients close here
  ASSERT_TRUE(eventually([&] { return pair->stats().connections_open == 0; }));
  const auto s = pair->stats();
  EXPECT_EQ(s.connections_accepted, static_cast<std::uint64_t>(waves * per_wave));
  EXPECT_EQ(s.requests, s.responses);
  EXPECT_EQ(s.requests_in_flight, 0u);
  EXPECT_EQ(s.unsent_bytes, 0u);
  EXPECT_TRUE(app->wait_count(inbound_kind::disconnect, waves * per_wave));
}

// ---------------------------------------------------------------- listeners

TEST_F(core_pair_http, UnixSocketServesAndReplacesAStaleSocketFile) {
  const std::string path = "/tmp/cadeloop-core-pair-" + std::to_string(::getpid()) + ".sock";
  {
    // A stale socket file: bound, then its owner went away without unlinking.
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.data(), path.size());
    ::unlink(path.c_str());
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ::close(fd);
  }
  opt.listen = listen_spec::unix_socket(path);
  start();
  EXPECT_EQ(pair->description(), "unix:" + path);
  test_client c = test_client::unix_socket(path);
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.send(get_request("/uds")));
  const http_response r = c.read_response();
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.body, "ok /uds #0");
  pair->stop();
  struct stat st{};
  EXPECT_NE(::lstat(path.c_str(), &st), 0) << "the socket file is removed at stop";
}

TEST_F(core_pair_http, PortInUseStopsStartWithOneLine) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 8), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const std::uint16_t port = ntohs(a.sin_port);
  opt.listen = listen_spec::tcp("127.0.0.1", port);
  core_pair p{opt};
  EXPECT_EQ(p.start(), "cannot listen on 127.0.0.1:" + std::to_string(port) + ": address already in use");
  ::close(fd);
}

TEST_F(core_pair_http, InheritedListeningFdServes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 16), 0);
  opt.listen = listen_spec::inherited(fd);
  start();  // the pair owns fd now
  EXPECT_EQ(pair->description().rfind("fd " + std::to_string(fd), 0), 0u);
  test_client c = client();
  ASSERT_TRUE(c.send(get_request("/fd")));
  const http_response r = c.read_response();
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.body, "ok /fd #0");
}

// A pathsend command carries an open descriptor the I/O thread closes once it
// sent the file. One still in the outbound ring when the pair ends (published
// or only staged: the I/O thread stopped before taking it) is closed as the
// pair is torn down, not kept open until the process exits.
TEST_F(core_pair_http, FileCommandsLeftInTheRingAreClosedWhenThePairEnds) {
  auto p = std::make_unique<core_pair>(opt);
  ASSERT_EQ(p->start(), "");
  p->stop();  // nothing takes commands from here on
  const int published = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const int staged = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(published, 0);
  ASSERT_GE(staged, 0);
  p->app().send_file(connection_id{0, 1}, 0, published, 0, 10);
  EXPECT_EQ(p->app().flush(), 1u);
  p->app().send_file(connection_id{0, 1}, 1, staged, 0, 10);
  ASSERT_NE(::fcntl(published, F_GETFD), -1) << "open while the pair lives";
  p.reset();
  EXPECT_EQ(::fcntl(published, F_GETFD), -1) << "the published command's file is still open";
  EXPECT_EQ(::fcntl(staged, F_GETFD), -1) << "the staged command's file is still open";
}

}  // namespace

// ---------------------------------------------------------------- borrowed response bytes

namespace {

// Bytes an app object owns (here: static), sent without a copy.
char borrowed_body[200000];

// Answers every request with a head and borrowed_body, borrowed with `owner`.
std::function<bool(fake_app&, inbound_message&)> answer_borrowed(void* owner) {
  return [owner](fake_app& a, inbound_message& m) {
    if (m.kind != inbound_kind::request) {
      return false;
    }
    const std::string head = "HTTP/1.1 200 OK\r\nContent-Length: 200000\r\n\r\n";
    a.side().send(m.conn, m.request, cadeloop::net::byte_buffer::copy_of(head));
    cadeloop::runtime::send_options o;
    o.end_of_response = true;
    a.side().send(m.conn, m.request,
                  cadeloop::net::byte_buffer::borrow(borrowed_body, sizeof borrowed_body, owner,
                                                     a.side().owner_sink()),
                  o);
    return true;
  };
}

// Takes the owners given back so far on the app thread.
std::vector<void*> owners_back(std::unique_ptr<fake_app>& app) {
  std::promise<std::vector<void*>> got;
  app->post([&](fake_app& a) {
    std::vector<void*> v;
    a.side().take_owners(v);
    got.set_value(std::move(v));
  });
  return got.get_future().get();
}

}  // namespace

TEST_F(core_pair_http, BorrowedBodyIsWrittenAndItsOwnerComesBackOnce) {
  for (std::size_t i = 0; i < sizeof borrowed_body; ++i) {
    borrowed_body[i] = static_cast<char>('a' + i % 26);
  }
  static int owner = 0;
  start(answer_borrowed(&owner));
  test_client c = client();
  std::vector<void*> back;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(c.send(get_request("/big")));
    const http_response r = c.read_response();
    ASSERT_TRUE(r.ok);
    EXPECT_EQ(r.body, std::string(borrowed_body, sizeof borrowed_body));
    ASSERT_TRUE(eventually([&] {
      for (void* p : owners_back(app)) {
        back.push_back(p);
      }
      return back.size() == static_cast<std::size_t>(i + 1);
    }));
  }
  EXPECT_EQ(back, std::vector<void*>(3, &owner));
}

TEST_F(core_pair_http, BorrowedBodyOfAResetClientComesBackToo) {
  static int owner = 0;
  start(answer_borrowed(&owner));
  {
    test_client c = client();
    int small = 4096;
    ::setsockopt(c.fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    ASSERT_TRUE(c.send(get_request("/big")));
    char some[512];
    ASSERT_GT(::recv(c.fd(), some, sizeof some, 0), 0);
    reset_close(c);
  }
  std::vector<void*> back;
  ASSERT_TRUE(eventually([&] {
    for (void* p : owners_back(app)) {
      back.push_back(p);
    }
    return !back.empty();
  }));
  EXPECT_EQ(back, std::vector<void*>{&owner});
}
