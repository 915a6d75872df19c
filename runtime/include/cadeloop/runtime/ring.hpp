#pragma once

#include <concurrentqueue/concurrentqueue.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace cadeloop::runtime {

/// One direction of a core pair: an ordered channel from exactly one producer
/// thread to exactly one consumer thread, over a moodycamel ConcurrentQueue
/// used through a single producer token (so the queue is one FIFO sub-queue).
///
/// Items are plain structs (raw pointers inside, owning types at the API).
/// The producer `stage()`s items as it works and `publish()`es the batch once
/// per pass of its loop; the consumer `drain()`s. `published_` (written by the
/// producer with a seq_cst read-modify-write after the batch is enqueued) and
/// `taken_` (written by the consumer) are the check-before-park handshake:
/// `has_pending()` loads `published_` with seq_cst, so together with
/// runtime::parker (seq_cst `parked` flag) a wakeup is never lost. They also
/// give the ring depth to any thread.
///
/// Items left in the ring when it is destroyed are not freed: the owner calls
/// `dispose_all()` first (after both threads stopped), because only it knows
/// what the raw pointers own.
template <class T>
class ordered_ring {
  static_assert(std::is_trivially_copyable_v<T>, "ring items are plain structs with raw pointers");

 public:
  /// A ring with room for `initial_capacity` items before it allocates. Any
  /// thread (before either side uses it).
  explicit ordered_ring(std::size_t initial_capacity = 1024)
      : queue_{initial_capacity}, token_{queue_} {
    staged_.reserve(256);
  }
  ordered_ring(const ordered_ring&) = delete;
  ordered_ring& operator=(const ordered_ring&) = delete;
  /// The owner, after both threads stopped and `dispose_all()` ran.
  ~ordered_ring() = default;

  // ---------------------------------------------------------------- producer

  /// Appends `item` to the producer's unpublished batch. May throw
  /// std::bad_alloc, before anything is staged (release the pointers an item
  /// carries only after this returns). Producer thread.
  void stage(const T& item) { staged_.push_back(item); }

  /// Items staged and not yet published. Producer thread.
  [[nodiscard]] std::size_t staged() const noexcept { return staged_.size(); }

  /// Makes the staged batch visible to the consumer (one bulk enqueue and one
  /// seq_cst increment). Returns how many items were published (0 when
  /// nothing was staged, or when the queue could not allocate: the batch
  /// stays staged and the next call retries). After a non-zero return, wake
  /// the consumer with its parker. Producer thread.
  std::size_t publish() noexcept {
    const std::size_t n = staged_.size();
    if (n == 0 || !queue_.enqueue_bulk(token_, staged_.data(), n)) {
      return 0;
    }
    staged_.clear();
    // seq_cst: pairs with has_pending() after the consumer's prepare_park().
    published_.fetch_add(n, std::memory_order_seq_cst);
    return n;
  }

  // ---------------------------------------------------------------- consumer

  /// Whether published items are waiting (seq_cst: the re-check before park).
  /// Consumer thread.
  [[nodiscard]] bool has_pending() const noexcept {
    return published_.load(std::memory_order_seq_cst) != taken_.load(std::memory_order_relaxed);
  }

  /// Hands up to `max` published items to `fn(const T&)`, oldest first, and
  /// returns how many. An item counts as taken before `fn` sees it: if `fn`
  /// throws, that item is the callee's, the exception propagates and the rest
  /// stay queued for the next drain. Consumer thread.
  template <class Fn>
  std::size_t drain(Fn&& fn, std::size_t max = SIZE_MAX) {
    std::size_t count = 0;
    while (count < max) {
      if (batch_pos_ == batch_len_) {
        batch_pos_ = batch_len_ = 0;
        // The acquire half of the handshake: this load synchronises with the
        // producer's fetch_add, after which its enqueue is visible.
        if (published_.load(std::memory_order_acquire) == taken_.load(std::memory_order_relaxed)) {
          break;
        }
        batch_len_ = queue_.try_dequeue_bulk_from_producer(token_, batch_.begin(), batch_.size());
        if (batch_len_ == 0) {
          break;
        }
      }
      const T item = batch_[batch_pos_++];
      taken_.store(taken_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
      ++count;
      fn(item);
    }
    return count;
  }

  // ---------------------------------------------------------------- any thread

  /// Items published and not yet taken (a snapshot). Any thread.
  [[nodiscard]] std::uint64_t depth() const noexcept {
    const std::uint64_t taken = taken_.load(std::memory_order_relaxed);
    const std::uint64_t published = published_.load(std::memory_order_relaxed);
    return published > taken ? published - taken : 0;
  }
  /// Items ever published. Any thread.
  [[nodiscard]] std::uint64_t published_count() const noexcept {
    return published_.load(std::memory_order_relaxed);
  }

  /// Hands every item still staged or queued to `fn(const T&)` so their
  /// pointers can be freed. The owner, after both threads stopped.
  template <class Fn>
  void dispose_all(Fn&& fn) {
    for (const T& item : staged_) {
      fn(item);
    }
    staged_.clear();
    for (std::size_t i = batch_pos_; i < batch_len_; ++i) {
      fn(batch_[i]);
    }
    batch_pos_ = batch_len_ = 0;
    T item{};
    while (queue_.try_dequeue_from_producer(token_, item)) {
      fn(item);
    }
  }

 private:
  static constexpr std::size_t batch_capacity = 64;

  moodycamel::ConcurrentQueue<T> queue_;
  moodycamel::ProducerToken token_;

  // Producer's cache line(s).
  alignas(64) std::atomic<std::uint64_t> published_{0};
  std::vector<T> staged_;

  // Consumer's cache line(s).
  alignas(64) std::atomic<std::uint64_t> taken_{0};
  std::size_t batch_pos_ = 0;
  std::size_t batch_len_ = 0;
  std::array<T, batch_capacity> batch_{};
};

}  // namespace cadeloop::runtime
