#pragma once

#include <atomic>
#include <cstdint>

namespace cadeloop::runtime {

/// The sleeping half of "check before park": one consumer thread sleeps on an
/// eventfd, any number of producers wake it, and a producer makes a system call
/// only when the consumer has announced that it is about to sleep.
///
/// Consumer protocol (one thread):
///   prepare_park();                 // parked = true (seq_cst)
///   if (work is visible) { cancel_park(); handle it; }
///   else { sleep in a poller that watches fd(); unpark(fd_was_readable); }
/// Producer protocol (any thread): publish the work with a seq_cst store or
/// read-modify-write (for example xthread_queue::push), then call wake().
///
/// Both sides use seq_cst on the flag and on the queue, so in the single total
/// order either the producer's load of `parked` sees the consumer's store, or
/// the consumer's re-check of the queue sees the producer's push. A wakeup is
/// never lost, and a busy consumer costs its producers no system call.
///
/// Owned by the consumer; it must outlive every producer that may call wake().
class parker {
 public:
  /// Creates the eventfd (non-blocking, close-on-exec).
  /// Throws std::system_error when the kernel refuses one. Thread: any.
  parker();
  /// Closes the eventfd. Thread: the consumer, after every producer stopped.
  ~parker();
  parker(const parker&) = delete;
  parker& operator=(const parker&) = delete;

  /// The eventfd the consumer adds to its poller; readable after a wake().
  /// Thread: any.
  [[nodiscard]] int fd() const noexcept { return fd_; }

  /// Announces that the consumer is about to sleep. Thread: the consumer.
  void prepare_park() noexcept { parked_.store(true, std::memory_order_seq_cst); }

  /// Withdraws prepare_park() after the re-check found work. Thread: the consumer.
  void cancel_park() noexcept { parked_.store(false, std::memory_order_relaxed); }

  /// The consumer's half of the rule in one call: announces the sleep, then
  /// asks `work_visible()` (which must read the queues with seq_cst, as
  /// xthread_queue::empty() does) once more. Returns true when the consumer
  /// may sleep (then call unpark() after), false when work arrived (the
  /// announcement is already withdrawn). Thread: the consumer.
  template <class WorkVisible>
  bool try_park(WorkVisible&& work_visible) noexcept {
    prepare_park();
    if (work_visible()) {
      cancel_park();
      return false;
    }
    return true;
  }

  /// Ends a sleep. `signalled`: the poller reported fd() readable, so the
  /// eventfd counter is drained (one read) and the next sleep is not cut
  /// short by this wake. Thread: the consumer.
  void unpark(bool signalled) noexcept;

  /// Wakes the consumer if it is parked or about to park; otherwise does
  /// nothing and makes no system call. Returns true when it wrote the eventfd.
  /// Call after the work is published. Thread: any.
  bool wake() noexcept;

  /// Whether the consumer has announced a sleep not yet ended. Thread: any
  /// (the answer may be stale by the time it is read; for tests and stats).
  [[nodiscard]] bool parked() const noexcept { return parked_.load(std::memory_order_relaxed); }

  /// Eventfd writes made by wake() so far. Thread: any.
  [[nodiscard]] std::uint64_t wakeups_sent() const noexcept {
    return wakeups_sent_.load(std::memory_order_relaxed);
  }

 private:
  // Written by the consumer and by producers: its own cache line, apart from
  // the producers' counter.
  alignas(64) std::atomic<bool> parked_{false};
  alignas(64) std::atomic<std::uint64_t> wakeups_sent_{0};
  int fd_ = -1;
};

}  // namespace cadeloop::runtime
