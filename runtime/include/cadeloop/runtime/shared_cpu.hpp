#pragma once

// When a core pair's two threads are confined to the same single CPU (the
// server under `taskset -c N`, or one CPU given to a pair), each can run only
// while the other gives the CPU up. Parking on an eventfd and being woken by
// the peer then costs a write, a read and a trip through the scheduler per
// hand-over. `shared_cpu_yield` is the other way: before it parks, a thread
// gives the CPU to its peer with sched_yield() and re-checks for work, for a
// bounded window and only while the peer is awake (not parked), so work the
// peer publishes meanwhile is taken without an eventfd round trip.

#include <sched.h>

#include <chrono>
#include <cstdint>

namespace cadeloop::runtime {

/// The one CPU the calling thread may run on, or -1 when its affinity allows
/// more than one (or cannot be read). Thread: the one asking.
int sole_cpu() noexcept;

/// One thread's yield window before it parks, with its adaptive state: after a
/// run of windows that found nothing (the peer was awake but produced
/// nothing until the window ended), windows are skipped, and one park in 16
/// probes whether yielding pays again. Owned by one thread.
class shared_cpu_yield {
 public:
  enum class outcome : std::uint8_t {
    found,        ///< work arrived: do not park
    peer_asleep,  ///< the peer parked (nothing can come from it but a wake): park
    expired,      ///< the window ended with nothing: park
    skipped,      ///< adaptive: windows were fruitless lately, none this time
  };

  /// Yields while `found()` is false, `peer_parked()` is false and `budget`
  /// has not passed. `found` must re-check with the ordering of the park
  /// protocol's re-check (a seq_cst ring counter load), since a found item is
  /// taken without a wake. Thread: the owner.
  template <class Found, class PeerParked>
  outcome run(std::chrono::microseconds budget, Found&& found, PeerParked&& peer_parked) {
    if (misses_in_row_ >= misses_before_backoff && ++parks_since_probe_ % probe_every != 0) {
      return outcome::skipped;
    }
    ++windows_;
    const auto deadline = std::chrono::steady_clock::now() + budget;
    for (;;) {
      if (found()) {
        misses_in_row_ = 0;
        ++hits_;
        return outcome::found;
      }
      if (peer_parked()) {
        return outcome::peer_asleep;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        ++misses_in_row_;
        return outcome::expired;
      }
      ::sched_yield();
    }
  }

  /// Windows run and windows that found work. Thread: the owner.
  [[nodiscard]] std::uint64_t windows() const noexcept { return windows_; }
  [[nodiscard]] std::uint64_t hits() const noexcept { return hits_; }

 private:
  static constexpr unsigned misses_before_backoff = 8;
  static constexpr unsigned probe_every = 16;
  unsigned misses_in_row_ = 0;
  unsigned parks_since_probe_ = 0;
  std::uint64_t windows_ = 0;
  std::uint64_t hits_ = 0;
};

}  // namespace cadeloop::runtime
