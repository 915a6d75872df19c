// Tests for cadeloop::http::request_parser's storage: made at the first
// feed, kept across reset(), freed by release() (a connection gone
// WebSocket), made again after a reset() of a released parser.

#include <cadeloop/http/request_parser.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string_view>
#include <vector>

namespace {

using namespace cadeloop::http;

constexpr std::string_view upgrade =
    "GET /chat HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
constexpr std::string_view get = "GET /x HTTP/1.1\r\nHost: a\r\n\r\n";

TEST(request_parser_storage, MadeAtTheFirstFeedAndKeptAcrossReset) {
  request_parser parser;
  EXPECT_FALSE(parser.holds_state());
  EXPECT_TRUE(parser.events().empty());
  EXPECT_FALSE(parser.mid_message());
  EXPECT_EQ(parser.feed(get).status, feed_status::ok);
  EXPECT_TRUE(parser.holds_state());
  ASSERT_EQ(parser.events().size(), 2u);
  EXPECT_EQ(parser.events()[0].head->path(), "/x");
  parser.reset();
  EXPECT_TRUE(parser.holds_state());
  EXPECT_EQ(parser.feed(get).consumed, get.size());
}

TEST(request_parser_storage, ReleaseFreesItAndTheParserTakesNoMoreInput) {
  head_pool pool;
  request_parser parser;
  parser.use_pool(&pool);
  const feed_result r = parser.feed(upgrade);
  ASSERT_EQ(r.status, feed_status::upgraded);
  ASSERT_EQ(parser.events().size(), 2u);
  std::unique_ptr<request_head> head = parser.take_head(parser.events()[0]);
  ASSERT_NE(head, nullptr);
  EXPECT_TRUE(head->websocket_upgrade());

  parser.release();
  EXPECT_FALSE(parser.holds_state());
  EXPECT_TRUE(parser.events().empty());
  EXPECT_FALSE(parser.mid_message());
  EXPECT_EQ(parser.error().status, 0);
  const feed_result again = parser.feed(get);
  EXPECT_EQ(again.status, feed_status::upgraded);
  EXPECT_EQ(again.consumed, 0u);
  EXPECT_FALSE(parser.holds_state());  // feeding a released parser makes nothing

  // The upgrade's head, back from the app after the release, goes to the pool.
  parser.recycle_head(std::move(head));
  EXPECT_EQ(pool.size(), 1u);
}

TEST(request_parser_storage, AReleasedParserResetForANewConnectionParsesAgain) {
  head_pool pool;
  request_parser parser{request_limits{.max_url = 16}};
  parser.use_pool(&pool);
  parser.set_credit(1);
  ASSERT_EQ(parser.feed(upgrade).status, feed_status::upgraded);
  parser.release();
  parser.reset();
  EXPECT_EQ(parser.credit(), 0u);  // the upgrade took the credit; the release keeps that
  parser.add_credit(2);
  EXPECT_EQ(parser.credit(), 2u);
  // The new storage has the parser's limits, credit and pool.
  const std::string_view two =
      "GET /a HTTP/1.1\r\nHost: a\r\n\r\nGET /b HTTP/1.1\r\nHost: a\r\n\r\n";
  EXPECT_EQ(parser.feed(two).consumed, two.size());
  ASSERT_EQ(parser.events().size(), 4u);
  EXPECT_EQ(parser.credit(), 0u);
  parser.recycle_head(parser.take_head(parser.events()[0]));
  EXPECT_EQ(pool.size(), 1u);
  parser.reset();
  parser.set_credit(request_parser::unlimited_credit);
  const feed_result too_long = parser.feed("GET /a-target-over-16 HTTP/1.1\r\nHost: a\r\n\r\n");
  EXPECT_EQ(too_long.status, feed_status::error);
  EXPECT_EQ(parser.error().status, 414);
}

// A burst of heads lent at once (64 connections pipelining 16 requests) comes
// back to the pool and is reused whole: the next burst allocates nothing.
TEST(head_pool, KeepsABurstUpToItsCapAndLendsTheSameHeadsAgain) {
  head_pool pool{256, 4096, 1u << 20};
  std::vector<std::unique_ptr<request_head>> lent;
  for (int i = 0; i < 1024; ++i) {
    lent.push_back(std::make_unique<request_head>());
  }
  std::vector<const request_head*> first;
  for (auto& h : lent) {
    first.push_back(h.get());
    pool.give(std::move(h));
  }
  EXPECT_EQ(pool.size(), 1024u);
  lent.clear();
  for (int i = 0; i < 1024; ++i) {
    std::unique_ptr<request_head> h = pool.take();
    ASSERT_NE(h, nullptr) << i;
    lent.push_back(std::move(h));
  }
  EXPECT_EQ(pool.take(), nullptr);
  std::vector<const request_head*> again;
  for (auto& h : lent) {
    again.push_back(h.get());
  }
  std::sort(first.begin(), first.end());
  std::sort(again.begin(), again.end());
  EXPECT_EQ(first, again);
}

TEST(head_pool, FreesBeyondItsCap) {
  head_pool pool{2, 8, 1u << 20};
  for (int i = 0; i < 12; ++i) {
    pool.give(std::make_unique<request_head>());
  }
  EXPECT_EQ(pool.size(), 8u);
}

// Heads that sat in the pool through a whole window were not needed by that
// window's load: they are freed, down to the floor.
TEST(head_pool, GivesBackWhatAWindowDidNotUse) {
  head_pool pool{2, 100, 10};
  for (int i = 0; i < 10; ++i) {  // the first window: 10 gives
    pool.give(std::make_unique<request_head>());
  }
  EXPECT_EQ(pool.size(), 10u);   // nothing has been idle for a whole window yet
  for (int i = 0; i < 5; ++i) {  // the second: one head lent at a time
    std::unique_ptr<request_head> h = pool.take();
    ASSERT_NE(h, nullptr);
    pool.give(std::move(h));
  }
  // 9 stayed through the window; freed down to the floor of 2.
  EXPECT_EQ(pool.size(), 2u);

  // Heads the load used in every window stay, whatever the floor.
  head_pool busy{0, 100, 8};
  for (int round = 0; round < 6; ++round) {
    std::vector<std::unique_ptr<request_head>> out;
    for (int i = 0; i < 4; ++i) {
      std::unique_ptr<request_head> h = busy.take();
      out.push_back(h ? std::move(h) : std::make_unique<request_head>());
    }
    for (auto& h : out) {
      busy.give(std::move(h));
    }
  }
  EXPECT_EQ(busy.size(), 4u);
}

}  // namespace
