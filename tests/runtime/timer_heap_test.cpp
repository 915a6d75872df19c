#include "cadeloop/runtime/timer_heap.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <utility>
#include <vector>

namespace cadeloop::runtime {
namespace {

struct timer {
  double when = 0;
  std::uint64_t seq = 0;
  std::size_t heap_index = timer_heap<timer>::npos;
  int id = 0;
};

TEST(timer_heap, pops_in_deadline_order_and_ties_in_arrival_order) {
  std::vector<timer> timers{{3.0}, {1.0}, {2.0}, {1.0}, {0.5}};
  for (int i = 0; i < static_cast<int>(timers.size()); ++i) {
    timers[static_cast<std::size_t>(i)].id = i;
  }
  timer_heap<timer> heap;
  for (auto& t : timers) {
    heap.push(&t);
  }
  std::vector<int> order;
  while (!heap.empty()) {
    order.push_back(heap.pop()->id);
  }
  EXPECT_EQ(order, (std::vector<int>{4, 1, 3, 2, 0}));
  for (auto& t : timers) {
    EXPECT_FALSE(timer_heap<timer>::contains(t));
  }
}

TEST(timer_heap, remove_takes_out_exactly_that_timer_anywhere_in_the_heap) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<double> when(0.0, 100.0);
  std::vector<timer> timers(2000);
  timer_heap<timer> heap;
  for (std::size_t i = 0; i < timers.size(); ++i) {
    timers[i].when = when(rng);
    timers[i].id = static_cast<int>(i);
    heap.push(&timers[i]);
  }
  std::vector<int> removed;
  for (std::size_t i = 0; i < timers.size(); i += 3) {
    EXPECT_TRUE(heap.remove(&timers[i]));
    EXPECT_FALSE(heap.remove(&timers[i]));  // a second cancel is a no-op
    removed.push_back(timers[i].id);
  }
  EXPECT_EQ(heap.size(), timers.size() - removed.size());
  double last = -1;
  std::size_t popped = 0;
  while (!heap.empty()) {
    timer* t = heap.pop();
    EXPECT_GE(t->when, last);
    EXPECT_NE(t->id % 3, 0);
    last = t->when;
    ++popped;
  }
  EXPECT_EQ(popped, timers.size() - removed.size());
}

TEST(timer_heap, clear_empties_before_handing_nodes_out) {
  std::vector<timer> timers(10);
  timer_heap<timer> heap;
  for (auto& t : timers) {
    heap.push(&t);
  }
  std::size_t seen = 0;
  heap.clear([&](timer* t) {
    EXPECT_TRUE(heap.empty());
    EXPECT_FALSE(timer_heap<timer>::contains(*t));
    ++seen;
  });
  EXPECT_EQ(seen, timers.size());
}

TEST(timer_heap, interleaved_push_remove_pop_matches_a_sorted_reference) {
  // Coarse deadlines so ties are common: (when, arrival) must order them.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> when(0, 50);
  std::uniform_int_distribution<int> op(0, 9);
  std::vector<timer> timers(20000);
  timer_heap<timer> heap;
  std::set<std::pair<double, std::uint64_t>> reference;
  std::vector<std::size_t> live;
  std::size_t next = 0;
  for (int step = 0; step < 60000; ++step) {
    const int o = op(rng);
    if (o < 5 && next < timers.size()) {
      timer& t = timers[next++];
      t.when = when(rng);
      heap.push(&t);
      reference.emplace(t.when, t.seq);
      live.push_back(next - 1);
    } else if (o < 8 && !live.empty()) {
      const std::size_t k = std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng);
      timer& t = timers[live[k]];
      const bool was_in = timer_heap<timer>::contains(t);
      EXPECT_EQ(heap.remove(&t), was_in);
      if (was_in) {
        reference.erase({t.when, t.seq});
      }
      live[k] = live.back();
      live.pop_back();
    } else if (!heap.empty()) {
      ASSERT_FALSE(reference.empty());
      EXPECT_EQ(heap.top_when(), reference.begin()->first);
      timer* t = heap.pop();
      EXPECT_EQ(std::make_pair(t->when, t->seq), *reference.begin());
      reference.erase(reference.begin());
    }
    ASSERT_EQ(heap.size(), reference.size());
  }
}

}  // namespace
}  // namespace cadeloop::runtime
