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

/// An indexed 4-ary min-heap of timers ordered by (when, seq). Cancelling a
/// timer removes it in O(log n) through the index it carries, so cancelled
/// timers never sit in the heap and nothing is ever scanned.
///
/// Each slot keeps the deadline and arrival number next to the node pointer:
/// sifting compares slots in one contiguous array and never dereferences a
/// node (with 10^5 timers the nodes are cache misses; the slots mostly are
/// not). Four children per level halve the depth, and the four sit in one or
/// two cache lines.
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
  [[nodiscard]] Node* top() const noexcept { return heap_.front().node; }
  /// The earliest deadline, without touching the node. Precondition: !empty().
  [[nodiscard]] double top_when() const noexcept { return heap_.front().when; }

  /// Adds n (not in any heap) and stamps its arrival number. Its `when` must
  /// not change while it is in the heap. May throw std::bad_alloc, leaving
  /// the heap unchanged.
  void push(Node* n) {
    const std::uint64_t seq = next_seq_;
    heap_.push_back(slot{static_cast<double>(n->when), seq, n});
    ++next_seq_;
    n->seq = seq;
    sift_up(heap_.size() - 1, heap_.back());
  }

  /// Removes and returns the earliest timer. Precondition: !empty().
  Node* pop() noexcept {
    Node* n = heap_.front().node;
    remove_at(0);
    return n;
  }

  /// Removes n if it is in the heap; returns whether it was.
  bool remove(Node* n) noexcept {
    if (n->heap_index == npos || n->heap_index >= heap_.size() || heap_[n->heap_index].node != n) {
      return false;
    }
    remove_at(n->heap_index);
    return true;
  }

  /// Empties the heap, handing every node to fn(Node*) after the heap is
  /// already empty (so fn may re-enter and push).
  template <class Fn>
  void clear(Fn&& fn) {
    std::vector<slot> slots;
    slots.swap(heap_);
    for (const slot& s : slots) {
      s.node->heap_index = npos;
    }
    for (const slot& s : slots) {
      fn(s.node);
    }
  }

  /// Calls fn(Node*) on every node, in no particular order. fn must not change the heap.
  template <class Fn>
  void for_each(Fn&& fn) const {
    for (const slot& s : heap_) {
      fn(s.node);
    }
  }

 private:
  static constexpr std::size_t arity = 4;

  struct slot {
    double when;
    std::uint64_t seq;
    Node* node;
  };

  static bool earlier(const slot& a, const slot& b) noexcept {
    return a.when < b.when || (a.when == b.when && a.seq < b.seq);
  }

  void place(std::size_t i, const slot& s) noexcept {
    heap_[i] = s;
    s.node->heap_index = i;
  }

  void sift_up(std::size_t i, slot s) noexcept {
    while (i > 0) {
      const std::size_t parent = (i - 1) / arity;
      if (!earlier(s, heap_[parent])) {
        break;
      }
      place(i, heap_[parent]);
      i = parent;
    }
    place(i, s);
  }

  void sift_down(std::size_t i, slot s) noexcept {
    const std::size_t count = heap_.size();
    for (;;) {
      const std::size_t first = arity * i + 1;
      if (first >= count) {
        break;
      }
      const std::size_t last = first + arity < count ? first + arity : count;
      std::size_t best = first;
      for (std::size_t c = first + 1; c < last; ++c) {
        if (earlier(heap_[c], heap_[best])) {
          best = c;
        }
      }
      if (!earlier(heap_[best], s)) {
        break;
      }
      place(i, heap_[best]);
      i = best;
    }
    place(i, s);
  }

  void remove_at(std::size_t i) noexcept {
    heap_[i].node->heap_index = npos;
    const slot last = heap_.back();
    heap_.pop_back();
    if (i < heap_.size()) {
      // The moved slot may belong above or below its new place.
      if (i > 0 && earlier(last, heap_[(i - 1) / arity])) {
        sift_up(i, last);
      } else {
        sift_down(i, last);
      }
    }
  }

  std::vector<slot> heap_;
  std::uint64_t next_seq_ = 0;
};

}  // namespace cadeloop::runtime
