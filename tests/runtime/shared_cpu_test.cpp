// The pair's shared-CPU yield window (runtime/include/cadeloop/runtime/
// shared_cpu.hpp): with both threads of a real pair confined to one CPU and
// shared_cpu_yield set, each thread yields to the other before it parks.
// What a client sees must not change (every answer right, in order, on one
// connection and on many); what changes is visible in the pair's counters:
// the I/O thread hardly ever writes the app's eventfd.

#include "pair_fixture.hpp"
#include "test_client.hpp"

#include <cadeloop/runtime/shared_cpu.hpp>

#include <gtest/gtest.h>

#include <sched.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using cadeloop::test::get_request;
using cadeloop::test::http_response;
using cadeloop::test::test_client;

std::string numbered(const char* prefix, int n) {
  char text[64];
  std::snprintf(text, sizeof text, "%s%d", prefix, n);
  return text;
}

// Confines the calling thread to one CPU (the first it may use) while in
// scope; threads it starts meanwhile (the pair's I/O thread, the fake app
// thread) keep that CPU.
class one_cpu_scope {
 public:
  one_cpu_scope() {
    ::sched_getaffinity(0, sizeof saved_, &saved_);
    while (!CPU_ISSET(cpu_, &saved_)) {
      ++cpu_;
    }
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu_, &one);
    ::sched_setaffinity(0, sizeof one, &one);
  }
  ~one_cpu_scope() { ::sched_setaffinity(0, sizeof saved_, &saved_); }
  one_cpu_scope(const one_cpu_scope&) = delete;
  one_cpu_scope& operator=(const one_cpu_scope&) = delete;

  [[nodiscard]] std::size_t cpu() const noexcept { return cpu_; }

 private:
  cpu_set_t saved_{};
  std::size_t cpu_ = 0;
};

class shared_cpu : public cadeloop::test::pair_fixture {
 protected:
  // Starts the pair with both threads on one CPU; the test thread (the
  // client) then runs on the other CPUs, when there are others, so that it
  // does not compete with the pair for its CPU. TearDown gives it all back.
  void SetUp() override {
    pair_fixture::SetUp();
    ::sched_getaffinity(0, sizeof saved_, &saved_);
  }

  void start_on_one_cpu(std::chrono::microseconds window) {
    opt.shared_cpu_yield = window;
    std::size_t pair_cpu = 0;
    {
      one_cpu_scope scope;
      pair_cpu = scope.cpu();
      start();
    }
    cpu_set_t others = saved_;
    CPU_CLR(pair_cpu, &others);
    if (CPU_COUNT(&others) > 0) {
      ::sched_setaffinity(0, sizeof others, &others);
    }
  }

  void TearDown() override {
    pair_fixture::TearDown();
    ::sched_setaffinity(0, sizeof saved_, &saved_);
  }

  // `n` requests one after another on one connection; every answer checked.
  void one_connection(int n) {
    test_client c = client();
    ASSERT_TRUE(c.connected());
    for (int i = 0; i < n; ++i) {
      const std::string target = numbered("/r", i);
      ASSERT_TRUE(c.send(get_request(target)));
      const http_response r = c.read_response();
      ASSERT_TRUE(r.ok) << i;
      ASSERT_EQ(r.status, 200);
      ASSERT_EQ(r.body, "ok " + target + numbered(" #", i));
    }
  }

  cpu_set_t saved_{};
};

// ------------------------------------------------ the window on its own

using cadeloop::runtime::shared_cpu_yield;
using outcome = shared_cpu_yield::outcome;

TEST(shared_cpu_yield, EndsAtWorkAtAParkedPeerOrAtTheDeadline) {
  shared_cpu_yield y;
  int checks = 0;
  EXPECT_EQ(y.run(
                1s, [&] { return ++checks == 3; }, [] { return false; }),
            outcome::found);
  EXPECT_EQ(checks, 3);  // looked again after each yield
  EXPECT_EQ(y.run(
                1s, [] { return false; }, [] { return true; }),
            outcome::peer_asleep);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(y.run(
                2ms, [] { return false; }, [] { return false; }),
            outcome::expired);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 2ms);
  EXPECT_EQ(y.windows(), 3u);
  EXPECT_EQ(y.hits(), 1u);
}

TEST(shared_cpu_yield, BacksOffAfterFruitlessWindowsAndProbes) {
  shared_cpu_yield y;
  const auto nothing = [] { return false; };
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(y.run(0us, nothing, nothing), outcome::expired) << i;
  }
  // Eight misses in a row: 15 parks in 16 skip the window, the 16th probes.
  int skipped = 0;
  for (int i = 0; i < 16; ++i) {
    skipped += y.run(0us, nothing, nothing) == outcome::skipped ? 1 : 0;
  }
  EXPECT_EQ(skipped, 15);
  // A probe that finds work ends the back-off.
  outcome o = outcome::skipped;
  while ((o = y.run(
              1s, [] { return true; }, nothing)) == outcome::skipped) {
  }
  EXPECT_EQ(o, outcome::found);
  EXPECT_EQ(y.run(
                1s, [] { return true; }, nothing),
            outcome::found);
  // A parked peer is not a miss.
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(y.run(1s, nothing, [] { return true; }), outcome::peer_asleep) << i;
  }
}

TEST(sole_cpu, NamesTheOneCpuOrMinusOne) {
  cpu_set_t all;
  ::sched_getaffinity(0, sizeof all, &all);
  {
    one_cpu_scope scope;
    cpu_set_t now;
    ::sched_getaffinity(0, sizeof now, &now);
    const int cpu = cadeloop::runtime::sole_cpu();
    ASSERT_GE(cpu, 0);
    EXPECT_TRUE(CPU_ISSET(static_cast<std::size_t>(cpu), &now));
  }
  if (CPU_COUNT(&all) > 1) {
    EXPECT_EQ(cadeloop::runtime::sole_cpu(), -1);  // the affinity given back allows several
  } else {
    EXPECT_GE(cadeloop::runtime::sole_cpu(), 0);
  }
}

TEST_F(shared_cpu, OneConnectionIsServedInOrderAndAnswersAreTakenWithoutAWake) {
  // A long window: the client shares a busy machine, and the window ends
  // early anyway when the peer parks.
  start_on_one_cpu(20ms);
  constexpr int total = 300;
  one_connection(total);
  const auto s = pair->stats();
  EXPECT_EQ(s.requests, static_cast<std::uint64_t>(total));
  std::printf(
      "shared CPU, yield on: %llu requests, %llu wakeups to the app, %llu to the I/O thread, "
      "%llu app parks, %llu I/O yield windows (%llu found work)\n",
      static_cast<unsigned long long>(s.requests),
      static_cast<unsigned long long>(s.wakeups_to_app),
      static_cast<unsigned long long>(s.wakeups_to_io),
      static_cast<unsigned long long>(s.app_parks), static_cast<unsigned long long>(s.spins),
      static_cast<unsigned long long>(s.spin_hits));
  // With the window the I/O thread yields to the app and takes each answer
  // awake; without it (the next test) the two park and wake each other.
  EXPECT_LT(s.wakeups_to_io, s.requests / 2);
  EXPECT_GT(s.spin_hits, s.requests / 2);
  // The app does not yield back to an idle I/O thread through the client's
  // think time (both would only hand the CPU to each other): it parks.
  EXPECT_GE(s.app_parks, s.requests / 2);
}

TEST_F(shared_cpu, ThreadsOnSeveralCpusDoNotYield) {
  cpu_set_t all;
  ::sched_getaffinity(0, sizeof all, &all);
  if (CPU_COUNT(&all) < 2) {
    GTEST_FAIL() << "this test needs two CPUs";
  }
  opt.shared_cpu_yield = 5ms;
  start();  // not confined: the window never runs, the pair parks as before
  one_connection(50);
  const auto s = pair->stats();
  EXPECT_EQ(s.requests, 50u);
  EXPECT_EQ(s.spins, 0u);
}

TEST_F(shared_cpu, WithoutTheWindowThePairParksAndWakes) {
  start_on_one_cpu(0us);
  constexpr int total = 100;
  one_connection(total);
  const auto s = pair->stats();
  EXPECT_GE(s.wakeups_to_app + s.wakeups_to_io, s.requests);
  EXPECT_EQ(s.spins, 0u);
}

TEST_F(shared_cpu, ManyConnectionsAndPipelinedBatchesStayInOrder) {
  start_on_one_cpu(50us);
  constexpr int clients = 16;
  constexpr int batches = 10;
  constexpr int depth = 8;
  std::vector<std::string> failures(clients);
  std::vector<std::thread> threads;
  for (int n = 0; n < clients; ++n) {
    threads.emplace_back([&, n] {
      std::string& failure = failures[static_cast<std::size_t>(n)];
      test_client c = client();
      if (!c.connected()) {
        failure = "not connected";
        return;
      }
      for (int b = 0; b < batches; ++b) {
        std::string burst;
        for (int k = 0; k < depth; ++k) {
          burst += get_request(numbered("/c", n * 1000 + b * depth + k));
        }
        if (!c.send(burst)) {
          failure = "send failed";
          return;
        }
        for (int k = 0; k < depth; ++k) {
          const http_response r = c.read_response();
          const std::string target = numbered("/c", n * 1000 + b * depth + k);
          if (!r.ok || r.status != 200 || r.body.rfind("ok " + target + " #", 0) != 0) {
            failure = std::string{"bad answer for "}.append(target).append(": ").append(r.body);
            return;
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
  EXPECT_EQ(pair->stats().requests, static_cast<std::uint64_t>(clients * batches * depth));
}

}  // namespace
