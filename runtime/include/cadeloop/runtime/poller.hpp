#pragma once

#include <sys/epoll.h>

#include <cstdint>
#include <span>
#include <system_error>

namespace cadeloop::runtime {

/// Readiness polling over epoll, level-triggered. Each registration carries a
/// 64-bit token that comes back with its events (the loop uses the fd number,
/// and a reserved token for its parker's eventfd).
///
/// Owned and used by one thread (the loop thread); not thread-safe.
class poller {
 public:
  /// Interest bits, the epoll ones.
  static constexpr std::uint32_t readable = EPOLLIN;
  static constexpr std::uint32_t writable = EPOLLOUT;

  /// Creates the epoll instance (close-on-exec). Throws std::system_error.
  poller();
  /// Closes the epoll instance.
  ~poller();
  poller(const poller&) = delete;
  poller& operator=(const poller&) = delete;

  /// The epoll descriptor.
  [[nodiscard]] int fd() const noexcept { return fd_; }

  /// Registers fd for `events`. Registering an fd the kernel still has (it was
  /// closed and its number reused while a dup kept the old one alive) is
  /// turned into a modify.
  std::error_code add(int fd, std::uint32_t events, std::uint64_t token) noexcept;
  /// Changes the interest of a registered fd; re-adds an fd the kernel forgot
  /// (it was closed and reopened under the same number).
  std::error_code modify(int fd, std::uint32_t events, std::uint64_t token) noexcept;
  /// Unregisters fd. An fd that is already gone (closed) is not an error.
  std::error_code remove(int fd) noexcept;

  /// Waits up to timeout_ms (-1: no limit, 0: do not block) and fills `out`.
  /// Returns the number of events; an interrupted wait (EINTR) returns 0.
  /// A negative return is -errno.
  int wait(std::span<epoll_event> out, int timeout_ms) noexcept;

 private:
  int fd_ = -1;
};

}  // namespace cadeloop::runtime
