// The stats endpoint's HTTP side: one thread, one io_context, one acceptor,
// a handful of short-lived connections. Rendering is in stats_render.cpp.
//
// It is deliberately simple and defensive rather than fast: it serves a
// dashboard, a scraper and probes, a few requests per second, so every
// connection parses one request at a time (message credit 1), reads only
// when it needs bytes, and is closed on the first error. Responses are
// written by http's response encoder, as the server's are.
#include "cadeloop/runtime/stats/stats_endpoint.hpp"
#include "cadeloop/runtime/server_log.hpp"

#include <cadeloop/http/request_parser.hpp>
#include <cadeloop/http/response_encoder.hpp>
#include <cadeloop/net/listener.hpp>

#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include <fcntl.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <optional>
#include <span>
#include <thread>
#include <unordered_set>
#include <utility>

namespace cadeloop::runtime {

namespace asio = boost::asio;
using stream_socket = asio::generic::stream_protocol::socket;

namespace {

// A bad client must not starve the main process: few connections, small
// heads, and a deadline for each request. A probe must not be starved by
// them either: at the cap, the connection idle longest makes room for the
// new one (see on_accept).
constexpr std::size_t max_connections = 64;
constexpr std::chrono::seconds request_deadline{15};
// After an accept error other than an aborted connection (EMFILE, ENFILE,
// ENOBUFS), the listener stays readable: retrying at once would spin. The
// server's listeners wait as long (net/server_accept.cpp).
constexpr std::chrono::milliseconds accept_retry_delay{50};
constexpr std::size_t read_chunk = 4096;

http::request_limits endpoint_limits() {
  http::request_limits limits;
  limits.max_url = 2048;
  limits.max_header_bytes = 8 * 1024;
  limits.max_headers = 64;
  limits.max_body = 64 * 1024;  // read and dropped; only so a POST still gets its 405
  limits.max_chunk_extension_bytes = 1024;
  return limits;
}

struct reply {
  unsigned status = 200;
  std::string_view content_type = "text/plain; charset=utf-8";
  std::string body;
  std::string_view static_body;  // used instead of `body` when not empty (the dashboard)
  bool allow_header = false;     // 405: say which methods are allowed
};

// The endpoint's responses carry no Date and no Server, as before it used
// http's encoder: nothing reads them, and its date cache is then never read.
http::encoder_options endpoint_encoder_options() {
  http::encoder_options options;
  options.server = {};
  options.send_date = false;
  return options;
}

// On every response, errors included: the numbers change every request, so a
// proxy must not serve yesterday's; and no content sniffing.
constexpr std::array<http::header_field, 2> endpoint_headers{{
    {"Cache-Control", "no-store"},
    {"X-Content-Type-Options", "nosniff"},
}};

// Serialises `r` with http's response encoder, which frames it (Content-Length,
// no body for HEAD) and decides the connection (`Connection: close` when
// `context` or the client asks for it). The caller reads the verdict from
// `encoder.keep_alive()`.
std::string serialize(const reply& r, http::response_encoder& encoder,
                      const http::request_context& context) {
  const std::string_view body = r.static_body.empty() ? std::string_view{r.body} : r.static_body;
  std::array<http::header_field, endpoint_headers.size() + 3> fields{};
  std::size_t n = 0;
  fields[n++] = {"Content-Type", r.content_type};
  for (const http::header_field& f : endpoint_headers) {
    fields[n++] = f;
  }
  if (r.allow_header) {
    fields[n++] = {"Allow", "GET, HEAD"};
  }
  if (r.content_type.starts_with("text/html")) {
    // The dashboard loads nothing from elsewhere and talks only to /stats.
    fields[n++] = {"Content-Security-Policy",
                   "default-src 'none'; script-src 'unsafe-inline'; "
                   "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:"};
  }
  http::response_head head;
  head.status = r.status;
  head.headers = std::span<const http::header_field>{fields.data(), n};
  head.body_size = body.size();
  std::string out;
  out.reserve(256 + (context.is_head ? 0 : body.size()));
  encoder.start(context);
  // The head is the endpoint's own (fixed names, values without CTLs, a
  // registered status) and the body has the declared length, so a refusal is
  // a broken invariant.
  if (!encoder.write_head(head, out).ok() || !encoder.write_body(body, out).ok() ||
      !encoder.finish({}, out).ok()) {
    server_log::write(server_log::log_level::critical, "stats endpoint",
                      "the response encoder refused a response of the endpoint");
    std::abort();
  }
  return out;
}

std::int64_t unix_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class stats_connection;

}  // namespace

struct stats_endpoint::state {
  state(stats_endpoint& owner_in, stats_process_info info_in, stats_reader reader_in)
      : owner(owner_in), info(std::move(info_in)), reader(std::move(reader_in)) {}

  void do_accept();
  void on_accept(const boost::system::error_code& ec, stream_socket socket);
  // Closes the connection idle longest to make room for a new one; false
  // when every connection is busy writing a response.
  bool evict_idlest();
  void shutdown();
  reply answer(std::string_view path);
  [[nodiscard]] double uptime_s() const;
  // Whether a request with this Host header may be answered (allowed_hosts).
  [[nodiscard]] bool host_allowed(std::optional<std::string_view> host) const;

  stats_endpoint& owner;
  stats_process_info info;
  stats_reader reader;
  std::vector<std::string> allowed_hosts;  // lower case; empty: any Host
  // The connections' encoders hold it; with send_date off they never read it.
  http::date_cache dates;
  // Connections alive, so shutdown() can close them. Endpoint thread only.
  // Declared before `io`: handlers destroyed with the io_context release
  // connections, which leave this set.
  std::unordered_set<stats_connection*> connections;
  asio::io_context io{1};
  std::unique_ptr<net::listener> listener;  // destroyed before `io`
  asio::steady_timer accept_retry{io};      // the back-off after an accept error
  std::thread thread;
  bool closing = false;  // endpoint thread only
  // Uptime runs on the steady clock from the moment the endpoint started,
  // offset by how long the server had already been up then; so it never
  // jumps when the wall clock is set.
  std::chrono::steady_clock::time_point steady_origin = std::chrono::steady_clock::now();
  double uptime_at_origin_s = 0;
};

namespace {

/// One accepted connection. Owned by the handlers in flight (shared_ptr);
/// lives and dies on the endpoint thread.
class stats_connection : public std::enable_shared_from_this<stats_connection> {
 public:
  stats_connection(stats_endpoint::state& owner, stream_socket socket)
      : owner_(owner),
        socket_(std::move(socket)),
        timer_(owner.io),
        parser_(endpoint_limits()),
        encoder_(owner.dates, endpoint_encoder_options()) {
    parser_.set_credit(1);
    owner_.connections.insert(this);
  }
  stats_connection(const stats_connection&) = delete;
  stats_connection& operator=(const stats_connection&) = delete;
  ~stats_connection() { owner_.connections.erase(this); }

  void start() {
    arm_deadline();
    do_read();
  }

  /// Whether it can be closed to make room: not stopped, not writing a response.
  [[nodiscard]] bool evictable() const noexcept { return !stopped_ && !writing_; }
  /// When it last received bytes or finished a response.
  [[nodiscard]] std::chrono::steady_clock::time_point last_active() const noexcept {
    return last_active_;
  }
  [[nodiscard]] bool stopped() const noexcept { return stopped_; }

  /// Closes the socket; the handlers in flight finish with operation_aborted
  /// and drop the last references.
  void stop() noexcept {
    stopped_ = true;
    boost::system::error_code ignored;
    timer_.cancel();
    socket_.shutdown(asio::socket_base::shutdown_both, ignored);
    socket_.close(ignored);
  }

 private:
  void arm_deadline() {
    timer_.expires_after(request_deadline);
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) {
        self->stop();  // a request took too long to arrive: a stuck or slow client
      }
    });
  }

  void do_read() {
    socket_.async_read_some(asio::buffer(chunk_),
                            [self = shared_from_this()](const boost::system::error_code& ec,
                                                        std::size_t n) { self->on_read(ec, n); });
  }

  void on_read(const boost::system::error_code& ec, std::size_t n) {
    if (ec) {
      // End of stream, a reset, or stop(): nothing to answer.
      stop();
      return;
    }
    last_active_ = std::chrono::steady_clock::now();
    pending_.append(chunk_.data(), n);
    process();
  }

  // Feeds the unparsed bytes; answers the request they complete, or reads more.
  void process() {
    const http::feed_result result = parser_.feed(pending_);
    bool complete = false;
    for (const http::parse_event& event : parser_.events()) {
      if (event.kind == http::parse_event_kind::head) {
        method_ = event.head->method();
        path_.assign(event.head->path());
        keep_alive_ = event.head->keep_alive();
        http_minor_ = event.head->version_minor();
        host_allowed_ = owner_.host_allowed(event.head->headers().find("host"));
        have_head_ = true;
      } else if (event.kind == http::parse_event_kind::message_complete) {
        complete = true;
      }
    }
    switch (result.status) {
      case http::feed_status::error: {
        // Answered as the server answers a protocol error (a connection-
        // closing text/plain response), with the endpoint's own headers.
        const http::parse_error& error = parser_.error();
        std::string text{error.reason};
        text += '\n';
        std::string out;
        (void)http::encode_error_response(error.status, text, owner_.dates, out,
                                          endpoint_encoder_options(), endpoint_headers);
        write(std::move(out), true);
        return;
      }
      case http::feed_status::upgraded:
      case http::feed_status::closing:
        // Answer the last request and close; the bytes after it are ignored.
        if (have_head_) {
          respond(true);
        } else {
          stop();
        }
        return;
      case http::feed_status::ok:
      case http::feed_status::paused:
        pending_.erase(0, result.consumed);
        if (complete) {
          respond(false);
        } else {
          do_read();
        }
        return;
    }
  }

  // Answers the request just parsed; `close_after`: close after it even if
  // the client would keep the connection.
  void respond(bool close_after) {
    have_head_ = false;
    const bool head_only = method_ == http::request_method::head;
    reply r;
    if (!host_allowed_) {
      r.status = 421;
      r.body = "misdirected request: this Host is not in stats_allowed_hosts\n";
      close_after = true;
    } else if (method_ != http::request_method::get && !head_only) {
      r.status = 405;
      r.body = "method not allowed: the stats endpoint answers GET\n";
      r.allow_header = true;
    } else {
      r = owner_.answer(path_);
    }
    http::request_context context;
    context.is_head = head_only;
    context.http_minor = http_minor_;
    context.client_keep_alive = keep_alive_;
    context.server_closing = close_after;
    std::string out = serialize(r, encoder_, context);
    write(std::move(out), !encoder_.keep_alive());
  }

  void write(std::string bytes, bool close) {
    writing_ = true;
    out_ = std::move(bytes);
    asio::async_write(
        socket_, asio::buffer(out_),
        [self = shared_from_this(), close](const boost::system::error_code& ec, std::size_t) {
          self->on_write(ec, close);
        });
  }

  void on_write(const boost::system::error_code& ec, bool close) {
    writing_ = false;
    last_active_ = std::chrono::steady_clock::now();
    if (ec || close || owner_.closing) {
      stop();
      return;
    }
    // Keep-alive: a fresh deadline for the next request, which may already
    // be (partly) in `pending_`.
    arm_deadline();
    parser_.add_credit(1);
    if (pending_.empty()) {
      do_read();
    } else {
      process();
    }
  }

  stats_endpoint::state& owner_;
  stream_socket socket_;
  asio::steady_timer timer_;
  http::request_parser parser_;
  http::response_encoder encoder_;
  std::array<char, read_chunk> chunk_{};
  std::string pending_;  // bytes read and not yet consumed by the parser
  std::string out_;      // the response being written
  std::string path_;
  http::request_method method_ = http::request_method::get;
  bool keep_alive_ = false;
  std::uint8_t http_minor_ = 1;
  bool have_head_ = false;
  bool host_allowed_ = true;
  bool writing_ = false;
  bool stopped_ = false;
  std::chrono::steady_clock::time_point last_active_ = std::chrono::steady_clock::now();
};

}  // namespace

void stats_endpoint::state::do_accept() {
  listener->acceptor().async_accept(
      [this](const boost::system::error_code& ec, stream_socket socket) {
        on_accept(ec, std::move(socket));
      });
}

void stats_endpoint::state::on_accept(const boost::system::error_code& ec, stream_socket socket) {
  if (closing || ec == asio::error::operation_aborted) {
    return;
  }
  if (ec && ec != asio::error::connection_aborted) {
    // Out of descriptors or memory: the listener stays readable, so accepting
    // again at once would spin. Wait, then accept again (the error is
    // transient for a listener that stays open).
    accept_retry.expires_after(accept_retry_delay);
    accept_retry.async_wait([this](const boost::system::error_code& wait_ec) {
      if (!wait_ec && !closing) {
        do_accept();
      }
    });
    return;
  }
  if (!ec) {
    // Close-on-exec, as the server's own connections: a process the app
    // starts must not hold a dashboard's connection open.
    (void)::fcntl(socket.native_handle(), F_SETFD, FD_CLOEXEC);
    std::size_t live = 0;
    for (const stats_connection* c : connections) {
      live += c->stopped() ? 0U : 1U;
    }
    // Over the cap, the newest connection wins: a probe that just connected
    // is answered, and the client idle longest (an idle or slow one) goes.
    if (live < max_connections || evict_idlest()) {
      std::make_shared<stats_connection>(*this, std::move(socket))->start();
    } else {
      boost::system::error_code ignored;
      socket.close(ignored);  // every connection is writing a response: refuse this one
    }
  }
  do_accept();
}

bool stats_endpoint::state::evict_idlest() {
  stats_connection* idlest = nullptr;
  for (stats_connection* c : connections) {
    if (c->evictable() && (idlest == nullptr || c->last_active() < idlest->last_active())) {
      idlest = c;
    }
  }
  if (idlest == nullptr) {
    return false;
  }
  idlest->stop();
  return true;
}

void stats_endpoint::state::shutdown() {
  closing = true;
  accept_retry.cancel();
  if (listener) {
    listener->close();
  }
  // stop() makes the connections' handlers finish; copy first because they
  // leave the set as they die.
  std::vector<stats_connection*> open(connections.begin(), connections.end());
  for (stats_connection* c : open) {
    c->stop();
  }
}

double stats_endpoint::state::uptime_s() const {
  const std::chrono::duration<double> since = std::chrono::steady_clock::now() - steady_origin;
  return uptime_at_origin_s + since.count();
}

reply stats_endpoint::state::answer(std::string_view path) {
  reply r;
  if (path == "/healthz") {
    r.body = "ok\n";
    return r;
  }
  if (path == "/") {
    r.content_type = "text/html; charset=utf-8";
    r.static_body = stats_dashboard_html();
    return r;
  }
  if (path != "/stats" && path != "/metrics" && path != "/readyz") {
    r.status = 404;
    r.body = "not found: the stats endpoint serves /, /stats, /metrics, /healthz and /readyz\n";
    return r;
  }
  std::vector<pair_stats_snapshot> pairs;
  try {
    pairs = reader();
  } catch (const std::exception& e) {
    r.status = 500;
    r.body = std::string{"cannot read the pairs' counters: "} + e.what() + "\n";
    return r;
  } catch (...) {
    r.status = 500;
    r.body = "cannot read the pairs' counters\n";
    return r;
  }
  const bool draining = owner.draining();
  const std::uint64_t restarts = owner.restarts();
  if (path == "/stats") {
    r.content_type = "application/json";
    r.body = render_stats_json(pairs, info, unix_ms_now(), uptime_s(), draining);
    // The process-wide restart count, the document's first key (the
    // supervisor's, not any pair's page's).
    if (r.body.starts_with('{')) {
      r.body.insert(1, std::string{"\"restarts\":"}.append(std::to_string(restarts)).append(","));
    }
  } else if (path == "/metrics") {
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = render_prometheus(pairs, info, uptime_s(), draining);
    r.body +=
        "# HELP cadeloop_restarts_total Pairs or serving processes restarted after they died.\n"
        "# TYPE cadeloop_restarts_total counter\ncadeloop_restarts_total ";
    r.body += std::to_string(restarts);
    r.body += '\n';
  } else {
    std::string why;
    if (stats_ready(pairs, draining, why)) {
      r.body = "ready\n";
    } else {
      r.status = 503;
      r.body = "not ready: " + why + "\n";
    }
  }
  return r;
}

bool stats_endpoint::state::host_allowed(std::optional<std::string_view> host) const {
  if (allowed_hosts.empty()) {
    return true;
  }
  if (!host) {
    return false;
  }
  std::string_view name = *host;
  // "[::1]:9100" -> "[::1]", "example.com:9100" -> "example.com".
  if (!name.empty() && name.front() == '[') {
    name = name.substr(0, std::min(name.find(']'), name.size() - 1) + 1);
  } else {
    name = name.substr(0, std::min(name.find(':'), name.size()));
  }
  return std::any_of(allowed_hosts.begin(), allowed_hosts.end(), [name](const std::string& a) {
    return a.size() == name.size() &&
           std::equal(a.begin(), a.end(), name.begin(), [](char x, char y) {
             return x == static_cast<char>(std::tolower(static_cast<unsigned char>(y)));
           });
  });
}

std::unique_ptr<stats_endpoint> stats_endpoint::start(const stats_endpoint_options& options,
                                                      stats_process_info info, stats_reader reader,
                                                      std::string& error) {
  std::unique_ptr<stats_endpoint> endpoint{new stats_endpoint};
  auto s = std::make_unique<state>(*endpoint, std::move(info), std::move(reader));
  for (const std::string& h : options.allowed_hosts) {
    std::string lower = h;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    s->allowed_hosts.push_back(std::move(lower));
  }
  net::listen_spec spec = net::listen_spec::tcp(options.host, options.port, 64);
  spec.reuse_port = false;  // one stats endpoint per port: a second one must fail to bind
  s->listener = net::open_listener(s->io, spec, error);
  if (!s->listener) {
    // "cannot listen on ..." names the address; say which listener it was.
    error = "stats endpoint: " + error;
    return nullptr;
  }
  endpoint->port_ = s->listener->local_address().port;
  endpoint->description_ = s->listener->description();
  s->uptime_at_origin_s =
      s->info.started_unix_ms > 0
          ? static_cast<double>(unix_ms_now() - s->info.started_unix_ms) / 1000.0
          : 0.0;
  if (s->uptime_at_origin_s < 0) {
    s->uptime_at_origin_s = 0;
  }
  s->do_accept();
  state* raw = s.get();
  endpoint->state_ = std::move(s);
  endpoint->state_->thread = std::thread([raw] {
    // A handler that throws (allocation failure) must not take the server
    // down with it: log and keep serving.
    for (;;) {
      try {
        raw->io.run();
        return;
      } catch (const std::exception& e) {
        server_log::write(server_log::log_level::error, "stats endpoint", e.what());
      }
    }
  });
  return endpoint;
}

void stats_endpoint::close() noexcept {
  if (!state_) {
    return;
  }
  state* s = state_.get();
  if (s->thread.joinable()) {
    // shutdown() runs on the endpoint thread, which owns the sockets; once
    // nothing is pending, run() returns and the thread ends.
    asio::post(s->io, [s] { s->shutdown(); });
    s->thread.join();
  }
  // Handlers that never ran still hold connections; destroy them (and the
  // listener) before the io_context, on this thread, now that no other runs.
  s->io.stop();
  state_.reset();
}

stats_endpoint::~stats_endpoint() {
  close();
}

}  // namespace cadeloop::runtime
