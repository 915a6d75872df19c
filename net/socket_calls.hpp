// Private to net/: the socket calls the server makes itself rather than
// through Asio, and how their errno becomes the error_code the read and
// write paths test (would_block() in server_connection.hpp).
#pragma once

#include <boost/system/error_code.hpp>

#include <cstddef>

namespace cadeloop::net {

/// A failed socket call's errno as an error_code in the system category, as
/// Asio reports it: EAGAIN is then Asio's would_block (wait for readiness).
[[nodiscard]] boost::system::error_code socket_error(int err) noexcept;

/// One send(2) of `size` bytes on the non-blocking stream socket `fd`, with
/// MSG_NOSIGNAL (a gone peer is EPIPE, not SIGPIPE) and EINTR retried: the
/// bytes the kernel took, or 0 with `ec` set (would_block when the socket
/// is full). Used for a write of one piece, where Asio would take sendmsg(2).
std::size_t send_one(int fd, const void* data, std::size_t size,
                     boost::system::error_code& ec) noexcept;

}  // namespace cadeloop::net
