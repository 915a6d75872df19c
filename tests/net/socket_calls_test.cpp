// The server's own socket calls (net/socket_calls.hpp): a write of one piece
// that finds the socket full must say "would block" (the connection waits
// for writability and keeps its bytes), never an error that closes it; a
// write to a gone peer is an error, not a SIGPIPE. A full socket is rare on
// the server's path (it writes after writability), so it is made here.

#include "socket_calls.hpp"

#include <gtest/gtest.h>
#include <boost/asio/error.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <string>

namespace {

using cadeloop::net::send_one;
using cadeloop::net::socket_error;

struct socket_pair {
  int fd[2] = {-1, -1};
  socket_pair() {
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fd) != 0) {
      ADD_FAILURE() << "socketpair: " << errno;
      return;
    }
    const int small = 4096;
    (void)::setsockopt(fd[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    (void)::fcntl(fd[0], F_SETFL, ::fcntl(fd[0], F_GETFL) | O_NONBLOCK);
  }
  ~socket_pair() {
    close(0);
    close(1);
  }
  void close(int i) {
    if (fd[i] >= 0) {
      ::close(fd[i]);
      fd[i] = -1;
    }
  }
  socket_pair(const socket_pair&) = delete;
  socket_pair& operator=(const socket_pair&) = delete;
};

TEST(SocketCalls, AFullSocketIsWouldBlockAndTheBytesGoOnceItDrains) {
  socket_pair p;
  const std::string piece(1000, 'x');
  boost::system::error_code ec;
  std::size_t sent = 0;
  int writes = 0;
  for (; writes < 100000; ++writes) {
    const std::size_t n = send_one(p.fd[0], piece.data(), piece.size(), ec);
    if (ec) {
      EXPECT_EQ(n, 0u);
      break;
    }
    sent += n;
  }
  ASSERT_LT(writes, 100000) << "the socket never filled";
  EXPECT_EQ(ec, boost::asio::error::would_block) << ec.message();
  EXPECT_GT(sent, 0u);

  // The reader drains what was sent; the next write goes through.
  std::array<char, 65536> buf{};
  std::size_t got = 0;
  while (got < sent) {
    const ssize_t r = ::read(p.fd[1], buf.data(), buf.size());
    ASSERT_GT(r, 0);
    got += static_cast<std::size_t>(r);
  }
  EXPECT_EQ(got, sent);
  EXPECT_EQ(send_one(p.fd[0], piece.data(), piece.size(), ec), piece.size());
  EXPECT_FALSE(ec) << ec.message();
}

TEST(SocketCalls, AGonePeerIsAnErrorNotASignal) {
  socket_pair p;
  p.close(1);
  boost::system::error_code ec;
  EXPECT_EQ(send_one(p.fd[0], "x", 1, ec), 0u);  // a SIGPIPE would end the test binary here
  EXPECT_EQ(ec, boost::system::error_code(EPIPE, boost::system::system_category())) << ec.message();
}

TEST(SocketCalls, ErrnoMapping) {
  // What would_block() (server_connection.hpp) tests for.
  EXPECT_EQ(socket_error(EAGAIN), boost::asio::error::would_block);
  EXPECT_EQ(socket_error(EWOULDBLOCK), boost::asio::error::would_block);
  EXPECT_EQ(socket_error(ECONNRESET),
            boost::system::error_code(ECONNRESET, boost::system::system_category()));
}

}  // namespace
