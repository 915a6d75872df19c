#pragma once

// Private to pyhost: how a native producer (the core pair's inbound ring)
// joins cadeloop.Loop's poll step, so that draining it costs no system call
// while work flows and the loop parks correctly when it does not.

#include <Python.h>

#include <cstdint>

namespace cadeloop::pyhost {

/// Work that arrives from another thread and is handled inside the loop's own
/// pass, on the loop's thread, with the loop's GIL held (except the parking
/// calls, which the loop makes with or without its GIL, and which touch no
/// Python object).
///
/// The loop calls, in each pass:
///   run()                  after its cross-thread queue is drained, before it
///                          decides whether to sleep, and again after the poll;
///   try_park()/unpark()    around a sleep, after its own parker announced the
///                          sleep (check before park: each source announces on
///                          its own parker and re-checks its own ring, so no
///                          wake-up is lost whichever side produced);
///   end_of_pass()          after the pass's callbacks ran: publish what the
///                          pass produced (one batch per pass) and wake the
///                          peer only if it is parked.
/// fd() is added to the loop's poller for the source's whole life.
/// Solo mode (a source that may serve its producer's sockets itself, see
/// runtime::app_side): once per pass, after try_park() and before the poll,
/// the loop asks wants_sockets_fd() and adds sockets_fd() to its poller
/// (readable) or removes it accordingly, and calls sockets_ready() when a
/// poll reports it. attached(true/false) bracket the source's time in the loop.
///
/// Owned by whoever attached it (the ASGI server); it must be detached from
/// the loop before it is destroyed. Loop thread only.
class loop_source {
 public:
  virtual ~loop_source() = default;

  /// Handles what arrived. Returns the number of items handled (> 0 means the
  /// loop must not sleep this pass: callbacks may have been scheduled), or -1
  /// with a Python exception set to stop the loop.
  virtual int run() = 0;
  /// Announces a sleep and re-checks for work; true: the loop may sleep.
  virtual bool try_park() noexcept = 0;
  /// Ends a sleep announced by a successful try_park(); `signalled`: fd() was
  /// reported readable by the poll.
  virtual void unpark(bool signalled) noexcept = 0;
  /// Publishes what this pass produced and wakes the peer if it is parked.
  virtual void end_of_pass() noexcept = 0;
  /// The eventfd the peer writes to wake a parked loop.
  [[nodiscard]] virtual int fd() const noexcept = 0;

  /// Solo mode: the second descriptor to watch while wants_sockets_fd().
  [[nodiscard]] virtual int sockets_fd() const noexcept { return -1; }
  /// Whether sockets_fd() must be watched now (asked once per pass).
  [[nodiscard]] virtual bool wants_sockets_fd() noexcept { return false; }
  /// The poll reported sockets_fd() readable.
  virtual void sockets_ready() noexcept {}
  /// While sockets_fd() is watched: serves them now, from the loop's spin,
  /// with the loop's GIL released (no Python object is touched). True: work
  /// for the next run() was published.
  [[nodiscard]] virtual bool serve_sockets_nogil() noexcept { return false; }
  /// While sockets_fd() is watched: how long the loop polls before it sleeps
  /// (adaptive, when the loop has no spin of its own; 0: sleep at once).
  [[nodiscard]] virtual std::uint32_t sockets_spin_us() const noexcept { return 0; }
  /// Called when the source joins the loop (true) and when it leaves (false).
  virtual void attached(bool /*yes*/) noexcept {}
};

}  // namespace cadeloop::pyhost
