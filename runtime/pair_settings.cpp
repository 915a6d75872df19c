// The settings -> core pair options hand-off: each setting the pair consumes
// bound once to the option field it fills (each_binding), read in one
// direction by pair_settings_from and in the other by read_back.
#include <cadeloop/runtime/pair_settings.hpp>

#include <cadeloop/http/request.hpp>

#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

namespace cadeloop::runtime {

namespace {

using config::setting_id;

// Fields whose value means more than the number or text in them. Each holds a
// reference to the field (const when reading back).

/// A byte limit whose none is `http::request_limits::unlimited`.
template <class Field>
struct no_limit {
  Field& bytes;
};
template <class Field>
no_limit(Field&) -> no_limit<Field>;

/// A string whose none is "" (a file that is stderr when unset, a path).
template <class Field>
struct text_or_none {
  Field& text;
};
template <class Field>
text_or_none(Field&) -> text_or_none<Field>;

/// `uds`: set, it makes the listen spec a Unix socket at that path.
template <class Spec>
struct unix_listen {
  Spec& spec;
};
template <class Spec>
unix_listen(Spec&) -> unix_listen<Spec>;

/// `uds_mode`: octal permission bits, as text ("0660").
struct octal_mode {
  unsigned& mode;
};
struct octal_mode_view {
  const unsigned& mode;
};

/// The bits of an octal mode text ("660", "0660", "0o660"), or -1.
long parse_octal_mode(std::string_view text) {
  if (text.starts_with("0o") || text.starts_with("0O")) {
    text.remove_prefix(2);
  }
  if (text.empty() || text.size() > 5) {
    return -1;
  }
  long v = 0;
  for (const char ch : text) {
    if (ch < '0' || ch > '7') {
      return -1;
    }
    v = v * 8 + (ch - '0');
  }
  return v <= 07777 ? v : -1;
}

/// `fd`: set, it makes the listen spec an inherited descriptor.
template <class Spec>
struct fd_listen {
  Spec& spec;
};
template <class Spec>
fd_listen(Spec&) -> fd_listen<Spec>;

/// `ws`: whether the I/O thread serves WebSockets. off and none turn them
/// off; every other word (auto, on, uvicorn's implementation names) turns
/// them on. Read back as the canonical word: auto (on) or off.
struct ws_switch {
  bool& enabled;
};
struct ws_switch_view {
  const bool& enabled;
};

/// Calls `bind(id, field path, field)` for every option field a setting
/// fills, in one list for both directions (`Settings` is pair_settings or
/// const pair_settings). A setting missing here never reaches the pair.
template <class Settings, class Bind>
void each_binding(Settings& s, Bind&& bind) {
  auto& listen = s.pair.listen;
  auto& server = s.pair.server;
  auto& limits = server.limits;
  auto& log = server.access_log;
  // ---- the app side (the ASGI bridge)
  bind(setting_id::root_path, "app.root_path", s.app.root_path);
  bind(setting_id::server_header, "app.server_header", s.app.server_header);
  bind(setting_id::send_high_mark, "app.send_high_mark", s.app.send_high_mark);
  bind(setting_id::proxy_headers, "app.proxy_headers", s.app.proxy_headers);
  bind(setting_id::forwarded_allow_ips, "app.forwarded_allow_ips", s.app.forwarded_allow_ips);
  bind(setting_id::date_header, "app.date_header", s.app.date_header);
  bind(setting_id::headers, "app.headers", s.app.headers);
  bind(setting_id::asyncio_tasks, "app.asyncio_tasks", s.app.asyncio_tasks);
  bind(setting_id::uds, "app.unix_path", text_or_none{s.app.unix_path});
  // ---- where the pair listens
  bind(setting_id::host, "pair.listen.host", listen.host);
  bind(setting_id::port, "pair.listen.port", listen.port);
  bind(setting_id::backlog, "pair.listen.backlog", listen.backlog);
  bind(setting_id::uds, "pair.listen.path", unix_listen{listen});
  if constexpr (std::is_const_v<Settings>) {
    bind(setting_id::uds_mode, "pair.listen.mode", octal_mode_view{listen.mode});
  } else {
    bind(setting_id::uds_mode, "pair.listen.mode", octal_mode{listen.mode});
  }
  bind(setting_id::fd, "pair.listen.fd", fd_listen{listen});
  // ---- the I/O thread's HTTP server
  bind(setting_id::server_header, "pair.server.server_header", server.server_header);
  bind(setting_id::max_body, "pair.server.limits.max_body", no_limit{limits.max_body});
  bind(setting_id::max_url, "pair.server.limits.max_url", limits.max_url);
  bind(setting_id::max_header_bytes, "pair.server.limits.max_header_bytes",
       limits.max_header_bytes);
  bind(setting_id::max_headers, "pair.server.limits.max_headers", limits.max_headers);
  bind(setting_id::max_pipelined, "pair.server.max_pipelined", server.max_pipelined);
  bind(setting_id::max_connections, "pair.server.max_connections", server.max_connections);
  bind(setting_id::max_requests_in_flight, "pair.server.max_requests_in_flight",
       server.max_requests_in_flight);
  bind(setting_id::request_line_timeout, "pair.server.request_line_timeout",
       server.request_line_timeout);
  bind(setting_id::keepalive_idle, "pair.server.keepalive_idle", server.keepalive_idle);
  bind(setting_id::linger_timeout, "pair.server.linger_timeout", server.linger_timeout);
  bind(setting_id::body_window, "pair.server.body_window", server.body_window);
  bind(setting_id::drain_low_mark, "pair.server.drain_low_mark", server.drain_low_mark);
  bind(setting_id::body_timeout, "pair.server.body_timeout", server.body_timeout);
  bind(setting_id::body_min_rate, "pair.server.body_min_rate", server.body_min_rate);
  bind(setting_id::write_timeout, "pair.server.write_timeout", server.write_timeout);
  bind(setting_id::memory_budget, "pair.server.memory_budget", server.memory_budget);
  bind(setting_id::access_log, "pair.server.access_log.enabled", log.enabled);
  bind(setting_id::access_log_format, "pair.server.access_log.format", log.format);
  bind(setting_id::access_log_file, "pair.server.access_log.file", text_or_none{log.file});
  bind(setting_id::access_log_queue, "pair.server.access_log.queue_lines", log.queue_lines);
  // ---- WebSockets (the I/O thread)
  auto& ws = server.ws;
  if constexpr (std::is_const_v<Settings>) {
    bind(setting_id::ws, "pair.server.ws.enabled", ws_switch_view{ws.enabled});
  } else {
    bind(setting_id::ws, "pair.server.ws.enabled", ws_switch{ws.enabled});
  }
  bind(setting_id::ws_max_size, "pair.server.ws.max_message", ws.max_message);
  bind(setting_id::ws_max_queue, "pair.server.ws.max_queue", ws.max_queue);
  bind(setting_id::ws_ping_interval, "pair.server.ws.ping_interval", ws.ping_interval);
  bind(setting_id::ws_ping_timeout, "pair.server.ws.ping_timeout", ws.ping_timeout);
  bind(setting_id::ws_per_message_deflate, "pair.server.ws.per_message_deflate",
       ws.per_message_deflate);
  // ---- TLS (the I/O thread)
  auto& tls = server.tls;
  bind(setting_id::ssl_certfile, "pair.server.tls.certfile", text_or_none{tls.certfile});
  bind(setting_id::ssl_keyfile, "pair.server.tls.keyfile", text_or_none{tls.keyfile});
  bind(setting_id::ssl_keyfile_password, "pair.server.tls.keyfile_password",
       text_or_none{tls.keyfile_password});
  bind(setting_id::ssl_ca_certs, "pair.server.tls.ca_certs", text_or_none{tls.ca_certs});
  bind(setting_id::ssl_cert_reqs, "pair.server.tls.cert_reqs", tls.cert_reqs);
  bind(setting_id::ssl_ciphers, "pair.server.tls.ciphers", text_or_none{tls.ciphers});
  bind(setting_id::ssl_ciphersuites, "pair.server.tls.ciphersuites",
       text_or_none{tls.ciphersuites});
  bind(setting_id::ssl_min_version, "pair.server.tls.min_version", tls.min_version);
  bind(setting_id::ssl_ticket_rotation, "pair.server.tls.ticket_rotation", tls.ticket_rotation);
  // ---- the pair itself
  bind(setting_id::grace, "pair.grace", s.pair.grace);
  bind(setting_id::io_spin_us, "pair.spin", s.pair.spin);
  bind(setting_id::stuck_timeout, "pair.stuck_timeout", s.pair.stuck_timeout);
  bind(setting_id::shared_cpu_yield_us, "pair.shared_cpu_yield", s.pair.shared_cpu_yield);
  bind(setting_id::solo_max_batch, "pair.solo_max_batch", s.pair.solo_max_batch);
  bind(setting_id::solo_busy_passes, "pair.solo_busy_passes", s.pair.solo_busy_passes);
  bind(setting_id::solo_spin_us, "pair.solo_spin", s.pair.solo_spin);
}

/// A whole-number setting's value in a field of type T. The table's bounds
/// keep every value inside T; one outside is a table that does not match its
/// field (fatal).
template <std::integral T>
T narrow(setting_id id, std::int64_t n) {
  if (!std::in_range<T>(n)) {
    const std::string_view name = config::row(id).name;
    std::fprintf(stderr, "cadeloop: pair settings: %.*s = %lld does not fit its option field\n",
                 static_cast<int>(name.size()), name.data(), static_cast<long long>(n));
    std::abort();
  }
  return static_cast<T>(n);
}

/// Writes each field from the resolved values.
struct fill {
  const config::resolved_values& values;

  void operator()(setting_id id, std::string_view, std::string& field) const {
    field = values.text(id);
  }
  void operator()(setting_id id, std::string_view, bool& field) const { field = values.flag(id); }
  template <std::integral T>
  requires(!std::same_as<T, bool>) void operator()(setting_id id, std::string_view,
                                                   T& field) const {
    field = narrow<T>(id, values.whole(id));
  }
  void operator()(setting_id id, std::string_view, std::chrono::milliseconds& field) const {
    field = std::chrono::milliseconds{std::llround(values.real(id) * 1000.0)};
  }
  void operator()(setting_id id, std::string_view, std::chrono::microseconds& field) const {
    field = std::chrono::microseconds{values.whole(id)};  // the setting's unit is microseconds
  }
  void operator()(setting_id id, std::string_view, no_limit<std::uint64_t> field) const {
    field.bytes = values.is_none(id) ? http::request_limits::unlimited
                                     : narrow<std::uint64_t>(id, values.whole(id));
  }
  void operator()(setting_id id, std::string_view, text_or_none<std::string> field) const {
    field.text = values.is_none(id) ? std::string{} : values.text(id);
  }
  void operator()(setting_id id, std::string_view, unix_listen<net::listen_spec> field) const {
    if (!values.is_none(id)) {
      field.spec.kind = net::listen_spec::kind_type::unix_socket;
      field.spec.path = values.text(id);
    }
  }
  void operator()(setting_id id, std::string_view, octal_mode field) const {
    const long v = parse_octal_mode(values.text(id));
    field.mode = v < 0 ? 0660U : static_cast<unsigned>(v);
  }
  void operator()(setting_id id, std::string_view, ws_switch field) const {
    const std::string word = values.text(id);
    field.enabled = word != "off" && word != "none";
  }
  void operator()(setting_id id, std::string_view, fd_listen<net::listen_spec> field) const {
    if (!values.is_none(id)) {
      field.spec.kind = net::listen_spec::kind_type::inherited_fd;
      field.spec.fd = narrow<int>(id, values.whole(id));
    }
  }
};

/// Reads each field back as a value of its setting.
struct read {
  std::vector<option_reading>& out;

  void add(setting_id id, std::string_view field, config::value v) const {
    out.push_back({id, field, std::move(v)});
  }
  void operator()(setting_id id, std::string_view f, const std::string& field) const {
    add(id, f, field);
  }
  void operator()(setting_id id, std::string_view f, const bool& field) const { add(id, f, field); }
  template <std::integral T>
  requires(!std::same_as<T, bool>) void operator()(setting_id id, std::string_view f,
                                                   const T& field) const {
    add(id, f, static_cast<std::int64_t>(field));
  }
  void operator()(setting_id id, std::string_view f, const std::chrono::milliseconds& field) const {
    add(id, f, static_cast<double>(field.count()) / 1000.0);
  }
  void operator()(setting_id id, std::string_view f, const std::chrono::microseconds& field) const {
    add(id, f, static_cast<std::int64_t>(field.count()));
  }
  void operator()(setting_id id, std::string_view f, no_limit<const std::uint64_t> field) const {
    if (field.bytes == http::request_limits::unlimited) {
      add(id, f, std::monostate{});
    } else {
      add(id, f, static_cast<std::int64_t>(field.bytes));
    }
  }
  void operator()(setting_id id, std::string_view f, text_or_none<const std::string> field) const {
    if (field.text.empty()) {
      add(id, f, std::monostate{});
    } else {
      add(id, f, field.text);
    }
  }
  void operator()(setting_id id, std::string_view f,
                  unix_listen<const net::listen_spec> field) const {
    if (field.spec.kind == net::listen_spec::kind_type::unix_socket) {
      add(id, f, field.spec.path);
    } else {
      add(id, f, std::monostate{});
    }
  }
  void operator()(setting_id id, std::string_view f, octal_mode_view field) const {
    char text[8];
    std::snprintf(text, sizeof text, "0%o", field.mode);
    add(id, f, std::string{text});
  }
  void operator()(setting_id id, std::string_view f, ws_switch_view field) const {
    add(id, f, std::string{field.enabled ? "auto" : "off"});
  }
  void operator()(setting_id id, std::string_view f,
                  fd_listen<const net::listen_spec> field) const {
    if (field.spec.kind == net::listen_spec::kind_type::inherited_fd) {
      add(id, f, static_cast<std::int64_t>(field.spec.fd));
    } else {
      add(id, f, std::monostate{});
    }
  }
};

}  // namespace

pair_settings pair_settings_from(const config::resolved_values& values) {
  if (!values.is_none(setting_id::uds) && !values.is_none(setting_id::fd)) {
    throw config::setting_error(config::error_kind::invalid, "uds and fd cannot both be given");
  }
  if (parse_octal_mode(values.text(setting_id::uds_mode)) < 0) {
    throw config::setting_error(
        config::error_kind::invalid,
        "uds_mode = '" + values.text(setting_id::uds_mode) + "' is not an octal mode such as 0660");
  }
  pair_settings s;
  each_binding(s, fill{values});
  return s;
}

std::vector<option_reading> read_back(const pair_settings& s) {
  std::vector<option_reading> out;
  each_binding(s, read{out});
  return out;
}

}  // namespace cadeloop::runtime
