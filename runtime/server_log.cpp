// The server log: one spdlog logger, one synchronous sink on file descriptor 2.
#include "cadeloop/runtime/server_log.hpp"

#include <spdlog/details/log_msg.h>
#include <spdlog/logger.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>

#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <mutex>
#include <string>

namespace cadeloop::runtime::server_log {

namespace {

constexpr std::string_view pattern = "cadeloop: %v";

// Writes each formatted message with one write(2) (more only when the kernel
// takes part of it), straight to fd 2 rather than through C's `stderr`: a
// line then never interleaves mid-way with another process's (the worker
// processes share the supervisor's stderr) and owes nothing to stdio's
// buffering or its lock.
class stderr_sink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  // fork(2) copies only the forking thread. Had another thread been inside
  // sink_it_ at that moment, the child would inherit mutex_ locked by a
  // thread it does not have, and its first message would hang for good.
  // With --stats-port the supervisor forks (and re-forks a worker that died)
  // while the endpoint's thread runs, and that thread writes here when a
  // handler fails; so rather than rely on "no thread exists yet", fork waits
  // for the sink to be idle (pthread_atfork below) and both sides release it.
  void before_fork() noexcept { mutex_.lock(); }
  void after_fork() noexcept { mutex_.unlock(); }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t line;  // 250 bytes inline: no allocation for a short message
    formatter_->format(msg, line);
    write_all(line.data(), line.size());
  }
  void flush_() override {}  // nothing is buffered

 private:
  static void write_all(const char* data, std::size_t size) noexcept {
    while (size > 0) {
      const ssize_t n = ::write(STDERR_FILENO, data, size);
      if (n >= 0) {
        data += n;
        size -= static_cast<std::size_t>(n);
        continue;
      }
      if (errno == EINTR) {
        continue;
      }
      if (errno == EAGAIN) {
        // Someone made the descriptor non-blocking (a shared terminal):
        // wait for room a while rather than spin or cut the message.
        pollfd p{STDERR_FILENO, POLLOUT, 0};
        if (::poll(&p, 1, 1000) > 0) {
          continue;
        }
      }
      return;  // closed, full for a second, or a broken pipe: drop the rest
    }
  }
};

spdlog::level::level_enum to_spdlog(log_level level) noexcept {
  switch (level) {
    case log_level::debug:
      return spdlog::level::debug;
    case log_level::info:
      return spdlog::level::info;
    case log_level::warning:
      return spdlog::level::warn;
    case log_level::error:
      return spdlog::level::err;
    case log_level::critical:
      break;
  }
  return spdlog::level::critical;
}

struct server_logger {
  std::shared_ptr<stderr_sink> sink = std::make_shared<stderr_sink>();
  // Not in spdlog's registry: nothing else (spdlog::set_level, drop_all) can
  // re-level or drop it behind our back.
  spdlog::logger logger{"cadeloop", sink};

  server_logger() {
    sink->set_formatter(std::make_unique<spdlog::pattern_formatter>(
        std::string{pattern}, spdlog::pattern_time_type::local, std::string{"\n"}));
    logger.set_level(spdlog::level::info);
    logger.flush_on(spdlog::level::off);
    // A message that cannot be written is dropped; spdlog's default handler
    // would print to stderr behind its own lock.
    logger.set_error_handler([](const std::string&) {});
  }
};

server_logger& instance() noexcept {
  // Made on first use and never destroyed: native threads (the stats
  // endpoint's, a failing I/O thread) may write while the process exits.
  static server_logger* const the_logger = [] {
    auto* made = new server_logger;
    ::pthread_atfork([] { instance().sink->before_fork(); }, [] { instance().sink->after_fork(); },
                     [] { instance().sink->after_fork(); });
    return made;
  }();
  return *the_logger;
}

}  // namespace

void write(log_level level, std::string_view message) noexcept {
  try {
    instance().logger.log(to_spdlog(level), spdlog::string_view_t{message.data(), message.size()});
  } catch (...) {
    // Dropped, as documented: a log call never takes the caller down.
  }
}

void write(log_level level, std::string_view context, std::string_view detail) noexcept {
  try {
    instance().logger.log(to_spdlog(level), "{}: {}", context, detail);
  } catch (...) {
  }
}

void set_level(log_level level) noexcept {
  instance().logger.set_level(to_spdlog(level));
}

log_level level() noexcept {
  switch (instance().logger.level()) {
    case spdlog::level::trace:
    case spdlog::level::debug:
      return log_level::debug;
    case spdlog::level::info:
      return log_level::info;
    case spdlog::level::warn:
      return log_level::warning;
    case spdlog::level::err:
      return log_level::error;
    default:
      return log_level::critical;
  }
}

std::optional<log_level> level_from_name(std::string_view name) noexcept {
  for (auto l : {log_level::debug, log_level::info, log_level::warning, log_level::error,
                 log_level::critical}) {
    if (level_name(l) == name) {
      return l;
    }
  }
  return std::nullopt;
}

std::string_view level_name(log_level level) noexcept {
  switch (level) {
    case log_level::debug:
      return "debug";
    case log_level::info:
      return "info";
    case log_level::warning:
      return "warning";
    case log_level::error:
      return "error";
    case log_level::critical:
      break;
  }
  return "critical";
}

}  // namespace cadeloop::runtime::server_log
