#include "socket_calls.hpp"

#include <sys/socket.h>
#include <sys/types.h>

#include <cerrno>

namespace cadeloop::net {

boost::system::error_code socket_error(int err) noexcept {
  // Asio's would_block is EWOULDBLOCK (== EAGAIN here) in the system category.
  return {err, boost::system::system_category()};
}

std::size_t send_one(int fd, const void* data, std::size_t size,
                     boost::system::error_code& ec) noexcept {
  for (;;) {
    const ssize_t r = ::send(fd, data, size, MSG_NOSIGNAL);
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

}  // namespace cadeloop::net
