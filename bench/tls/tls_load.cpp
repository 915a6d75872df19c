// tls_load: the HTTPS load generator of bench/tls/driver.py.
//
// One thread, epoll, non-blocking sockets, OpenSSL on each socket (no
// certificate verification: the servers under test use a throw-away one).
// Each connection sends a GET, reads the whole response (status line,
// Content-Length body), checks the status is 200, and sends the next one on
// the same connection (keep-alive), or with --new-conn closes and opens a new
// TLS connection for every request (a full handshake each time unless
// --resume, which offers the last session's ticket). A reset, an early close
// or a bad status is counted as an error and the connection is opened again.
//
// Prints one JSON object on stdout: requests, rps, handshakes,
// handshakes_per_s, resumed, p50_us, p99_us, errors.
//
//   tls_load --port 8443 --connections 64 --duration 10
//   tls_load --port 8443 --connections 16 --duration 10 --new-conn

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <string_view>
#include <vector>

namespace {

std::uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ULL +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

struct options {
  int port = 8443;
  int connections = 64;
  double duration = 10.0;
  bool new_conn = false;
  bool resume = false;
  std::string path = "/";
};

enum class phase { handshake, send, receive };

struct conn {
  int fd = -1;
  SSL* ssl = nullptr;
  phase at = phase::handshake;
  std::string in;
  std::uint64_t started = 0;
};

struct load {
  options opt;
  SSL_CTX* ctx = nullptr;
  int ep = -1;
  sockaddr_in addr{};
  std::string request;
  std::vector<conn> conns;
  SSL_SESSION* session = nullptr;  // the last one, for --resume
  std::uint64_t requests = 0, handshakes = 0, resumed = 0, errors = 0;
  std::vector<std::uint32_t> latencies_us;
  bool measuring = true;

  void open(std::size_t i) {
    conn& c = conns[i];
    c = conn{};
    c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    const int one = 1;
    ::setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (::connect(c.fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 &&
        errno != EINPROGRESS) {
      std::perror("connect");
      std::exit(1);
    }
    c.ssl = SSL_new(ctx);
    SSL_set_fd(c.ssl, c.fd);
    SSL_set_connect_state(c.ssl);
    if (opt.resume && session != nullptr) {
      SSL_set_session(c.ssl, session);
    }
    c.started = now_ns();
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT;
    ev.data.u64 = i;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, c.fd, &ev);
  }

  void close(std::size_t i) {
    conn& c = conns[i];
    ::epoll_ctl(ep, EPOLL_CTL_DEL, c.fd, nullptr);
    if (opt.resume) {
      // Freed without close_notify, OpenSSL marks the session not resumable.
      (void)SSL_shutdown(c.ssl);
      ERR_clear_error();
      if (SSL_SESSION* s = SSL_get1_session(c.ssl)) {
        if (session != nullptr) {
          SSL_SESSION_free(session);
        }
        session = s;
      }
    }
    SSL_free(c.ssl);
    ::close(c.fd);
    c.ssl = nullptr;
    c.fd = -1;
  }

  void fail(std::size_t i) {
    ++errors;
    ERR_clear_error();
    close(i);
    open(i);
  }

  void want(std::size_t i, int err) {
    epoll_event ev{};
    ev.events = err == SSL_ERROR_WANT_WRITE ? EPOLLOUT : EPOLLIN;
    ev.data.u64 = i;
    ::epoll_ctl(ep, EPOLL_CTL_MOD, conns[i].fd, &ev);
  }

  /// The response in c.in is whole: true, and its length in `used`.
  static bool complete(const std::string& in, std::size_t& used, bool& ok) {
    const std::size_t head = in.find("\r\n\r\n");
    if (head == std::string::npos) {
      return false;
    }
    ok = in.compare(0, 12, "HTTP/1.1 200") == 0;
    std::size_t length = 0;
    std::string lower = in.substr(0, head);
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    const std::size_t cl = lower.find("\r\ncontent-length:");
    if (cl != std::string::npos) {
      length = std::strtoull(lower.c_str() + cl + 17, nullptr, 10);
    }
    if (in.size() < head + 4 + length) {
      return false;
    }
    used = head + 4 + length;
    return true;
  }

  void drive(std::size_t i) {
    for (;;) {
      conn& c = conns[i];
      ERR_clear_error();
      if (c.at == phase::handshake) {
        const int r = SSL_do_handshake(c.ssl);
        if (r != 1) {
          const int err = SSL_get_error(c.ssl, r);
          if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
            want(i, err);
            return;
          }
          fail(i);
          return;
        }
        if (measuring) {
          ++handshakes;
          resumed += SSL_session_reused(c.ssl) != 0 ? 1 : 0;
        }
        c.at = phase::send;
        if (!opt.new_conn) {
          c.started = now_ns();
        }
      }
      if (c.at == phase::send) {
        const int r = SSL_write(c.ssl, request.data(), static_cast<int>(request.size()));
        if (r <= 0) {
          const int err = SSL_get_error(c.ssl, r);
          if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
            want(i, err);
            return;
          }
          fail(i);
          return;
        }
        c.at = phase::receive;
      }
      char buf[16384];
      const int r = SSL_read(c.ssl, buf, sizeof buf);
      if (r <= 0) {
        const int err = SSL_get_error(c.ssl, r);
        if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
          want(i, err);
          return;
        }
        fail(i);
        return;
      }
      c.in.append(buf, static_cast<std::size_t>(r));
      std::size_t used = 0;
      bool ok = false;
      if (!complete(c.in, used, ok)) {
        continue;
      }
      if (!ok) {
        fail(i);
        return;
      }
      if (measuring) {
        ++requests;
        latencies_us.push_back(static_cast<std::uint32_t>((now_ns() - c.started) / 1000));
      }
      c.in.erase(0, used);
      if (opt.new_conn) {
        close(i);
        open(i);
        return;
      }
      c.at = phase::send;
      c.started = now_ns();
    }
  }

  int run() {
    ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
    static constexpr unsigned char alpn[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
    SSL_CTX_set_alpn_protos(ctx, alpn, sizeof alpn);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT);
    request = std::string{"GET "}.append(opt.path).append(" HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    request.append(opt.new_conn ? "Connection: close\r\n\r\n" : "\r\n");
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(opt.port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ep = ::epoll_create1(0);
    conns.resize(static_cast<std::size_t>(opt.connections));
    for (std::size_t i = 0; i < conns.size(); ++i) {
      open(i);
    }
    const std::uint64_t start = now_ns();
    const auto end = start + static_cast<std::uint64_t>(opt.duration * 1e9);
    std::vector<epoll_event> events(conns.size());
    while (now_ns() < end) {
      const int n = ::epoll_wait(ep, events.data(), static_cast<int>(events.size()), 100);
      for (int k = 0; k < n; ++k) {
        drive(static_cast<std::size_t>(events[static_cast<std::size_t>(k)].data.u64));
      }
    }
    const double seconds = static_cast<double>(now_ns() - start) / 1e9;
    std::sort(latencies_us.begin(), latencies_us.end());
    auto pct = [&](double p) -> unsigned {
      if (latencies_us.empty()) {
        return 0;
      }
      const auto idx =
          static_cast<std::size_t>(p / 100.0 * static_cast<double>(latencies_us.size() - 1));
      return latencies_us[idx];
    };
    std::printf(
        "{\"requests\": %llu, \"seconds\": %.3f, \"rps\": %.1f, \"handshakes\": %llu, "
        "\"handshakes_per_s\": %.1f, \"resumed\": %llu, \"p50_us\": %u, \"p99_us\": %u, "
        "\"errors\": %llu}\n",
        static_cast<unsigned long long>(requests), seconds, static_cast<double>(requests) / seconds,
        static_cast<unsigned long long>(handshakes), static_cast<double>(handshakes) / seconds,
        static_cast<unsigned long long>(resumed), pct(50), pct(99),
        static_cast<unsigned long long>(errors));
    return 0;
  }
};

}  // namespace

int main(int argc, char** argv) {
  load l;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--port") {
      l.opt.port = std::atoi(v), ++i;
    } else if (a == "--connections") {
      l.opt.connections = std::atoi(v), ++i;
    } else if (a == "--duration") {
      l.opt.duration = std::atof(v), ++i;
    } else if (a == "--path") {
      l.opt.path = v, ++i;
    } else if (a == "--new-conn") {
      l.opt.new_conn = true;
    } else if (a == "--resume") {
      l.opt.resume = true;
    } else {
      std::fprintf(stderr, "tls_load: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  return l.run();
}
