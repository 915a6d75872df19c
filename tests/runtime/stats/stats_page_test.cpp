// The per-pair stats page: histogram buckets and percentiles, a page in a
// MAP_SHARED region written by a forked child and read by its parent, and a
// real core pair placed on a region's page counting real HTTP requests.

#include "fake_app.hpp"
#include "test_client.hpp"

#include <cadeloop/runtime/core_pair.hpp>
#include <cadeloop/runtime/stats/stats_page.hpp>

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using cadeloop::net::latency_buckets;
using cadeloop::net::listen_spec;
using cadeloop::runtime::core_pair;
using cadeloop::runtime::core_pair_options;
using cadeloop::runtime::inbound_kind;
using cadeloop::runtime::latency_percentile_us;
using cadeloop::runtime::merge;
using cadeloop::runtime::pair_state;
using cadeloop::runtime::pair_stats_page;
using cadeloop::runtime::pair_stats_snapshot;
using cadeloop::runtime::snapshot;
using cadeloop::runtime::stats_region;
using cadeloop::test::fake_app;
using cadeloop::test::get_request;
using cadeloop::test::http_response;
using cadeloop::test::eventually;
using cadeloop::test::test_client;

// The exact q quantile of sorted values, by the same rank rule (ceil(q*n)).
std::uint64_t exact_quantile(const std::vector<std::uint64_t>& sorted, double q) {
  auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  rank = std::clamp<std::size_t>(rank, 1, sorted.size());
  return sorted[rank - 1];
}

// ---------------------------------------------------------------- buckets

TEST(latency_buckets, EveryBucketHoldsExactlyItsRangeAndIsNarrow) {
  for (std::size_t i = 0; i + 1 < latency_buckets::count; ++i) {
    SCOPED_TRACE(i);
    const std::uint64_t lo = latency_buckets::lower_bound_us(i);
    const std::uint64_t hi = latency_buckets::upper_bound_us(i);
    ASSERT_LT(lo, hi);
    EXPECT_EQ(latency_buckets::index_of(lo), i);
    EXPECT_EQ(latency_buckets::index_of(hi - 1), i);
    EXPECT_EQ(latency_buckets::index_of(hi), i + 1);
    EXPECT_EQ(pair_stats_snapshot::bucket_upper_us(i), hi);
    // Width at most 1/8 of the lower bound (1 µs at the bottom).
    EXPECT_LE((hi - lo) * 8, std::max<std::uint64_t>(lo, 8));
  }
  EXPECT_EQ(latency_buckets::index_of(0), 0u);
  // An hour is bucketed; the top bound is 2^32 µs (about 71.6 minutes).
  EXPECT_LT(latency_buckets::index_of(3'600'000'000ULL), latency_buckets::count - 1);
  EXPECT_EQ(latency_buckets::index_of(UINT64_MAX), latency_buckets::count - 1);
  EXPECT_EQ(pair_stats_snapshot::bucket_upper_us(latency_buckets::count - 1), UINT64_MAX);
}

// ---------------------------------------------------------------- percentiles

void check_percentiles(const std::vector<std::uint64_t>& values) {
  auto page = std::make_unique<pair_stats_page>();
  page->init(0);
  for (const std::uint64_t v : values) {
    page->io.latency.record(v);
  }
  const pair_stats_snapshot s = snapshot(*page);
  ASSERT_TRUE(s.valid);
  EXPECT_EQ(s.latency_count, values.size());
  std::uint64_t sum = 0;
  for (const std::uint64_t v : values) {
    sum += v;
  }
  EXPECT_EQ(s.latency_sum_us, sum);
  std::vector<std::uint64_t> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  for (const double q : {0.5, 0.9, 0.99, 0.999, 1.0}) {
    SCOPED_TRACE(q);
    const auto exact = static_cast<double>(exact_quantile(sorted, q));
    const double estimate = latency_percentile_us(s, q);
    // The documented bound: never below, at most 12.5 % (or 1 µs) above.
    EXPECT_GE(estimate, exact);
    EXPECT_LE(estimate, std::max(exact * 1.125, exact + 1.0));
  }
}

TEST(latency_percentiles, UniformDistributionWithinTheDocumentedBound) {
  std::vector<std::uint64_t> values;
  for (std::uint64_t v = 1; v <= 100'000; ++v) {
    values.push_back(v);
  }
  check_percentiles(values);
  // And the figures themselves, for a reader: p50 of 1..100000 is 50000,
  // read back as the upper bound of its bucket [49152, 53248).
  auto page = std::make_unique<pair_stats_page>();
  page->init(0);
  for (const std::uint64_t v : values) {
    page->io.latency.record(v);
  }
  EXPECT_EQ(latency_percentile_us(snapshot(*page), 0.5), 53248.0);
}

TEST(latency_percentiles, LogNormalDistributionWithinTheDocumentedBound) {
  std::mt19937_64 rng{42};
  std::lognormal_distribution<double> dist{6.0, 1.5};  // median ~400 µs, long tail
  std::vector<std::uint64_t> values;
  for (int i = 0; i < 200'000; ++i) {
    values.push_back(static_cast<std::uint64_t>(dist(rng)));
  }
  check_percentiles(values);
}

TEST(latency_percentiles, SmallAndEmpty) {
  auto page = std::make_unique<pair_stats_page>();
  page->init(0);
  EXPECT_EQ(latency_percentile_us(snapshot(*page), 0.99), 0.0);
  page->io.latency.record(3);
  EXPECT_EQ(latency_percentile_us(snapshot(*page), 0.5), 4.0);  // [3, 4)
  check_percentiles({0, 0, 1, 7, 8, 9, 1000, 1'000'000, 3'600'000'000ULL});
}

TEST(stats_snapshot, MergeAddsCountersAndBuckets) {
  auto a = std::make_unique<pair_stats_page>();
  auto b = std::make_unique<pair_stats_page>();
  a->init(0);
  b->init(1);
  a->claim();
  b->claim();
  a->io.requests.add(3);
  b->io.requests.add(4);
  a->io.count_status(200);
  b->io.count_status(404);
  b->io.count_status(503);
  a->io.latency.record(10);
  b->io.latency.record(1000);
  a->set_state(pair_state::serving);
  b->set_state(pair_state::draining);
  const std::vector<pair_stats_snapshot> pairs = {snapshot(*a), snapshot(*b),
                                                  pair_stats_snapshot{}};
  const pair_stats_snapshot total = merge(pairs);
  EXPECT_TRUE(total.valid);
  EXPECT_EQ(total.requests, 7u);
  EXPECT_EQ(total.responses_2xx, 1u);
  EXPECT_EQ(total.responses_4xx, 1u);
  EXPECT_EQ(total.responses_5xx, 1u);
  EXPECT_EQ(total.latency_count, 2u);
  EXPECT_EQ(total.latency_sum_us, 1010u);
  EXPECT_EQ(total.state, pair_state::draining);
  EXPECT_EQ(total.pid, 0);
  EXPECT_EQ(latency_percentile_us(total, 1.0),
            static_cast<double>(latency_buckets::upper_bound_us(latency_buckets::index_of(1000))));
}

// ---------------------------------------------------------------- shared memory

TEST(stats_region, PageWrittenByForkedChildIsReadByParent) {
  stats_region region{3};
  ASSERT_EQ(region.size(), 3u);
  for (std::size_t i = 0; i < region.size(); ++i) {
    const pair_stats_snapshot s = snapshot(region.page(i));
    EXPECT_TRUE(s.valid);
    EXPECT_EQ(s.index, i);
    EXPECT_EQ(s.state, pair_state::unused);
  }
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The child: a pair's threads would write these; plain stores suffice here.
    pair_stats_page& p = region.page(1);
    p.claim();
    p.set_state(pair_state::serving);
    for (int i = 0; i < 1000; ++i) {
      p.io.requests.add();
      p.io.responses.add();
      p.io.count_status(i % 10 == 0 ? 500 : 200);
      p.io.latency.record(static_cast<std::uint64_t>(i));
    }
    p.app.loop_ticks.add(7);
    p.io_loop.inbound_published.add(10);
    p.app.inbound_taken.add(4);
    p.set_state(pair_state::stopped);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);

  const std::vector<pair_stats_snapshot> all = region.snapshot_all();
  ASSERT_EQ(all.size(), 3u);
  const pair_stats_snapshot& s = all[1];
  ASSERT_TRUE(s.valid);
  EXPECT_EQ(s.index, 1u);
  EXPECT_EQ(s.pid, child);
  EXPECT_EQ(s.state, pair_state::stopped);
  EXPECT_GT(s.started_unix_ms, 0u);
  EXPECT_EQ(s.requests, 1000u);
  EXPECT_EQ(s.responses_2xx, 900u);
  EXPECT_EQ(s.responses_5xx, 100u);
  EXPECT_EQ(s.latency_count, 1000u);
  EXPECT_EQ(s.loop_ticks, 7u);
  EXPECT_EQ(s.inbound_messages, 10u);
  EXPECT_EQ(s.inbound_depth, 6u);
  EXPECT_EQ(all[0].state, pair_state::unused);
  EXPECT_EQ(all[2].requests, 0u);
}

// ---------------------------------------------------------------- a real pair

TEST(stats_page_pair, PairOnARegionPageCountsRealRequests) {
  stats_region region{2};
  core_pair_options opt;
  opt.listen = listen_spec::tcp("127.0.0.1", 0);
  opt.grace = 1s;
  opt.stats_page = &region.page(1);
  auto pair = std::make_unique<core_pair>(opt);
  EXPECT_EQ(snapshot(region.page(1)).state, pair_state::starting);
  ASSERT_EQ(pair->start(), "");
  auto app = std::make_unique<fake_app>(pair->app());
  // /missing -> 404, /slow -> 200 after 30 ms, anything else the default 200.
  app->set_hook([](fake_app& a, cadeloop::runtime::inbound_message& m) {
    if (m.kind != inbound_kind::request) {
      return false;
    }
    const std::string target{m.head->target()};
    if (target == "/missing") {
      a.respond(m.conn, m.request, 404, "no");
      return true;
    }
    if (target == "/slow") {
      std::this_thread::sleep_for(30ms);
      a.respond(m.conn, m.request, 200, "slow");
      return true;
    }
    return false;
  });
  app->start();
  EXPECT_TRUE(eventually([&] { return snapshot(region.page(1)).state == pair_state::serving; }));

  test_client c = test_client::tcp(pair->local_address().port);
  ASSERT_TRUE(c.connected());
  constexpr int ok_requests = 20;
  for (int i = 0; i < ok_requests; ++i) {
    ASSERT_TRUE(c.send(get_request("/ok")));
    ASSERT_EQ(c.read_response().status, 200);
  }
  ASSERT_TRUE(c.send(get_request("/missing")));
  ASSERT_EQ(c.read_response().status, 404);
  ASSERT_TRUE(c.send(get_request("/slow")));
  ASSERT_EQ(c.read_response().status, 200);
  // The I/O thread's own answer: 400, counted in its class too.
  test_client bad = test_client::tcp(pair->local_address().port);
  ASSERT_TRUE(bad.send("GARBAGE\r\n\r\n"));
  ASSERT_EQ(bad.read_response().status, 400);

  constexpr std::uint64_t app_responses = ok_requests + 2;
  ASSERT_TRUE(eventually([&] { return snapshot(region.page(1)).latency_count == app_responses; }));
  ASSERT_TRUE(eventually([&] { return snapshot(region.page(1)).protocol_errors == 1; }));
  const pair_stats_snapshot s = snapshot(region.page(1));
  EXPECT_TRUE(s.valid);
  EXPECT_EQ(s.index, 1u);
  EXPECT_EQ(s.pid, ::getpid());
  EXPECT_EQ(s.state, pair_state::serving);
  EXPECT_EQ(s.requests, app_responses);
  EXPECT_EQ(s.responses, app_responses);
  EXPECT_EQ(s.responses_2xx, ok_requests + 1u);
  EXPECT_EQ(s.responses_4xx, 2u);  // the app's 404 and the I/O thread's 400
  EXPECT_EQ(s.responses_1xx + s.responses_3xx + s.responses_5xx, 0u);
  EXPECT_EQ(s.connections_accepted, 2u);
  EXPECT_EQ(s.requests_in_flight, 0u);
  EXPECT_GT(s.bytes_in, 0u);
  EXPECT_GT(s.bytes_out, 0u);
  EXPECT_GT(s.loop_ticks, 0u);
  EXPECT_GT(s.io_passes, 0u);
  EXPECT_GE(s.inbound_messages, app_responses);
  EXPECT_GE(s.outbound_messages, app_responses);
  // The slow request is the maximum: at least its 30 ms, and the median is
  // far below it.
  EXPECT_GE(latency_percentile_us(s, 1.0), 30'000.0);
  EXPECT_LT(latency_percentile_us(s, 0.5), 30'000.0);
  EXPECT_GE(s.latency_sum_us, 30'000u);
  // The same numbers through the pair's own snapshot.
  EXPECT_EQ(pair->stats().requests, s.requests);
  EXPECT_EQ(&pair->stats_page(), &region.page(1));
  // The other page stays untouched.
  EXPECT_EQ(snapshot(region.page(0)).state, pair_state::unused);

  pair->stop();
  app->stop();
  const pair_stats_snapshot after = snapshot(region.page(1));
  EXPECT_EQ(after.state, pair_state::stopped);
  EXPECT_EQ(after.connections_open, 0u);
  EXPECT_EQ(after.inbound_depth, 0u);
  EXPECT_EQ(after.outbound_depth, 0u);
  app.reset();
  pair.reset();
  // The page outlives the pair, with its last counters.
  EXPECT_EQ(snapshot(region.page(1)).requests, app_responses);
}

TEST(stats_page_pair, PairWithoutAPageKeepsAPrivateOne) {
  core_pair_options opt;
  opt.listen = listen_spec::tcp("127.0.0.1", 0);
  opt.grace = 1s;
  opt.index = 5;
  core_pair pair{opt};
  ASSERT_EQ(pair.start(), "");
  fake_app app{pair.app()};
  app.start();
  test_client c = test_client::tcp(pair.local_address().port);
  ASSERT_TRUE(c.send(get_request("/x")));
  ASSERT_EQ(c.read_response().status, 200);
  ASSERT_TRUE(eventually([&] { return pair.stats().responses_2xx == 1; }));
  EXPECT_EQ(pair.stats().index, 5u);
  EXPECT_EQ(pair.stats().latency_count, 1u);
  pair.stop();
  app.stop();
}

}  // namespace
