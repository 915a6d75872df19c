#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace cadeloop::runtime {

/// What a timer_heap stores: a node that knows its deadline, its arrival
/// number (timers with the same deadline fire in the order they were added)
/// and its own position in the heap, so removing it needs no search.
template <class Node>
concept timer_node = requires(Node& n) {
  { n.when } -> std::convertible_to<double>;
  { n.seq } -> std::convertible_to<std::uint64_t>;
  { n.heap_index } -> std::convertible_to<std::size_t>;
};

/// An indexed binary min-heap of timers ordered by (when, seq). Cancelling a
/// timer removes it in O(log n) through the index it carries, so cancelled
/// timers never sit in the heap and nothing is ever scanned.
///
/// Stores raw Node pointers and does not own them: the caller keeps each node
/// alive while it is in the heap (the Python loop holds a reference). Used by
/// one thread; not thread-safe.
template <timer_node Node>
class timer_heap {
 public:
  /// heap_index of a node that is in no heap.
  static constexpr std::size_t npos = std::numeric_limits<std::size_t>::max();

  [[nodiscard]] bool empty() const noexcept { return heap_.empty(); }
  [[nodiscard]] std::size_t size() const noexcept { return heap_.size(); }
  /// Whether n is in a heap (this one, if the caller uses only one).
  [[nodiscard]] static bool contains(const Node& n) noexcept { return n.heap_index != npos; }

  /// The earliest timer. Precondition: !empty().
  [[nodiscard]] Node* top() const noexcept { return heap_.front(); }

  /// Adds n (not in any heap) and stamps its arrival number. May throw
  /// std::bad_alloc, leaving the heap unchanged.
  void push(Node* n) {
    heap_.push_back(n);
    n->seq = next_seq_++;
    n->heap_index = heap_.size() - 1;
    sift_up(heap_.size() - 1);
  }

  /// Removes and returns the earliest timer. Precondition: !empty().
  Node* pop() noexcept {
    Node* n = heap_.front();
    remove_at(0);
    return n;
  }

  /// Removes n if it is in the heap; returns whether it was.
  bool remove(Node* n) noexcept {
    if (n->heap_index == npos || n->heap_index >= heap_.size() || heap_[n->heap_index] != n) {
      return false;
    }
    remove_at(n->heap_index);
    return true;
  }

  /// Empties the heap, handing every node to fn(Node*) after the heap is
  /// already empty (so fn may re-enter and push).
  template <class Fn>
  void clear(Fn&& fn) {
    std::vector<Node*> nodes;
    nodes.swap(heap_);
    for (Node* n : nodes) {
      n->heap_index = npos;
    }
    for (Node* n : nodes) {
      fn(n);
    }
  }

  /// Calls fn(Node*) on every node, in no particular order. fn must not change the heap.
  template <class Fn>
  void for_each(Fn&& fn) const {
    for (Node* n : heap_) {
      fn(n);
    }
  }

 private:
  static bool earlier(const Node* a, const Node* b) noexcept {
    return a->when < b->when || (a->when == b->when && a->seq < b->seq);
  }

  void place(std::size_t i, Node* n) noexcept {
    heap_[i] = n;
    n->heap_index = i;
  }

  void sift_up(std::size_t i) noexcept {
    Node* n = heap_[i];
    while (i > 0) {
      const std::size_t parent = (i - 1) / 2;
      if (!earlier(n, heap_[parent])) {
        break;
      }
      place(i, heap_[parent]);
      i = parent;
    }
    place(i, n);
  }

  void sift_down(std::size_t i) noexcept {
    Node* n = heap_[i];
    const std::size_t count = heap_.size();
    for (;;) {
      std::size_t child = 2 * i + 1;
      if (child >= count) {
        break;
      }
      if (child + 1 < count && earlier(heap_[child + 1], heap_[child])) {
        ++child;
      }
      if (!earlier(heap_[child], n)) {
        break;
      }
      place(i, heap_[child]);
      i = child;
    }
    place(i, n);
  }

  void remove_at(std::size_t i) noexcept {
    Node* gone = heap_[i];
    Node* last = heap_.back();
    heap_.pop_back();
    gone->heap_index = npos;
    if (i < heap_.size()) {
      place(i, last);
      // The moved node may belong above or below its new place.
      if (i > 0 && earlier(last, heap_[(i - 1) / 2])) {
        sift_up(i);
      } else {
        sift_down(i);
      }
    }
  }

  std::vector<Node*> heap_;
  std::uint64_t next_seq_ = 0;
};

}  // namespace cadeloop::runtime
