// The watchdog of a real core pair (runtime/io_thread_watchdog.cpp): an app
// thread blocked while it has work marks the pair stuck after stuck_timeout
// and takes its listener out of the SO_REUSEPORT group (a connection is
// refused, not queued for nobody); the pair serves again once the app
// returns; an idle app is never stuck; stuck_timeout 0 turns it off.
#include "pair_fixture.hpp"

#include <atomic>
#include <chrono>
#include <thread>

namespace cadeloop::test {
namespace {

using namespace std::chrono_literals;
using runtime::pair_state;

class watchdog_test : public pair_fixture {
 protected:
  void SetUp() override {
    pair_fixture::SetUp();
    opt.stuck_timeout = 500ms;  // a loaded CI machine may not run a busy thread for 200 ms
  }
  void TearDown() override {
    release.store(true);
    pair_fixture::TearDown();
  }

  // An app whose "/block" request blocks its thread until `release`.
  void start_blocking() {
    start([this](fake_app&, runtime::inbound_message& m) {
      if (m.kind == runtime::inbound_kind::request && m.head->target() == "/block") {
        while (!release.load()) {
          std::this_thread::sleep_for(5ms);
        }
      }
      return false;
    });
  }

  bool wait_state(pair_state s, std::chrono::milliseconds timeout = 5s) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      if (pair->stats().state == s) {
        return true;
      }
      std::this_thread::sleep_for(10ms);
    }
    return pair->stats().state == s;
  }

  std::atomic<bool> release{false};
};

TEST_F(watchdog_test, a_blocked_app_marks_the_pair_stuck_and_the_listener_leaves) {
  start_blocking();
  const std::uint16_t port = pair->local_address().port;
  test_client blocked = client();
  ASSERT_TRUE(blocked.send("GET /block HTTP/1.1\r\nHost: x\r\n\r\n"));
  ASSERT_TRUE(wait_state(pair_state::stuck))
      << "requests " << pair->stats().requests << ", loop ticks " << pair->stats().loop_ticks
      << ", beat " << pair->stats().io_beat_ms;
  EXPECT_EQ(pair->stats().stuck_episodes, 1U);
  EXPECT_GT(pair->stats().io_beat_ms, 0U);
  EXPECT_GT(pair->stats().stuck_since_ms, 0U);
  // The only listener of the port left its group: refused, not queued.
  EXPECT_FALSE(test_client::tcp(port).connected());

  release.store(true);
  const http_response r = blocked.read_response();
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.status, 200);
  ASSERT_TRUE(wait_state(pair_state::serving));
  EXPECT_EQ(pair->stats().stuck_since_ms, 0U);
  // Listening again on the same socket.
  test_client again = test_client::tcp(port);
  ASSERT_TRUE(again.connected());
  ASSERT_TRUE(again.send("GET /after HTTP/1.1\r\nHost: x\r\n\r\n"));
  const http_response after = again.read_response();
  EXPECT_TRUE(after.ok);
  EXPECT_EQ(after.status, 200);
  EXPECT_EQ(pair->stats().stuck_episodes, 1U);
}

TEST_F(watchdog_test, an_idle_app_is_never_stuck) {
  start_blocking();
  test_client c = client();
  ASSERT_TRUE(c.send("GET /quick HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_EQ(c.read_response().status, 200);
  std::this_thread::sleep_for(1600ms);  // more than three timeouts with nothing to do
  EXPECT_EQ(pair->stats().state, pair_state::serving);
  EXPECT_EQ(pair->stats().stuck_episodes, 0U);
}

TEST_F(watchdog_test, stuck_timeout_0_turns_it_off) {
  opt.stuck_timeout = 0ms;
  start_blocking();
  test_client blocked = client();
  ASSERT_TRUE(blocked.send("GET /block HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::this_thread::sleep_for(700ms);
  EXPECT_EQ(pair->stats().state, pair_state::serving);
  EXPECT_EQ(pair->stats().io_beat_ms, 0U);
  EXPECT_TRUE(client().connected());
}

}  // namespace
}  // namespace cadeloop::test
