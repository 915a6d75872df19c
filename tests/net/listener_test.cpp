// Tests for cadeloop::net listeners: the three kinds, and the one-line errors
// a user sees when a listener cannot be opened.

#include <cadeloop/net/listener.hpp>

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>

namespace {

using cadeloop::net::listen_spec;
using cadeloop::net::open_listener;

// A listening TCP socket on 127.0.0.1 without SO_REUSEPORT; returns its port.
int plain_listener(std::uint16_t& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(::listen(fd, 8), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return fd;
}

std::string temp_path(const char* tag) {
  return "/tmp/cadeloop-net-" + std::to_string(::getpid()) + "-" + tag;
}

TEST(net_listener, PortInUseIsOneClearLine) {
  boost::asio::io_context io;
  std::uint16_t port = 0;
  const int fd = plain_listener(port);
  std::string error;
  auto l = open_listener(io, listen_spec::tcp("127.0.0.1", port), error);
  EXPECT_EQ(l, nullptr);
  EXPECT_EQ(error, "cannot listen on 127.0.0.1:" + std::to_string(port) + ": address already in use");
  ::close(fd);
}

TEST(net_listener, EachPairBindsItsOwnListenerWithReusePort) {
  boost::asio::io_context io;
  std::string error;
  auto first = open_listener(io, listen_spec::tcp("127.0.0.1", 0), error);
  ASSERT_NE(first, nullptr) << error;
  const std::uint16_t port = first->local_address().port;
  EXPECT_NE(port, 0);
  auto second = open_listener(io, listen_spec::tcp("127.0.0.1", port), error);
  ASSERT_NE(second, nullptr) << error;
  EXPECT_EQ(second->description(), "127.0.0.1:" + std::to_string(port));
  EXPECT_TRUE(first->is_tcp());
}

TEST(net_listener, HostNamesAreResolvedOnce) {
  boost::asio::io_context io;
  std::string error;
  auto l = open_listener(io, listen_spec::tcp("localhost", 0), error);
  ASSERT_NE(l, nullptr) << error;
  EXPECT_NE(l->local_address().port, 0);
  auto bad = open_listener(io, listen_spec::tcp("no-such-host.invalid", 8000), error);
  EXPECT_EQ(bad, nullptr);
  EXPECT_EQ(error, "cannot listen on no-such-host.invalid:8000: cannot resolve host 'no-such-host.invalid'");
}

TEST(net_listener, UnixSocketRefusesAPathThatIsNotASocket) {
  boost::asio::io_context io;
  const std::string path = temp_path("regular");
  const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  ::close(fd);
  std::string error;
  auto l = open_listener(io, listen_spec::unix_socket(path), error);
  EXPECT_EQ(l, nullptr);
  EXPECT_EQ(error, "cannot listen on unix:" + path + ": the path exists and is not a socket");
  struct stat st{};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << "a regular file is never removed";
  ::unlink(path.c_str());
}

TEST(net_listener, UnixSocketRefusesALiveSocketAndReplacesAStaleOne) {
  boost::asio::io_context io;
  const std::string path = temp_path("sock");
  ::unlink(path.c_str());
  std::string error;
  auto live = open_listener(io, listen_spec::unix_socket(path), error);
  ASSERT_NE(live, nullptr) << error;
  auto second = open_listener(io, listen_spec::unix_socket(path), error);
  EXPECT_EQ(second, nullptr);
  EXPECT_EQ(error, "cannot listen on unix:" + path + ": address already in use");

  // Stale: a socket file nobody listens on any more.
  live.reset();
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.data(), path.size());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ::close(fd);
  auto replaced = open_listener(io, listen_spec::unix_socket(path), error);
  ASSERT_NE(replaced, nullptr) << error;
  EXPECT_EQ(replaced->description(), "unix:" + path);
  EXPECT_FALSE(replaced->is_tcp());
  replaced.reset();
  struct stat st{};
  EXPECT_NE(::lstat(path.c_str(), &st), 0) << "the socket file is removed on close";
}

TEST(net_listener, InheritedFdMustBeAListeningStreamSocket) {
  boost::asio::io_context io;
  std::string error;

  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  EXPECT_EQ(open_listener(io, listen_spec::inherited(pipe_fds[0]), error), nullptr);
  EXPECT_EQ(error, "cannot listen on fd " + std::to_string(pipe_fds[0]) + ": not a socket");
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);

  const int udp = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  EXPECT_EQ(open_listener(io, listen_spec::inherited(udp), error), nullptr);
  EXPECT_EQ(error, "cannot listen on fd " + std::to_string(udp) + ": not a stream socket");
  ::close(udp);

  const int idle = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_EQ(open_listener(io, listen_spec::inherited(idle), error), nullptr);
  EXPECT_EQ(error, "cannot listen on fd " + std::to_string(idle) + ": the socket is not listening");
  EXPECT_GE(::fcntl(idle, F_GETFD), 0) << "a refused descriptor stays open for its owner";
  ::close(idle);

  EXPECT_EQ(open_listener(io, listen_spec::inherited(-1), error), nullptr);
  EXPECT_EQ(error, "cannot listen on fd -1: not an open descriptor");

  std::uint16_t port = 0;
  const int good = plain_listener(port);
  auto l = open_listener(io, listen_spec::inherited(good), error);
  ASSERT_NE(l, nullptr) << error;
  EXPECT_EQ(l->local_address().port, port);
  EXPECT_TRUE(l->is_tcp());
}

}  // namespace
