// The epoll poller: one epoll instance per loop, level-triggered
// registrations and a bounded wait. Loop support, Python-free (see
// runtime/CMakeLists.txt).
#include "cadeloop/runtime/poller.hpp"

#include <unistd.h>

#include <cerrno>
#include <climits>

namespace cadeloop::runtime {

namespace {

std::error_code last_error() noexcept {
  return {errno, std::generic_category()};
}

int ctl(int epfd, int op, int fd, std::uint32_t events, std::uint64_t token) noexcept {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = token;
  return ::epoll_ctl(epfd, op, fd, &ev);
}

}  // namespace

poller::poller() : fd_(::epoll_create1(EPOLL_CLOEXEC)) {
  if (fd_ < 0) {
    throw std::system_error(last_error(), "epoll_create1");
  }
}

poller::~poller() {
  if (fd_ >= 0) {
    ::close(fd_);
  }
}

std::error_code poller::add(int fd, std::uint32_t events, std::uint64_t token) noexcept {
  if (ctl(fd_, EPOLL_CTL_ADD, fd, events, token) == 0) {
    return {};
  }
  if (errno == EEXIST && ctl(fd_, EPOLL_CTL_MOD, fd, events, token) == 0) {
    return {};
  }
  return last_error();
}

std::error_code poller::modify(int fd, std::uint32_t events, std::uint64_t token) noexcept {
  if (ctl(fd_, EPOLL_CTL_MOD, fd, events, token) == 0) {
    return {};
  }
  if (errno == ENOENT && ctl(fd_, EPOLL_CTL_ADD, fd, events, token) == 0) {
    return {};
  }
  return last_error();
}

std::error_code poller::remove(int fd) noexcept {
  if (::epoll_ctl(fd_, EPOLL_CTL_DEL, fd, nullptr) == 0 || errno == ENOENT || errno == EBADF) {
    return {};
  }
  return last_error();
}

int poller::wait(std::span<epoll_event> out, int timeout_ms) noexcept {
  const int max =
      out.size() > static_cast<std::size_t>(INT_MAX) ? INT_MAX : static_cast<int>(out.size());
  const int n = ::epoll_wait(fd_, out.data(), max, timeout_ms);
  if (n < 0) {
    return errno == EINTR ? 0 : -errno;
  }
  return n;
}

}  // namespace cadeloop::runtime
