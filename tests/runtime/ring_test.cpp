// Tests for cadeloop::runtime::ordered_ring with runtime::parker: order,
// batching, and a ping-pong stress with real wakeups (also run under TSan).
//
// The busy ping-pong publishes every message on its own (one per pass, the
// worst case for wakeups) and asserts that check-before-park still keeps
// eventfd writes far below one per message. The rule was made to fail on
// purpose once, by making wake_peer() below write the eventfd on every
// publish: the test went red (0.54 wakeups per message against about 0.001).

#include <cadeloop/runtime/parker.hpp>
#include <cadeloop/runtime/ring.hpp>

#include <gtest/gtest.h>

#include <poll.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace {

using cadeloop::runtime::ordered_ring;
using cadeloop::runtime::parker;

struct msg {
  std::uint64_t seq = 0;
  std::uint64_t payload = 0;
};

// The producer's half of check-before-park: an eventfd write only if the peer
// announced a sleep.
std::uint64_t wake_peer(parker& p) { return p.wake() ? 1 : 0; }

// Sleeps on `p` unless `ring` has work; counts sleeps that ended by the
// safety timeout while work was waiting (a lost wakeup).
template <class T>
void park_on(parker& p, const ordered_ring<T>& ring, std::uint64_t& parks, std::uint64_t& lost) {
  if (!p.try_park([&] { return ring.has_pending(); })) {
    return;
  }
  ++parks;
  pollfd fd{p.fd(), POLLIN, 0};
  const int r = ::poll(&fd, 1, 2000);
  p.unpark(r > 0);
  if (r == 0 && ring.has_pending()) {
    ++lost;
  }
}

TEST(ring, DeliversInOrderAcrossBatches) {
  ordered_ring<msg> ring{4};
  std::uint64_t next = 0;
  std::uint64_t expect = 0;
  for (int round = 0; round < 50; ++round) {
    const int n = round * 7 % 100;
    for (int i = 0; i < n; ++i) {
      ring.stage({next++, 0});
    }
    EXPECT_EQ(ring.publish(), static_cast<std::size_t>(n));
    EXPECT_EQ(ring.depth(), static_cast<std::uint64_t>(n));
    EXPECT_EQ(ring.has_pending(), n != 0);
    ring.drain([&](const msg& m) { EXPECT_EQ(m.seq, expect++); }, 10);  // partial drain
    ring.drain([&](const msg& m) { EXPECT_EQ(m.seq, expect++); });
    EXPECT_FALSE(ring.has_pending());
  }
  EXPECT_EQ(expect, next);
}

TEST(ring, StagedItemsAreInvisibleUntilPublished) {
  ordered_ring<msg> ring;
  ring.stage({1, 0});
  EXPECT_FALSE(ring.has_pending());
  EXPECT_EQ(ring.drain([](const msg&) {}), 0u);
  EXPECT_EQ(ring.publish(), 1u);
  EXPECT_TRUE(ring.has_pending());
}

TEST(ring, AThrowingConsumerKeepsTheRestQueued) {
  ordered_ring<msg> ring;
  for (std::uint64_t i = 0; i < 5; ++i) {
    ring.stage({i, 0});
  }
  ring.publish();
  EXPECT_THROW(ring.drain([](const msg& m) {
    if (m.seq == 2) {
      throw std::runtime_error("boom");
    }
  }),
               std::runtime_error);
  std::vector<std::uint64_t> rest;
  ring.drain([&](const msg& m) { rest.push_back(m.seq); });
  EXPECT_EQ(rest, (std::vector<std::uint64_t>{3, 4}));
}

struct pingpong_result {
  std::uint64_t messages = 0;
  std::uint64_t wakeups = 0;
  std::uint64_t parks = 0;
  std::uint64_t lost = 0;
  bool in_order = true;
};

// Work the echo side does per message, so that it is the busy side.
std::uint64_t busy_work(std::uint64_t x, int rounds) {
  for (int i = 0; i < rounds; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
  }
  return x;
}

// A drives `total` messages through B and back with at most `window` in
// flight, staging at most `per_pass` per pass of its loop; B does `work`
// rounds per message. Both sides publish once per pass and park with
// check-before-park.
pingpong_result ping_pong(std::uint64_t total, std::uint64_t window, std::uint64_t per_pass, int work) {
  ordered_ring<msg> a_to_b;
  ordered_ring<msg> b_to_a;
  parker a_parker;
  parker b_parker;
  std::atomic<std::uint64_t> b_wakeups{0};
  std::atomic<std::uint64_t> b_parks{0};
  std::atomic<std::uint64_t> b_lost{0};
  std::atomic<std::uint64_t> sink{0};

  std::thread echo{[&] {
    std::uint64_t echoed = 0;
    std::uint64_t wakeups = 0;
    std::uint64_t parks = 0;
    std::uint64_t lost = 0;
    std::uint64_t acc = 0;
    while (echoed < total) {
      const std::size_t n = a_to_b.drain([&](const msg& m) {
        acc += busy_work(m.seq, work);
        b_to_a.stage({m.seq, m.payload + 1});
        ++echoed;
      });
      if (b_to_a.publish() != 0) {
        wakeups += wake_peer(a_parker);
      }
      if (n == 0) {
        park_on(b_parker, a_to_b, parks, lost);
      }
    }
    sink = acc;
    b_wakeups = wakeups;
    b_parks = parks;
    b_lost = lost;
  }};

  pingpong_result r;
  std::uint64_t sent = 0;
  std::uint64_t received = 0;
  while (received < total) {
    for (std::uint64_t i = 0; i < per_pass && sent < total && sent - received < window; ++i) {
      a_to_b.stage({sent, sent * 3});
      ++sent;
    }
    if (a_to_b.publish() != 0) {
      r.wakeups += wake_peer(b_parker);
    }
    const std::size_t n = b_to_a.drain([&](const msg& m) {
      r.in_order = r.in_order && m.seq == received && m.payload == m.seq * 3 + 1;
      ++received;
    });
    if (n == 0 && (sent == total || sent - received >= window)) {
      park_on(a_parker, b_to_a, r.parks, r.lost);
    }
  }
  echo.join();
  r.messages = total * 2;
  r.wakeups += b_wakeups;
  r.parks += b_parks;
  r.lost += b_lost;
  return r;
}

TEST(ring, StrictPingPongNeverLosesAWakeup) {
  // One message in flight: every exchange parks, so every exchange races
  // a publish against a prepare_park. A lost wakeup shows as a 2 s sleep
  // that ended with work waiting.
  const pingpong_result r = ping_pong(20000, 1, 1, 0);
  EXPECT_TRUE(r.in_order);
  EXPECT_EQ(r.lost, 0u);
  EXPECT_LE(r.wakeups, r.messages);
}

TEST(ring, BusyPingPongWakesFarLessThanOncePerMessage) {
  const pingpong_result r = ping_pong(200000, 1024, 1, 64);
  EXPECT_TRUE(r.in_order);
  EXPECT_EQ(r.lost, 0u);
  const double per_message = static_cast<double>(r.wakeups) / static_cast<double>(r.messages);
  std::printf("busy ping-pong: %llu messages, %llu wakeups (%.4f per message), %llu parks\n",
              static_cast<unsigned long long>(r.messages), static_cast<unsigned long long>(r.wakeups), per_message,
              static_cast<unsigned long long>(r.parks));
  EXPECT_LT(per_message, 0.1) << "check-before-park should make wakeups rare while both sides are busy";
}

}  // namespace
