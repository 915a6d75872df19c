// The stats endpoint's documents: /stats (JSON) and /metrics (Prometheus
// text format 0.0.4), from pair snapshots. Pure functions; the keys and
// metric names are documented in docs/operations.md, so a change here is a
// change of a public interface.
#include "cadeloop/runtime/stats/stats_render.hpp"

#include <cadeloop/net/json_escape.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>

namespace cadeloop::runtime {

namespace {

using snap = pair_stats_snapshot;
using net::append_json_string;

// ---- numbers and strings ---------------------------------------------------

void append_uint(std::string& out, std::uint64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void append_int(std::string& out, std::int64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

// Shortest text that reads back as `v`; JSON and Prometheus both accept it
// ("1e-06", "0.25", "3"). Non-finite values never reach here.
void append_double(std::string& out, double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

// Prometheus label values escape backslash, double quote and newline.
void append_label_value(std::string& out, std::string_view s) {
  for (const char c : s) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
}

double seconds_from_us(std::uint64_t us) {
  return static_cast<double>(us) / 1e6;
}

// ---- JSON ------------------------------------------------------------------

// A minimal writer for one object at a time: key() adds the separator.
class json_object {
 public:
  explicit json_object(std::string& out) : out_(out) { out_ += '{'; }
  json_object(const json_object&) = delete;
  json_object& operator=(const json_object&) = delete;
  ~json_object() { out_ += '}'; }

  std::string& key(std::string_view k) {
    if (!first_) {
      out_ += ',';
    }
    first_ = false;
    append_json_string(out_, k);
    out_ += ':';
    return out_;
  }
  void field(std::string_view k, std::uint64_t v) { append_uint(key(k), v); }
  void field_signed(std::string_view k, std::int64_t v) { append_int(key(k), v); }
  void field_double(std::string_view k, double v) {
    std::string& out = key(k);
    if (std::isfinite(v)) {
      append_double(out, v);
    } else {
      out += "null";
    }
  }
  void field_bool(std::string_view k, bool v) { key(k) += v ? "true" : "false"; }
  void field_string(std::string_view k, std::string_view v) { append_json_string(key(k), v); }

 private:
  std::string& out_;
  bool first_ = true;
};

// The bucket counts' sum: what the histogram really holds (latency_count is
// stored after the bucket, so it can be a moment ahead or behind).
std::uint64_t histogram_count(const snap& s) {
  std::uint64_t n = 0;
  for (const std::uint64_t c : s.latency_buckets) {
    n += c;
  }
  return n;
}

// The counters a pair and the totals share.
void json_counters(json_object& o, const snap& s) {
  o.field("requests", s.requests);
  {
    json_object r{o.key("responses")};
    r.field("total", s.responses);
    r.field("1xx", s.responses_1xx);
    r.field("2xx", s.responses_2xx);
    r.field("3xx", s.responses_3xx);
    r.field("4xx", s.responses_4xx);
    r.field("5xx", s.responses_5xx);
  }
  o.field("bytes_in", s.bytes_in);
  o.field("bytes_out", s.bytes_out);
  o.field("unsent_bytes", s.unsent_bytes);
  o.field("connections_open", s.connections_open);
  o.field("connections_accepted", s.connections_accepted);
  o.field("requests_in_flight", s.requests_in_flight);
  o.field("inbound_depth", s.inbound_depth);
  o.field("outbound_depth", s.outbound_depth);
  o.field("inbound_messages", s.inbound_messages);
  o.field("outbound_messages", s.outbound_messages);
  o.field("wakeups_to_app", s.wakeups_to_app);
  o.field("wakeups_to_io", s.wakeups_to_io);
  o.field("io_parks", s.io_parks);
  o.field("app_parks", s.app_parks);
  o.field("spins", s.spins);
  o.field("spin_hits", s.spin_hits);
  o.field("io_passes", s.io_passes);
  o.field("solo_handoffs", s.solo_handoffs);
  o.field("solo_steals", s.solo_steals);
  o.field("solo_passes", s.solo_passes);
  o.field("loop_ticks", s.loop_ticks);
  o.field("write_calls", s.write_calls);
  o.field("protocol_errors", s.protocol_errors);
  o.field("timeouts", s.timeouts);
  o.field("app_errors", s.app_errors);
  o.field("concurrency_refusals", s.concurrency_refusals);
  o.field("stale_messages", s.stale_messages);
  o.field("accept_pauses", s.accept_pauses);
  o.field("access_log_dropped", s.access_log_dropped);
  o.field("body_timeouts", s.body_timeouts);
  o.field("write_timeouts", s.write_timeouts);
  o.field("budget_refusals", s.budget_refusals);
  o.field("budget_cuts", s.budget_cuts);
  o.field("stuck_episodes", s.stuck_episodes);
  {
    json_object w{o.key("websockets")};
    w.field("open", s.ws_open);
    w.field("accepted", s.ws_upgrades_accepted);
    w.field("rejected", s.ws_upgrades_rejected);
    w.field("denied", s.ws_upgrades_denied);
    w.field("messages_in", s.ws_messages_in);
    w.field("messages_out", s.ws_messages_out);
    w.field("bytes_in", s.ws_bytes_in);
    w.field("bytes_out", s.ws_bytes_out);
    json_object c{w.key("closes")};
    c.field("normal", s.ws_closes_normal);
    c.field("protocol", s.ws_closes_protocol);
    c.field("dropped", s.ws_closes_dropped);
    c.field("other", s.ws_closes_other);
  }
  {
    json_object t{o.key("tls")};
    t.field("handshakes", s.tls_handshakes);
    t.field("resumed", s.tls_resumed);
    {
      json_object v{t.key("versions")};
      v.field("TLSv1.2", s.tls_v12);
      v.field("TLSv1.3", s.tls_v13);
    }
    json_object f{t.key("failures")};
    f.field("protocol", s.tls_fail_protocol);
    f.field("client_cert", s.tls_fail_client_cert);
    f.field("timeout", s.tls_fail_timeout);
    f.field("plain_http", s.tls_fail_plain_http);
    f.field("closed", s.tls_fail_closed);
  }
  {
    json_object l{o.key("latency_us")};
    const std::uint64_t n = histogram_count(s);
    l.field("count", n);
    l.field("sum", s.latency_sum_us);
    l.field_double("mean",
                   n == 0 ? 0.0 : static_cast<double>(s.latency_sum_us) / static_cast<double>(n));
    const latency_percentiles p = percentiles(s);
    l.field_double("p50", p.p50_us);
    l.field_double("p90", p.p90_us);
    l.field_double("p99", p.p99_us);
    l.field_double("p99.9", p.p999_us);
  }
}

// ---- Prometheus --------------------------------------------------------------

// One metric family: # HELP, # TYPE, then its samples.
void family(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

// `name{pair="i"[,extra]} value`
void sample(std::string& out, std::string_view name, const snap& s, std::string_view extra,
            std::uint64_t v) {
  out += name;
  out += "{pair=\"";
  append_uint(out, s.index);
  out += '"';
  if (!extra.empty()) {
    out += ',';
    out += extra;
  }
  out += "} ";
  append_uint(out, v);
  out += '\n';
}

using field_of = std::uint64_t (*)(const snap&);

// A family with one sample per valid pair.
void per_pair(std::string& out, std::span<const snap> pairs, std::string_view name,
              std::string_view type, std::string_view help, field_of get) {
  family(out, name, type, help);
  for (const snap& s : pairs) {
    if (s.valid) {
      sample(out, name, s, {}, get(s));
    }
  }
}

// A family with one sample per valid pair and value of one more label.
void per_pair_labelled(std::string& out, std::span<const snap> pairs, std::string_view name,
                       std::string_view type, std::string_view help,
                       std::initializer_list<std::pair<std::string_view, field_of>> labelled) {
  family(out, name, type, help);
  for (const snap& s : pairs) {
    if (!s.valid) {
      continue;
    }
    for (const auto& [label, get] : labelled) {
      sample(out, name, s, label, get(s));
    }
  }
}

// Exposed histogram bounds: two per power of two (2^k and 1.5 * 2^k µs),
// from 8 µs to 2^32 µs. The page's 241 buckets would make 241 series per
// pair; cumulative counts at a subset of the bucket bounds are still exact.
bool exposed_bound(std::size_t bucket) {
  using b = net::latency_buckets;
  return bucket >= b::sub_count && (bucket - b::sub_count) % (b::sub_count / 2) == 0;
}

void histogram(std::string& out, std::span<const snap> pairs) {
  constexpr std::string_view name = "cadeloop_request_duration_seconds";
  family(out, name, "histogram",
         "Time from a request head handed to the app to its response queued whole.");
  for (const snap& s : pairs) {
    if (!s.valid) {
      continue;
    }
    std::string pair_label = "pair=\"";
    append_uint(pair_label, s.index);
    pair_label += '"';
    // Bucket i holds durations below bucket_upper_us(i), i.e. at or below
    // that bound: the cumulative count up to bucket i - 1 is the sample at
    // le = lower bound of bucket i.
    std::uint64_t cumulative = 0;
    for (std::size_t i = 0; i < s.latency_buckets.size(); ++i) {
      if (exposed_bound(i)) {
        out += name;
        out += "_bucket{";
        out += pair_label;
        out += ",le=\"";
        append_double(out, seconds_from_us(net::latency_buckets::lower_bound_us(i)));
        out += "\"} ";
        append_uint(out, cumulative);
        out += '\n';
      }
      cumulative += s.latency_buckets[i];
    }
    out += name;
    out += "_bucket{";
    out += pair_label;
    out += ",le=\"+Inf\"} ";
    append_uint(out, cumulative);
    out += '\n';
    out += name;
    out += "_sum{";
    out += pair_label;
    out += "} ";
    append_double(out, seconds_from_us(s.latency_sum_us));
    out += '\n';
    out += name;
    out += "_count{";
    out += pair_label;
    out += "} ";
    append_uint(out, cumulative);  // equal to +Inf, as the format requires
    out += '\n';
  }
}

constexpr pair_state all_states[] = {pair_state::unused,  pair_state::starting,
                                     pair_state::serving, pair_state::draining,
                                     pair_state::stopped, pair_state::stuck};

}  // namespace

bool stats_ready(std::span<const pair_stats_snapshot> pairs, bool draining, std::string& why) {
  if (draining) {
    why = "draining";
    return false;
  }
  if (pairs.empty()) {
    why = "no pairs";
    return false;
  }
  // A stuck pair does not accept (the watchdog paused its listener), so the
  // others take its connections: ready while at least one pair serves.
  std::size_t serving = 0;
  for (const snap& s : pairs) {
    if (!s.valid || (s.state != pair_state::serving && s.state != pair_state::stuck)) {
      why = "pair " + std::to_string(s.index) + " is " +
            std::string{state_name(s.valid ? s.state : pair_state::unused)};
      return false;
    }
    serving += s.state == pair_state::serving ? 1 : 0;
  }
  if (serving == 0) {
    why = pairs.size() == 1
              ? std::string{"pair "}.append(std::to_string(pairs[0].index)).append(" is stuck")
              : std::string{"every pair is stuck"};
    return false;
  }
  why.clear();
  return true;
}

std::string render_stats_json(std::span<const pair_stats_snapshot> pairs,
                              const stats_process_info& info, std::int64_t now_unix_ms,
                              double uptime_s, bool draining) {
  std::string out;
  out.reserve(2048 + pairs.size() * 1200 + pair_stats_snapshot::latency_bucket_count * 24);
  std::string why;
  const bool ready = stats_ready(pairs, draining, why);
  {
    json_object doc{out};
    doc.field_string("cadeloop_version", info.cadeloop_version);
    doc.field_string("python_version", info.python_version);
    doc.field_string("isolation", info.isolation);
    doc.field_signed("started_unix_ms", info.started_unix_ms);
    doc.field_signed("now_unix_ms", now_unix_ms);
    doc.field_double("uptime_s", uptime_s);
    doc.field_bool("draining", draining);
    doc.field_bool("ready", ready);
    doc.field_string("not_ready_reason", why);
    {
      std::string& a = doc.key("pairs");
      a += '[';
      bool first = true;
      for (const snap& s : pairs) {
        if (!first) {
          a += ',';
        }
        first = false;
        json_object p{a};
        p.field("index", s.index);
        p.field_signed("pid", s.pid);
        p.field_string("state", state_name(s.valid ? s.state : pair_state::unused));
        p.field("started_unix_ms", s.started_unix_ms);
        const double pair_uptime =
            s.valid && s.started_unix_ms > 0
                ? std::max(0.0, static_cast<double>(now_unix_ms -
                                                    static_cast<std::int64_t>(s.started_unix_ms)) /
                                    1000.0)
                : 0.0;
        p.field_double("uptime_s", pair_uptime);
        json_counters(p, s);
      }
      a += ']';
    }
    {
      const snap total = merge(pairs);
      json_object t{doc.key("totals")};
      std::uint64_t serving = 0;
      std::uint64_t stuck = 0;
      for (const snap& s : pairs) {
        serving += (s.valid && s.state == pair_state::serving) ? 1 : 0;
        stuck += (s.valid && s.state == pair_state::stuck) ? 1 : 0;
      }
      t.field("pairs", pairs.size());
      t.field("pairs_serving", serving);
      t.field("pairs_stuck", stuck);
      json_counters(t, total);
      // The whole histogram, so the dashboard can take percentiles of an
      // interval from the difference of two polls.
      json_object h{t.key("latency_histogram")};
      std::string& le = h.key("le_us");
      le += '[';
      for (std::size_t i = 0; i < total.latency_buckets.size(); ++i) {
        if (i != 0) {
          le += ',';
        }
        const std::uint64_t bound = pair_stats_snapshot::bucket_upper_us(i);
        if (bound == std::numeric_limits<std::uint64_t>::max()) {
          le += "null";  // the overflow bucket: +Inf, which JSON can't spell
        } else {
          append_uint(le, bound);
        }
      }
      le += ']';
      std::string& counts = h.key("counts");
      counts += '[';
      for (std::size_t i = 0; i < total.latency_buckets.size(); ++i) {
        if (i != 0) {
          counts += ',';
        }
        append_uint(counts, total.latency_buckets[i]);
      }
      counts += ']';
    }
  }
  out += '\n';
  return out;
}

std::string render_prometheus(std::span<const pair_stats_snapshot> pairs,
                              const stats_process_info& info, double uptime_s, bool draining) {
  std::string out;
  out.reserve(8192 + pairs.size() * 9000);
  std::string why;
  const bool ready = stats_ready(pairs, draining, why);

  family(out, "cadeloop_build_info", "gauge",
         "Always 1; the labels say which cadeloop and Python serve.");
  out += "cadeloop_build_info{version=\"";
  append_label_value(out, info.cadeloop_version);
  out += "\",python_version=\"";
  append_label_value(out, info.python_version);
  out += "\",isolation=\"";
  append_label_value(out, info.isolation);
  out += "\"} 1\n";
  family(out, "cadeloop_start_time_seconds", "gauge",
         "When the server started, Unix time in seconds.");
  out += "cadeloop_start_time_seconds ";
  append_double(out, static_cast<double>(info.started_unix_ms) / 1000.0);
  out += '\n';
  family(out, "cadeloop_uptime_seconds", "gauge", "Seconds since the server started.");
  out += "cadeloop_uptime_seconds ";
  append_double(out, uptime_s);
  out += '\n';
  family(out, "cadeloop_draining", "gauge", "1 once a graceful stop began (SIGTERM), else 0.");
  out += draining ? "cadeloop_draining 1\n" : "cadeloop_draining 0\n";
  family(out, "cadeloop_ready", "gauge",
         "1 while /readyz answers 200: every pair serving and not draining.");
  out += ready ? "cadeloop_ready 1\n" : "cadeloop_ready 0\n";

  family(out, "cadeloop_pair_state", "gauge", "1 for the state the pair is in, 0 for the others.");
  for (const snap& s : pairs) {
    const pair_state now = s.valid ? s.state : pair_state::unused;
    for (const pair_state st : all_states) {
      std::string label = "state=\"";
      label += state_name(st);
      label += '"';
      sample(out, "cadeloop_pair_state", s, label, st == now ? 1 : 0);
    }
  }
  family(out, "cadeloop_pair_start_time_seconds", "gauge",
         "When the pair started, Unix time in seconds.");
  for (const snap& s : pairs) {
    if (s.valid) {
      out += "cadeloop_pair_start_time_seconds{pair=\"";
      append_uint(out, s.index);
      out += "\"} ";
      append_double(out, static_cast<double>(s.started_unix_ms) / 1000.0);
      out += '\n';
    }
  }
  family(out, "cadeloop_pair_pid", "gauge", "The process the pair runs in.");
  for (const snap& s : pairs) {
    if (s.valid) {
      sample(out, "cadeloop_pair_pid", s, {}, static_cast<std::uint64_t>(s.pid < 0 ? 0 : s.pid));
    }
  }

  per_pair(out, pairs, "cadeloop_requests_total", "counter", "Request heads handed to the app.",
           [](const snap& s) { return s.requests; });
  per_pair(out, pairs, "cadeloop_app_responses_total", "counter", "Responses the app finished.",
           [](const snap& s) { return s.responses; });
  per_pair_labelled(
      out, pairs, "cadeloop_responses_total", "counter",
      "Final responses by status class, the app's and the I/O thread's own error answers.",
      {{"class=\"1xx\"", [](const snap& s) { return s.responses_1xx; }},
       {"class=\"2xx\"", [](const snap& s) { return s.responses_2xx; }},
       {"class=\"3xx\"", [](const snap& s) { return s.responses_3xx; }},
       {"class=\"4xx\"", [](const snap& s) { return s.responses_4xx; }},
       {"class=\"5xx\"", [](const snap& s) { return s.responses_5xx; }}});
  per_pair(out, pairs, "cadeloop_received_bytes_total", "counter", "Bytes read from clients.",
           [](const snap& s) { return s.bytes_in; });
  per_pair(out, pairs, "cadeloop_sent_bytes_total", "counter", "Bytes written to clients.",
           [](const snap& s) { return s.bytes_out; });
  per_pair(out, pairs, "cadeloop_unsent_bytes", "gauge",
           "Response bytes the I/O thread holds, not yet written.",
           [](const snap& s) { return s.unsent_bytes; });
  per_pair(out, pairs, "cadeloop_connections_accepted_total", "counter",
           "Client connections accepted.", [](const snap& s) { return s.connections_accepted; });
  per_pair(out, pairs, "cadeloop_connections_open", "gauge", "Client connections open now.",
           [](const snap& s) { return s.connections_open; });
  per_pair(out, pairs, "cadeloop_requests_in_flight", "gauge",
           "Requests handed to the app and not yet answered.",
           [](const snap& s) { return s.requests_in_flight; });
  per_pair_labelled(
      out, pairs, "cadeloop_ring_depth", "gauge",
      "Entries waiting in a ring: inbound (I/O thread to app), outbound (app to I/O thread).",
      {{"ring=\"inbound\"", [](const snap& s) { return s.inbound_depth; }},
       {"ring=\"outbound\"", [](const snap& s) { return s.outbound_depth; }}});
  per_pair_labelled(out, pairs, "cadeloop_ring_messages_total", "counter",
                    "Entries ever put on a ring: inbound by the I/O thread, outbound by the app.",
                    {{"ring=\"inbound\"", [](const snap& s) { return s.inbound_messages; }},
                     {"ring=\"outbound\"", [](const snap& s) { return s.outbound_messages; }}});
  per_pair_labelled(out, pairs, "cadeloop_wakeups_total", "counter",
                    "Wakeups sent to a parked peer thread (eventfd writes), by the thread woken.",
                    {{"to=\"app\"", [](const snap& s) { return s.wakeups_to_app; }},
                     {"to=\"io\"", [](const snap& s) { return s.wakeups_to_io; }}});
  per_pair_labelled(out, pairs, "cadeloop_parks_total", "counter",
                    "Times a thread of the pair went to sleep.",
                    {{"thread=\"io\"", [](const snap& s) { return s.io_parks; }},
                     {"thread=\"app\"", [](const snap& s) { return s.app_parks; }}});
  per_pair(out, pairs, "cadeloop_spins_total", "counter",
           "Times the I/O thread busy-waited for app messages before parking.",
           [](const snap& s) { return s.spins; });
  per_pair(out, pairs, "cadeloop_spin_hits_total", "counter",
           "Spins that ended because a message arrived (no park needed).",
           [](const snap& s) { return s.spin_hits; });
  per_pair(out, pairs, "cadeloop_io_passes_total", "counter", "Passes of the I/O thread's loop.",
           [](const snap& s) { return s.io_passes; });
  per_pair_labelled(out, pairs, "cadeloop_solo_total", "counter",
                    "Solo mode: the I/O thread gave the sockets to the app thread (handoffs), took "
                    "them back from a busy app thread (steals); I/O passes the app thread ran.",
                    {{"event=\"handoff\"", [](const snap& s) { return s.solo_handoffs; }},
                     {"event=\"steal\"", [](const snap& s) { return s.solo_steals; }},
                     {"event=\"app_pass\"", [](const snap& s) { return s.solo_passes; }}});
  per_pair(out, pairs, "cadeloop_loop_ticks_total", "counter",
           "Passes of the app thread's event loop.", [](const snap& s) { return s.loop_ticks; });
  per_pair(out, pairs, "cadeloop_write_calls_total", "counter",
           "Socket write calls of the I/O thread.", [](const snap& s) { return s.write_calls; });
  per_pair(out, pairs, "cadeloop_protocol_errors_total", "counter",
           "Requests rejected as malformed or over a limit (answered 4xx/5xx and closed).",
           [](const snap& s) { return s.protocol_errors; });
  per_pair(out, pairs, "cadeloop_timeouts_total", "counter", "Connections closed by a timeout.",
           [](const snap& s) { return s.timeouts; });
  per_pair(out, pairs, "cadeloop_app_errors_total", "counter",
           "App exceptions and malformed messages from the app.",
           [](const snap& s) { return s.app_errors; });
  per_pair(out, pairs, "cadeloop_concurrency_refusals_total", "counter",
           "Requests and websockets refused with 503 beyond limit_concurrency.",
           [](const snap& s) { return s.concurrency_refusals; });
  per_pair(out, pairs, "cadeloop_stale_messages_total", "counter",
           "App messages for a connection or request already gone, dropped.",
           [](const snap& s) { return s.stale_messages; });
  per_pair(out, pairs, "cadeloop_accept_pauses_total", "counter",
           "Times the listener stopped accepting (a connection or memory limit).",
           [](const snap& s) { return s.accept_pauses; });
  per_pair(out, pairs, "cadeloop_stuck_episodes_total", "counter",
           "Times the watchdog marked the pair stuck (no app progress for stuck_timeout).",
           [](const snap& s) { return s.stuck_episodes; });
  per_pair(out, pairs, "cadeloop_access_log_dropped_total", "counter",
           "Access log lines dropped because the log queue was full.",
           [](const snap& s) { return s.access_log_dropped; });
  per_pair(out, pairs, "cadeloop_body_timeouts_total", "counter",
           "Request bodies cut by body_timeout or body_min_rate.",
           [](const snap& s) { return s.body_timeouts; });
  per_pair(out, pairs, "cadeloop_write_timeouts_total", "counter",
           "Connections closed because their output was not read for write_timeout.",
           [](const snap& s) { return s.write_timeouts; });
  per_pair(out, pairs, "cadeloop_budget_refusals_total", "counter",
           "Requests answered 503 because the pair was over memory_budget.",
           [](const snap& s) { return s.budget_refusals; });
  per_pair(out, pairs, "cadeloop_budget_cuts_total", "counter",
           "Slowest connections cut to keep the pair within its memory or in-flight budget.",
           [](const snap& s) { return s.budget_cuts; });
  per_pair(out, pairs, "cadeloop_websockets_open", "gauge", "Accepted WebSockets open now.",
           [](const snap& s) { return s.ws_open; });
  per_pair_labelled(
      out, pairs, "cadeloop_websocket_upgrades_total", "counter",
      "WebSocket upgrade requests by outcome: accepted by the app (101), rejected as a bad "
      "handshake by the I/O thread (400/426), denied by the app (or left by the client first).",
      {{"outcome=\"accepted\"", [](const snap& s) { return s.ws_upgrades_accepted; }},
       {"outcome=\"rejected\"", [](const snap& s) { return s.ws_upgrades_rejected; }},
       {"outcome=\"denied\"", [](const snap& s) { return s.ws_upgrades_denied; }}});
  per_pair_labelled(out, pairs, "cadeloop_websocket_messages_total", "counter",
                    "WebSocket messages: in (handed to the app), out (sent by the app).",
                    {{"direction=\"in\"", [](const snap& s) { return s.ws_messages_in; }},
                     {"direction=\"out\"", [](const snap& s) { return s.ws_messages_out; }}});
  per_pair_labelled(
      out, pairs, "cadeloop_websocket_message_bytes_total", "counter",
      "WebSocket payload bytes (uncompressed): in (handed to the app), out (sent by the app).",
      {{"direction=\"in\"", [](const snap& s) { return s.ws_bytes_in; }},
       {"direction=\"out\"", [](const snap& s) { return s.ws_bytes_out; }}});
  per_pair_labelled(
      out, pairs, "cadeloop_websocket_closes_total", "counter",
      "Ends of accepted WebSockets by close code class: normal (1000, 1001), protocol (1002, "
      "1007, 1009), dropped (1006), other (1005, 1011, 1012, 3000-4999, ...).",
      {{"class=\"normal\"", [](const snap& s) { return s.ws_closes_normal; }},
       {"class=\"protocol\"", [](const snap& s) { return s.ws_closes_protocol; }},
       {"class=\"dropped\"", [](const snap& s) { return s.ws_closes_dropped; }},
       {"class=\"other\"", [](const snap& s) { return s.ws_closes_other; }}});
  per_pair_labelled(out, pairs, "cadeloop_tls_handshakes_total", "counter",
                    "TLS handshakes completed, by version.",
                    {{"version=\"TLSv1.2\"", [](const snap& s) { return s.tls_v12; }},
                     {"version=\"TLSv1.3\"", [](const snap& s) { return s.tls_v13; }}});
  per_pair(out, pairs, "cadeloop_tls_resumed_total", "counter",
           "TLS handshakes that resumed a session (ticket or cache).",
           [](const snap& s) { return s.tls_resumed; });
  per_pair_labelled(
      out, pairs, "cadeloop_tls_handshake_failures_total", "counter",
      "TLS handshakes that failed, by reason: protocol (no shared version or cipher, bad "
      "records), client_cert (missing or refused), timeout, plain_http (plain HTTP to the TLS "
      "port, answered 400), closed (the client left, or sent too many handshake bytes).",
      {{"reason=\"protocol\"", [](const snap& s) { return s.tls_fail_protocol; }},
       {"reason=\"client_cert\"", [](const snap& s) { return s.tls_fail_client_cert; }},
       {"reason=\"timeout\"", [](const snap& s) { return s.tls_fail_timeout; }},
       {"reason=\"plain_http\"", [](const snap& s) { return s.tls_fail_plain_http; }},
       {"reason=\"closed\"", [](const snap& s) { return s.tls_fail_closed; }}});
  histogram(out, pairs);
  return out;
}

}  // namespace cadeloop::runtime
