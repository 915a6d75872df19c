// The table itself: every cadeloop setting, declared once.
#include <array>
#include <cstdint>
#include <string_view>

#include "cadeloop/config/settings.hpp"

namespace cadeloop::config {

namespace {

constexpr std::int64_t kib = 1024;
constexpr std::int64_t mib = 1024 * kib;
constexpr std::int64_t gib = 1024 * mib;
constexpr std::int64_t pib = 1024 * 1024 * gib;

constexpr std::array<std::string_view, 3> lifespan_choices{"auto", "on", "off"};
constexpr std::array<std::string_view, 3> isolation_choices{"auto", "subinterpreters", "processes"};
constexpr std::array<std::string_view, 4> log_levels{"debug", "info", "warning", "error"};

// Sections, in the order the reference shows them.
constexpr std::string_view app_section = "Application";
constexpr std::string_view listen_section = "Listening";
constexpr std::string_view cores_section = "Cores";
constexpr std::string_view limit_section = "Limits";
constexpr std::string_view timeout_section = "Timeouts";
constexpr std::string_view flow_section = "Flow control";
constexpr std::string_view log_section = "Logging";
constexpr std::string_view stats_section = "Statistics";
constexpr std::string_view tuning_section = "Tuning";

// Bounds a designated initializer cannot name shorter.
constexpr double day = 86400.0;

constexpr setting table[] = {
    // ---- the app
    {.name = "app",
     .type = kind::string,
     .default_text = "none",
     .nullable = true,
     .none_means = "must be given (APP on the command line)",
     .section = app_section,
     .doc = "the ASGI app as module:attribute, e.g. \"main:app\""},
    {.name = "app_dir",
     .type = kind::string,
     .default_text = "none",
     .nullable = true,
     .none_means = "the current directory",
     .section = app_section,
     .doc = "directory the app is imported from"},
    {.name = "factory",
     .type = kind::boolean,
     .default_text = "false",
     .section = app_section,
     .doc = "the app is a factory: call it to get the ASGI app"},
    {.name = "root_path",
     .type = kind::string,
     .default_text = "",
     .section = app_section,
     .doc = "the ASGI root_path (the mount point behind a proxy)"},
    {.name = "lifespan",
     .type = kind::choice,
     .default_text = "auto",
     .choices = lifespan_choices,
     .section = app_section,
     .doc = "ASGI lifespan protocol: auto (use it if the app supports it), on (required), off"},
    {.name = "server_header",
     .type = kind::string,
     .default_text = "cadeloop",
     .section = app_section,
     .doc = "value of the Server response header (\"\" for none)"},

    // ---- where to listen
    {.name = "host",
     .type = kind::string,
     .default_text = "127.0.0.1",
     .section = listen_section,
     .doc = "address to listen on"},
    {.name = "port",
     .type = kind::integer,
     .default_text = "8000",
     .min_int = 0,
     .max_int = 65535,
     .section = listen_section,
     .doc = "TCP port to listen on, 0 for any free port"},
    {.name = "uds",
     .type = kind::string,
     .default_text = "none",
     .nullable = true,
     .none_means = "listen on host:port",
     .section = listen_section,
     .doc = "listen on this Unix socket path instead of host:port"},
    {.name = "fd",
     .type = kind::integer,
     .default_text = "none",
     .min_int = 0,
     .max_int = 2147483647,
     .nullable = true,
     .none_means = "listen on host:port",
     .section = listen_section,
     .doc = "serve an inherited listening socket (systemd socket activation)"},
    {.name = "backlog",
     .type = kind::integer,
     .default_text = "1024",
     .min_int = 1,
     .max_int = 65535,
     .section = listen_section,
     .doc = "listen(2) backlog"},

    // ---- cores
    {.name = "cores",
     .type = kind::integer,
     .default_text = "1",
     .min_int = 0,
     .max_int = 1024,
     .section = cores_section,
     .doc = "core pairs to run; 0 for one per usable CPU"},
    {.name = "isolation",
     .type = kind::choice,
     .default_text = "auto",
     .choices = isolation_choices,
     .section = cores_section,
     .doc = "where each pair's interpreter lives: auto, subinterpreters (own GIL, 3.12+) or "
            "processes"},
    {.name = "pin",
     .type = kind::boolean,
     .default_text = "false",
     .section = cores_section,
     .doc = "tie each pair's two threads to one CPU set"},

    // ---- limits
    {.name = "max_body",
     .type = kind::size,
     .default_text = "1GiB",
     .min_int = 0,
     .max_int = pib,
     .nullable = true,
     .none_means = "no limit",
     .unit = "bytes",
     .section = limit_section,
     .doc = "largest request body (413 above)"},
    {.name = "max_url",
     .type = kind::size,
     .default_text = "8KiB",
     .min_int = 32,
     .max_int = mib,
     .unit = "bytes",
     .section = limit_section,
     .doc = "longest request target (414 above)"},
    {.name = "max_header_bytes",
     .type = kind::size,
     .default_text = "64KiB",
     .min_int = 32,
     .max_int = 16 * mib,
     .unit = "bytes",
     .section = limit_section,
     .doc = "largest request head (431 above)"},
    {.name = "max_headers",
     .type = kind::integer,
     .default_text = "100",
     .min_int = 1,
     .max_int = 10000,
     .section = limit_section,
     .doc = "most header fields in a request (431 above)"},
    {.name = "max_pipelined",
     .type = kind::integer,
     .default_text = "16",
     .min_int = 1,
     .max_int = 1024,
     .section = limit_section,
     .doc = "requests in flight per connection (pipelining)"},
    {.name = "max_connections",
     .type = kind::integer,
     .default_text = "10000",
     .min_int = 1,
     .max_int = 1 << 24,
     .section = limit_section,
     .doc = "open connections above which accepting pauses"},
    {.name = "max_requests_in_flight",
     .type = kind::integer,
     .default_text = "4096",
     .min_int = 1,
     .max_int = 1 << 24,
     .section = limit_section,
     .doc = "requests in flight (all connections) above which accepting pauses"},

    // ---- timeouts
    {.name = "request_line_timeout",
     .type = kind::duration,
     .default_text = "10s",
     .min_real = 0.001,
     .max_real = day,
     .unit = "seconds",
     .section = timeout_section,
     .doc = "time for a request head to arrive (408 after)"},
    {.name = "keepalive_idle",
     .type = kind::duration,
     .default_text = "5s",
     .min_real = 0.001,
     .max_real = day,
     .unit = "seconds",
     .section = timeout_section,
     .doc = "how long an idle keep-alive connection is kept"},
    {.name = "grace",
     .type = kind::duration,
     .default_text = "30s",
     .min_real = 0,
     .max_real = day,
     .unit = "seconds",
     .section = timeout_section,
     .doc = "time in-flight requests get to finish after SIGTERM/SIGINT"},

    // ---- flow control
    {.name = "body_window",
     .type = kind::size,
     .default_text = "256KiB",
     .min_int = kib,
     .max_int = gib,
     .unit = "bytes",
     .section = flow_section,
     .doc = "request body bytes handed to the app and not yet read before reading pauses"},
    {.name = "send_high_mark",
     .type = kind::size,
     .default_text = "1MiB",
     .min_int = kib,
     .max_int = gib,
     .unit = "bytes",
     .section = flow_section,
     .doc = "response bytes per connection after which send() waits for the client"},

    // ---- logging
    {.name = "log_level",
     .type = kind::choice,
     .default_text = "info",
     .choices = log_levels,
     .section = log_section,
     .doc = "least severe server log message shown"},
    {.name = "access_log",
     .type = kind::boolean,
     .default_text = "false",
     .section = log_section,
     .doc = "write one access log line per response"},
    {.name = "access_log_format",
     .type = kind::string,
     .default_text = "default",
     .section = log_section,
     .doc = "access log line format: \"default\", \"json\", or a template"},
    {.name = "access_log_file",
     .type = kind::string,
     .default_text = "none",
     .nullable = true,
     .none_means = "stderr",
     .section = log_section,
     .doc = "file the access log is appended to"},

    // ---- statistics
    {.name = "stats_port",
     .type = kind::integer,
     .default_text = "none",
     .min_int = 0,
     .max_int = 65535,
     .nullable = true,
     .none_means = "off",
     .section = stats_section,
     .doc = "port of the stats endpoint (/stats, /metrics, /healthz, /readyz)"},
    {.name = "stats_host",
     .type = kind::string,
     .default_text = "127.0.0.1",
     .section = stats_section,
     .doc = "address the stats endpoint listens on"},
    {.name = "stats_json_on_exit",
     .type = kind::string,
     .default_text = "none",
     .nullable = true,
     .none_means = "not written",
     .section = stats_section,
     .doc = "file the counters are written to as JSON at exit (and on SIGUSR1)"},

    // ---- tuning
    {.name = "io_spin_us",
     .type = kind::integer,
     .default_text = "0",
     .min_int = 0,
     .max_int = 1000000,
     .unit = "microseconds",
     .section = tuning_section,
     .doc = "how long the I/O thread spins before it sleeps"},
    {.name = "spin_us",
     .type = kind::integer,
     .default_text = "0",
     .min_int = 0,
     .max_int = 1000000,
     .unit = "microseconds",
     .section = tuning_section,
     .doc = "how long the app loop spins before it sleeps"},
};

constexpr std::array<std::string_view, 3> not_settings{"CONFIG", "FUZZ_SECONDS", "FUZZ_JOBS"};

}  // namespace

std::span<const setting> settings() noexcept {
  return table;
}

std::span<const std::string_view> environment_names_not_settings() noexcept {
  return not_settings;
}

const setting* find_setting(std::string_view name) noexcept {
  for (const setting& s : table) {
    if (s.name == name) {
      return &s;
    }
  }
  return nullptr;
}

}  // namespace cadeloop::config
