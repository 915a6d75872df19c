#pragma once

// A raw-socket HTTP/1.1 client for the core-pair tests: it writes bytes as
// given and reads responses byte-exactly, so a test sees what is on the wire.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <functional>
#include <thread>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <utility>

namespace cadeloop::test {

/// One parsed response.
struct http_response {
  bool ok = false;       ///< a complete response was read
  int status = 0;
  std::string status_line;
  std::map<std::string, std::string> headers;  ///< names lower-cased
  std::string body;

  [[nodiscard]] std::string header(const std::string& lower) const {
    auto it = headers.find(lower);
    return it == headers.end() ? std::string{} : it->second;
  }
};

class test_client {
 public:
  test_client() = default;
  explicit test_client(int fd) : fd_{fd} {}
  test_client(test_client&& o) noexcept : fd_{std::exchange(o.fd_, -1)}, buf_{std::move(o.buf_)} {}
  test_client& operator=(test_client&& o) noexcept {
    close();
    fd_ = std::exchange(o.fd_, -1);
    buf_ = std::move(o.buf_);
    return *this;
  }
  ~test_client() { close(); }

  static test_client tcp(std::uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      return test_client{};
    }
    return test_client{fd};
  }

  static test_client unix_socket(const std::string& path) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.data(), path.size());
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      return test_client{};
    }
    return test_client{fd};
  }

  [[nodiscard]] bool connected() const { return fd_ >= 0; }
  [[nodiscard]] int fd() const { return fd_; }

  void close() {
    if (fd_ >= 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }

  /// Writes everything (blocking). False on error.
  bool send(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) {
          continue;
        }
        return false;
      }
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }

  void shutdown_write() { ::shutdown(fd_, SHUT_WR); }

  /// Reads one response (`head_request`: no body follows the head).
  http_response read_response(bool head_request = false, std::chrono::milliseconds timeout = std::chrono::seconds{10}) {
    http_response r;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::size_t end = std::string::npos;
    while ((end = buf_.find("\r\n\r\n")) == std::string::npos) {
      if (!fill(deadline)) {
        return r;
      }
    }
    const std::string head = buf_.substr(0, end);
    buf_.erase(0, end + 4);
    std::size_t line_end = head.find("\r\n");
    r.status_line = head.substr(0, line_end);
    if (r.status_line.size() >= 12) {
      r.status = std::atoi(r.status_line.substr(9, 3).c_str());
    }
    while (line_end != std::string::npos) {
      const std::size_t start = line_end + 2;
      line_end = head.find("\r\n", start);
      const std::string line = head.substr(start, line_end == std::string::npos ? std::string::npos : line_end - start);
      const std::size_t colon = line.find(':');
      if (colon == std::string::npos) {
        continue;
      }
      std::string name = line.substr(0, colon);
      for (char& ch : name) {
        ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      }
      std::string value = line.substr(colon + 1);
      while (!value.empty() && value.front() == ' ') {
        value.erase(0, 1);
      }
      r.headers[name] = value;
    }
    if (head_request || r.status == 204 || r.status == 304 || (r.status >= 100 && r.status < 200)) {
      r.ok = true;
      return r;
    }
    if (r.headers.count("content-length") != 0) {
      const std::size_t len = std::stoull(r.headers["content-length"]);
      while (buf_.size() < len) {
        if (!fill(deadline)) {
          return r;
        }
      }
      r.body = buf_.substr(0, len);
      buf_.erase(0, len);
      r.ok = true;
      return r;
    }
    if (r.header("transfer-encoding") == "chunked") {
      for (;;) {
        std::size_t le = 0;
        while ((le = buf_.find("\r\n")) == std::string::npos) {
          if (!fill(deadline)) {
            return r;
          }
        }
        const std::size_t size = std::stoull(buf_.substr(0, le), nullptr, 16);
        while (buf_.size() < le + 2 + size + 2) {
          if (!fill(deadline)) {
            return r;
          }
        }
        r.body += buf_.substr(le + 2, size);
        buf_.erase(0, le + 2 + size + 2);
        if (size == 0) {
          r.ok = true;
          return r;
        }
      }
    }
    // Close-delimited.
    while (fill(deadline)) {
    }
    r.body = std::move(buf_);
    buf_.clear();
    r.ok = true;
    return r;
  }

  /// True when the server closes (EOF or reset) within `timeout` without
  /// sending anything more.
  bool closed_by_server(std::chrono::milliseconds timeout = std::chrono::seconds{10}) {
    if (!buf_.empty()) {
      return false;
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    char tmp[4096];
    for (;;) {
      if (!wait_readable(deadline)) {
        return false;
      }
      const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
      if (n == 0 || (n < 0 && errno == ECONNRESET)) {
        return true;
      }
      if (n > 0) {
        buf_.append(tmp, static_cast<std::size_t>(n));
        return false;
      }
      if (errno != EINTR && errno != EAGAIN) {
        return false;
      }
    }
  }

  /// True when nothing arrives (no bytes, no EOF) for `quiet`.
  bool silent_for(std::chrono::milliseconds quiet) {
    pollfd p{fd_, POLLIN, 0};
    return buf_.empty() && ::poll(&p, 1, static_cast<int>(quiet.count())) == 0;
  }

  /// Bytes received but not yet parsed.
  std::string& buffered() { return buf_; }

  /// Reads what is available within `timeout` into the buffer; false on EOF/error/timeout.
  bool fill(std::chrono::steady_clock::time_point deadline) {
    if (!wait_readable(deadline)) {
      return false;
    }
    char tmp[65536];
    const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n <= 0) {
      return false;
    }
    buf_.append(tmp, static_cast<std::size_t>(n));
    return true;
  }

 private:
  bool wait_readable(std::chrono::steady_clock::time_point deadline) {
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        return false;
      }
      pollfd p{fd_, POLLIN, 0};
      const int r = ::poll(&p, 1, static_cast<int>(left.count()));
      if (r > 0) {
        return true;
      }
      if (r < 0 && errno != EINTR) {
        return false;
      }
    }
  }

  int fd_ = -1;
  std::string buf_;
};

/// "GET <target> HTTP/1.1" with a Host header and `extra` header lines.
inline std::string get_request(std::string_view target, std::string_view extra = {}) {
  std::string r = "GET ";
  r += target;
  r += " HTTP/1.1\r\nHost: test\r\n";
  r += extra;
  r += "\r\n";
  return r;
}

/// Polls `pred` every 2 ms until it holds or `timeout` passes; its last answer.
inline bool eventually(const std::function<bool()>& pred,
                       std::chrono::milliseconds timeout = std::chrono::seconds{10}) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds{2});
  }
  return pred();
}

}  // namespace cadeloop::test
