// Solo mode (runtime/include/cadeloop/runtime/core_pair.hpp, "solo mode";
// docs/architecture.md, "One thread while little is in flight"): while the
// pair's I/O thread has nothing to do it hands the sockets to an app thread
// that opted in, which serves them from its own epoll loop. A real pair on
// 127.0.0.1 with the solo app of solo_app.hpp and raw-socket clients: every
// answer must stay right and in order whoever serves the sockets; who served
// them shows in the pair's counters (solo_handoffs, solo_steals,
// solo_passes, wakeups_to_app).

#include "solo_app.hpp"
#include "test_client.hpp"

#include <cadeloop/runtime/core_pair.hpp>

#include <gtest/gtest.h>

#include <dlfcn.h>
#include <sys/epoll.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

// ------------------------------------------------ a seam inside the app's pass
//
// The app thread's pass over the sockets (io_thread::solo_pass, run by
// app_side) collects readiness with epoll_wait on the reactor's descriptor
// (solo_fd()). This definition wraps the C library's (or, under a
// sanitizer that intercepts it, as TSan does, the interceptor, so its
// model of the descriptors stays whole) and, once armed, runs a test action
// on the app thread at that point (once the pass has collected events,
// before their handlers run): a stop requested while the app thread is
// inside a pass.

extern "C" int __interceptor_epoll_wait(int, epoll_event*, int, int) __attribute__((weak));

namespace {

std::atomic<int> g_pass_fd{-1};                              // solo_fd() of the armed pair
std::atomic<std::function<void()>*> g_pass_action{nullptr};  // taken by the first pass

using epoll_wait_fn = int (*)(int, epoll_event*, int, int);

epoll_wait_fn next_epoll_wait() {
  static const epoll_wait_fn fn = [] {
    if (__interceptor_epoll_wait != nullptr) {
      return &__interceptor_epoll_wait;
    }
    return reinterpret_cast<epoll_wait_fn>(::dlsym(RTLD_NEXT, "epoll_wait"));
  }();
  return fn;
}

}  // namespace

extern "C" int epoll_wait(int epfd, epoll_event* events, int maxevents, int timeout) {
  const int n = next_epoll_wait()(epfd, events, maxevents, timeout);
  // After the pass collected events, before their handlers run.
  if (n > 0 && epfd == g_pass_fd.load() && cadeloop::test::solo_app::on_app_thread()) {
    if (std::function<void()>* action = g_pass_action.exchange(nullptr)) {
      (*action)();
    }
  }
  return n;
}

namespace {

using namespace std::chrono_literals;
using cadeloop::runtime::core_pair;
using cadeloop::runtime::core_pair_stats;
using cadeloop::runtime::inbound_message;
using cadeloop::test::eventually;
using cadeloop::test::get_request;
using cadeloop::test::http_response;
using cadeloop::test::solo_app;
using cadeloop::test::test_client;

std::string numbered(const char* prefix, int n) {
  char text[64];
  std::snprintf(text, sizeof text, "%s%d", prefix, n);
  return text;
}

void print(const char* what, const core_pair_stats& s) {
  std::printf(
      "%s: %llu requests, %llu handoffs, %llu steals, %llu solo passes, %llu wakeups to the app\n",
      what, static_cast<unsigned long long>(s.requests),
      static_cast<unsigned long long>(s.solo_handoffs),
      static_cast<unsigned long long>(s.solo_steals),
      static_cast<unsigned long long>(s.solo_passes),
      static_cast<unsigned long long>(s.wakeups_to_app));
}

class solo_mode : public ::testing::Test {
 protected:
  void SetUp() override {
    opt.listen = cadeloop::net::listen_spec::tcp("127.0.0.1", 0);
    opt.grace = 2s;
  }

  // Starts the pair and the solo app; true when the app opted in.
  bool start(solo_app::hook hook = {}) {
    pair = std::make_unique<core_pair>(opt);
    EXPECT_EQ(pair->start(), "");
    app = std::make_unique<solo_app>(pair->app(), std::move(hook));
    return app->start();
  }

  void TearDown() override {
    g_pass_action.store(nullptr);
    g_pass_fd.store(-1);
    if (pair) {
      pair->stop();
    }
    if (app) {
      app->stop();
    }
    app.reset();
    pair.reset();
  }

  [[nodiscard]] test_client client() const { return test_client::tcp(pair->local_address().port); }
  [[nodiscard]] core_pair_stats stats() const { return pair->stats(); }

  // Waits until the I/O thread has handed the sockets over `n` times.
  bool handed_over(std::uint64_t n) {
    return eventually([&] { return stats().solo_handoffs >= n; }, 5s);
  }

  // One request on `c`, its answer checked.
  static void round_trip(test_client& c, const std::string& target) {
    ASSERT_TRUE(c.send(get_request(target)));
    const http_response r = c.read_response();
    ASSERT_TRUE(r.ok) << target;
    ASSERT_EQ(r.status, 200) << target;
    ASSERT_EQ(r.body, "ok " + target);
  }

  // Joins the pair on another thread; whether it ended within `limit`.
  bool stops_within(std::chrono::milliseconds limit) {
    auto done = std::async(std::launch::async, [this] { pair->join(); });
    if (done.wait_for(limit) == std::future_status::ready) {
      return true;
    }
    ADD_FAILURE() << "the pair did not stop: waiting for it (a hang ends at the test's timeout)";
    std::fflush(stdout);
    return false;
  }

  cadeloop::runtime::core_pair_options opt;
  std::unique_ptr<core_pair> pair;
  std::unique_ptr<solo_app> app;
};

// ------------------------------------------------ serving

TEST_F(solo_mode, SequentialRequestsAreServedByTheAppThreadWithoutWakeups) {
  ASSERT_TRUE(start());
  test_client c = client();
  ASSERT_TRUE(c.connected());
  round_trip(c, "/warm");  // wakes the I/O thread, which then idles
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(handed_over(1)) << "an idle I/O thread hands the sockets to an app that opted in";
  const core_pair_stats before = stats();
  constexpr int total = 200;
  for (int i = 0; i < total; ++i) {
    round_trip(c, numbered("/s", i));
    if (HasFatalFailure()) {
      return;
    }
  }
  const core_pair_stats s = stats();
  print("200 sequential requests", s);
  EXPECT_EQ(s.requests, static_cast<std::uint64_t>(total) + 1);
  EXPECT_GE(s.solo_handoffs, 1u);
  EXPECT_GT(s.solo_passes - before.solo_passes, static_cast<std::uint64_t>(total) / 2)
      << "the app thread read most requests itself";
  EXPECT_GT(app->socket_events.load(), static_cast<std::uint64_t>(total) / 2)
      << "its own poll reported the sockets readable";
  // Served by the thread that answers: nobody wakes it per request.
  EXPECT_LT(s.wakeups_to_app - before.wakeups_to_app, static_cast<std::uint64_t>(total) / 4);
}

TEST_F(solo_mode, APipelinedBurstPastTheBatchIsGivenBackAndAllAnswered) {
  opt.solo_max_batch = 4;
  ASSERT_TRUE(start());
  test_client c = client();
  ASSERT_TRUE(c.connected());
  round_trip(c, "/first");
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(handed_over(1));
  round_trip(c, "/second");  // served in solo mode
  ASSERT_FALSE(HasFatalFailure());
  const core_pair_stats before = stats();
  EXPECT_GT(before.solo_passes, 0u);
  constexpr int rounds = 4;
  constexpr int depth = 12;  // > solo_max_batch, <= max_pipelined: one read, one pass
  for (int b = 0; b < rounds; ++b) {
    std::string burst;
    for (int k = 0; k < depth; ++k) {
      burst += get_request(numbered("/b", b * depth + k));
    }
    ASSERT_TRUE(c.send(burst));
    for (int k = 0; k < depth; ++k) {
      const http_response r = c.read_response();
      ASSERT_TRUE(r.ok) << b << "/" << k;
      ASSERT_EQ(r.body, "ok " + numbered("/b", b * depth + k));
    }
    // Given back after the burst's pass, handed over again once idle.
    ASSERT_TRUE(handed_over(before.solo_handoffs + static_cast<std::uint64_t>(b) + 1))
        << "after burst " << b;
  }
  const core_pair_stats after = stats();
  print("bursts of 12", after);
  EXPECT_EQ(after.requests, static_cast<std::uint64_t>(2 + rounds * depth));
  // Each burst's give-back shows as one more hand-over; steals (a busy app
  // thread losing them) are not what this counts.
  EXPECT_GE((after.solo_handoffs - before.solo_handoffs) - (after.solo_steals - before.solo_steals),
            static_cast<std::uint64_t>(rounds));
}

TEST_F(solo_mode, ABlockedAppThreadLosesTheSocketsAndOtherClientsAreStillRead) {
  std::atomic<bool> in_hook{false};
  std::atomic<bool> release{false};
  std::atomic<bool> held_sockets{false};
  ASSERT_TRUE(start([&](solo_app& a, inbound_message& m) {
    if (m.head->target() == "/block") {
      held_sockets.store(a.side().serves_sockets());
      in_hook.store(true);
      // The app thread busy (in Python, say) without running a pass.
      const auto until = std::chrono::steady_clock::now() + 2s;
      while (!release.load() && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(1ms);
      }
    }
    return false;
  }));
  test_client a = client();
  test_client b = client();
  ASSERT_TRUE(a.connected() && b.connected());
  round_trip(b, "/warm");
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(handed_over(1));
  ASSERT_TRUE(a.send(get_request("/block")));
  ASSERT_TRUE(eventually([&] { return in_hook.load(); }, 5s));
  EXPECT_TRUE(held_sockets.load()) << "the app thread held the sockets when it blocked";
  ASSERT_TRUE(b.send(get_request("/second")));
  // The I/O thread takes the sockets back and reads the second request
  // while the app thread is still blocked: it waits in the inbound ring.
  // (A request is counted when parsed and published at the end of that
  // pass, so the wait is for both: a snapshot between the two shows it
  // read but not yet in the ring.)
  const bool read_meanwhile = eventually(
      [&] {
        const core_pair_stats s = stats();
        return s.requests >= 3 && s.inbound_depth >= 1;
      },
      1500ms);
  const core_pair_stats during = stats();
  release.store(true);
  EXPECT_TRUE(read_meanwhile);
  EXPECT_GE(during.solo_steals, 1u);
  EXPECT_GE(during.inbound_depth, 1u) << "published, not yet taken by the blocked app";
  const http_response ra = a.read_response();
  ASSERT_TRUE(ra.ok);
  EXPECT_EQ(ra.body, "ok /block");
  const http_response rb = b.read_response();
  ASSERT_TRUE(rb.ok);
  EXPECT_EQ(rb.body, "ok /second");
  const core_pair_stats after = stats();
  print("blocked app", after);
  // Idle again: the sockets go back to the app thread, which serves on.
  round_trip(b, "/after");
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_TRUE(eventually([&] { return stats().solo_passes > after.solo_passes; }, 5s));
}

TEST_F(solo_mode, WriteThroughSendsAnEndedResponseBeforeThePassEnds) {
  // A response that ends, written through while the app thread still has
  // work in the same pass (its task finishing): the client has it at once.
  std::atomic<bool> client_has_it{false};
  std::atomic<bool> held_sockets{false};
  std::atomic<bool> answered_inside{false};
  ASSERT_TRUE(start([&](solo_app& a, inbound_message& m) {
    if (m.head->target() != "/through") {
      return false;
    }
    held_sockets.store(a.side().serves_sockets());
    a.respond(m.conn, m.request);
    a.side().write_through();
    // Still inside the pass: the client must not need flush() to see it.
    answered_inside.store(eventually([&] { return client_has_it.load(); }, 2s));
    return true;
  }));
  test_client c = client();
  ASSERT_TRUE(c.connected());
  round_trip(c, "/warm");
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(handed_over(1));
  ASSERT_TRUE(c.send(get_request("/through")));
  const http_response r = c.read_response();
  client_has_it.store(true);
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.body, "ok /through");
  EXPECT_TRUE(eventually([&] { return answered_inside.load(); }, 3s))
      << "the response reached the client only after the app thread's pass";
  EXPECT_TRUE(held_sockets.load());
  round_trip(c, "/next");
}

TEST_F(solo_mode, HandOversGiveBacksAndStealsKeepEveryConnectionInOrder) {
  // All three ways the sockets change hands, again and again, while four
  // clients pipeline: bursts past the batch (given back), single requests
  // (served by the app thread), and now and then an app thread busy for
  // 15 ms (stolen).
  opt.solo_max_batch = 4;
  std::atomic<int> seen{0};
  ASSERT_TRUE(start([&](solo_app&, inbound_message&) {
    if (seen.fetch_add(1) % 60 == 59) {
      std::this_thread::sleep_for(15ms);
    }
    return false;
  }));
  constexpr int clients = 4;
  constexpr int rounds = 40;
  std::vector<std::string> failures(clients);
  std::vector<std::thread> threads;
  int total = 0;
  for (int n = 0; n < clients; ++n) {
    for (int i = 0; i < rounds; ++i) {
      total += 1 + (n + i) % 7;
    }
    threads.emplace_back([&, n] {
      std::string& failure = failures[static_cast<std::size_t>(n)];
      test_client c = client();
      for (int i = 0; i < rounds && failure.empty(); ++i) {
        const int depth = 1 + (n + i) % 7;
        std::string burst;
        for (int k = 0; k < depth; ++k) {
          burst += get_request(numbered("/m", n * 10000 + i * 10 + k));
        }
        if (!c.send(burst)) {
          failure = "send failed";
          break;
        }
        for (int k = 0; k < depth; ++k) {
          const std::string target = numbered("/m", n * 10000 + i * 10 + k);
          const http_response r = c.read_response();
          if (!r.ok || r.body != "ok " + target) {
            failure = std::string{"bad answer for "}.append(target).append(": ").append(r.body);
            break;
          }
        }
      }
    });
  }
  for (std::thread& t : threads) {
    t.join();
  }
  for (const std::string& f : failures) {
    EXPECT_EQ(f, "");
  }
  const core_pair_stats s = stats();
  print("mixed load", s);
  EXPECT_EQ(s.requests, static_cast<std::uint64_t>(total));
  EXPECT_GE(s.solo_handoffs, 1u);
  EXPECT_GT(s.solo_passes, 0u);
}

TEST_F(solo_mode, AnAppThreadStuckWithTheSocketsIsStillSeenByTheWatchdog) {
  // The watchdog's beat is a timer of the I/O loop: while the app thread
  // holds the sockets it runs in the app's passes. Stuck holding them, the
  // app thread loses them, and the I/O thread's beat marks the pair stuck.
  opt.stuck_timeout = 200ms;
  std::atomic<bool> in_hook{false};
  std::atomic<bool> release{false};
  ASSERT_TRUE(start([&](solo_app&, inbound_message& m) {
    if (m.head->target() == "/stuck") {
      in_hook.store(true);
      const auto until = std::chrono::steady_clock::now() + 3s;
      while (!release.load() && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(1ms);
      }
    }
    return false;
  }));
  test_client c = client();
  ASSERT_TRUE(c.connected());
  round_trip(c, "/warm");
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(handed_over(1));
  ASSERT_TRUE(c.send(get_request("/stuck")));
  ASSERT_TRUE(eventually([&] { return in_hook.load(); }, 5s));
  // A second request waits for the stuck app: it has work and no progress.
  test_client d = client();
  ASSERT_TRUE(d.connected());
  ASSERT_TRUE(d.send(get_request("/waiting")));
  const bool marked = eventually([&] { return stats().stuck_episodes >= 1; }, 2s);
  release.store(true);
  EXPECT_TRUE(marked) << "the pair was marked stuck while its app thread held on";
  const http_response r = c.read_response();
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.body, "ok /stuck");
  const http_response rd = d.read_response();
  ASSERT_TRUE(rd.ok);
  EXPECT_EQ(rd.body, "ok /waiting");
  EXPECT_TRUE(eventually([&] { return stats().stuck_since_ms == 0; }, 3s)) << "progresses again";
}

// ------------------------------------------------ stopping

TEST_F(solo_mode, AStopTakesTheSocketsFromAnIdleAppAndDrains) {
  std::atomic<bool> held{false};
  cadeloop::net::connection_id conn{};
  std::uint32_t seq = 0;
  ASSERT_TRUE(start([&](solo_app&, inbound_message& m) {
    if (m.head->target() == "/held") {
      conn = m.conn;
      seq = m.request;
      held.store(true);
      return true;  // answered after the stop, from a task
    }
    return false;
  }));
  test_client busy = client();
  test_client idle = client();
  ASSERT_TRUE(busy.connected() && idle.connected());
  round_trip(idle, "/idle");
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(handed_over(1));
  ASSERT_TRUE(busy.send(get_request("/held")));
  ASSERT_TRUE(eventually([&] { return held.load(); }, 5s));
  std::this_thread::sleep_for(20ms);  // the app thread parks, holding the sockets
  pair->request_stop();
  // The drain is the I/O thread's: it closes the idle connection at once...
  EXPECT_TRUE(idle.closed_by_server(1500ms));
  // ...and waits for the response in flight, which still goes out whole.
  app->post([&](solo_app& a) { a.respond(conn, seq); });
  const http_response r = busy.read_response();
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ok /held");
  EXPECT_TRUE(busy.closed_by_server(1500ms));
  EXPECT_TRUE(stops_within(1500ms)) << "ended by its connections, not by the 2 s grace";
}

TEST_F(solo_mode, AStopRequestedInsideTheAppsPassEndsThePassThenDrains) {
  ASSERT_TRUE(start());
  test_client c = client();
  ASSERT_TRUE(c.connected());
  round_trip(c, "/before");
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(handed_over(1));
  const core_pair_stats before = stats();
  std::atomic<bool> fired{false};
  // At the app thread's next pass, inside it: stop, then stay in the pass
  // long enough for the I/O thread to look twice (it must not take the
  // sockets from a pass; it asks, and the pass gives them back at its end).
  std::function<void()> action = [&] {
    pair->request_stop();
    fired.store(true);
    std::this_thread::sleep_for(30ms);
  };
  g_pass_fd.store(pair->app().solo_fd());
  g_pass_action.store(&action);
  ASSERT_TRUE(c.send(get_request("/during")));
  const http_response r = c.read_response();
  EXPECT_TRUE(fired.load()) << "the stop was requested inside an app-thread pass";
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ok /during");
  EXPECT_TRUE(c.closed_by_server(1500ms));
  EXPECT_TRUE(stops_within(1500ms));
  const core_pair_stats s = stats();
  EXPECT_GT(s.solo_passes, before.solo_passes);
  EXPECT_EQ(s.solo_steals, before.solo_steals) << "a pass in progress is never stolen";
  EXPECT_EQ(s.requests, 2u);
  EXPECT_EQ(s.responses, 2u);
}

TEST_F(solo_mode, StopsUnderLoadNeverHang) {
  // Stops that land wherever they land: between passes, inside them, while
  // the sockets are given back. Each stop must end within the grace and
  // every response a client got must be whole.
  for (int round = 0; round < 4; ++round) {
    ASSERT_TRUE(start());
    std::atomic<bool> go{true};
    std::vector<std::thread> clients;
    std::atomic<int> bad{0};
    for (int n = 0; n < 3; ++n) {
      clients.emplace_back([&, n] {
        test_client c = client();
        for (int i = 0; go.load() && c.connected(); ++i) {
          const std::string target = numbered("/l", n * 100000 + i);
          const int burst = 1 + i % 3;
          std::string bytes;
          for (int k = 0; k < burst; ++k) {
            bytes += get_request(target);
          }
          if (!c.send(bytes)) {
            return;
          }
          for (int k = 0; k < burst; ++k) {
            const http_response r = c.read_response(false, 3s);
            if (!r.ok) {
              if (!r.status_line.empty()) {
                bad.fetch_add(1);  // a head without its body: cut short
              }
              return;
            }
            if (r.body != "ok " + target) {
              bad.fetch_add(1);
              return;
            }
          }
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds{20 + 15 * round});
    pair->request_stop();
    EXPECT_TRUE(stops_within(1800ms)) << "round " << round;
    go.store(false);
    for (std::thread& t : clients) {
      t.join();
    }
    EXPECT_EQ(bad.load(), 0) << "round " << round;
    TearDown();
  }
}

// ------------------------------------------------ opting out

TEST_F(solo_mode, DisableSoloGivesTheSocketsBack) {
  ASSERT_TRUE(start());
  test_client c = client();
  ASSERT_TRUE(c.connected());
  round_trip(c, "/warm");
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(handed_over(1));
  round_trip(c, "/solo");
  ASSERT_FALSE(HasFatalFailure());
  std::atomic<bool> held_before{false};
  std::atomic<bool> held_after{true};
  app->post([&](solo_app& a) {
    held_before.store(a.side().serves_sockets());
    a.side().disable_solo();
    held_after.store(a.side().serves_sockets());
  });
  ASSERT_TRUE(eventually([&] { return app->tasks_run.load() == 1; }, 5s));
  EXPECT_TRUE(held_before.load());
  EXPECT_FALSE(held_after.load());
  const core_pair_stats before = stats();
  for (int i = 0; i < 20; ++i) {
    round_trip(c, numbered("/io", i));  // served by the I/O thread, or not at all
    if (HasFatalFailure()) {
      return;
    }
  }
  const core_pair_stats after = stats();
  print("after disable_solo", after);
  EXPECT_EQ(after.solo_passes, before.solo_passes) << "the app thread no longer serves the sockets";
  EXPECT_EQ(after.solo_handoffs, before.solo_handoffs) << "nor is it handed them again";
  EXPECT_EQ(after.requests, 22u);
}

TEST_F(solo_mode, ZeroMaxBatchRefusesSoloMode) {
  opt.solo_max_batch = 0;
  EXPECT_FALSE(start()) << "enable_solo() refuses";
  std::atomic<int> serving{-1};
  app->post([&](solo_app& a) { serving.store(a.side().serves_sockets() ? 1 : 0); });
  ASSERT_TRUE(eventually([&] { return serving.load() >= 0; }, 5s));
  EXPECT_EQ(serving.load(), 0);
  test_client c = client();
  ASSERT_TRUE(c.connected());
  for (int i = 0; i < 20; ++i) {
    round_trip(c, numbered("/n", i));
    if (HasFatalFailure()) {
      return;
    }
  }
  const core_pair_stats s = stats();
  EXPECT_EQ(s.requests, 20u);
  EXPECT_EQ(s.solo_handoffs, 0u);
  EXPECT_EQ(s.solo_passes, 0u);
  EXPECT_EQ(app->socket_events.load(), 0u);
}

}  // namespace
