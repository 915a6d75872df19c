#pragma once
// The way back of a core pair's small response buffers. The app thread
// writes a response into a block of block_size bytes (app_side::take_buffer);
// the block travels to the I/O thread like any response buffer, and once its
// bytes are written the I/O thread gives the block back here for the app
// thread to take again. Without it every response is a malloc on one thread
// and a free on the other, which glibc's per-thread caches cannot serve.

#include <array>
#include <atomic>
#include <cstddef>

namespace cadeloop::runtime {

/// A single-producer single-consumer ring of free blocks (new char[block_size]).
/// Producer: whichever thread serves the sockets (the I/O thread, or the app
/// thread in solo mode; the pair's owner hand-over orders the two). Consumer:
/// the app thread.
class block_return {
 public:
  /// Bytes of each block: most responses (a head and a small body) fit.
  static constexpr std::size_t block_size = 2048;
  /// Blocks kept at most (more are deleted): at most 256 KiB per pair.
  static constexpr std::size_t capacity = 128;

  block_return() = default;
  block_return(const block_return&) = delete;
  block_return& operator=(const block_return&) = delete;
  ~block_return() {
    while (char* b = take()) {
      delete[] b;
    }
  }

  /// Keeps `block`; false (the caller deletes it) when the ring is full. Producer.
  bool give(char* block) noexcept {
    const std::size_t tail = tail_.load(std::memory_order_relaxed);
    if (tail - head_.load(std::memory_order_acquire) == capacity) {
      return false;
    }
    slots_[tail % capacity] = block;
    tail_.store(tail + 1, std::memory_order_release);
    return true;
  }

  /// A kept block, or nullptr when there is none. Consumer.
  char* take() noexcept {
    const std::size_t head = head_.load(std::memory_order_relaxed);
    if (head == tail_.load(std::memory_order_acquire)) {
      return nullptr;
    }
    char* b = slots_[head % capacity];
    head_.store(head + 1, std::memory_order_release);
    return b;
  }

  /// Blocks kept now (a snapshot when the other side is busy). Any thread.
  [[nodiscard]] std::size_t size() const noexcept {
    return tail_.load(std::memory_order_acquire) - head_.load(std::memory_order_acquire);
  }

  /// For http_server::set_block_sink.
  static bool give_to(void* self, char* block) noexcept {
    return static_cast<block_return*>(self)->give(block);
  }

 private:
  alignas(64) std::atomic<std::size_t> head_{0};  // consumer's
  alignas(64) std::atomic<std::size_t> tail_{0};  // producer's
  std::array<char*, capacity> slots_{};
};

}  // namespace cadeloop::runtime
