// The server's own socket calls (net/socket_calls.hpp): a write of one piece
// that finds the socket full must say "would block" (the connection waits
// for writability and keeps its bytes), never an error that closes it; a
// write to a gone peer is an error, not a SIGPIPE. A full socket is rare on
// the server's path (it writes after writability), so it is made here. The
// read of a plain connection never waits, and accept4 gives sockets that are
// non-blocking and close-on-exec.

#include "socket_calls.hpp"

#include <gtest/gtest.h>
#include <boost/asio/error.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <netinet/in.h>

#include <array>
#include <cerrno>
#include <string>
#include <vector>

namespace {

using cadeloop::net::accept_one;
using cadeloop::net::recv_one;
using cadeloop::net::send_gather;
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

// The plain read path: what is there, then "would block" (never a wait),
// then Asio's eof once the peer closed.
TEST(SocketCalls, ARecvTakesWhatIsThereThenWouldBlockThenEof) {
  socket_pair p;
  ASSERT_EQ(::write(p.fd[1], "hello", 5), 5);
  std::array<char, 16> buf{};
  boost::system::error_code ec;
  EXPECT_EQ(recv_one(p.fd[0], buf.data(), buf.size(), ec), 5u);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_EQ(std::string(buf.data(), 5), "hello");
  EXPECT_EQ(recv_one(p.fd[0], buf.data(), buf.size(), ec), 0u);
  EXPECT_EQ(ec, boost::asio::error::would_block) << ec.message();
  p.close(1);
  EXPECT_EQ(recv_one(p.fd[0], buf.data(), buf.size(), ec), 0u);
  EXPECT_EQ(ec, boost::asio::error::eof) << ec.message();
}

// Several pieces in one call, in order; empty pieces are no call at all.
TEST(SocketCalls, AGatheredSendWritesThePiecesInOrder) {
  socket_pair p;
  const std::string a = "head;";
  const std::string b = "body";
  boost::system::error_code ec;
  std::vector<boost::asio::const_buffer> iov{boost::asio::buffer(a), boost::asio::const_buffer{},
                                             boost::asio::buffer(b)};
  EXPECT_EQ(send_gather(p.fd[0], iov, ec), a.size() + b.size());
  EXPECT_FALSE(ec) << ec.message();
  std::array<char, 16> buf{};
  ASSERT_EQ(::read(p.fd[1], buf.data(), buf.size()), 9);
  EXPECT_EQ(std::string(buf.data(), 9), "head;body");
  const std::vector<boost::asio::const_buffer> none{boost::asio::const_buffer{}};
  p.close(1);  // a call would now fail with EPIPE
  EXPECT_EQ(send_gather(p.fd[0], none, ec), 0u);
  EXPECT_FALSE(ec) << ec.message();
}

// accept4: nothing waiting is "would block"; a connection comes non-blocking,
// close-on-exec, with the peer's address.
TEST(SocketCalls, AnAcceptedSocketIsNonBlockingAndCloseOnExec) {
  const int l = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  ASSERT_GE(l, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(l, 4), 0);
  ASSERT_EQ(::getsockname(l, reinterpret_cast<sockaddr*>(&a), &len), 0);
  sockaddr_storage peer{};
  socklen_t peer_length = 0;
  boost::system::error_code ec;
  EXPECT_EQ(accept_one(l, peer, peer_length, ec), -1);
  EXPECT_EQ(ec, boost::asio::error::would_block) << ec.message();
  const int c = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  sockaddr_in mine{};
  len = sizeof mine;
  ASSERT_EQ(::getsockname(c, reinterpret_cast<sockaddr*>(&mine), &len), 0);
  const int s = accept_one(l, peer, peer_length, ec);
  ASSERT_GE(s, 0) << ec.message();
  EXPECT_NE(::fcntl(s, F_GETFL) & O_NONBLOCK, 0);
  EXPECT_NE(::fcntl(s, F_GETFD) & FD_CLOEXEC, 0);
  ASSERT_EQ(peer_length, sizeof(sockaddr_in));
  EXPECT_EQ(reinterpret_cast<const sockaddr_in&>(peer).sin_port, mine.sin_port);
  ::close(s);
  ::close(c);
  ::close(l);
}

}  // namespace
