#pragma once

#include <cadeloop/runtime/stats/stats_page.hpp>
#include <cadeloop/runtime/stats/stats_render.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cadeloop::runtime {

/// Reads every pair's counters, in pair order. Called on the stats endpoint's
/// thread, once per request that needs counters (/stats, /metrics, /readyz);
/// it must not block for long (reading the shared pages does not). It may
/// throw: the request then gets a 500.
using stats_reader = std::function<std::vector<pair_stats_snapshot>()>;

/// Where the stats endpoint listens. Plain data.
struct stats_endpoint_options {
  /// A numeric address or a name resolved once at start. Loopback by default:
  /// the counters are not for the whole network.
  std::string host = "127.0.0.1";
  /// 0 picks an ephemeral port (see `stats_endpoint::port()`).
  std::uint16_t port = 0;
  /// The Host header values (port ignored, compared without case) a request
  /// may carry; any other gets 421 and a close, so a web page that rebinds a
  /// DNS name to the endpoint's address cannot read it. Empty: any Host.
  std::vector<std::string> allowed_hosts{};
};

/// The stats endpoint: a small native HTTP/1.1 server on its own thread with
/// its own Asio io_context, in the main process. It answers
///
/// - `GET /stats`: JSON, per pair and totals (keys in docs/operations.md);
/// - `GET /metrics`: Prometheus text exposition format 0.0.4;
/// - `GET /healthz`: 200 while the process serves;
/// - `GET /readyz`: 200 while every pair is serving or stuck and at least one
///   serves, 503 once `set_draining()` was called (or while a pair starts,
///   drains or stopped, or every pair is stuck);
/// - `GET /`: the live HTML dashboard (one page, no external resources).
///
/// HEAD is answered like GET without the body; any other method gets 405,
/// any other path 404, a malformed request 400 and a close. Heads are capped
/// at 8 KiB and a request must arrive within 15 s. Connections are capped at
/// 64 at a time, and when a 65th arrives the one idle longest is closed to
/// make room, so idle or slow connections can't starve a probe: the newest
/// connection is always served. Accept errors such as EMFILE are retried
/// after 50 ms, not at once, so the thread never spins.
///
/// Created, closed and destroyed by one owning thread (the main thread);
/// `set_draining()` and `port()` may be called from any thread.
class stats_endpoint {
 public:
  /// Binds `options.host:options.port` and starts serving on a new thread.
  /// On failure returns nullptr and sets `error` to one line for the user,
  /// e.g. "cannot listen on 127.0.0.1:9100: address already in use".
  /// Owning thread.
  [[nodiscard]] static std::unique_ptr<stats_endpoint> start(const stats_endpoint_options& options,
                                                             stats_process_info info,
                                                             stats_reader reader,
                                                             std::string& error);

  stats_endpoint(const stats_endpoint&) = delete;
  stats_endpoint& operator=(const stats_endpoint&) = delete;
  /// Closes (see `close()`). Owning thread.
  ~stats_endpoint();

  /// The bound port (the real one when 0 was asked for). Any thread.
  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }
  /// "127.0.0.1:43211". Any thread.
  [[nodiscard]] const std::string& description() const noexcept { return description_; }

  /// From now on /readyz answers 503, so a load balancer stops sending before
  /// the listeners close. Never undone. Any thread (the main thread calls it
  /// at SIGTERM).
  void set_draining() noexcept { draining_.store(true, std::memory_order_relaxed); }
  /// True once `set_draining()` was called. Any thread.
  [[nodiscard]] bool draining() const noexcept { return draining_.load(std::memory_order_relaxed); }

  /// Counts one restart of a pair or serving process that died (the
  /// supervisor calls it); /stats shows the sum as `restarts` and /metrics
  /// as `cadeloop_restarts_total`. Any thread.
  void count_restart() noexcept { restarts_.fetch_add(1, std::memory_order_relaxed); }
  /// The restarts counted so far. Any thread.
  [[nodiscard]] std::uint64_t restarts() const noexcept {
    return restarts_.load(std::memory_order_relaxed);
  }

  /// Stops accepting, closes every connection and joins the thread; waits
  /// for a reader call in progress to return. Idempotent. Owning thread.
  void close() noexcept;

  struct state;  // the io_context, the acceptor and the connections (the .cpp)

 private:
  stats_endpoint() = default;

  std::unique_ptr<state> state_;
  std::uint16_t port_ = 0;
  std::string description_;
  std::atomic<bool> draining_{false};
  std::atomic<std::uint64_t> restarts_{0};
};

/// The dashboard page served at `/` (runtime/stats/stats_dashboard.html, embedded
/// at build time). Static storage. Any thread.
[[nodiscard]] std::string_view stats_dashboard_html() noexcept;

}  // namespace cadeloop::runtime
