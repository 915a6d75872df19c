// What the server makes of an accepted connection, read from the sockets
// themselves: the accepted socket is non-blocking, close-on-exec (a child
// process the app starts does not keep a client's connection open after the
// server closed it) and has TCP_NODELAY, on every connection, not only the
// first; the listener is close-on-exec too; and each request carries the
// connection's peer and local addresses, also when the listener is bound to
// the wildcard address (the local address is then the one the client dialled).

#include <dirent.h>
#include <fcntl.h>
#include <netinet/tcp.h>

#include <vector>

#include "direct_server_fixture.hpp"

namespace {

class accept_test : public direct_server_test {
 public:
  [[nodiscard]] std::uint16_t port_of() const { return port; }
  bool pump_until_requests(std::size_t n) {
    return pump_until([&] { return sink.count(sink_event::kind::request) == n; });
  }
  [[nodiscard]] sink_event last_request() const { return sink.requests().back(); }
};
using kind = sink_event::kind;
using cadeloop::net::socket_address;

socket_address name_of(int fd, bool peer) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  const int rc = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len)
                      : ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  return rc == 0 ? socket_address::from_sockaddr(reinterpret_cast<sockaddr*>(&ss), len)
                 : socket_address{};
}

bool same(const socket_address& a, const socket_address& b) {
  return a.family == b.family && a.port == b.port && a.bytes == b.bytes;
}

// This process's descriptors (the server runs on the test's thread).
std::vector<int> open_fds() {
  std::vector<int> out;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) {
    return out;
  }
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') {
      out.push_back(std::atoi(e->d_name));
    }
  }
  ::closedir(d);
  return out;
}

// The server's end of `client`'s connection: the socket whose peer is the
// client's local address. -1 if none.
int server_end_of(const raw_client& client) {
  const socket_address mine = name_of(client.fd(), false);
  for (const int fd : open_fds()) {
    if (fd != client.fd() && same(name_of(fd, true), mine)) {
      return fd;
    }
  }
  return -1;
}

int listening_fd(std::uint16_t port) {
  for (const int fd : open_fds()) {
    int accepting = 0;
    socklen_t len = sizeof accepting;
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) == 0 && accepting != 0 &&
        name_of(fd, false).port == port) {
      return fd;
    }
  }
  return -1;
}

TEST_F(accept_test, EveryAcceptedSocketIsNonBlockingCloseOnExecAndNoDelay) {
  start();
  std::vector<std::unique_ptr<raw_client>> clients;
  for (int i = 0; i < 3; ++i) {
    clients.push_back(std::make_unique<raw_client>(port));
    ASSERT_TRUE(clients.back()->send(get_request("/a")));
    ASSERT_TRUE(pump_until([&] { return sink.count(kind::request) == clients.size(); }));
    const int fd = server_end_of(*clients.back());
    ASSERT_GE(fd, 0) << "connection " << i;
    EXPECT_NE(::fcntl(fd, F_GETFL) & O_NONBLOCK, 0) << "connection " << i;
    EXPECT_NE(::fcntl(fd, F_GETFD) & FD_CLOEXEC, 0) << "connection " << i;
    int nodelay = 0;
    socklen_t len = sizeof nodelay;
    ASSERT_EQ(::getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, &len), 0);
    EXPECT_NE(nodelay, 0) << "connection " << i;
  }
  const int lfd = listening_fd(port);
  ASSERT_GE(lfd, 0);
  EXPECT_NE(::fcntl(lfd, F_GETFD) & FD_CLOEXEC, 0);
}

// Two connections' requests carry each one's own peer address and the
// address the client dialled.
void expect_own_addresses(accept_test& t, const char* host) {
  for (std::size_t i = 0; i < 2; ++i) {
    raw_client c{t.port_of()};
    ASSERT_TRUE(c.send(get_request("/a")));
    ASSERT_TRUE(t.pump_until_requests(i + 1));
    const sink_event e = t.last_request();
    EXPECT_TRUE(same(e.client, name_of(c.fd(), false))) << host << " " << e.client.to_string();
    EXPECT_EQ(e.server.to_string(), "127.0.0.1:" + std::to_string(t.port_of())) << host;
  }
}

TEST_F(accept_test, ARequestCarriesItsConnectionsAddresses) {
  start("127.0.0.1");
  expect_own_addresses(*this, "127.0.0.1");
}

TEST_F(accept_test, OnAWildcardListenerTheServerAddressIsTheOneDialled) {
  start("0.0.0.0");
  expect_own_addresses(*this, "0.0.0.0");
}

}  // namespace
