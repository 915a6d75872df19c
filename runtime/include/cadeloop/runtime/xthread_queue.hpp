#pragma once

#include <atomic>
#include <cstddef>
#include <utility>

namespace cadeloop::runtime {

/// A multi-producer, single-consumer hand-off: producers push one item at a
/// time, the consumer takes everything at once, in push order per producer
/// (and in the order the pushes were linearised across producers).
///
/// It is a Treiber stack whose consumer swaps the whole list out and reverses
/// it. Because the consumer never pops single nodes there is no ABA problem
/// and no node is touched by two threads after it is published. Pushes are
/// seq_cst read-modify-writes so the queue pairs with parker (see parker.hpp).
///
/// Items still queued when the queue is destroyed are destroyed with it, on
/// the destroying thread; an item type whose destruction needs a particular
/// thread or lock (a PyObject*) must be drained first.
template <class T>
class xthread_queue {
 public:
  xthread_queue() = default;
  xthread_queue(const xthread_queue&) = delete;
  xthread_queue& operator=(const xthread_queue&) = delete;
  /// Thread: the consumer, after every producer stopped.
  ~xthread_queue() {
    drain([](T&&) noexcept {});
  }

  /// Publishes one item. May throw std::bad_alloc, before anything is
  /// published. Thread: any.
  void push(T value) {
    auto* n = new node{std::move(value), nullptr};
    node* head = head_.load(std::memory_order_relaxed);
    do {
      n->next = head;
    } while (!head_.compare_exchange_weak(head, n, std::memory_order_seq_cst,
                                          std::memory_order_relaxed));
  }

  /// Whether nothing is queued. The seq_cst load is the consumer's re-check
  /// after parker::prepare_park(). Thread: the consumer (any thread may ask,
  /// but only the consumer's answer is stable).
  [[nodiscard]] bool empty() const noexcept {
    return head_.load(std::memory_order_seq_cst) == nullptr;
  }

  /// Takes every queued item and calls fn(T&&) on each, oldest first.
  /// Returns how many. fn must not throw. Thread: the consumer.
  template <class Fn>
  std::size_t drain(Fn&& fn) noexcept {
    node* n = head_.exchange(nullptr, std::memory_order_acquire);
    // The stack is newest first; reverse it to hand items out in push order.
    node* oldest = nullptr;
    while (n != nullptr) {
      node* next = n->next;
      n->next = oldest;
      oldest = n;
      n = next;
    }
    std::size_t count = 0;
    while (oldest != nullptr) {
      node* next = oldest->next;
      fn(std::move(oldest->value));
      delete oldest;
      oldest = next;
      ++count;
    }
    return count;
  }

 private:
  struct node {
    T value;
    node* next;
  };
  alignas(64) std::atomic<node*> head_{nullptr};
};

}  // namespace cadeloop::runtime
