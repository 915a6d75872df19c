#include "cadeloop/runtime/poller.hpp"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>

namespace cadeloop::runtime {
namespace {

struct socket_pair {
  int fds[2] = {-1, -1};
  socket_pair() { EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0); }
  ~socket_pair() {
    for (int fd : fds) {
      if (fd >= 0) {
        ::close(fd);
      }
    }
  }
};

TEST(poller, reports_readable_and_writable_with_the_token) {
  poller p;
  socket_pair s;
  ASSERT_FALSE(p.add(s.fds[0], poller::readable, 7));
  std::array<epoll_event, 4> events{};
  EXPECT_EQ(p.wait(events, 0), 0);
  ASSERT_EQ(::write(s.fds[1], "x", 1), 1);
  ASSERT_EQ(p.wait(events, 1000), 1);
  // epoll_event is packed on x86-64: copy the token out before gtest binds a reference to it.
  EXPECT_EQ(std::uint64_t{events[0].data.u64}, 7u);
  EXPECT_TRUE(events[0].events & poller::readable);
  ASSERT_FALSE(p.modify(s.fds[0], poller::readable | poller::writable, 8));
  ASSERT_EQ(p.wait(events, 0), 1);
  EXPECT_EQ(std::uint64_t{events[0].data.u64}, 8u);
  EXPECT_TRUE(events[0].events & poller::writable);
  ASSERT_FALSE(p.remove(s.fds[0]));
  EXPECT_EQ(p.wait(events, 0), 0);
}

TEST(poller, tolerates_a_closed_and_reused_fd_number) {
  poller p;
  socket_pair s;
  ASSERT_FALSE(p.add(s.fds[0], poller::readable, 1));
  ::close(s.fds[0]);  // the kernel drops the registration with the last reference
  EXPECT_FALSE(p.remove(s.fds[0]));
  socket_pair t;  // probably reuses the number
  EXPECT_FALSE(p.modify(t.fds[0], poller::readable, 2));
  s.fds[0] = -1;
}

TEST(poller, refuses_a_regular_file_with_an_error_code) {
  poller p;
  char name[] = "/tmp/cadeloop-poller-XXXXXX";
  const int fd = ::mkstemp(name);
  ASSERT_GE(fd, 0);
  ::unlink(name);
  EXPECT_EQ(p.add(fd, poller::readable, 1), std::errc::operation_not_permitted);
  ::close(fd);
}

}  // namespace
}  // namespace cadeloop::runtime
