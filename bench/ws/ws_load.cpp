// ws_load: the WebSocket load client of bench/ws/driver.py.
//
// One thread, raw sockets and epoll, so that the client is not what limits a
// server's messages per second. Each connection does the RFC 6455 handshake,
// then keeps `--inflight` binary messages of `--size` bytes outstanding (a
// new one goes out when an echo comes back). Client frames are masked (RFC
// 6455 5.3), with one masking key per run: the frame is built once and sent
// as it is, so the client spends nothing per message on masking while the
// server still unmasks every byte.
//
//   ws_load --port 8000 --connections 64 --size 64 --duration 5 --warmup 1
//   ws_load --port 8000 --connections 1 --size 1024 --inflight 32 --duration 5
//   ws_load --port 8000 --connections 10000 --idle   # opens them, prints "open N", waits for EOF
//   on stdin
//
// Prints "measure" when the measured window opens, then one JSON object when
// it closes: messages echoed in the window, msgs/s, latency p50/p99 in
// microseconds, and errors.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

struct options {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string path = "/ws";
  int connections = 1;
  std::size_t size = 64;
  int inflight = 1;
  double duration = 5.0;
  double warmup = 1.0;
  bool idle = false;
  int connect_window = 256;  // handshakes under way at once
};

enum class phase : std::uint8_t { connecting, handshake, open, closed };

struct conn {
  int fd = -1;
  phase state = phase::connecting;
  std::string in;   // bytes read and not yet parsed
  std::string out;  // bytes not yet written
  std::size_t out_off = 0;
  bool want_out = false;
  std::deque<clock_type::time_point> sent;  // send times of the messages in flight
};

std::string frame_for(std::size_t size, std::uint8_t opcode) {
  std::string f;
  f.push_back(static_cast<char>(0x80U | opcode));
  if (size < 126) {
    f.push_back(static_cast<char>(0x80U | size));
  } else if (size <= 0xFFFFU) {
    f.push_back(static_cast<char>(0x80U | 126U));
    f.push_back(static_cast<char>((size >> 8U) & 0xFFU));
    f.push_back(static_cast<char>(size & 0xFFU));
  } else {
    f.push_back(static_cast<char>(0x80U | 127U));
    for (int i = 7; i >= 0; --i) {
      f.push_back(static_cast<char>(
          (static_cast<std::uint64_t>(size) >> (8U * static_cast<unsigned>(i))) & 0xFFU));
    }
  }
  const unsigned char mask[4] = {0x37, 0xfa, 0x21, 0x3d};
  f.append(reinterpret_cast<const char*>(mask), 4);
  for (std::size_t i = 0; i < size; ++i) {
    const auto plain = static_cast<unsigned char>('a' + static_cast<int>(i % 26));
    f.push_back(static_cast<char>(plain ^ mask[i % 4]));
  }
  return f;
}

class load {
 public:
  explicit load(const options& o) : opt_(o), frame_(frame_for(o.size, 0x2)) {
    ep_ = epoll_create1(0);
    conns_.resize(static_cast<std::size_t>(o.connections));
    request_ = "GET " + o.path + " HTTP/1.1\r\nHost: " + o.host + ":" + std::to_string(o.port) +
               "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
  }

  int run() {
    const auto start = clock_type::now();
    std::size_t next = 0;
    std::vector<epoll_event> events(1024);
    bool stdin_open = opt_.idle;
    if (opt_.idle) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = ~std::uint64_t{0};
      epoll_ctl(ep_, EPOLL_CTL_ADD, 0, &ev);
    }
    bool announced = false;
    for (;;) {
      while (next < conns_.size() && connecting_ < opt_.connect_window) {
        open_one(next++);
      }
      const auto now = clock_type::now();
      const double t = std::chrono::duration<double>(now - start).count();
      if (!opt_.idle) {
        if (!measuring_ && open_ == opt_.connections && t >= warm_until_) {
          measuring_ = true;
          counted_ = 0;
          measure_start_ = now;
          // The driver reads the server's CPU time at this line and at the result.
          std::printf("measure\n");
          std::fflush(stdout);
        }
        if (measuring_ &&
            std::chrono::duration<double>(now - measure_start_).count() >= opt_.duration) {
          report(std::chrono::duration<double>(now - measure_start_).count());
          return 0;
        }
        if (t > opt_.warmup + opt_.duration + 60.0) {
          std::printf("{\"error\": \"timed out with %d of %d connections open\"}\n", open_,
                      opt_.connections);
          return 1;
        }
      } else if (!announced && open_ + failed_ == opt_.connections && next == conns_.size()) {
        std::printf("open %d failed %d\n", open_, failed_);
        std::fflush(stdout);
        announced = true;
      }
      if (opt_.idle && !stdin_open) {
        return 0;
      }
      if (!opt_.idle && failed_ > 0 && open_ + failed_ == opt_.connections &&
          next == conns_.size()) {
        std::printf("{\"error\": \"%d connections failed: %s\"}\n", failed_, last_error_.c_str());
        return 1;
      }
      const int n = epoll_wait(ep_, events.data(), static_cast<int>(events.size()), 100);
      for (int i = 0; i < n; ++i) {
        if (events[static_cast<std::size_t>(i)].data.u64 == ~std::uint64_t{0}) {
          char b[256];
          if (read(0, b, sizeof b) <= 0) {
            stdin_open = false;
          }
          continue;
        }
        on_event(conns_[events[static_cast<std::size_t>(i)].data.u64],
                 events[static_cast<std::size_t>(i)].events);
      }
    }
  }

  void set_warmup(double seconds) { warm_until_ = seconds; }

 private:
  void open_one(std::size_t i) {
    conn& c = conns_[i];
    c.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    const int one = 1;
    setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(opt_.port));
    inet_pton(AF_INET, opt_.host.c_str(), &a.sin_addr);
    ++connecting_;
    if (connect(c.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS) {
      fail(c, "connect");
      return;
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT;
    ev.data.u64 = i;
    epoll_ctl(ep_, EPOLL_CTL_ADD, c.fd, &ev);
    c.want_out = true;
    c.out = request_;
  }

  void fail(conn& c, const char* why) {
    if (c.state == phase::closed) {
      return;
    }
    if (c.state == phase::open) {
      --open_;
    } else {
      --connecting_;
    }
    c.state = phase::closed;
    ++failed_;
    last_error_ = std::string{why} + ": " + std::strerror(errno);
    if (c.fd >= 0) {
      close(c.fd);
      c.fd = -1;
    }
  }

  void on_event(conn& c, std::uint32_t events) {
    if (c.state == phase::closed) {
      return;
    }
    if ((events & EPOLLOUT) != 0U) {
      if (c.state == phase::connecting) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          errno = err;
          fail(c, "connect");
          return;
        }
        c.state = phase::handshake;
      }
      flush(c);
    }
    if ((events & (EPOLLIN | EPOLLERR | EPOLLHUP)) != 0U) {
      read_some(c);
    }
  }

  void flush(conn& c) {
    while (c.out_off < c.out.size()) {
      const ssize_t n =
          send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN) {
          break;
        }
        fail(c, "send");
        return;
      }
      c.out_off += static_cast<std::size_t>(n);
    }
    if (c.out_off == c.out.size()) {
      c.out.clear();
      c.out_off = 0;
    }
    const bool want = !c.out.empty() || c.state == phase::connecting;
    if (want != c.want_out) {
      c.want_out = want;
      epoll_event ev{};
      ev.events = EPOLLIN | (want ? EPOLLOUT : 0U);
      ev.data.u64 = static_cast<std::uint64_t>(&c - conns_.data());
      epoll_ctl(ep_, EPOLL_CTL_MOD, c.fd, &ev);
    }
  }

  void send_message(conn& c) {
    c.sent.push_back(clock_type::now());
    c.out += frame_;
  }

  void read_some(conn& c) {
    char buf[65536];
    for (;;) {
      const ssize_t n = recv(c.fd, buf, sizeof buf, 0);
      if (n == 0) {
        errno = ECONNRESET;
        fail(c, "server closed");
        return;
      }
      if (n < 0) {
        if (errno == EAGAIN) {
          break;
        }
        fail(c, "recv");
        return;
      }
      c.in.append(buf, static_cast<std::size_t>(n));
      if (static_cast<std::size_t>(n) < sizeof buf) {
        break;
      }
    }
    if (c.state == phase::handshake) {
      const std::size_t end = c.in.find("\r\n\r\n");
      if (end == std::string::npos) {
        return;
      }
      if (c.in.compare(0, 12, "HTTP/1.1 101") != 0) {
        errno = EPROTO;
        fail(c, "handshake refused");
        return;
      }
      c.in.erase(0, end + 4);
      c.state = phase::open;
      --connecting_;
      ++open_;
      if (!opt_.idle) {
        for (int i = 0; i < opt_.inflight; ++i) {
          send_message(c);
        }
      }
    }
    parse(c);
    if (c.state != phase::closed) {
      flush(c);
    }
  }

  void parse(conn& c) {
    std::size_t pos = 0;
    const auto* p = reinterpret_cast<const unsigned char*>(c.in.data());
    const std::size_t size = c.in.size();
    while (size - pos >= 2) {
      const unsigned op = p[pos] & 0x0FU;
      std::uint64_t len = p[pos + 1] & 0x7FU;
      std::size_t head = 2;
      if (len == 126) {
        if (size - pos < 4) {
          break;
        }
        len = (static_cast<std::uint64_t>(p[pos + 2]) << 8U) | p[pos + 3];
        head = 4;
      } else if (len == 127) {
        if (size - pos < 10) {
          break;
        }
        len = 0;
        for (std::size_t i = 0; i < 8; ++i) {
          len = (len << 8U) | p[pos + 2 + i];
        }
        head = 10;
      }
      if (size - pos < head + len) {
        break;
      }
      const std::string_view payload{c.in.data() + pos + head, static_cast<std::size_t>(len)};
      pos += head + static_cast<std::size_t>(len);
      if (op == 0x9) {  // ping: answer with a masked pong of the same payload
        std::string pong = frame_for(0, 0xA);
        if (!payload.empty() && payload.size() < 126) {
          pong = frame_for(payload.size(), 0xA);
          const unsigned char mask[4] = {0x37, 0xfa, 0x21, 0x3d};
          for (std::size_t i = 0; i < payload.size(); ++i) {
            pong[6 + i] = static_cast<char>(static_cast<unsigned char>(payload[i]) ^ mask[i % 4]);
          }
        }
        c.out += pong;
      } else if (op == 0x8) {
        errno = ECONNRESET;
        fail(c, "server sent close");
        return;
      } else if (op == 0x1 || op == 0x2 || op == 0x0) {
        if ((p[pos - head - static_cast<std::size_t>(len)] & 0x80U) == 0) {
          continue;  // a fragment: the message ends with its FIN frame
        }
        if (payload.size() != opt_.size && op != 0x0) {
          ++bad_echoes_;
        }
        const auto now = clock_type::now();
        if (!c.sent.empty()) {
          if (measuring_) {
            const auto us =
                std::chrono::duration_cast<std::chrono::microseconds>(now - c.sent.front()).count();
            latencies_.push_back(static_cast<std::uint32_t>(std::min<long long>(us, 0xFFFFFFFFLL)));
            ++counted_;
          }
          c.sent.pop_front();
        }
        send_message(c);
      }
    }
    c.in.erase(0, pos);
  }

  void report(double seconds) {
    std::sort(latencies_.begin(), latencies_.end());
    const auto pct = [&](double q) -> double {
      if (latencies_.empty()) {
        return 0.0;
      }
      return latencies_[std::min(
          latencies_.size() - 1,
          static_cast<std::size_t>(q * static_cast<double>(latencies_.size())))];
    };
    std::printf(
        "{\"messages\": %llu, \"seconds\": %.4f, \"msgs_per_s\": %.1f, \"p50_us\": %.0f, "
        "\"p99_us\": %.0f, "
        "\"open\": %d, \"failed\": %d, \"bad_echoes\": %llu, \"error\": \"%s\"}\n",
        static_cast<unsigned long long>(counted_), seconds, static_cast<double>(counted_) / seconds,
        pct(0.5), pct(0.99), open_, failed_, static_cast<unsigned long long>(bad_echoes_),
        last_error_.c_str());
  }

  options opt_;
  std::string frame_;
  std::string request_;
  int ep_ = -1;
  std::vector<conn> conns_;
  int connecting_ = 0;
  int open_ = 0;
  int failed_ = 0;
  std::string last_error_;
  bool measuring_ = false;
  double warm_until_ = 0.0;
  clock_type::time_point measure_start_;
  std::uint64_t counted_ = 0;
  std::uint64_t bad_echoes_ = 0;
  std::vector<std::uint32_t> latencies_;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "ws_load: %s\nusage: ws_load --port P [--host H] [--path /ws] [--connections N] "
               "[--size BYTES]"
               " [--inflight K] [--duration S] [--warmup S] [--idle]\n",
               why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        usage("missing value");
      }
      return argv[++i];
    };
    if (a == "--host") {
      o.host = value();
    } else if (a == "--port") {
      o.port = std::atoi(value());
    } else if (a == "--path") {
      o.path = value();
    } else if (a == "--connections") {
      o.connections = std::atoi(value());
    } else if (a == "--size") {
      o.size = static_cast<std::size_t>(std::atoll(value()));
    } else if (a == "--inflight") {
      o.inflight = std::atoi(value());
    } else if (a == "--duration") {
      o.duration = std::atof(value());
    } else if (a == "--warmup") {
      o.warmup = std::atof(value());
    } else if (a == "--idle") {
      o.idle = true;
    } else {
      usage("unknown argument");
    }
  }
  if (o.connections < 1 || o.inflight < 1 || o.port <= 0) {
    usage("bad --connections, --inflight or --port");
  }
  load l{o};
  l.set_warmup(o.warmup);
  return l.run();
}
