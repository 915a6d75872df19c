#include "socket_calls.hpp"

#include <boost/asio/error.hpp>

#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <array>
#include <cerrno>

namespace cadeloop::net {

// The calls below go through syscall(2), not glibc's send/recv/sendmsg/
// accept4: those are thread cancellation points, and in a process with
// threads each call switches asynchronous cancellation on and off around
// the system call (two atomic exchanges on the thread's state, about 1 % of
// a plaintext request's CPU here). Nothing in cadeloop cancels threads.

boost::system::error_code socket_error(int err) noexcept {
  // Asio's would_block is EWOULDBLOCK (== EAGAIN here) in the system category.
  return {err, boost::system::system_category()};
}

std::size_t send_one(int fd, const void* data, std::size_t size, boost::system::error_code& ec,
                     int flags) noexcept {
  for (;;) {
    const long r = ::syscall(SYS_sendto, fd, data, size, MSG_NOSIGNAL | flags, nullptr, 0);
    if (r >= 0) {
      ec = {};
      return static_cast<std::size_t>(r);
    }
    if (errno != EINTR) {
      ec = socket_error(errno);
      return 0;
    }
  }
}

std::size_t send_gather(int fd, const std::vector<boost::asio::const_buffer>& iov,
                        boost::system::error_code& ec, int flags) noexcept {
  std::array<iovec, 64> v{};
  std::size_t count = 0;
  std::size_t total = 0;
  for (const auto& b : iov) {
    if (count == v.size()) {
      break;
    }
    v[count].iov_base = const_cast<void*>(b.data());  // sendmsg does not write through it
    v[count].iov_len = b.size();
    total += b.size();
    ++count;
  }
  ec = {};
  if (total == 0) {
    return 0;
  }
  msghdr m{};
  m.msg_iov = v.data();
  m.msg_iovlen = count;
  for (;;) {
    const long r = ::syscall(SYS_sendmsg, fd, &m, MSG_NOSIGNAL | flags);
    if (r >= 0) {
      return static_cast<std::size_t>(r);
    }
    if (errno != EINTR) {
      ec = socket_error(errno);
      return 0;
    }
  }
}

std::size_t recv_one(int fd, void* data, std::size_t size, boost::system::error_code& ec) noexcept {
  for (;;) {
    const long r = ::syscall(SYS_recvfrom, fd, data, size, 0, nullptr, nullptr);
    if (r > 0 || (r == 0 && size == 0)) {
      ec = {};
      return static_cast<std::size_t>(r);
    }
    if (r == 0) {
      ec = boost::asio::error::eof;
      return 0;
    }
    if (errno != EINTR) {
      ec = socket_error(errno);
      return 0;
    }
  }
}

int accept_one(int fd, sockaddr_storage& peer, socklen_t& peer_length,
               boost::system::error_code& ec) noexcept {
  for (;;) {
    peer_length = sizeof peer;
    const int s = static_cast<int>(::syscall(SYS_accept4, fd, reinterpret_cast<sockaddr*>(&peer),
                                             &peer_length, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (s >= 0) {
      ec = {};
      return s;
    }
    if (errno != EINTR) {
      ec = socket_error(errno);
      return -1;
    }
  }
}

}  // namespace cadeloop::net
