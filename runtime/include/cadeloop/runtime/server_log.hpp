#pragma once

// The server log: the messages cadeloop writes for its operator (started,
// isolation chosen, a pair restarted, an app exception with its traceback),
// as opposed to the access log (one line per request, net/access_log.hpp).
//
// One process-wide spdlog logger named "cadeloop" with a synchronous sink on
// standard error: each message is formatted as "cadeloop: <message>\n" and
// written to file descriptor 2 with one write(2) before the call returns, so
// it lands in order with whatever else the process writes there (Python's
// sys.stderr included) and nothing is lost if the process dies right after.
// These messages are rare; a queue and a thread would buy nothing.
//
// The state is process-wide: the Python module is loaded once per process,
// so every sub-interpreter and every native thread shares one logger and one
// level. A forked child inherits both (and a usable lock, see server_log.cpp).

#include <cstdint>
#include <optional>
#include <string_view>

namespace cadeloop::runtime::server_log {

/// Severity of a message, least to most severe. The names are those of
/// `--log-level` (and of Python's logging levels).
enum class log_level : std::uint8_t { debug, info, warning, error, critical };

/// Writes "cadeloop: <message>\n" to standard error when `level` is at least
/// level(); a message of several lines (a traceback) keeps its newlines and
/// gets the prefix once. Never throws: a failure to write is dropped.
/// Thread: any, including a forked child and a thread without an interpreter.
void write(log_level level, std::string_view message) noexcept;

/// Writes "cadeloop: <context>: <detail>\n", formatted without allocating
/// for short messages (for a caller that is failing because memory ran out).
/// Thread: any.
void write(log_level level, std::string_view context, std::string_view detail) noexcept;

/// Sets the least severe level written; info until set. Thread: any.
void set_level(log_level level) noexcept;

/// The least severe level written. Thread: any.
[[nodiscard]] log_level level() noexcept;

/// The level named `name` ("debug", "info", "warning", "error",
/// "critical"), or nullopt. Thread: any.
[[nodiscard]] std::optional<log_level> level_from_name(std::string_view name) noexcept;

/// The name of `level`, as level_from_name() reads it. Thread: any.
[[nodiscard]] std::string_view level_name(log_level level) noexcept;

}  // namespace cadeloop::runtime::server_log
