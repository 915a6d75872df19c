#pragma once

// The one place where the resolved settings (config/) become a core pair's
// options: the I/O side's `core_pair_options` (listen address, limits,
// timeouts, budgets, access log) and the app side's `app_options` (what the
// ASGI bridge reads). Each setting the pair consumes is bound once, in
// pair_settings.cpp, to the option field it fills; the same binding reads the
// field back, so tests can check both that every setting arrives and that
// every C++ default equals the table's.
//
// Option fields that are not settings are fixed by the code and set only by
// C++ tests: server_options::read_buffer_size, linger_max_bytes,
// request_limits::max_chunk_extension_bytes, listen_spec::reuse_port,
// core_pair_options::ring_capacity. Per-pair placement (stats page, index)
// comes from whoever starts the pair, not from the settings.

#include <cadeloop/config/settings.hpp>
#include <cadeloop/runtime/core_pair.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cadeloop::runtime {

/// What the app side of a pair (the ASGI bridge in pyhost/asgi/) reads from
/// the settings. Plain data; the defaults are the table's.
struct app_options {
  /// Response bytes per connection sent before `send()` waits for "drained".
  std::uint64_t send_high_mark = 1024 * 1024;
  /// The ASGI `root_path`.
  std::string root_path;
  /// The `Server` header of the app's responses ("" for none).
  std::string server_header = "cadeloop";
  /// Whether proxy headers are read at all (proxy_headers).
  bool proxy_headers = true;
  /// The peers trusted with proxy headers, as written (forwarded_allow_ips).
  std::string forwarded_allow_ips = "127.0.0.1";
  /// Whether the app's responses get a Date header (date_header).
  bool date_header = true;
  /// Headers added to every app response, "Name: value" lines (headers).
  std::string headers;
  /// Whether each request's app runs in an asyncio.Task instead of the native request task
  /// (asyncio_tasks).
  bool asyncio_tasks = false;
  /// The Unix socket path of scope["server"] ("" when the pair listens on TCP or an fd).
  std::string unix_path;
};

/// Everything one core pair is made from, as the settings give it. Plain data.
struct pair_settings {
  core_pair_options pair{};
  app_options app{};
};

/// The options of one core pair filled from `values`. Throws
/// config::setting_error (invalid) when `uds` and `fd` are both set. Any thread.
[[nodiscard]] pair_settings pair_settings_from(const config::resolved_values& values);

/// One option field read back as a value of the setting that fills it.
struct option_reading {
  config::setting_id id;
  /// The field, as a path from pair_settings ("pair.server.limits.max_body").
  std::string_view field;
  config::value v;
};

/// Every field a setting fills, read back from `s` in the setting's own
/// terms (seconds, bytes, none for "no limit" or "not set"), in the order
/// the bindings are declared; a setting filling two fields appears twice.
/// `read_back(pair_settings_from(v))` gives back v's values (durations to
/// the millisecond or microsecond the option keeps). For tests and
/// `_core.pair_options_preview`. Any thread.
[[nodiscard]] std::vector<option_reading> read_back(const pair_settings& s);

}  // namespace cadeloop::runtime
