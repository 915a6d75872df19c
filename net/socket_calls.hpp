// Private to net/: the socket calls the server makes itself rather than
// through Asio, and how their errno becomes the error_code the read and
// write paths test (would_block() in server_connection.hpp).
#pragma once

#include <boost/asio/buffer.hpp>
#include <boost/system/error_code.hpp>

#include <sys/socket.h>

#include <cstddef>
#include <vector>

namespace cadeloop::net {

/// A failed socket call's errno as an error_code in the system category, as
/// Asio reports it: EAGAIN is then Asio's would_block (wait for readiness).
[[nodiscard]] boost::system::error_code socket_error(int err) noexcept;

/// One send(2) of `size` bytes on the non-blocking stream socket `fd`, with
/// MSG_NOSIGNAL (a gone peer is EPIPE, not SIGPIPE) and EINTR retried: the
/// bytes the kernel took, or 0 with `ec` set (would_block when the socket
/// is full). Used for a write of one piece, where Asio would take sendmsg(2).
/// `flags` are added to the call's (MSG_MORE for a connection's last bytes).
std::size_t send_one(int fd, const void* data, std::size_t size, boost::system::error_code& ec,
                     int flags = 0) noexcept;

/// One sendmsg(2) of the pieces in `iov` (at most the first 64, as Asio's
/// write_some), MSG_NOSIGNAL, EINTR retried: the bytes the kernel took, or 0
/// with `ec` set. Nothing to send is 0 with no error and no call. `flags`
/// as for send_one.
std::size_t send_gather(int fd, const std::vector<boost::asio::const_buffer>& iov,
                        boost::system::error_code& ec, int flags = 0) noexcept;

/// One recv(2) of up to `size` bytes, EINTR retried: the bytes read; 0 with
/// Asio's `eof` when the peer closed its side (and `size` > 0), or 0 with
/// `ec` set (would_block when nothing is there). The socket is non-blocking:
/// unlike Asio's read_some, this never waits, whatever Asio believes of it.
std::size_t recv_one(int fd, void* data, std::size_t size, boost::system::error_code& ec) noexcept;

/// One accept4(2) on the non-blocking listening socket `fd`: the new socket,
/// already non-blocking and close-on-exec, with the peer's address in
/// `peer` / `peer_length`; or -1 with `ec` set (would_block when none is
/// waiting). EINTR is retried.
int accept_one(int fd, sockaddr_storage& peer, socklen_t& peer_length,
               boost::system::error_code& ec) noexcept;

}  // namespace cadeloop::net
