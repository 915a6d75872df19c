// The check-before-park handshake: no lost wakeups between two threads that
// ping-pong (each one sleeping as soon as it has nothing to do), none with
// several producers, and no system call while the consumer is busy.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "cadeloop/runtime/parker.hpp"
#include "cadeloop/runtime/poller.hpp"
#include "cadeloop/runtime/xthread_queue.hpp"

namespace cadeloop::runtime {
namespace {

constexpr std::uint64_t wake_token = 1;

/// What a real loop does between its last look at the queue and parking
/// (timers, the ready queue): a couple of microseconds in which a producer's
/// push lands often. Without it the window the rule covers is a few
/// nanoseconds wide and a broken rule would go unnoticed.
void bookkeeping() {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(2);
  while (std::chrono::steady_clock::now() < until) {
  }
}

/// One side of a ping-pong: an inbox, the parker guarding it and a poller to
/// sleep in. Everything but push()/wake() is used by the owning thread only.
struct endpoint {
  xthread_queue<std::uint64_t> inbox;
  parker park;
  poller poll;
  std::uint64_t announced = 0;  // try_park() calls
  std::uint64_t sleeps = 0;     // of which went to sleep
  std::uint64_t lost_wakeups = 0;

  endpoint() { EXPECT_FALSE(poll.add(park.fd(), poller::readable, wake_token)); }

  void send_to(endpoint& peer, std::uint64_t value) {
    peer.inbox.push(value);
    peer.park.wake();
  }

  /// Takes what is queued; sleeps (check before park) while nothing is.
  /// Returns false when `stop` is set. A sleep that ends by timeout with
  /// work queued that was already there before the sleep ended is a lost
  /// wakeup: the producer saw the consumer awake and the consumer saw an
  /// empty queue. (The peer answers within microseconds, so a push that
  /// races a multi-second timeout means a lost wake, not a slow peer.)
  template <class Fn>
  bool receive(Fn&& fn, const std::atomic<bool>& stop) {
    for (;;) {
      if (inbox.drain(fn) > 0) {
        return true;
      }
      if (stop.load()) {
        return false;
      }
      bookkeeping();
      ++announced;
      if (!park.try_park([&] { return !inbox.empty(); })) {
        continue;
      }
      ++sleeps;
      std::array<epoll_event, 4> events{};
      const int n = poll.wait(events, 2000);
      park.unpark(n > 0);
      if (n == 0 && !inbox.empty()) {
        ++lost_wakeups;
        return false;
      }
    }
  }
};

TEST(parker, ping_pong_between_two_threads_loses_no_wakeup) {
  constexpr std::uint64_t rounds = 50'000;
  endpoint a;
  endpoint b;
  std::atomic<bool> stop{false};
  auto give_up = [&] {
    stop.store(true);
    a.inbox.push(0);
    a.park.wake();
    b.inbox.push(0);
    b.park.wake();
  };
  std::uint64_t a_last = 0;
  std::uint64_t b_received = 0;
  std::thread pong([&] {
    while (b_received < rounds) {
      const bool ok = b.receive(
          [&](std::uint64_t&& v) {
            if (!stop.load()) {
              EXPECT_EQ(v, b_received);
              ++b_received;
              b.send_to(a, v);
            }
          },
          stop);
      if (!ok || stop.load()) {
        give_up();
        return;
      }
    }
  });
  for (std::uint64_t i = 0; i < rounds && !stop.load(); ++i) {
    a.send_to(b, i);
    if (!a.receive([&](std::uint64_t&& v) { a_last = v; }, stop)) {
      give_up();
    }
  }
  pong.join();
  std::fprintf(stderr, "sleeps %llu/%llu wakeups %llu/%llu lost %llu/%llu\n",
               (unsigned long long)a.sleeps, (unsigned long long)b.sleeps,
               (unsigned long long)a.park.wakeups_sent(), (unsigned long long)b.park.wakeups_sent(),
               (unsigned long long)a.lost_wakeups, (unsigned long long)b.lost_wakeups);
  EXPECT_EQ(a.lost_wakeups, 0u);
  EXPECT_EQ(b.lost_wakeups, 0u);
  EXPECT_EQ(a_last, rounds - 1);
  EXPECT_EQ(b_received, rounds);
  // Threads here sleep all the time, so wakes are really sent; never more
  // than one per announced park (a wake may hit a park the re-check withdrew).
  EXPECT_GT(a.sleeps + b.sleeps, 0u);
  EXPECT_GT(a.park.wakeups_sent() + b.park.wakeups_sent(), 0u);
  EXPECT_LE(a.park.wakeups_sent(), a.announced);
  EXPECT_LE(b.park.wakeups_sent(), b.announced);
}

TEST(parker, many_producers_one_sleeping_consumer_receive_everything_in_order) {
  constexpr int producers = 4;
  constexpr std::uint64_t per_producer = 20'000;
  endpoint consumer;
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      for (std::uint64_t i = 0; i < per_producer; ++i) {
        consumer.inbox.push((static_cast<std::uint64_t>(p) << 32) | i);
        consumer.park.wake();
        if (i % 1024 == 0) {
          std::this_thread::yield();
        }
      }
    });
  }
  std::array<std::uint64_t, producers> next{};
  std::uint64_t received = 0;
  const std::atomic<bool> never{false};
  while (received < producers * per_producer && consumer.lost_wakeups == 0) {
    consumer.receive([&](std::uint64_t&& v) {
      const auto p = static_cast<std::size_t>(v >> 32);
      ASSERT_LT(p, next.size());
      EXPECT_EQ(v & 0xffffffffu, next[p]) << "producer " << p << " out of order";
      next[p] = (v & 0xffffffffu) + 1;
      ++received;
    }, never);
  }
  for (auto& t : threads) {
    t.join();
  }
  EXPECT_EQ(consumer.lost_wakeups, 0u);
  EXPECT_EQ(received, producers * per_producer);
}

TEST(parker, wake_makes_no_system_call_while_the_consumer_is_awake) {
  parker park;
  for (int i = 0; i < 1000; ++i) {
    EXPECT_FALSE(park.wake());
  }
  EXPECT_EQ(park.wakeups_sent(), 0u);
  park.prepare_park();
  EXPECT_TRUE(park.wake());
  // One wake per sleep: the second producer finds the flag already taken.
  EXPECT_FALSE(park.wake());
  EXPECT_EQ(park.wakeups_sent(), 1u);
  EXPECT_FALSE(park.parked());
}

TEST(parker, a_wake_makes_the_eventfd_readable_and_unpark_drains_it) {
  parker park;
  poller poll;
  ASSERT_FALSE(poll.add(park.fd(), poller::readable, wake_token));
  std::array<epoll_event, 2> events{};
  EXPECT_EQ(poll.wait(events, 0), 0);
  park.prepare_park();
  park.wake();
  ASSERT_EQ(poll.wait(events, 1000), 1);
  EXPECT_EQ(std::uint64_t{events[0].data.u64}, wake_token);
  park.unpark(true);
  EXPECT_EQ(poll.wait(events, 0), 0);
}

TEST(xthread_queue, drain_hands_items_out_oldest_first_and_destroys_leftovers) {
  xthread_queue<std::unique_ptr<int>> q;
  EXPECT_TRUE(q.empty());
  for (int i = 0; i < 5; ++i) {
    q.push(std::make_unique<int>(i));
  }
  EXPECT_FALSE(q.empty());
  std::vector<int> seen;
  EXPECT_EQ(q.drain([&](std::unique_ptr<int>&& v) noexcept { seen.push_back(*v); }), 5u);
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(q.empty());
  q.push(std::make_unique<int>(7));  // freed by the destructor (ASan checks)
}

}  // namespace
}  // namespace cadeloop::runtime
