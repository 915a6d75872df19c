#pragma once

// Private to net/: the per-connection queues of http_server.

#include <cstddef>
#include <utility>
#include <vector>

namespace cadeloop::net {

/// A first-in first-out queue over one vector that allocates nothing until
/// the first push. `std::deque` allocates a map and a block (576 bytes with
/// libstdc++) even when empty, and a server holds three queues per
/// connection slot, idle or not. Popped elements are destroyed at once; the
/// storage is compacted when the queue empties, or when the dead prefix
/// outgrows the live part, so a queue that keeps flowing stays small.
/// Not thread-safe: one owner thread.
template <class T>
class fifo {
 public:
  using iterator = typename std::vector<T>::iterator;
  using const_iterator = typename std::vector<T>::const_iterator;

  [[nodiscard]] bool empty() const noexcept { return head_ == items_.size(); }
  [[nodiscard]] std::size_t size() const noexcept { return items_.size() - head_; }

  T& front() noexcept { return items_[head_]; }
  const T& front() const noexcept { return items_[head_]; }
  T& back() noexcept { return items_.back(); }
  const T& back() const noexcept { return items_.back(); }
  T& operator[](std::size_t i) noexcept { return items_[head_ + i]; }
  const T& operator[](std::size_t i) const noexcept { return items_[head_ + i]; }

  iterator begin() noexcept { return items_.begin() + static_cast<std::ptrdiff_t>(head_); }
  iterator end() noexcept { return items_.end(); }
  const_iterator begin() const noexcept {
    return items_.begin() + static_cast<std::ptrdiff_t>(head_);
  }
  const_iterator end() const noexcept { return items_.end(); }

  void push_back(T&& value) { items_.push_back(std::move(value)); }
  template <class... Args>
  T& emplace_back(Args&&... args) {
    return items_.emplace_back(std::forward<Args>(args)...);
  }
  void pop_back() {
    items_.pop_back();
    if (empty()) {
      clear();
    }
  }
  void pop_front() {
    items_[head_] = T{};  // release what it holds now, not at the next compaction
    ++head_;
    if (empty()) {
      clear();
    } else if (head_ >= 16 && head_ * 2 >= items_.size()) {
      items_.erase(items_.begin(), items_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
  }
  /// Makes the live size `n` (new elements value-initialised).
  void resize(std::size_t n) { items_.resize(head_ + n); }
  /// Empties the queue; a large buffer left by a burst is given back.
  void clear() noexcept {
    items_.clear();
    head_ = 0;
    if (items_.capacity() > 64) {
      std::vector<T>{}.swap(items_);
    }
  }

 private:
  std::vector<T> items_;
  std::size_t head_ = 0;
};

}  // namespace cadeloop::net
