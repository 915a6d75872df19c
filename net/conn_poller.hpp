// Private to net/: readiness of plain connection sockets tracked by the
// server itself, without Asio's EPOLL_CTL_MOD per read wait
// (docs/architecture.md, "Readiness of our own"):
//
// - socket_read_wait: a read wait queued on the socket's own registration in
//   the io_context's reactor (Boost 1.74's detail interface). Asio registers
//   every socket edge-triggered; a read operation that may be tried
//   speculatively is queued without epoll_ctl, and ours reports itself
//   "exhausted" when it completes, so an edge that comes while none is queued
//   makes the next one complete at once.
// - conn_poller: one more edge-triggered epoll set per I/O thread, nested in
//   the reactor, where each plain socket is registered once for EPOLLRDHUP
//   only: a FIN that came with the last bytes shows there, since a short read
//   of those bytes does not.
#pragma once

#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>

#include <sys/epoll.h>

#include <cstddef>
#include <cstdint>
#include <span>

namespace cadeloop::net {

/// The epoll descriptor of `io`'s reactor (its private `epoll_fd_`, read
/// through Boost 1.74's detail interface); -1 if it has none.
int reactor_fd_of(boost::asio::io_context& io) noexcept;
/// Whether `io` has handlers ready to run (posted, or completed at once)
/// besides its reactor: what a `poll()` would run without any new event.
/// Only for the thread that alone uses `io` at the time (no lock taken).
bool has_ready_handlers(boost::asio::io_context& io) noexcept;

/// One connection slot's read wait. Owned by the connection record and
/// reused by the slot's next connection, unless it is still queued when the
/// socket closes: then it is left to the reactor, which completes it
/// (aborted) or destroys it, and it frees itself.
class socket_read_wait {
 public:
  /// Called when the wait completes on the I/O thread: `key` as given to start().
  using handler = void (*)(void* ctx, std::uint64_t key);

  socket_read_wait() = default;
  socket_read_wait(const socket_read_wait&) = delete;
  socket_read_wait& operator=(const socket_read_wait&) = delete;
  ~socket_read_wait() { release(); }

  /// Queues the wait on `s` (open, in `io`'s reactor); completes at once
  /// (posted) when an edge came since the last completion.
  void start(boost::asio::io_context& io, boost::asio::generic::stream_protocol::socket& s,
             handler on_ready, void* ctx, std::uint64_t key);
  /// Before the socket closes: a queued wait is left to free itself.
  void release() noexcept;

 private:
  struct op;
  op* op_ = nullptr;
};

class conn_poller {
 public:
  /// Called with the events one wait collected (at most 64), on the I/O
  /// thread, from inside the io_context's handlers.
  using handler = void (*)(void* ctx, std::span<const epoll_event> events);

  /// The set and its wait; unusable (add() returns false) if either cannot
  /// be made, and then connections keep Asio's waits.
  conn_poller(boost::asio::io_context& io, handler on_events, void* ctx);
  conn_poller(const conn_poller&) = delete;
  conn_poller& operator=(const conn_poller&) = delete;
  ~conn_poller();

  /// Registers `fd` (EPOLLRDHUP, edge-triggered: the peer's FIN, errors)
  /// with `key` as its events' data. Closing the socket removes it. False:
  /// not registered.
  bool add(int fd, std::uint64_t key) noexcept;

 private:
  struct wait_op;
  void arm();
  void complete(wait_op& op);

  int epfd_ = -1;
  void* reactor_ = nullptr;  // boost::asio::detail::epoll_reactor
  void* state_ = nullptr;    // its per-descriptor data for epfd_
  wait_op* op_ = nullptr;
  bool pending_ = false;
  handler on_events_;
  void* ctx_;
};

}  // namespace cadeloop::net
