// Tests for cadeloop::runtime::block_return, the ring that brings a core
// pair's written-out response blocks back to the app thread: order, the full
// ring refusing, and one producer and one consumer thread passing blocks
// (also run under TSan and ASan, which see a block used after it was given
// or lost).

#include <cadeloop/runtime/block_return.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <thread>
#include <vector>

namespace {

using cadeloop::runtime::block_return;

char* new_block(char fill) {
  char* b = new char[block_return::block_size];
  std::memset(b, fill, block_return::block_size);
  return b;
}

TEST(block_return, GivesBackInOrderAndIsEmptyAfter) {
  block_return r;
  EXPECT_EQ(r.take(), nullptr);
  std::vector<char*> given;
  for (int i = 0; i < 5; ++i) {
    given.push_back(new_block(static_cast<char>('a' + i)));
    ASSERT_TRUE(r.give(given.back()));
  }
  EXPECT_EQ(r.size(), 5u);
  for (char* expected : given) {
    char* b = r.take();
    ASSERT_EQ(b, expected);
    delete[] b;
  }
  EXPECT_EQ(r.take(), nullptr);
  EXPECT_EQ(r.size(), 0u);
}

TEST(block_return, AFullRingRefusesAndTheCallerKeepsTheBlock) {
  block_return r;
  for (std::size_t i = 0; i < block_return::capacity; ++i) {
    ASSERT_TRUE(r.give(new_block('x')));
  }
  char* extra = new_block('y');
  EXPECT_FALSE(r.give(extra));  // still ours: deleting it must be fine (ASan)
  delete[] extra;
  char* first = r.take();
  ASSERT_NE(first, nullptr);
  EXPECT_TRUE(r.give(first));  // room again
  EXPECT_EQ(r.size(), block_return::capacity);
  // The destructor frees what is left (a leak would fail the ASan stage).
}

TEST(block_return, OneProducerAndOneConsumerPassEveryBlockOnce) {
  block_return r;
  constexpr int total = 200000;
  std::atomic<int> taken{0};
  std::atomic<bool> done{false};
  std::thread consumer([&] {
    long sum = 0;
    while (!done.load(std::memory_order_acquire) || r.size() != 0) {
      if (char* b = r.take()) {
        sum += b[0];  // the producer's write is visible
        b[1] = 'c';   // and the block is the consumer's now
        delete[] b;
        taken.fetch_add(1, std::memory_order_relaxed);
      }
    }
    EXPECT_EQ(sum, static_cast<long>(taken.load()) * 'p');
  });
  int refused = 0;
  for (int i = 0; i < total; ++i) {
    char* b = new_block('p');
    if (!r.give(b)) {
      ++refused;
      delete[] b;
    }
  }
  done.store(true, std::memory_order_release);
  consumer.join();
  EXPECT_EQ(taken.load() + refused, total);
  EXPECT_GT(taken.load(), 0);
}

}  // namespace
