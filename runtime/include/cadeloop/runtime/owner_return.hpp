#pragma once
// The way back of the owners of borrowed response bytes (net::byte_buffer::
// borrow). The app thread sends a large body from the app's own object
// without copying it: the object's reference travels with the bytes to the
// I/O thread, and once they are written (or dropped with their connection)
// the reference comes back here for the app thread to release, on the thread
// and under the lock its interpreter requires.

#include <atomic>
#include <mutex>
#include <new>
#include <vector>

#include <cadeloop/net/byte_buffer.hpp>
#include <cadeloop/runtime/parker.hpp>

namespace cadeloop::runtime {

/// Owners given back by whichever thread drops a borrowed buffer (the I/O
/// thread, the app thread in solo mode or on an error path, the pair's
/// teardown), taken by the app thread. Lock-guarded: a borrowed body is a
/// large one, so one uncontended lock per body costs nothing beside its bytes.
class owner_return {
 public:
  /// `wake`: the app thread's parker, woken when an owner comes back while
  /// it sleeps (so a large body is released when written, not at the next
  /// request).
  explicit owner_return(parker& wake) noexcept : wake_{wake} {}
  owner_return(const owner_return&) = delete;
  owner_return& operator=(const owner_return&) = delete;

  /// The sink to borrow buffers with. Any thread.
  [[nodiscard]] const net::owner_sink* sink() const noexcept { return &sink_; }

  /// Keeps `owner` for take_all. Any thread. On allocation failure the owner
  /// is kept nowhere: its object then stays alive (a leak, never a release
  /// on the wrong thread).
  void give(void* owner) noexcept {
    {
      std::lock_guard<std::mutex> lock{mu_};
      try {
        owners_.push_back(owner);
      } catch (const std::bad_alloc&) {
        return;
      }
    }
    waiting_.store(true, std::memory_order_seq_cst);
    (void)wake_.wake();  // a system call only if the app thread announced a sleep
  }

  /// Whether owners wait (seq_cst: valid as the app thread's re-check after
  /// it announced a sleep). Any thread.
  [[nodiscard]] bool waiting() const noexcept { return waiting_.load(std::memory_order_seq_cst); }

  /// Moves every owner given so far into `out` (appended). The app thread.
  void take_all(std::vector<void*>& out) {
    std::lock_guard<std::mutex> lock{mu_};
    waiting_.store(false, std::memory_order_relaxed);
    if (out.empty()) {
      out.swap(owners_);
    } else {
      out.insert(out.end(), owners_.begin(), owners_.end());
      owners_.clear();
    }
  }

 private:
  static void give_to(void* self, void* owner) noexcept {
    static_cast<owner_return*>(self)->give(owner);
  }

  parker& wake_;
  std::mutex mu_;
  std::vector<void*> owners_;
  std::atomic<bool> waiting_{false};
  net::owner_sink sink_{&owner_return::give_to, this};
};

}  // namespace cadeloop::runtime
