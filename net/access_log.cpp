// The access log: parsing the format, capturing a request's fields on the
// I/O thread, formatting a line (default, JSON or a template) and handing it
// to spdlog's asynchronous logger, which drops rather than waits when full.
#include "cadeloop/net/access_log.hpp"
#include "cadeloop/net/json_escape.hpp"

#include <cadeloop/http/request.hpp>
#include <cadeloop/http/token.hpp>

#include <spdlog/async_logger.h>
#include <spdlog/details/log_msg.h>
#include <spdlog/details/thread_pool.h>
#include <spdlog/sinks/base_sink.h>

#include <limits.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

namespace cadeloop::net {

namespace {

constexpr std::string_view default_template =
    R"({time} {client} "{method} {target}" {status} {bytes} {duration_us}us pair={pair})";

// Lines above the queue's capacity minus this margin are dropped before they
// reach spdlog, so that its own overflow policy (overrun_oldest, which would
// drop another pair's line uncounted) stays a backstop for races between
// this many I/O threads at once.
constexpr std::size_t queue_margin = 64;

enum class field_kind : std::uint8_t {
  literal,
  time,
  client,
  method,
  path,
  query,
  target,
  status,
  bytes,
  duration_us,
  duration_ms,
  pair,
  header,
};

struct named_field {
  std::string_view name;
  field_kind kind;
};

constexpr named_field field_names[] = {
    {"time", field_kind::time},
    {"client", field_kind::client},
    {"method", field_kind::method},
    {"path", field_kind::path},
    {"query", field_kind::query},
    {"target", field_kind::target},
    {"status", field_kind::status},
    {"bytes", field_kind::bytes},
    {"duration_us", field_kind::duration_us},
    {"duration_ms", field_kind::duration_ms},
    {"duration", field_kind::duration_us},
    {"pair", field_kind::pair},
};

struct token {
  field_kind kind = field_kind::literal;
  std::string text;        // literal text
  std::size_t header = 0;  // header: index into the format's header names
};

std::string lower(std::string_view s) {
  std::string out{s};
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') {
      c = static_cast<char>(c - 'A' + 'a');
    }
  }
  return out;
}

std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) {
    s.remove_suffix(1);
  }
  return s;
}

void append_uint(std::string& out, std::uint64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

constexpr char hex_digits[] = "0123456789abcdef";

// Template values: printable ASCII as is, everything else (and '"', '\\') as
// \xHH, so a line is one line and its quoting is unambiguous.
void append_text(std::string& out, std::string_view v) {
  for (const char ch : v) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') {
      out += "\\x";
      out += hex_digits[c >> 4];
      out += hex_digits[c & 0xf];
    } else {
      out += ch;
    }
  }
}

// Captured fields: each as a 4-byte length (host order) and its bytes; an
// absent one as the length UINT32_MAX.
constexpr std::uint32_t absent = UINT32_MAX;

void put_field(std::string& out, std::optional<std::string_view> v) {
  const std::uint32_t n =
      v ? static_cast<std::uint32_t>(std::min<std::size_t>(v->size(), absent - 1)) : absent;
  char len[sizeof n];
  std::memcpy(len, &n, sizeof n);
  out.append(len, sizeof n);
  if (v) {
    out.append(v->data(), n);
  }
}

std::optional<std::string_view> take_field(std::string_view& in) noexcept {
  std::uint32_t n = absent;
  if (in.size() < sizeof n) {
    return std::nullopt;
  }
  std::memcpy(&n, in.data(), sizeof n);
  in.remove_prefix(sizeof n);
  if (n == absent || n > in.size()) {
    return std::nullopt;
  }
  const std::string_view v = in.substr(0, n);
  in.remove_prefix(n);
  return v;
}

}  // namespace

// ---------------------------------------------------------------- format

class access_log::format {
 public:
  // Parses `spec`; "" on success, else one line.
  std::string parse(std::string_view spec) {
    if (spec.empty() || spec == "default") {
      return parse_template(default_template);
    }
    if (spec == "json" || spec.starts_with("json:")) {
      json = true;
      if (spec.size() > 4) {
        std::string_view rest = spec.substr(5);
        while (!rest.empty()) {
          const std::size_t comma = rest.find(',');
          const std::string_view name = trim(rest.substr(0, comma));
          rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
          if (std::string e = add_header(name); !e.empty()) {
            return e;
          }
        }
      }
      return {};
    }
    return parse_template(spec);
  }

  bool json = false;
  std::vector<token> tokens;
  std::vector<std::string> headers;  // lower-case names, in capture order

 private:
  std::string add_header(std::string_view name) {
    if (name.empty()) {
      return "access_log_format: an empty header name";
    }
    std::string n = lower(name);
    if (!http::is_token(n)) {
      return "access_log_format: '" + std::string{name} + "' is not a header name";
    }
    headers.push_back(std::move(n));
    return {};
  }

  void literal(std::string_view text) {
    if (tokens.empty() || tokens.back().kind != field_kind::literal) {
      tokens.push_back(token{});
    }
    tokens.back().text.append(text);
  }

  std::string parse_template(std::string_view spec) {
    std::size_t i = 0;
    while (i < spec.size()) {
      const char c = spec[i];
      if (c == '{' && i + 1 < spec.size() && spec[i + 1] == '{') {
        literal("{");
        i += 2;
      } else if (c == '}') {
        if (i + 1 < spec.size() && spec[i + 1] == '}') {
          literal("}");
          i += 2;
          continue;
        }
        return "access_log_format: a '}' without its '{' (write '}}' for a brace)";
      } else if (c == '{') {
        const std::size_t end = spec.find('}', i);
        if (end == std::string_view::npos) {
          return "access_log_format: '{' without its '}' (write '{{' for a brace)";
        }
        const std::string_view name = spec.substr(i + 1, end - i - 1);
        if (std::string e = add_field(name); !e.empty()) {
          return e;
        }
        i = end + 1;
      } else {
        const std::size_t next = spec.find_first_of("{}", i);
        const std::size_t stop = next == std::string_view::npos ? spec.size() : next;
        literal(spec.substr(i, stop - i));
        i = stop;
      }
    }
    return {};
  }

  std::string add_field(std::string_view name) {
    if (name.starts_with("header:")) {
      if (std::string e = add_header(name.substr(7)); !e.empty()) {
        return e;
      }
      token t;
      t.kind = field_kind::header;
      t.header = headers.size() - 1;
      tokens.push_back(std::move(t));
      return {};
    }
    for (const named_field& f : field_names) {
      if (f.name == name) {
        token t;
        t.kind = f.kind;
        tokens.push_back(std::move(t));
        return {};
      }
    }
    return "access_log_format: unknown field {" + std::string{name} +
           "} (fields: time, client, method, path, query, target, status, bytes, duration_us, "
           "duration_ms, "
           "pair, header:NAME)";
  }
};

std::string check_access_log_format(std::string_view format) {
  access_log::format f;
  return f.parse(format);
}

// ---------------------------------------------------------------- writer

namespace {

// Writes the lines of one destination on spdlog's pool thread: the payload
// as formatted by the I/O thread, then '\n'. Lines collect in the sink's own
// buffer and go out with write(2), always ending at a line's end: when the
// last line queued for the sink is in, or when the buffer passes 64 KiB.
// Several processes (process mode: one per pair) append to one file opened
// with O_APPEND, and one write(2) of whole lines lands whole; a stdio buffer
// would cut a line at 64 KiB and let another process's lines in between.
// Into a pipe (stderr under a supervisor), each write stays within PIPE_BUF,
// the size a pipe keeps whole, unless one line alone is longer.
class line_sink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  line_sink(std::FILE* file, bool owned, std::atomic<std::int64_t>& process_queued)
      : file_{file}, owned_{owned}, process_queued_{process_queued} {
    struct stat st{};
    const int fd = ::fileno(file_);
    chunk_ = fd >= 0 && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? buffer_limit : PIPE_BUF;
  }
  line_sink(const line_sink&) = delete;
  line_sink& operator=(const line_sink&) = delete;
  ~line_sink() override {
    write_out();
    if (owned_) {
      std::fclose(file_);
    }
  }

  /// Lines queued for this sink and not yet written. Any thread.
  std::atomic<std::int64_t> queued{0};

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    out_.append(msg.payload.data(), msg.payload.size());
    out_ += '\n';
    if (queued.load(std::memory_order_relaxed) <= 1 || out_.size() >= buffer_limit) {
      write_out();
    }
    // After the write: flush_access_logs() waits for zero.
    queued.fetch_sub(1, std::memory_order_release);
    // One entry carries a pass's lines, '\n'-separated (access_log::flush).
    const auto lines = 1 + std::count(msg.payload.begin(), msg.payload.end(), '\n');
    process_queued_.fetch_sub(static_cast<std::int64_t>(lines), std::memory_order_release);
  }
  void flush_() override { write_out(); }

 private:
  static constexpr std::size_t buffer_limit = 64 * 1024;

  // Writes out_ (whole lines) in pieces of at most chunk_ bytes that each end
  // at a line's end; a line longer than chunk_ goes alone. A failed write
  // (a full disk, a closed pipe) drops what is left: the log never blocks or
  // throws into the pool thread.
  void write_out() {
    const int fd = ::fileno(file_);
    std::size_t at = 0;
    while (at < out_.size()) {
      std::size_t end = out_.size();
      if (end - at > chunk_) {
        const std::size_t cut = out_.rfind('\n', at + chunk_ - 1);
        end = cut != std::string::npos && cut >= at ? cut + 1 : out_.find('\n', at) + 1;
      }
      if (!write_all(fd, std::string_view{out_}.substr(at, end - at))) {
        break;
      }
      at = end;
    }
    out_.clear();
  }

  static bool write_all(int fd, std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::write(fd, bytes.data(), bytes.size());
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

  std::FILE* file_;
  bool owned_;
  std::atomic<std::int64_t>& process_queued_;
  std::size_t chunk_;
  std::string out_;  // whole lines not yet written (the sink's mutex guards it)
};

}  // namespace

// Lines gathered into one queue entry at most (a pass that answers more queues several).
constexpr std::size_t max_batch_bytes = 64 * 1024;

class access_log::writer {
 public:
  writer(std::shared_ptr<line_sink> sink, std::shared_ptr<spdlog::async_logger> logger,
         std::atomic<std::int64_t>& process_queued, std::int64_t limit)
      : sink_{std::move(sink)},
        logger_{std::move(logger)},
        process_queued_{process_queued},
        limit_{limit} {}

  // Any I/O thread. Counted before it is queued, so the sink never sees a
  // line it was not told about.
  bool log(std::string_view lines, std::size_t count) {
    // The limit counts lines, not queue entries, so batching does not raise
    // the memory a stalled destination can make the queue hold.
    const auto n = static_cast<std::int64_t>(count);
    if (process_queued_.fetch_add(n, std::memory_order_relaxed) + n > limit_) {
      process_queued_.fetch_sub(n, std::memory_order_relaxed);
      return false;
    }
    const std::string_view line = lines;
    sink_->queued.fetch_add(1, std::memory_order_relaxed);
    logger_->log(spdlog::level::info, spdlog::string_view_t{line.data(), line.size()});
    return true;
  }

 private:
  std::shared_ptr<line_sink> sink_;
  std::shared_ptr<spdlog::async_logger> logger_;
  std::atomic<std::int64_t>& process_queued_;
  std::int64_t limit_;
};

namespace {

// How long a line may wait in an I/O thread's batch before the collector
// queues it: lines of a busy server go to the log thread in batches (the I/O
// threads never wake it for fewer than 64 KiB), an idle server's within this.
constexpr std::chrono::milliseconds collect_interval{50};

// The process's one spdlog thread pool, one writer per destination, and the
// collector: a thread that, once a line is waiting, sleeps collect_interval
// and then queues every access log's batch. It sleeps without a timeout while
// no line waits, so an idle process has no wake-ups. Created on first use
// (thread-safe) and kept until the process exits; at exit the collector
// queues what is left and the pool's destructor writes it.
class log_backend {
 public:
  log_backend() {
    // fork() while the collector holds mu_ would leave the child's copy
    // locked for good: fork waits for it instead (a forked worker opens its
    // own logs).
    ::pthread_atfork([] { backend_for_fork().mu_.lock(); }, [] { backend_for_fork().mu_.unlock(); },
                     [] { backend_for_fork().mu_.unlock(); });
  }
  log_backend(const log_backend&) = delete;
  log_backend& operator=(const log_backend&) = delete;
  ~log_backend() {
    if (pid_ != ::getpid()) {
      std::lock_guard lock{mu_};
      forget_inherited();
      return;
    }
    stop_collector();
    hand_over_all();
  }

  // An I/O thread added a line to its batch: wakes the collector unless it
  // is already on its way. One relaxed load per line while it is.
  void note_pending() noexcept {
    if (!armed_.load(std::memory_order_relaxed) &&
        !armed_.exchange(true, std::memory_order_acq_rel)) {
      armed_.notify_one();
    }
  }

  std::shared_ptr<access_log::writer> open(const access_log_options& o) {
    std::lock_guard lock{mu_};
    if (pid_ != ::getpid()) {
      // A forked child: the parent's pool thread does not exist here.
      forget_inherited();
      pid_ = ::getpid();
    }
    const std::string key = o.file.empty() || o.file == "-" ? std::string{} : o.file;
    if (auto it = writers_.find(key); it != writers_.end()) {
      if (auto w = it->second.lock()) {
        return w;
      }
    }
    if (!pool_) {
      const std::size_t lines = std::max<std::size_t>(o.queue_lines, queue_margin * 2);
      pool_ = std::make_shared<spdlog::details::thread_pool>(lines, 1);
      limit_ = static_cast<std::int64_t>(lines - queue_margin);
      collector_ = std::thread{[this] { collect(); }};
    }
    std::FILE* file = stderr;
    if (!key.empty()) {
      file = std::fopen(key.c_str(), "ae");  // append, close-on-exec
      if (file == nullptr) {
        throw std::runtime_error("access_log_file: cannot open '" + key +
                                 "': " + std::strerror(errno));
      }
    }
    auto sink = std::make_shared<line_sink>(file, !key.empty(), queued_);
    auto logger = std::make_shared<spdlog::async_logger>(
        "cadeloop.access", sink, pool_, spdlog::async_overflow_policy::overrun_oldest);
    logger->set_level(spdlog::level::info);
    auto w =
        std::make_shared<access_log::writer>(std::move(sink), std::move(logger), queued_, limit_);
    writers_[key] = w;
    return w;
  }

  void attach(access_log* log) {
    std::lock_guard lock{mu_};
    logs_.push_back(log);
  }

  void detach(access_log* log) {
    std::lock_guard lock{mu_};
    std::erase(logs_, log);
  }

  // Queues every attached log's batch (under mu_, so none is destroyed meanwhile).
  void hand_over_all() {
    std::lock_guard lock{mu_};
    if (pid_ != ::getpid()) {
      return;  // a forked child: the parent's logs are not running here
    }
    for (access_log* log : logs_) {
      log->hand_over_elsewhere();
    }
  }

  static log_backend& backend_for_fork();

  bool wait_idle(std::chrono::milliseconds timeout) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (queued_.load(std::memory_order_acquire) > 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds{1});
    }
    return true;
  }

 private:
  // The collector thread.
  void collect() {
    for (;;) {
      armed_.wait(false, std::memory_order_acquire);
      {
        std::unique_lock lock{stop_mu_};
        if (stop_cv_.wait_for(lock, collect_interval, [this] { return stopping_; })) {
          return;
        }
      }
      // Before taking the batches: a line added after this is taken now or
      // arms the next round, never left behind.
      armed_.store(false, std::memory_order_seq_cst);
      hand_over_all();
    }
  }

  void stop_collector() {
    if (!collector_.joinable()) {
      return;
    }
    {
      std::lock_guard lock{stop_mu_};
      stopping_ = true;
    }
    stop_cv_.notify_all();
    armed_.store(true, std::memory_order_release);
    armed_.notify_all();
    collector_.join();
  }

  // Leaks what a forked child inherited: destroying the pool, or the
  // collector's handle, would join a thread that exists only in the parent.
  // mu_ held.
  void forget_inherited() {
    if (pool_) {
      (void)new std::shared_ptr<spdlog::details::thread_pool>(std::move(pool_));
    }
    if (collector_.joinable()) {
      (void)new std::thread(std::move(collector_));
    }
    pool_.reset();
    writers_.clear();
    logs_.clear();
    queued_.store(0, std::memory_order_relaxed);
    armed_.store(false, std::memory_order_relaxed);
  }

  std::mutex mu_;
  pid_t pid_ = ::getpid();
  std::shared_ptr<spdlog::details::thread_pool> pool_;
  std::int64_t limit_ = 0;
  std::map<std::string, std::weak_ptr<access_log::writer>> writers_;
  std::vector<access_log*> logs_;  // every live access_log of this process
  std::atomic<bool> armed_{
      false};  // a line waits for the collector (which is awake or about to be)
  std::thread collector_;
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;  // stop_mu_
  std::atomic<std::int64_t> queued_{0};
};

log_backend& backend() {
  static log_backend b;
  return b;
}

log_backend& log_backend::backend_for_fork() {
  return backend();
}

}  // namespace

bool flush_access_logs(std::chrono::milliseconds timeout) {
  backend().hand_over_all();
  return backend().wait_idle(timeout);
}

// ---------------------------------------------------------------- access_log

access_log::access_log(const access_log_options& options)
    : format_{std::make_unique<format>()}, pair_{options.pair} {
  if (std::string e = format_->parse(options.format); !e.empty()) {
    throw std::invalid_argument(e);
  }
  writer_ = backend().open(options);
  line_.reserve(256);
  backend().attach(this);
}

access_log::~access_log() {
  backend().detach(this);
  (void)flush();
}

std::size_t access_log::hand_over_locked() {
  if (batch_lines_ == 0) {
    return 0;
  }
  const std::size_t lines = batch_lines_;
  const bool queued = writer_->log(batch_, lines);
  batch_.clear();
  batch_lines_ = 0;
  return queued ? 0 : lines;
}

std::size_t access_log::flush() {
  std::size_t dropped = dropped_elsewhere_.exchange(0, std::memory_order_relaxed);
  std::lock_guard lock{mu_};
  return dropped + hand_over_locked();
}

void access_log::hand_over_elsewhere() {
  std::lock_guard lock{mu_};
  if (const std::size_t dropped = hand_over_locked(); dropped != 0) {
    dropped_elsewhere_.fetch_add(dropped, std::memory_order_relaxed);
  }
}

void access_log::capture(const http::request_head& head, std::string& out) const {
  put_field(out, head.method_name());
  put_field(out, head.path());
  put_field(out, head.query());
  for (const std::string& name : format_->headers) {
    put_field(out, head.headers().find(name));
  }
}

std::size_t access_log::write(std::string_view captured, std::string_view client_text,
                              unsigned status, std::uint64_t bytes, std::uint64_t duration_us) {
  // What capture() kept, in its order; all absent for the I/O thread's own answers.
  std::string_view in = captured;
  const std::optional<std::string_view> method = take_field(in);
  const std::optional<std::string_view> path = take_field(in);
  const std::optional<std::string_view> query = take_field(in);
  auto header = [&](std::size_t i) {
    std::string_view rest = in;
    std::optional<std::string_view> v;
    for (std::size_t k = 0; k <= i; ++k) {
      v = take_field(rest);
    }
    return v;
  };

  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now).count();
  const std::int64_t second = ms / 1000;
  if (second != time_second_) {
    time_second_ = second;
    const auto t = static_cast<std::time_t>(second);
    std::tm tm{};
    ::gmtime_r(&t, &tm);
    char buf[32];
    const std::size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    time_prefix_.assign(buf, n);
  }
  auto append_time = [&](std::string& out) {
    out += time_prefix_;
    const auto milli = static_cast<unsigned>(ms % 1000);
    out += '.';
    out += static_cast<char>('0' + milli / 100);
    out += static_cast<char>('0' + milli / 10 % 10);
    out += static_cast<char>('0' + milli % 10);
    out += 'Z';
  };

  std::string& out = line_;
  out.clear();
  if (format_->json) {
    out += "{\"time\":\"";
    append_time(out);
    out += "\",\"client\":";
    append_json_string(out, client_text);
    auto optional_string = [&](std::string_view key, std::optional<std::string_view> v) {
      out += ",\"";
      out += key;
      out += "\":";
      if (v) {
        append_json_string(out, *v);
      } else {
        out += "null";
      }
    };
    optional_string("method", method);
    optional_string("path", path);
    optional_string("query", query);
    out += ",\"status\":";
    if (status != 0) {
      append_uint(out, status);
    } else {
      out += "null";
    }
    out += ",\"bytes\":";
    append_uint(out, bytes);
    out += ",\"duration_us\":";
    append_uint(out, duration_us);
    out += ",\"pair\":";
    append_uint(out, pair_);
    if (!format_->headers.empty()) {
      out += ",\"headers\":{";
      std::string_view rest = in;
      for (std::size_t i = 0; i < format_->headers.size(); ++i) {
        if (i != 0) {
          out += ',';
        }
        append_json_string(out, format_->headers[i]);
        out += ':';
        const std::optional<std::string_view> v = take_field(rest);
        if (v) {
          append_json_string(out, *v);
        } else {
          out += "null";
        }
      }
      out += '}';
    }
    out += '}';
  } else {
    auto text_or_dash = [&](std::optional<std::string_view> v) {
      if (v) {
        append_text(out, *v);
      } else {
        out += '-';
      }
    };
    for (const token& t : format_->tokens) {
      switch (t.kind) {
        case field_kind::literal:
          out += t.text;
          break;
        case field_kind::time:
          append_time(out);
          break;
        case field_kind::client:
          append_text(out, client_text);
          break;
        case field_kind::method:
          text_or_dash(method);
          break;
        case field_kind::path:
          text_or_dash(path);
          break;
        case field_kind::query:
          text_or_dash(path ? query : std::nullopt);
          break;
        case field_kind::target:
          text_or_dash(path);
          if (query && !query->empty()) {
            out += '?';
            append_text(out, *query);
          }
          break;
        case field_kind::status:
          if (status != 0) {
            append_uint(out, status);
          } else {
            out += '-';
          }
          break;
        case field_kind::bytes:
          append_uint(out, bytes);
          break;
        case field_kind::duration_us:
          append_uint(out, duration_us);
          break;
        case field_kind::duration_ms: {
          append_uint(out, duration_us / 1000);
          out += '.';
          const std::uint64_t frac = duration_us % 1000;
          out += static_cast<char>('0' + frac / 100);
          out += static_cast<char>('0' + frac / 10 % 10);
          out += static_cast<char>('0' + frac % 10);
          break;
        }
        case field_kind::pair:
          append_uint(out, pair_);
          break;
        case field_kind::header:
          text_or_dash(header(t.header));
          break;
      }
    }
  }
  // Gathered; queued by the collector within collect_interval, or here when
  // the batch is big.
  std::lock_guard lock{mu_};
  if (!batch_.empty()) {
    batch_ += '\n';
  }
  batch_ += out;
  ++batch_lines_;
  // Lines the collector found no room for are reported with the next line.
  std::size_t dropped = 0;
  if (dropped_elsewhere_.load(std::memory_order_relaxed) != 0) {
    dropped = dropped_elsewhere_.exchange(0, std::memory_order_relaxed);
  }
  if (batch_.size() >= max_batch_bytes) {
    return dropped + hand_over_locked();
  }
  backend().note_pending();
  return dropped;
}

}  // namespace cadeloop::net
