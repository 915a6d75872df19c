// Private to net/: readiness of plain connection sockets tracked by the
// server itself. Each socket is registered once, edge-triggered, in an epoll
// set of the I/O thread's own; that set is watched by the io_context's
// reactor through one wait that is re-armed without a system call. Asio's
// async_wait would instead re-arm the socket with EPOLL_CTL_MOD on every
// read wait (docs/architecture.md, "Readiness of our own").
#pragma once

#include <boost/asio/io_context.hpp>

#include <sys/epoll.h>

#include <cstddef>
#include <cstdint>
#include <span>

namespace cadeloop::net {

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

  /// Registers `fd` (EPOLLIN | EPOLLRDHUP, edge-triggered) with `key` as its
  /// events' data. Closing the socket removes it. False: not registered.
  bool add(int fd, std::uint64_t key) noexcept;

  /// Waits that ended with events (for tests and counters).
  [[nodiscard]] std::uint64_t wakes() const noexcept { return wakes_; }

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
  std::uint64_t wakes_ = 0;
};

}  // namespace cadeloop::net
