#pragma once

// The access log: one line per answered request, formatted by the I/O thread
// and written by spdlog's asynchronous logger on its own thread, so a pair
// never waits for a disk or a terminal. When the queue is full a line is
// dropped and counted (server_counters::access_log_dropped), never waited for.
//
// Formats (`access_log_options::format`):
//
//   "" / "default"  {time} {client} "{method} {target}" {status} {bytes} {duration_us}us
//   pair={pair}
//                   2024-05-01T12:00:00.123Z 127.0.0.1:50312 "GET /items?id=3" 200 141 87us pair=0
//   "json"          one JSON object per line, keys time, client, method, path,
//                   query, status, bytes, duration_us, pair (strings escaped;
//                   bytes that are not UTF-8 are written as \u00XX)
//   "json:NAME,..." the same plus "headers": {"NAME": value or null, ...}
//   a template      text with {field}s; "{{" and "}}" are literal braces
//
// Fields: {time} (UTC, ISO 8601, ms: when the line is formatted, at the end of
// the response), {client} ("ip:port", "[ipv6]:port", "unix" or "-"),
// {method}, {path} (as sent, not decoded), {query} (after '?', "" if none),
// {target} (path, then "?query" if any), {status}, {bytes} (response bytes
// including the head, as the app handed them over), {duration_us} and
// {duration_ms} (from the moment the head was handed to the app to the moment
// the whole response was queued for the socket), {pair} (the core pair's
// index), {header:NAME} (the request header's value, "-" if absent; NAME is
// case-insensitive; repeated headers give the first). In templates, values
// are written with '"', '\\', control characters and bytes >= 0x7f as \xHH.
// Answers the I/O thread writes itself (400, 408, 413, ...) are logged with
// "-" for what it never had (method, path, headers) and duration 0.
//
// A WebSocket writes two lines, both with the upgrade request's fields:
// at the upgrade, status 101, {bytes} of the 101 response and the time from
// the head to the app's accept; at the end, the close code in place of the
// status (1000..4999, never an HTTP status: 1006 for a drop), {bytes} the
// message payload bytes the server sent (before compression) and the
// duration from the 101 to the close:
//   ... "GET /chat" 101 129 412us pair=0
//   ... "GET /chat" 1000 5120 8021307us pair=0

#include <cadeloop/net/connection_id.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace cadeloop::http {
class request_head;
}

namespace cadeloop::net {

/// Settings of one pair's access log. Plain data.
struct access_log_options {
  /// Off by default.
  bool enabled = false;
  /// "default" (or ""), "json", "json:NAME,..." or a template (see access_log.hpp).
  std::string format = "default";
  /// "" or "-": standard error; otherwise a file, opened for appending (one
  /// writer per file per process, shared by every pair that names it).
  std::string file;
  /// The `{pair}` field.
  std::uint32_t pair = 0;
  /// Lines the process's queue holds; only the first log opened in the
  /// process sets it. Above it, lines are dropped and counted.
  std::size_t queue_lines = 8192;
};

/// Checks `format`; returns "" or one line naming the problem
/// ("access_log_format: unknown field {usr}"). Any thread.
[[nodiscard]] std::string check_access_log_format(std::string_view format);

/// One I/O thread's access log: the compiled format and a handle on the
/// process-wide writer. Made, used and destroyed on one I/O thread (it may be
/// made on the control thread before the I/O thread starts).
class access_log {
 public:
  /// Opens the log `options` describe. Throws std::invalid_argument for a bad
  /// format and std::runtime_error when the file cannot be opened (both with
  /// one line naming the setting).
  explicit access_log(const access_log_options& options);
  access_log(const access_log&) = delete;
  access_log& operator=(const access_log&) = delete;
  ~access_log();

  /// Appends to `out` what a line will need from `head` (method, path, query,
  /// the headers the format names); `out` is kept with the request while the
  /// head itself goes to the app. I/O thread.
  void capture(const http::request_head& head, std::string& out) const;

  /// Formats one line from what `capture` kept ("" for a request the I/O
  /// thread answered itself) and adds it to the batch. The batch goes to the
  /// log thread as one queue entry when it passes 64 KiB (here), or when the
  /// process's collector thread takes it: within 50 ms of its first line, so
  /// a busy I/O thread never wakes the log thread for a few lines and an
  /// idle one has nothing to do. Returns how many lines were dropped because
  /// the queue was full (a big batch queued here, or batches the collector
  /// queued since the last call). `client_text` is the client's
  /// `socket_address::to_string()`. I/O thread.
  std::size_t write(std::string_view captured, std::string_view client_text, unsigned status,
                    std::uint64_t bytes, std::uint64_t duration_us);
  /// Queues the lines write() gathered since the last hand-over now, as one
  /// entry of the async queue. Returns how many lines were dropped because
  /// the queue was full, including those dropped when the collector or
  /// flush_access_logs() took the batch on another thread. I/O thread; the
  /// destructor flushes too.
  std::size_t flush();

  class format;
  class writer;

  /// The collector and flush_access_logs(): queues the batch from another
  /// thread. Any thread.
  void hand_over_elsewhere();

 private:
  std::size_t hand_over_locked();  // mu_ held

  std::unique_ptr<format> format_;
  std::shared_ptr<writer> writer_;
  std::uint32_t pair_;
  std::string line_;
  // The batch: written by the I/O thread, taken by it (64 KiB), by the
  // collector or by flush_access_logs(). Uncontended but for those calls.
  std::mutex mu_;
  std::string batch_;  // lines not yet queued, '\n'-separated
  std::size_t batch_lines_ = 0;
  std::atomic<std::size_t> dropped_elsewhere_{0};
  std::int64_t time_second_ = -1;
  std::string time_prefix_;  // "2024-05-01T12:00:00" of time_second_
};

/// Queues every access log's unqueued lines (also those of busy I/O threads),
/// then waits until every line queued in this process has been written and
/// its file flushed, or `timeout` passed; true if all were. Any thread
/// (tests, and shutdown before the process exits).
bool flush_access_logs(std::chrono::milliseconds timeout);

}  // namespace cadeloop::net
