// Tests for cadeloop::runtime::block_return, the ring that brings a core
// pair's written-out response blocks back to the app thread: order, the full
// ring refusing, and one producer and one consumer thread passing blocks
// (also run under TSan and ASan, which see a block used after it was given
// or lost).

#include <cadeloop/runtime/block_return.hpp>
#include <cadeloop/runtime/owner_return.hpp>
#include <cadeloop/runtime/parker.hpp>

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

// ------------------------------------------------ owner_return and borrowed buffers

using cadeloop::net::byte_buffer;
using cadeloop::runtime::owner_return;
using cadeloop::runtime::parker;

std::vector<void*> taken(owner_return& r) {
  std::vector<void*> out;
  r.take_all(out);
  return out;
}

TEST(owner_return, ABorrowedBufferGivesItsOwnerBackOnceWhenDestroyed) {
  parker p;
  owner_return r{p};
  static const char bytes[] = "0123456789";
  int a = 0;
  int b = 0;
  {
    byte_buffer x = byte_buffer::borrow(bytes, 10, &a, r.sink());
    EXPECT_EQ(x.view(), "0123456789");
    EXPECT_EQ(x.owner(), &a);
    byte_buffer y = std::move(x);  // moves the owner: one give, by y
    EXPECT_EQ(x.owner(), nullptr);
    EXPECT_FALSE(r.waiting());
    y = byte_buffer::borrow(bytes, 4, &b, r.sink());  // the overwritten one's owner goes back now
    EXPECT_TRUE(r.waiting());
    EXPECT_EQ(taken(r), std::vector<void*>{&a});
    EXPECT_EQ(y.view(), "0123");
  }
  EXPECT_EQ(taken(r), std::vector<void*>{&b});
  EXPECT_FALSE(r.waiting());
}

TEST(owner_return, ReleaseHandsTheOwnerOnWithoutGivingItBack) {
  parker p;
  owner_return r{p};
  static const char bytes[] = "abc";
  int a = 0;
  byte_buffer x = byte_buffer::borrow(bytes, 3, &a, r.sink());
  void* owner = x.owner();
  EXPECT_EQ(x.release(), nullptr);  // nothing allocated to hand over
  EXPECT_EQ(owner, &a);
  EXPECT_TRUE(x.empty());
  EXPECT_TRUE(taken(r).empty());
}

TEST(owner_return, OwnersGivenFromAnotherThreadAreAllTaken) {
  parker p;
  owner_return r{p};
  static const char bytes[] = "x";
  std::vector<int> owners(10000);
  std::thread producer{[&] {
    for (int& o : owners) {
      byte_buffer b = byte_buffer::borrow(bytes, 1, &o, r.sink());
    }
  }};
  std::vector<void*> got;
  while (got.size() < owners.size()) {
    r.take_all(got);
  }
  producer.join();
  ASSERT_EQ(got.size(), owners.size());
  for (std::size_t i = 0; i < owners.size(); ++i) {
    EXPECT_EQ(got[i], &owners[i]);
  }
}

}  // namespace
