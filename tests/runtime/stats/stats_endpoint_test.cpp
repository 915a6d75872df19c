// The stats endpoint over real sockets, with a fake reader whose numbers are
// known: /stats parses as JSON and carries them, /metrics is well-formed
// Prometheus text with cumulative buckets, the probes, 404/405/400, limits.
#include <cadeloop/runtime/stats/stats_endpoint.hpp>

#include <gtest/gtest.h>

#include "test_json.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <variant>
#include <vector>

namespace cadeloop::runtime {
namespace {

using test::json;
using test::json_parser;

// ---- a blocking client -----------------------------------------------------------

struct http_reply {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  bool closed = false;  // the server closed the connection after this reply
};

class client {
 public:
  explicit client(std::uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      throw std::runtime_error("connect failed");
    }
  }
  client(const client&) = delete;
  client& operator=(const client&) = delete;
  ~client() { ::close(fd_); }

  void send(std::string_view bytes) const {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) {
        throw std::runtime_error("send failed");
      }
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
  }

  // Reads one response (Content-Length framed); `head_only` for HEAD.
  http_reply read_reply(bool head_only = false) {
    http_reply r;
    std::size_t end = 0;
    while ((end = buf_.find("\r\n\r\n")) == std::string::npos) {
      if (!fill()) {
        throw std::runtime_error("EOF before the head: [" + buf_ + "]");
      }
    }
    std::istringstream head{buf_.substr(0, end)};
    std::string line;
    std::getline(head, line);
    r.status = std::stoi(line.substr(9, 3));
    while (std::getline(head, line)) {
      if (!line.empty() && line.back() == '\r') {
        line.pop_back();
      }
      const auto colon = line.find(':');
      std::string name = line.substr(0, colon);
      for (char& c : name) {
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      }
      r.headers[name] = line.substr(colon + 2);
    }
    buf_.erase(0, end + 4);
    const std::size_t length = head_only ? 0 : std::stoul(r.headers.at("content-length"));
    while (buf_.size() < length) {
      if (!fill()) {
        throw std::runtime_error("EOF in the body");
      }
    }
    r.body = buf_.substr(0, length);
    buf_.erase(0, length);
    return r;
  }

  // True when the server closed the connection (EOF with nothing more).
  bool at_eof() {
    while (buf_.empty()) {
      if (!fill()) {
        return true;
      }
    }
    return false;
  }

 private:
  bool fill() {
    char tmp[65536];
    const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n < 0) {
      throw std::runtime_error("recv failed or timed out");
    }
    if (n == 0) {
      return false;
    }
    buf_.append(tmp, static_cast<std::size_t>(n));
    return true;
  }

  int fd_ = -1;
  std::string buf_;
};

http_reply get(std::uint16_t port, std::string_view path) {
  client c{port};
  c.send("GET " + std::string{path} + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
  http_reply r = c.read_reply();
  r.closed = c.at_eof();
  return r;
}

// ---- known numbers ----------------------------------------------------------------

std::size_t bucket_of(std::uint64_t us) {
  return net::latency_buckets::index_of(us);
}

pair_stats_snapshot pair(std::uint32_t index, std::uint64_t scale) {
  pair_stats_snapshot s;
  s.valid = true;
  s.index = index;
  s.pid = 4242;
  s.state = pair_state::serving;
  s.started_unix_ms = 1'700'000'000'000;
  s.requests = 100 * scale;
  s.responses = 99 * scale;
  s.responses_2xx = 90 * scale;
  s.responses_4xx = 6 * scale;
  s.responses_5xx = 3 * scale;
  s.bytes_in = 12'345 * scale;
  s.bytes_out = 67'890 * scale;
  s.connections_open = 3 * scale;
  s.connections_accepted = 10 * scale;
  s.requests_in_flight = 1 * scale;
  s.inbound_depth = 2 * scale;
  s.outbound_depth = 4 * scale;
  s.wakeups_to_app = 7 * scale;
  s.wakeups_to_io = 8 * scale;
  s.spins = 50 * scale;
  s.spin_hits = 40 * scale;
  s.loop_ticks = 500 * scale;
  // 60 requests at 100 µs, 30 at 1 ms, 9 at 10 ms, 1 at 2 s.
  s.latency_buckets[bucket_of(100)] = 60 * scale;
  s.latency_buckets[bucket_of(1000)] = 30 * scale;
  s.latency_buckets[bucket_of(10'000)] = 9 * scale;
  s.latency_buckets[bucket_of(2'000'000)] = 1 * scale;
  s.latency_count = 100 * scale;
  s.latency_sum_us = (60 * 100 + 30 * 1000 + 9 * 10'000 + 2'000'000) * scale;
  return s;
}

stats_process_info info() {
  return {"threads", "3.13.1", "0.1.0", 1'700'000'000'000};
}

class stats_endpoint_test : public ::testing::Test {
 protected:
  void SetUp() override {
    pairs_ = {pair(0, 1), pair(1, 2)};
    std::string error;
    endpoint_ = stats_endpoint::start(
        {"127.0.0.1", 0}, info(), [this] { return read(); }, error);
    ASSERT_TRUE(endpoint_) << error;
    port_ = endpoint_->port();
    ASSERT_NE(port_, 0);
  }

  std::vector<pair_stats_snapshot> read() {
    const std::lock_guard lock{mutex_};
    if (throw_) {
      throw std::runtime_error("the region is gone");
    }
    return pairs_;
  }
  void set_pairs(std::vector<pair_stats_snapshot> p) {
    const std::lock_guard lock{mutex_};
    pairs_ = std::move(p);
  }

  std::mutex mutex_;
  std::vector<pair_stats_snapshot> pairs_;
  bool throw_ = false;
  std::unique_ptr<stats_endpoint> endpoint_;
  std::uint16_t port_ = 0;
};

// ---- /stats ---------------------------------------------------------------------

TEST_F(stats_endpoint_test, stats_is_json_with_the_numbers) {
  const http_reply r = get(port_, "/stats");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.headers.at("content-type"), "application/json");
  EXPECT_EQ(r.headers.at("cache-control"), "no-store");
  const json doc = json_parser{r.body}.parse();
  EXPECT_EQ(doc["isolation"].str(), "threads");
  EXPECT_EQ(doc["python_version"].str(), "3.13.1");
  EXPECT_EQ(doc["cadeloop_version"].str(), "0.1.0");
  EXPECT_GT(doc["uptime_s"].num(), 0.0);
  EXPECT_FALSE(doc["draining"].boolean());
  EXPECT_TRUE(doc["ready"].boolean());
  ASSERT_EQ(doc["pairs"].size(), 2u);

  const json& p1 = doc["pairs"][1];
  EXPECT_EQ(p1["index"].num(), 1);
  EXPECT_EQ(p1["pid"].num(), 4242);
  EXPECT_EQ(p1["state"].str(), "serving");
  EXPECT_EQ(p1["requests"].num(), 200);
  EXPECT_EQ(p1["responses"]["total"].num(), 198);
  EXPECT_EQ(p1["responses"]["2xx"].num(), 180);
  EXPECT_EQ(p1["responses"]["4xx"].num(), 12);
  EXPECT_EQ(p1["responses"]["5xx"].num(), 6);
  EXPECT_EQ(p1["responses"]["1xx"].num(), 0);
  EXPECT_EQ(p1["bytes_in"].num(), 24'690);
  EXPECT_EQ(p1["bytes_out"].num(), 135'780);
  EXPECT_EQ(p1["connections_open"].num(), 6);
  EXPECT_EQ(p1["connections_accepted"].num(), 20);
  EXPECT_EQ(p1["requests_in_flight"].num(), 2);
  EXPECT_EQ(p1["inbound_depth"].num(), 4);
  EXPECT_EQ(p1["outbound_depth"].num(), 8);
  EXPECT_EQ(p1["wakeups_to_app"].num(), 14);
  EXPECT_EQ(p1["wakeups_to_io"].num(), 16);
  EXPECT_EQ(p1["spins"].num(), 100);
  EXPECT_EQ(p1["spin_hits"].num(), 80);
  EXPECT_EQ(p1["loop_ticks"].num(), 1000);

  // Percentiles are bucket upper bounds: never below the value, at most
  // 1/8 above it.
  const json& lat = p1["latency_us"];
  EXPECT_EQ(lat["count"].num(), 200);
  EXPECT_GE(lat["p50"].num(), 100);
  EXPECT_LE(lat["p50"].num(), 112.5);
  EXPECT_GE(lat["p90"].num(), 1000);
  EXPECT_LE(lat["p90"].num(), 1125);
  EXPECT_GE(lat["p99"].num(), 10'000);
  EXPECT_LE(lat["p99"].num(), 11'250);
  EXPECT_GE(lat["p99.9"].num(), 2'000'000);
  EXPECT_LE(lat["p99.9"].num(), 2'250'000);

  const json& t = doc["totals"];
  EXPECT_EQ(t["pairs"].num(), 2);
  EXPECT_EQ(t["pairs_serving"].num(), 2);
  EXPECT_EQ(t["requests"].num(), 300);
  EXPECT_EQ(t["responses"]["5xx"].num(), 9);
  EXPECT_EQ(t["connections_open"].num(), 9);
  EXPECT_EQ(t["latency_us"]["count"].num(), 300);
  const json& h = t["latency_histogram"];
  ASSERT_EQ(h["le_us"].size(), pair_stats_snapshot::latency_bucket_count);
  ASSERT_EQ(h["counts"].size(), pair_stats_snapshot::latency_bucket_count);
  EXPECT_TRUE(h["le_us"][pair_stats_snapshot::latency_bucket_count - 1].is_null());
  EXPECT_EQ(h["counts"][bucket_of(1000)].num(), 90);
}

TEST_F(stats_endpoint_test, stats_follows_the_reader) {
  auto p = pair(0, 1);
  p.requests = 7;
  p.state = pair_state::starting;
  set_pairs({p});
  const json doc = json_parser{get(port_, "/stats").body}.parse();
  EXPECT_EQ(doc["pairs"].size(), 1u);
  EXPECT_EQ(doc["pairs"][0]["requests"].num(), 7);
  EXPECT_EQ(doc["pairs"][0]["state"].str(), "starting");
  EXPECT_FALSE(doc["ready"].boolean());
  EXPECT_EQ(doc["not_ready_reason"].str(), "pair 0 is starting");
}

// ---- /metrics ---------------------------------------------------------------------

struct metric_sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Parses the exposition strictly enough to catch what promtool would: every
// sample belongs to a family declared by # HELP and # TYPE before it, label
// syntax, one family block per name.
std::vector<metric_sample> parse_metrics(const std::string& text,
                                         std::map<std::string, std::string>& types) {
  static const std::regex help{R"(^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .+$)"};
  static const std::regex type{
      R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$)"};
  static const std::regex line{
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*"(,[a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*")*)?\})? (\S+)$)"};
  static const std::regex label{R"(([a-zA-Z_][a-zA-Z0-9_]*)="((\\.|[^"\\])*)\")"};
  std::vector<metric_sample> out;
  std::set<std::string> done;
  std::string current;
  std::istringstream in{text};
  std::string l;
  EXPECT_EQ(text.back(), '\n');
  while (std::getline(in, l)) {
    std::smatch m;
    if (std::regex_match(l, m, help)) {
      EXPECT_TRUE(done.insert(m[1]).second) << "family repeated: " << m[1];
      current = m[1];
      continue;
    }
    if (std::regex_match(l, m, type)) {
      EXPECT_EQ(m[1], current) << "TYPE without HELP: " << l;
      types[m[1]] = m[2];
      continue;
    }
    EXPECT_TRUE(std::regex_match(l, m, line)) << "malformed line: " << l;
    if (m.empty()) {
      continue;
    }
    metric_sample s;
    s.name = m[1];
    const std::string family_name =
        types[current] == "histogram"
            ? std::regex_replace(s.name, std::regex{"_(bucket|sum|count)$"}, "")
            : s.name;
    EXPECT_EQ(family_name, current) << "sample outside its family: " << l;
    const std::string labels = m[3];
    for (auto it = std::sregex_iterator(labels.begin(), labels.end(), label);
         it != std::sregex_iterator(); ++it) {
      s.labels[(*it)[1]] = (*it)[2];
    }
    const std::string v = m[7];
    s.value = v == "+Inf" ? INFINITY : std::stod(v);
    out.push_back(std::move(s));
  }
  return out;
}

TEST_F(stats_endpoint_test, metrics_are_prometheus_text) {
  const http_reply r = get(port_, "/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.headers.at("content-type"), "text/plain; version=0.0.4; charset=utf-8");
  std::map<std::string, std::string> types;
  const std::vector<metric_sample> samples = parse_metrics(r.body, types);

  for (const auto& [name, t] : types) {
    if (t == "counter") {
      EXPECT_TRUE(name.ends_with("_total")) << name;
    } else {
      EXPECT_FALSE(name.ends_with("_total")) << name;
    }
  }
  EXPECT_EQ(types.at("cadeloop_requests_total"), "counter");
  EXPECT_EQ(types.at("cadeloop_connections_open"), "gauge");
  EXPECT_EQ(types.at("cadeloop_request_duration_seconds"), "histogram");

  auto find = [&](const std::string& name, const std::map<std::string, std::string>& labels) {
    for (const auto& s : samples) {
      if (s.name == name && s.labels == labels) {
        return s.value;
      }
    }
    ADD_FAILURE() << "no sample " << name;
    return -1.0;
  };
  EXPECT_EQ(find("cadeloop_requests_total", {{"pair", "1"}}), 200);
  EXPECT_EQ(find("cadeloop_responses_total", {{"pair", "0"}, {"class", "5xx"}}), 3);
  EXPECT_EQ(find("cadeloop_received_bytes_total", {{"pair", "1"}}), 24'690);
  EXPECT_EQ(find("cadeloop_ring_depth", {{"pair", "1"}, {"ring", "outbound"}}), 8);
  EXPECT_EQ(find("cadeloop_wakeups_total", {{"pair", "0"}, {"to", "app"}}), 7);
  EXPECT_EQ(find("cadeloop_pair_state", {{"pair", "0"}, {"state", "serving"}}), 1);
  EXPECT_EQ(find("cadeloop_pair_state", {{"pair", "0"}, {"state", "starting"}}), 0);
  EXPECT_EQ(find("cadeloop_ready", {}), 1);
  EXPECT_EQ(find("cadeloop_build_info",
                 {{"version", "0.1.0"}, {"python_version", "3.13.1"}, {"isolation", "threads"}}),
            1);

  // The histogram, per pair: buckets cumulative with increasing le, ending
  // at +Inf equal to _count; _sum in seconds.
  for (const std::string p : {"0", "1"}) {
    double last_le = -1;
    double last_count = 0;
    double inf = -1;
    std::size_t buckets = 0;
    for (const auto& s : samples) {
      if (s.name != "cadeloop_request_duration_seconds_bucket" || s.labels.at("pair") != p) {
        continue;
      }
      ++buckets;
      const std::string& le = s.labels.at("le");
      const double bound = le == "+Inf" ? INFINITY : std::stod(le);
      EXPECT_GT(bound, last_le) << le;
      EXPECT_GE(s.value, last_count) << "not cumulative at le=" << le;
      // Known content: everything at or below 100 µs is the 60 (x scale).
      if (bound >= 100e-6 && bound < 1000e-6) {
        EXPECT_EQ(s.value, p == "0" ? 60 : 120) << le;
      }
      last_le = bound;
      last_count = s.value;
      if (le == "+Inf") {
        inf = s.value;
      }
    }
    EXPECT_GT(buckets, 20u);
    EXPECT_EQ(inf, p == "0" ? 100 : 200);
    EXPECT_EQ(find("cadeloop_request_duration_seconds_count", {{"pair", p}}), inf);
    EXPECT_DOUBLE_EQ(find("cadeloop_request_duration_seconds_sum", {{"pair", p}}),
                     (p == "0" ? 1 : 2) * 2.126);
  }
}

TEST(stats_render, label_values_are_escaped) {
  stats_process_info odd{"thr\"eads", "3.13\\1\nx", "0.1.0", 0};
  const std::string text = render_prometheus({}, odd, 1.0, false);
  EXPECT_NE(text.find(R"(python_version="3.13\\1\nx")"), std::string::npos) << text;
  EXPECT_NE(text.find(R"(isolation="thr\"eads")"), std::string::npos) << text;
}

TEST(stats_render, json_strings_are_escaped) {
  stats_process_info odd{"a\"b", "1\\2\x01", "0.1.0", 0};
  const std::string text = render_stats_json({}, odd, 0, 0.0, false);
  const json doc = json_parser{text}.parse();
  EXPECT_EQ(doc["isolation"].str(), "a\"b");
  EXPECT_FALSE(doc["ready"].boolean());
  EXPECT_EQ(doc["not_ready_reason"].str(), "no pairs");
}

// ---- probes ---------------------------------------------------------------------------

TEST_F(stats_endpoint_test, healthz_is_200) {
  const http_reply r = get(port_, "/healthz");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ok\n");
  endpoint_->set_draining();
  EXPECT_EQ(get(port_, "/healthz").status, 200) << "a drain is not a failure of liveness";
}

TEST_F(stats_endpoint_test, readyz_flips_to_503_after_set_draining) {
  EXPECT_EQ(get(port_, "/readyz").status, 200);
  EXPECT_FALSE(endpoint_->draining());
  endpoint_->set_draining();
  EXPECT_TRUE(endpoint_->draining());
  const http_reply r = get(port_, "/readyz");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.body, "not ready: draining\n");
  const json doc = json_parser{get(port_, "/stats").body}.parse();
  EXPECT_TRUE(doc["draining"].boolean());
  EXPECT_FALSE(doc["ready"].boolean());
}

TEST_F(stats_endpoint_test, readyz_is_503_until_every_pair_serves) {
  auto starting = pair(1, 1);
  starting.state = pair_state::starting;
  set_pairs({pair(0, 1), starting});
  http_reply r = get(port_, "/readyz");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.body, "not ready: pair 1 is starting\n");
  pair_stats_snapshot unused;
  unused.index = 1;
  set_pairs({pair(0, 1), unused});
  EXPECT_EQ(get(port_, "/readyz").status, 503);
  set_pairs({});
  EXPECT_EQ(get(port_, "/readyz").status, 503);
  set_pairs({pair(0, 1), pair(1, 1)});
  EXPECT_EQ(get(port_, "/readyz").status, 200);
}

// ---- the dashboard ---------------------------------------------------------------------

TEST_F(stats_endpoint_test, dashboard_is_one_self_contained_page) {
  const http_reply r = get(port_, "/");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.headers.at("content-type"), "text/html; charset=utf-8");
  EXPECT_NE(r.headers.at("content-security-policy").find("default-src 'none'"), std::string::npos);
  EXPECT_TRUE(r.body.starts_with("<!doctype html>"));
  EXPECT_NE(r.body.find("<canvas"), std::string::npos);
  EXPECT_NE(r.body.find("fetch(\"stats\""), std::string::npos);
  EXPECT_NE(r.body.find("</html>"), std::string::npos);
  // Nothing from elsewhere: no external scripts, styles, fonts or images.
  for (const char* bad : {"src=\"http", "href=\"http", "@import", "url(http", "<link"}) {
    EXPECT_EQ(r.body.find(bad), std::string::npos) << bad;
  }
  EXPECT_EQ(r.body, stats_dashboard_html());
}

// ---- errors and the protocol ---------------------------------------------------------------

TEST_F(stats_endpoint_test, unknown_path_is_404) {
  EXPECT_EQ(get(port_, "/nope").status, 404);
  EXPECT_EQ(get(port_, "/stats/").status, 404);
  EXPECT_EQ(get(port_, "/stats?x=1").status, 200) << "a query string does not change the path";
}

TEST_F(stats_endpoint_test, other_methods_are_405) {
  for (const char* req :
       {"POST /stats HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
        "DELETE /readyz HTTP/1.1\r\nHost: x\r\n\r\n", "PUT / HTTP/1.1\r\nHost: x\r\n\r\n"}) {
    client c{port_};
    c.send(req);
    const http_reply r = c.read_reply();
    EXPECT_EQ(r.status, 405) << req;
    EXPECT_EQ(r.headers.at("allow"), "GET, HEAD");
  }
}

TEST_F(stats_endpoint_test, head_has_no_body) {
  client c{port_};
  c.send("HEAD /stats HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  const http_reply h = c.read_reply(true);
  EXPECT_EQ(h.status, 200);
  EXPECT_GT(std::stoul(h.headers.at("content-length")), 100u);
  const http_reply g = c.read_reply();
  EXPECT_EQ(g.body, "ok\n") << "the HEAD response must not have carried a body";
}

TEST_F(stats_endpoint_test, keep_alive_and_pipelining) {
  client c{port_};
  c.send(
      "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /readyz HTTP/1.1\r\nHost: x\r\n\r\nGET /nope "
      "HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(c.read_reply().body, "ok\n");
  EXPECT_EQ(c.read_reply().body, "ready\n");
  EXPECT_EQ(c.read_reply().status, 404);
  c.send("GET /stats HTTP/1.1\r\nHost: x\r\n\r\n");
  const http_reply r = c.read_reply();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers.count("connection"), 0u);
  // HTTP/1.0 without keep-alive: answered, then closed.
  c.send("GET /healthz HTTP/1.0\r\n\r\n");
  const http_reply last = c.read_reply();
  EXPECT_EQ(last.status, 200);
  EXPECT_EQ(last.headers.at("connection"), "close");
  EXPECT_TRUE(c.at_eof());
}

TEST_F(stats_endpoint_test, malformed_request_gets_400_and_close) {
  for (const char* bad :
       {"GARBAGE\r\n\r\n",
        "GET /stats HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        "GET /stats HTTP/1.1\r\nBad Header\r\n\r\n", "GET /stats HTTP/9.9\r\n\r\n",
        "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"}) {
    client c{port_};
    c.send(bad);
    const http_reply r = c.read_reply();
    EXPECT_GE(r.status, 400) << bad;
    EXPECT_LT(r.status, 600) << bad;
    EXPECT_EQ(r.headers.at("connection"), "close") << bad;
    EXPECT_TRUE(c.at_eof()) << bad;
  }
  client c{port_};
  c.send("GARBAGE\r\n\r\n");
  EXPECT_EQ(c.read_reply().status, 400);
  // Still serving everyone else.
  EXPECT_EQ(get(port_, "/healthz").status, 200);
}

TEST_F(stats_endpoint_test, oversized_head_is_refused_and_closed) {
  client c{port_};
  c.send("GET /stats HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(16 * 1024, 'a') + "\r\n\r\n");
  const http_reply r = c.read_reply();
  EXPECT_EQ(r.status, 431);
  EXPECT_TRUE(c.at_eof());
  client u{port_};
  u.send("GET /" + std::string(4096, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(u.read_reply().status, 414);
}

TEST_F(stats_endpoint_test, reader_failure_is_500_not_a_crash) {
  {
    const std::lock_guard lock{mutex_};
    throw_ = true;
  }
  const http_reply r = get(port_, "/stats");
  EXPECT_EQ(r.status, 500);
  EXPECT_NE(r.body.find("the region is gone"), std::string::npos);
  EXPECT_EQ(get(port_, "/healthz").status, 200);
}

TEST_F(stats_endpoint_test, a_client_that_goes_away_mid_request_harms_nothing) {
  for (int i = 0; i < 20; ++i) {
    client c{port_};
    c.send("GET /sta");
  }
  EXPECT_EQ(get(port_, "/healthz").status, 200);
}

TEST_F(stats_endpoint_test, second_endpoint_on_the_same_port_fails_with_one_line) {
  std::string error;
  auto other = stats_endpoint::start(
      {"127.0.0.1", port_}, info(), [] { return std::vector<pair_stats_snapshot>{}; }, error);
  EXPECT_FALSE(other);
  EXPECT_EQ(error, "stats endpoint: cannot listen on 127.0.0.1:" + std::to_string(port_) +
                       ": address already in use");
}

TEST_F(stats_endpoint_test, close_is_idempotent_and_stops_serving) {
  // An open keep-alive connection must not keep close() waiting: it is closed.
  client idle{port_};
  idle.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(idle.read_reply().status, 200);
  endpoint_->close();
  endpoint_->close();
  EXPECT_TRUE(idle.at_eof());
  EXPECT_THROW(client{port_}, std::runtime_error);
}

TEST_F(stats_endpoint_test, idle_connections_at_the_cap_do_not_starve_a_probe) {
  // Three times the cap, half of them with half a head: the newest connection
  // is always served, the idlest make room.
  std::vector<std::unique_ptr<client>> idle;
  for (int i = 0; i < 192; ++i) {
    idle.push_back(std::make_unique<client>(port_));
    if (i % 2 == 1) {
      idle.back()->send("GET /healthz HTTP/1.1\r\nHo");
    }
  }
  EXPECT_EQ(get(port_, "/healthz").status, 200);
  EXPECT_EQ(get(port_, "/readyz").status, 200);
  // The first connections were the idlest: closed to make room.
  EXPECT_TRUE(idle.front()->at_eof());
}

TEST_F(stats_endpoint_test, restarts_are_counted_in_stats_and_metrics) {
  endpoint_->count_restart();
  endpoint_->count_restart();
  EXPECT_EQ(endpoint_->restarts(), 2u);
  const json doc = json_parser{get(port_, "/stats").body}.parse();
  EXPECT_EQ(doc["restarts"].num(), 2);
  EXPECT_NE(get(port_, "/metrics").body.find("\ncadeloop_restarts_total 2\n"), std::string::npos);
}

TEST(stats_endpoint, concurrent_clients_and_draining) {
  std::atomic<std::uint64_t> calls{0};
  std::string error;
  auto endpoint = stats_endpoint::start(
      {"127.0.0.1", 0}, info(),
      [&] {
        ++calls;
        return std::vector<pair_stats_snapshot>{pair(0, calls.load())};
      },
      error);
  ASSERT_TRUE(endpoint) << error;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      try {
        client c{endpoint->port()};
        for (int i = 0; i < 50; ++i) {
          c.send("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
          if (c.read_reply().status != 200) {
            ++failures;
          }
        }
      } catch (const std::exception&) {
        ++failures;
      }
    });
  }
  endpoint->set_draining();  // from another thread than the endpoint's
  for (auto& t : threads) {
    t.join();
  }
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(calls.load(), 200u);
  EXPECT_EQ(get(endpoint->port(), "/readyz").status, 503);
}

}  // namespace
}  // namespace cadeloop::runtime
