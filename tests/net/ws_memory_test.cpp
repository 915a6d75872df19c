// What an idle accepted WebSocket costs the server process: USS
// (Private_Clean + Private_Dirty of /proc/self/smaps_rollup) grown between
// 1,000 and 5,000 open idle WebSockets, divided by the 4,000 added. The
// clients are bare file descriptors in this process, so nothing of theirs
// lives in user memory; kernel socket buffers are not in USS either.

#include "ws_test_client.hpp"

#include <sys/resource.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define CADELOOP_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CADELOOP_TEST_ASAN 1
#endif
#endif

namespace {

using namespace ws_test;

std::size_t uss_bytes() {
  std::ifstream in{"/proc/self/smaps_rollup"};
  std::string key;
  std::size_t kb = 0;
  std::size_t total = 0;
  std::string unit;
  while (in >> key) {
    if (key == "Private_Clean:" || key == "Private_Dirty:") {
      in >> kb >> unit;
      total += kb * 1024;
    } else {
      in.ignore(1 << 20, '\n');
    }
  }
  return total;
}

int open_fd(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

TEST_F(ws_server_test, IdleWebSocketCostsAtMost4KiB) {
#ifdef CADELOOP_TEST_ASAN
  GTEST_SKIP() << "memory is not measured under AddressSanitizer (redzones, quarantine)";
#endif
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_max < 12000) {
    GTEST_SKIP() << "needs 12,000 file descriptors";
  }
  rl.rlim_cur = rl.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &rl);
  opt.max_connections = 20000;
  opt.ws.ping_interval = 0ms;
  start();
  std::vector<int> fds;
  const std::string hello =
      ws_client::handshake("Sec-WebSocket-Extensions: permessage-deflate\r\n");
  std::size_t accepted = 0;
  // The sink's record of the requests is the test's, not the server's: its
  // storage is made once here (a vector growing between the two readings
  // would move, and glibc may keep or return the old block), and only the
  // pages its 4,000 new entries touch are subtracted below.
  sink.requests.reserve(5000);
  // Opens up to `n` idle WebSockets, in batches.
  auto grow_to = [&](std::size_t n) {
    while (fds.size() < n) {
      const std::size_t batch = std::min<std::size_t>(200, n - fds.size());
      for (std::size_t i = 0; i < batch; ++i) {
        const int fd = open_fd(port);
        ASSERT_GE(fd, 0);
        ASSERT_EQ(::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL),
                  static_cast<ssize_t>(hello.size()));
        fds.push_back(fd);
      }
      ASSERT_TRUE(pump_until([&] { return sink.requests.size() == fds.size(); }, 20s));
      for (; accepted < sink.requests.size(); ++accepted) {
        const ws_request& r = sink.requests[accepted];
        ASSERT_TRUE(server->ws_accept(r.conn, r.seq, {}, {}));
      }
      pump();
      for (int k = 0; k < 5; ++k) {
        pump();
      }
    }
    char buf[512];
    for (const int fd : fds) {
      while (::recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0) {
      }
    }
    pump();
  };
  grow_to(1000);
  const std::size_t at_1000 = uss_bytes();
  grow_to(5000);
  const std::size_t at_5000 = uss_bytes();
  EXPECT_EQ(counters.ws_open.get(), 5000u);
  const std::size_t sink_bytes = 4000 * sizeof(ws_request);
  const double per_ws = (static_cast<double>(at_5000) - static_cast<double>(at_1000) -
                         static_cast<double>(sink_bytes)) /
                        4000.0;
  std::printf("USS per idle WebSocket (1,000 -> 5,000 open): %.0f bytes\n", per_ws);
  RecordProperty("uss_per_idle_websocket_bytes", static_cast<int>(per_ws));
  // The I/O thread's share of the 4 KiB an idle WebSocket may cost in all
  // (the app's Python objects are the rest): 1,256 bytes measured on glibc
  // 2.36 (1,326 with the sink counted this way; 1,567 was seen once in CI),
  // about 1.97 KiB when an accepted WebSocket kept its HTTP parser.
  EXPECT_LE(per_ws, 1792.0);
  for (const int fd : fds) {
    ::close(fd);
  }
  ASSERT_TRUE(pump_until([&] { return server->connection_count() == 0; }, 30s));
  EXPECT_EQ(counters.ws_open.get(), 0u);
}

}  // namespace
