// loadgen: the HTTP/1.1 load generator of bench/http/driver.py.
//
// One thread, epoll, nonblocking sockets. Every response is parsed (status line,
// Content-Length or chunked body) and checked: its status and its body length
// against the expected ones; a mismatch, a reset or an early close is counted
// as an error and the connection is opened again. Latency goes into a
// log-linear histogram (1/64 relative precision).
//
// Closed loop (default): each connection keeps --pipeline requests in flight,
// sending the next batch when the whole previous batch has been answered.
// --new-conn: every request on a fresh connection (sent with Connection: close;
// latency includes the connect). Open loop (--rate R): requests are due at a
// fixed total rate, spread evenly over the connections; a request whose
// connection is still busy waits, and its latency is counted from when it was
// due, not from when it was sent (coordinated omission corrected, as wrk2).
//
// The open loop polls (epoll_pwait2 with a zero timeout) while a request is due within
// 2 ms, so a due request goes out on time instead of after a timer's wake-up; how
// late each one went out is reported (send_late_*): when those grow, the load
// generator itself is the bottleneck and the latencies say so (only requests whose
// connection was free when they came due count there: a busy connection's wait is the
// server's). --warmup S runs the open loop for S seconds before the measured --duration
// and records nothing from it.
//
// --poll: never sleep in epoll, in either loop. A client that sleeps while it waits for
// answers makes the server wake it: on this VM a wake-up of an idle CPU is an interrupt
// sent from the server's CPU (a VM exit), charged to the server's CPU time, and only to a
// server slower than this client. With --poll no server pays it.
//
// Prints one JSON object on stdout. --timeline FILE also writes, per 10 ms of the
// run (by completion time), the responses completed and their largest latency
// (CSV: ms,responses,max_us), to see whether a tail is steady or a few stalls.
//
//   loadgen --port 8000 --path / --connections 64 --duration 5 --expect-status 200 --expect-length
//   13 loadgen --port 8000 --path /upload --method POST --body-size 16384 --connections 64
//   --duration 5 loadgen --port 8000 --path / --connections 64 --duration 10 --rate 40000 loadgen
//   --port 8000 --connections 1 --duration 600 --requests 2000   (stops after 2000 responses)

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
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

// Log-linear histogram of nanoseconds: 64 linear sub-buckets per power of two.
class Histogram {
 public:
  Histogram() : counts_(64 * 64, 0) {}
  void add(std::uint64_t ns) {
    counts_[index(ns)]++;
    total_++;
    if (ns > max_)
      max_ = ns;
  }
  [[nodiscard]] std::uint64_t total() const { return total_; }
  [[nodiscard]] double percentile_us(double p) const {
    if (total_ == 0)
      return 0.0;
    auto rank = static_cast<std::uint64_t>(std::ceil(p / 100.0 * static_cast<double>(total_)));
    if (rank == 0)
      rank = 1;
    std::uint64_t seen = 0;
    for (std::size_t i = 0; i < counts_.size(); ++i) {
      seen += counts_[i];
      if (seen >= rank)
        return static_cast<double>(upper(i)) / 1000.0;
    }
    return static_cast<double>(max_) / 1000.0;
  }
  [[nodiscard]] double max_us() const { return static_cast<double>(max_) / 1000.0; }

 private:
  static std::size_t index(std::uint64_t v) {
    if (v < 64)
      return static_cast<std::size_t>(v);
    const int msb = 63 - __builtin_clzll(v);  // >= 6
    const int shift = msb - 5;                // keep 6 significant bits
    const std::size_t sub = static_cast<std::size_t>(v >> shift) & 31U;
    std::size_t i = static_cast<std::size_t>(shift) * 32 + 32 + sub;
    return i < 64 * 64 ? i : 64 * 64 - 1;
  }
  static std::uint64_t upper(std::size_t i) {
    if (i < 64)
      return i;
    const std::size_t shift = (i - 32) / 32;
    const std::uint64_t sub = (i - 32) % 32;
    return ((32 + sub + 1) << shift) - 1;
  }
  std::vector<std::uint64_t> counts_;
  std::uint64_t total_ = 0;
  std::uint64_t max_ = 0;
};

struct Options {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string path = "/";
  std::string method = "GET";
  int connections = 64;
  double duration = 5.0;
  int pipeline = 1;
  bool new_conn = false;
  std::size_t body_size = 0;
  double rate = 0.0;
  double warmup = 0.0;  // open loop: seconds at the rate before the measured --duration
  int expect_status = 200;
  long long expect_length = -1;
  std::uint64_t max_requests = 0;  // stop after this many responses (0: run for --duration)
  std::string timeline;            // CSV of 10 ms slots, "" for none
  bool poll = false;               // never sleep in epoll: the client's CPU never idles (--poll)
};

struct Errors {
  std::uint64_t connect = 0, read = 0, write = 0, closed = 0, status = 0, length = 0, parse = 0;
  [[nodiscard]] std::uint64_t total() const {
    return connect + read + write + closed + status + length + parse;
  }
};

enum class Parse { head, body_length, chunk_size, chunk_data, chunk_crlf, trailers };

struct Conn {
  int fd = -1;
  bool connecting = false;
  std::uint64_t connect_at = 0;
  bool want_out = false;
  std::size_t out_off = 0;             // bytes of the request batch written so far
  int in_flight = 0;                   // requests sent (or being sent) and not yet answered
  std::vector<std::uint64_t> started;  // per in-flight request: when it was due or sent, in order
  std::size_t answered = 0;            // responses of the current batch read
  // open loop
  std::uint64_t next_due = 0;
  // parser
  Parse state = Parse::head;
  std::string head;
  int status = 0;
  long long remaining = 0;  // body bytes left (Content-Length) or in this chunk
  long long body = 0;
  bool chunked = false;
  bool server_closes = false;  // the response said "Connection: close"
  std::string line;            // chunk size line or trailer line being read
};

class Generator {
 public:
  explicit Generator(Options o) : o_(std::move(o)) {
    std::string req = o_.method + " " + o_.path + " HTTP/1.1\r\nHost: " + o_.host + "\r\n";
    if (o_.body_size > 0) {
      req += "Content-Type: application/octet-stream\r\nContent-Length: " +
             std::to_string(o_.body_size) + "\r\n";
    }
    if (o_.new_conn)
      req += "Connection: close\r\n";
    req += "\r\n";
    req.append(o_.body_size, 'x');
    one_ = req;
    for (int i = 0; i < o_.pipeline; ++i)
      batch_ += req;
    addr_.sin_family = AF_INET;
    addr_.sin_port = htons(static_cast<std::uint16_t>(o_.port));
    inet_pton(AF_INET, o_.host.c_str(), &addr_.sin_addr);
    ep_ = epoll_create1(EPOLL_CLOEXEC);
    conns_.resize(static_cast<std::size_t>(o_.connections));
    buf_.resize(256 * 1024);
  }

  int run() {
    const std::uint64_t start = now_ns();
    // The open loop's warm-up runs at the rate but records nothing: the measured window is the
    // steady state, not the queue a fresh set of connections builds in its first milliseconds.
    start_ = start + static_cast<std::uint64_t>(o_.warmup * 1e9);
    end_ = start_ + static_cast<std::uint64_t>(o_.duration * 1e9);
    if (!o_.timeline.empty()) {
      slots_.assign(static_cast<std::size_t>(o_.duration * 100) + 1, Slot{});
    }
    const bool open_loop = o_.rate > 0;
    if (open_loop)
      interval_ = static_cast<std::uint64_t>(1e9 * o_.connections / o_.rate);
    for (std::size_t i = 0; i < conns_.size(); ++i) {
      conns_[i].next_due = start + static_cast<std::uint64_t>(1e9 * static_cast<double>(i) /
                                                              (open_loop ? o_.rate : 1e9));
      open_conn(i);
    }
    std::vector<epoll_event> events(1024);
    while (true) {
      const std::uint64_t t = now_ns();
      if (t >= end_)
        break;
      std::uint64_t wait_ns = end_ - t;
      if (open_loop) {
        std::uint64_t due = UINT64_MAX;
        for (std::size_t i = 0; i < conns_.size(); ++i) {
          Conn& c = conns_[i];
          if (c.fd >= 0 && !c.connecting && c.in_flight == 0) {
            if (c.next_due <= t)
              send_due(i, t, true);
            if (c.in_flight == 0 && c.next_due < due)
              due = c.next_due;
          }
        }
        // Poll while something is due soon; sleep (to 2 ms before it) otherwise.
        if (due != UINT64_MAX)
          wait_ns = std::min(wait_ns, due > t + spin_ns ? due - t - spin_ns : 0);
      }
      if (o_.poll)
        wait_ns = 0;
      timespec timeout{};
      timeout.tv_sec = static_cast<time_t>(wait_ns / 1000000000ULL);
      timeout.tv_nsec = static_cast<long>(wait_ns % 1000000000ULL);
      const int n =
          epoll_pwait2(ep_, events.data(), static_cast<int>(events.size()), &timeout, nullptr);
      for (int k = 0; k < n; ++k)
        handle(static_cast<std::size_t>(events[static_cast<std::size_t>(k)].data.u64),
               events[static_cast<std::size_t>(k)].events);
    }
    const double elapsed = static_cast<double>(now_ns() - start_) / 1e9;
    report(elapsed);
    return 0;
  }

 private:
  void open_conn(std::size_t i) {
    Conn& c = conns_[i];
    const std::uint64_t due = c.next_due;
    c = Conn{};
    c.next_due = due;
    c.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c.connect_at = now_ns();
    int r = connect(c.fd, reinterpret_cast<sockaddr*>(&addr_), sizeof addr_);
    if (r < 0 && errno != EINPROGRESS) {
      errors_.connect++;
      ::close(c.fd);
      c.fd = -1;
      return;
    }
    c.connecting = true;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT;
    ev.data.u64 = i;
    epoll_ctl(ep_, EPOLL_CTL_ADD, c.fd, &ev);
    c.want_out = true;
  }

  void close_conn(std::size_t i) {
    Conn& c = conns_[i];
    if (c.fd >= 0)
      ::close(c.fd);  // also leaves the epoll set
    c.fd = -1;
  }

  void fail(std::size_t i, std::uint64_t& counter) {
    counter++;
    close_conn(i);
    if (now_ns() < end_)
      open_conn(i);
  }

  void set_out(std::size_t i, bool on) {
    Conn& c = conns_[i];
    if (c.want_out == on)
      return;
    epoll_event ev{};
    ev.events = EPOLLIN | (on ? EPOLLOUT : 0U);
    ev.data.u64 = i;
    epoll_ctl(ep_, EPOLL_CTL_MOD, c.fd, &ev);
    c.want_out = on;
  }

  // Queues a batch (closed loop: --pipeline requests; open loop: one) and writes what fits.
  void send_batch(std::size_t i, std::uint64_t due) {
    Conn& c = conns_[i];
    const int n = o_.rate > 0 ? 1 : o_.pipeline;
    c.started.assign(static_cast<std::size_t>(n), due);
    c.in_flight = n;
    c.answered = 0;
    c.out_off = 0;
    flush(i);
  }

  // Open loop: sends connection i's request that was due at next_due (now is t). `idle`: the
  // connection was free when it came due, so any lateness is the load generator's own.
  void send_due(std::size_t i, std::uint64_t t, bool idle) {
    Conn& c = conns_[i];
    if (idle && c.next_due >= start_)
      late_.add(t - c.next_due);
    const std::uint64_t due = c.next_due;
    c.next_due += interval_;
    send_batch(i, due);
  }

  [[nodiscard]] const std::string& payload() const { return o_.rate > 0 ? one_ : batch_; }

  void flush(std::size_t i) {
    Conn& c = conns_[i];
    const std::string& p = payload();
    while (c.out_off < p.size()) {
      ssize_t w = ::send(c.fd, p.data() + c.out_off, p.size() - c.out_off, MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EAGAIN) {
          set_out(i, true);
          return;
        }
        fail(i, errors_.write);
        return;
      }
      c.out_off += static_cast<std::size_t>(w);
    }
    set_out(i, false);
  }

  void handle(std::size_t i, std::uint32_t events) {
    Conn& c = conns_[i];
    if (c.fd < 0)
      return;
    if (c.connecting) {
      if (events & (EPOLLERR | EPOLLHUP)) {
        fail(i, errors_.connect);
        return;
      }
      if (!(events & EPOLLOUT))
        return;
      c.connecting = false;
      if (o_.rate > 0) {
        set_out(i, false);
        return;  // the main loop sends when due
      }
      send_batch(i, o_.new_conn ? c.connect_at : now_ns());
      return;
    }
    if ((events & EPOLLOUT) && c.out_off < payload().size())
      flush(i);
    if (c.fd < 0)
      return;
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR))
      read_ready(i);
  }

  void read_ready(std::size_t i) {
    while (true) {
      Conn& c = conns_[i];
      if (c.fd < 0)
        return;
      ssize_t r = ::recv(c.fd, buf_.data(), buf_.size(), 0);
      if (r < 0) {
        if (errno == EAGAIN)
          return;
        fail(i, errors_.read);
        return;
      }
      if (r == 0) {
        fail(i, errors_.closed);
        return;
      }
      if (!consume(i, buf_.data(), static_cast<std::size_t>(r)))
        return;
      if (static_cast<std::size_t>(r) < buf_.size())
        return;
    }
  }

  // Feeds bytes to connection i's parser; false when the connection was closed or replaced.
  bool consume(std::size_t i, const char* p, std::size_t n) {
    Conn* c = &conns_[i];
    std::size_t pos = 0;
    while (pos < n) {
      switch (c->state) {
        case Parse::head: {
          const std::size_t before = c->head.size();
          c->head.append(p + pos, n - pos);
          const std::size_t from = before >= 3 ? before - 3 : 0;
          const std::size_t end = c->head.find("\r\n\r\n", from);
          if (end == std::string::npos) {
            if (c->head.size() > 65536) {
              fail(i, errors_.parse);
              return false;
            }
            pos = n;
            break;
          }
          pos += end + 4 - before;
          if (!parse_head(*c, end)) {
            fail(i, errors_.parse);
            return false;
          }
          c->head.clear();
          c->body = 0;
          if (c->chunked) {
            c->state = Parse::chunk_size;
            c->line.clear();
          } else if (c->remaining > 0) {
            c->state = Parse::body_length;
          } else if (!complete(i)) {
            return false;
          }
          break;
        }
        case Parse::body_length: {
          const std::size_t take =
              std::min<std::size_t>(n - pos, static_cast<std::size_t>(c->remaining));
          pos += take;
          c->remaining -= static_cast<long long>(take);
          c->body += static_cast<long long>(take);
          if (c->remaining == 0) {
            c->state = Parse::head;
            if (!complete(i))
              return false;
          }
          break;
        }
        case Parse::chunk_size:
        case Parse::trailers: {
          const char* nl = static_cast<const char*>(std::memchr(p + pos, '\n', n - pos));
          const std::size_t upto = nl ? static_cast<std::size_t>(nl - p) + 1 : n;
          c->line.append(p + pos, upto - pos);
          pos = upto;
          if (!nl)
            break;
          if (c->state == Parse::trailers) {
            const bool empty = c->line == "\r\n" || c->line == "\n";
            c->line.clear();
            if (empty) {
              c->state = Parse::head;
              if (!complete(i))
                return false;
            }
            break;
          }
          char* endp = nullptr;
          const long long size = std::strtoll(c->line.c_str(), &endp, 16);
          if (endp == c->line.c_str() || size < 0) {
            fail(i, errors_.parse);
            return false;
          }
          c->line.clear();
          if (size == 0) {
            c->state = Parse::trailers;
          } else {
            c->remaining = size;
            c->state = Parse::chunk_data;
          }
          break;
        }
        case Parse::chunk_data: {
          const std::size_t take =
              std::min<std::size_t>(n - pos, static_cast<std::size_t>(c->remaining));
          pos += take;
          c->remaining -= static_cast<long long>(take);
          c->body += static_cast<long long>(take);
          if (c->remaining == 0) {
            c->state = Parse::chunk_crlf;
            c->line.clear();
          }
          break;
        }
        case Parse::chunk_crlf: {
          const char ch = p[pos++];
          if (ch == '\n')
            c->state = Parse::chunk_size;
          else if (ch != '\r') {
            fail(i, errors_.parse);
            return false;
          }
          break;
        }
      }
      c = &conns_[i];
      if (c->fd < 0)
        return false;
    }
    return true;
  }

  static bool iequals_prefix(std::string_view line, std::string_view name) {
    if (line.size() < name.size())
      return false;
    for (std::size_t k = 0; k < name.size(); ++k) {
      char a = line[k];
      if (a >= 'A' && a <= 'Z')
        a = static_cast<char>(a - 'A' + 'a');
      if (a != name[k])
        return false;
    }
    return true;
  }

  static bool parse_head(Conn& c, std::size_t end) {
    std::string_view h(c.head.data(), end + 2);
    if (h.size() < 12 || h.substr(0, 7) != "HTTP/1.")
      return false;
    c.status = std::atoi(std::string(h.substr(9, 3)).c_str());
    c.remaining = 0;
    c.chunked = false;
    c.server_closes = false;
    std::size_t at = h.find("\r\n") + 2;
    while (at < h.size()) {
      const std::size_t eol = h.find("\r\n", at);
      std::string_view line = h.substr(at, eol - at);
      at = eol + 2;
      if (iequals_prefix(line, "content-length:")) {
        c.remaining = std::atoll(std::string(line.substr(15)).c_str());
      } else if (iequals_prefix(line, "transfer-encoding:")) {
        c.chunked = line.find("chunked") != std::string_view::npos;
      } else if (iequals_prefix(line, "connection:")) {
        c.server_closes = line.find("close") != std::string_view::npos;
      }
    }
    return true;
  }

  // One response fully read: check it, record it, and send the next batch when this one is done.
  bool complete(std::size_t i) {
    Conn& c = conns_[i];
    const std::uint64_t t = now_ns();
    if (c.in_flight <= 0 || c.answered >= c.started.size()) {
      fail(i, errors_.parse);  // a response nobody asked for
      return false;
    }
    const std::uint64_t began = c.started[c.answered++];
    c.in_flight--;
    if (c.status != o_.expect_status) {
      fail(i, errors_.status);
      return false;
    }
    if (o_.expect_length >= 0 && c.body != o_.expect_length) {
      fail(i, errors_.length);
      return false;
    }
    if (t < end_)
      answered_++;  // warm-up included: the server's CPU time covers it too
    if (t < end_ && began >= start_) {
      hist_.add(t - began);
      if (!slots_.empty()) {
        Slot& slot =
            slots_[std::min(slots_.size() - 1, static_cast<std::size_t>((t - start_) / slot_ns))];
        slot.responses++;
        slot.max_ns = std::max(slot.max_ns, t - began);
      }
      bytes_ += static_cast<std::uint64_t>(c.body);
      if (o_.max_requests && hist_.total() >= o_.max_requests)
        end_ = t;
    }
    if (c.in_flight > 0)
      return true;
    if (o_.new_conn) {
      close_conn(i);
      if (t < end_)
        open_conn(i);
      return false;
    }
    if (o_.rate > 0) {
      // Open loop: a request that came due while this one was answered goes out now, its
      // latency counted from when it was due.
      if (c.next_due <= t && t < end_)
        send_due(i, t, false);
      return conns_[i].fd >= 0;
    }
    if (t < end_)
      send_batch(i, t);
    return conns_[i].fd >= 0;
  }

  void write_timeline() const {
    if (o_.timeline.empty())
      return;
    FILE* f = std::fopen(o_.timeline.c_str(), "w");
    if (f == nullptr)
      return;
    std::fprintf(f, "ms,responses,max_us\n");
    for (std::size_t k = 0; k < slots_.size(); ++k)
      std::fprintf(f, "%zu,%llu,%.1f\n", k * 10,
                   static_cast<unsigned long long>(slots_[k].responses),
                   static_cast<double>(slots_[k].max_ns) / 1e3);
    std::fclose(f);
  }

  void report(double elapsed) const {
    write_timeline();
    std::printf(
        "{\"requests\": %llu, \"seconds\": %.3f, \"rps\": %.1f, \"bytes\": %llu, "
        "\"p50_us\": %.1f, \"p90_us\": %.1f, \"p99_us\": %.1f, \"p999_us\": %.1f, \"max_us\": "
        "%.1f, "
        "\"errors\": %llu, \"errors_by_kind\": {\"connect\": %llu, \"read\": %llu, \"write\": "
        "%llu, "
        "\"closed\": %llu, \"status\": %llu, \"length\": %llu, \"parse\": %llu}, \"rate\": %.1f, "
        "\"send_late_p50_us\": %.1f, \"send_late_p99_us\": %.1f, \"send_late_max_us\": %.1f, "
        "\"responses_with_warmup\": %llu}\n",
        static_cast<unsigned long long>(hist_.total()), elapsed,
        static_cast<double>(hist_.total()) / elapsed, static_cast<unsigned long long>(bytes_),
        hist_.percentile_us(50), hist_.percentile_us(90), hist_.percentile_us(99),
        hist_.percentile_us(99.9), hist_.max_us(), static_cast<unsigned long long>(errors_.total()),
        static_cast<unsigned long long>(errors_.connect),
        static_cast<unsigned long long>(errors_.read),
        static_cast<unsigned long long>(errors_.write),
        static_cast<unsigned long long>(errors_.closed),
        static_cast<unsigned long long>(errors_.status),
        static_cast<unsigned long long>(errors_.length),
        static_cast<unsigned long long>(errors_.parse), o_.rate, late_.percentile_us(50),
        late_.percentile_us(99), late_.max_us(), static_cast<unsigned long long>(answered_));
  }

  Options o_;
  std::string one_, batch_;
  sockaddr_in addr_{};
  int ep_ = -1;
  std::vector<Conn> conns_;
  std::vector<char> buf_;
  std::uint64_t end_ = 0;
  std::uint64_t interval_ = 0;
  std::uint64_t bytes_ = 0;
  std::uint64_t answered_ = 0;  // responses checked, warm-up included
  Histogram hist_;
  Histogram late_;  // open loop: how long after its due time each request was sent
  static constexpr std::uint64_t spin_ns = 2'000'000;
  Errors errors_;
  struct Slot {
    std::uint64_t responses = 0;
    std::uint64_t max_ns = 0;
  };
  static constexpr std::uint64_t slot_ns = 10'000'000;
  std::uint64_t start_ = 0;
  std::vector<Slot> slots_;
};

int usage(const char* why) {
  std::fprintf(stderr, "loadgen: %s\n", why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int k = 1; k < argc; ++k) {
    const std::string a = argv[k];
    auto value = [&]() -> const char* { return k + 1 < argc ? argv[++k] : ""; };
    if (a == "--host")
      o.host = value();
    else if (a == "--port")
      o.port = std::atoi(value());
    else if (a == "--path")
      o.path = value();
    else if (a == "--method")
      o.method = value();
    else if (a == "--connections")
      o.connections = std::atoi(value());
    else if (a == "--duration")
      o.duration = std::atof(value());
    else if (a == "--pipeline")
      o.pipeline = std::atoi(value());
    else if (a == "--new-conn")
      o.new_conn = true;
    else if (a == "--body-size")
      o.body_size = static_cast<std::size_t>(std::atoll(value()));
    else if (a == "--warmup")
      o.warmup = std::atof(value());
    else if (a == "--rate")
      o.rate = std::atof(value());
    else if (a == "--expect-status")
      o.expect_status = std::atoi(value());
    else if (a == "--expect-length")
      o.expect_length = std::atoll(value());
    else if (a == "--timeline")
      o.timeline = value();
    else if (a == "--poll")
      o.poll = true;
    else if (a == "--requests")
      o.max_requests = static_cast<std::uint64_t>(std::atoll(value()));
    else
      return usage(("unknown argument " + a).c_str());
  }
  if (o.connections < 1 || o.pipeline < 1 || o.duration <= 0)
    return usage("connections, pipeline and duration must be positive");
  if (o.warmup < 0 || (o.warmup > 0 && o.rate <= 0))
    return usage("--warmup is the open loop's (with --rate), in seconds");
  if (o.rate > 0 && o.pipeline != 1)
    return usage("--rate sends one request at a time per connection");
  Generator g(o);
  return g.run();
}
