#pragma once

// Per-pair statistics in memory that other threads and processes can read
// without locks or messages.
//
// Each core pair writes its counters into one `pair_stats_page`. The page is
// made of lock-free atomics only (no pointers), grouped by the one thread that
// writes them on their own cache lines, so it can sit in a MAP_SHARED region
// (`stats_region`) that a main process created before forking workers, or
// that several sub-interpreters of one process share. Readers take a
// `pair_stats_snapshot` (plain numbers) with relaxed loads: every counter is
// exact on its own, counters are not mutually consistent to the instant.

#include <cadeloop/net/server_counters.hpp>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

namespace cadeloop::runtime {

/// Where a pair is in its life, as written into its page.
enum class pair_state : std::uint32_t {
  unused = 0,    ///< the page belongs to no pair (yet)
  starting = 1,  ///< the pair is built; its I/O thread has not started serving
  serving = 2,   ///< the I/O thread is serving
  draining = 3,  ///< a graceful stop began: listener closed, in-flight requests finishing
  stopped = 4,   ///< the I/O thread ended
  stuck = 5,     ///< serving, but the app thread made no progress for `stuck_timeout` while it
                 ///< had work: the listener is paused until it progresses again (the watchdog)
};

/// "unused", "starting", "serving", "draining", "stopped", "stuck" (or "unknown"). Any thread.
[[nodiscard]] std::string_view state_name(pair_state s) noexcept;

/// The I/O thread's loop counters (besides the HTTP server's). Written only by the I/O thread
/// (the HTTP server's, in `io`, by whichever thread serves the sockets: see pair_channels::owner).
struct alignas(64) io_loop_counters {
  using counter = net::single_writer_counter;
  counter passes;             ///< passes of the I/O loop
  counter parks;              ///< times the I/O thread slept
  counter spins;              ///< times it busy-waited for app messages before parking
  counter spin_hits;          ///< spins that ended because a message arrived (no park)
  counter inbound_published;  ///< items published on the inbound ring (ring depth: minus
                              ///< app.inbound_taken)
  counter outbound_taken;     ///< items taken from the outbound ring
  counter wakeups_to_app;     ///< eventfd writes that woke the app thread
  counter solo_handoffs;      ///< times it gave the sockets to the app thread (solo mode)
  counter solo_steals;        ///< times it took them back from an app thread busy in Python
};

/// The app thread's counters. Written only by the app thread.
struct alignas(64) app_counters {
  using counter = net::single_writer_counter;
  counter outbound_staged;     ///< messages the app staged (send, consumed, close, ...)
  counter outbound_published;  ///< items published on the outbound ring (depth: minus
                               ///< io_loop.outbound_taken)
  counter inbound_taken;       ///< items taken from the inbound ring
  counter parks;               ///< times the app thread slept
  counter wakeups_to_io;       ///< eventfd writes by the app that woke the I/O thread
  counter loop_ticks;          ///< passes of the app's loop (one flush() each)
  counter app_errors;          ///< app exceptions and malformed messages (reported by the app side)
  counter concurrency_refusals;  ///< requests and websockets refused with 503 by limit_concurrency
  counter solo_passes;           ///< I/O passes the app thread ran itself (solo mode)
};

/// The watchdog's beats. `app_busy` is written by the app thread (1 while it
/// runs, 0 while it sleeps); the rest by the I/O thread, whose watchdog timer
/// compares the app's progress (`app.loop_ticks`) between beats. Times are
/// CLOCK_MONOTONIC milliseconds (steady_clock; the same clock in every process,
/// so a supervising process can tell how old a beat is).
struct alignas(64) watchdog_beats {
  using counter = net::single_writer_counter;
  std::atomic<std::uint32_t> app_busy{0};    ///< app thread: 1 unless it sleeps in its parker
  std::atomic<std::uint64_t> io_beat_ms{0};  ///< I/O thread: its last watchdog beat (0: none yet)
  std::atomic<std::uint64_t> stuck_since_ms{
      0};                  ///< I/O thread: when it marked the pair stuck (0: not)
  counter stuck_episodes;  ///< I/O thread: times the pair was marked stuck
};

/// The identity of a page. `magic` is stored last (release) when a page is
/// set up, so a reader that sees it (acquire) sees the rest.
struct alignas(64) page_header {
  std::atomic<std::uint32_t> magic{0};
  std::atomic<std::uint32_t> version{0};
  std::atomic<std::uint32_t> page_size{0};  ///< sizeof(pair_stats_page) of the writer
  std::atomic<std::uint32_t> index{0};      ///< the pair's index (page i of a region is pair i)
  std::atomic<std::int32_t> pid{0};         ///< the process the pair runs in (0: unused page)
  std::atomic<std::uint32_t> state{0};      ///< a pair_state
  std::atomic<std::uint64_t> started_unix_ms{0};  ///< when the pair was placed on the page
};

/// One core pair's counters. Standard layout, lock-free atomics only, no
/// pointers; each group is written by one thread:
///   header   the control thread that builds the pair (then `state` by the I/O thread)
///   io       the I/O thread (HTTP server counters and the latency histogram)
///   io_loop  the I/O thread
///   app      the app thread
///   watchdog the I/O thread (and `app_busy` by the app thread)
/// Any thread of any process that maps the page may read it (`snapshot`).
/// A page is owned by whoever made it (a `stats_region`, or a `core_pair`
/// for its private page) and must outlive the pair placed on it.
struct pair_stats_page {
  static constexpr std::uint32_t magic_value = 0x53'50'44'43;  // "CDPS"
  static constexpr std::uint32_t layout_version = 3;

  page_header header;
  net::server_counters io;
  io_loop_counters io_loop;
  app_counters app;
  watchdog_beats watchdog;

  /// Marks the page as page `index` with no pair on it (state unused). Any
  /// thread, before any pair uses the page.
  void init(std::uint32_t index) noexcept;
  /// Zeroes every counter and marks the page as used by a pair of this
  /// process, started now (state starting). The control thread that builds
  /// the pair, while no thread writes the page (a reader may watch: it sees
  /// the header invalid while the counters are cleared).
  void claim() noexcept;
  /// Sets the state. The thread that owns the pair's stage of life (control
  /// thread before start, then the I/O thread).
  void set_state(pair_state s) noexcept {
    header.state.store(static_cast<std::uint32_t>(s), std::memory_order_release);
  }
  /// Whether the header names this layout (acquire). Any thread.
  [[nodiscard]] bool valid() const noexcept;
};

static_assert(std::is_standard_layout_v<pair_stats_page>,
              "a stats page must be shareable between processes");
static_assert(std::atomic<std::uint32_t>::is_always_lock_free &&
              std::atomic<std::int32_t>::is_always_lock_free);

/// A plain copy of one page (or of several, merged). Any thread may make and
/// use it; the endpoint formats JSON and Prometheus text from it.
struct pair_stats_snapshot {
  static constexpr std::size_t latency_bucket_count = net::latency_buckets::count;

  bool valid = false;  ///< the page had a valid header (else every field is 0)
  std::uint32_t index = 0;
  std::int32_t pid = 0;
  pair_state state = pair_state::unused;
  std::uint64_t started_unix_ms = 0;

  // I/O thread.
  std::uint64_t requests = 0;   ///< heads handed to the app
  std::uint64_t responses = 0;  ///< responses the app finished
  std::uint64_t responses_1xx =
      0;  ///< final responses by class: the app's and the I/O thread's own error answers
  std::uint64_t responses_2xx = 0;
  std::uint64_t responses_3xx = 0;
  std::uint64_t responses_4xx = 0;
  std::uint64_t responses_5xx = 0;
  std::uint64_t bytes_in = 0;
  std::uint64_t bytes_out = 0;
  std::uint64_t unsent_bytes = 0;  ///< response bytes held by the I/O thread
  std::uint64_t connections_open = 0;
  std::uint64_t connections_accepted = 0;
  std::uint64_t requests_in_flight = 0;
  std::uint64_t protocol_errors = 0;
  std::uint64_t timeouts = 0;
  std::uint64_t stale_messages = 0;  ///< app messages for a gone connection/request, dropped
  std::uint64_t accept_pauses = 0;
  std::uint64_t write_calls = 0;
  std::uint64_t access_log_dropped = 0;
  std::uint64_t body_timeouts = 0;    ///< request bodies cut by body_timeout / body_min_rate
  std::uint64_t write_timeouts = 0;   ///< connections closed by write_timeout
  std::uint64_t budget_refusals = 0;  ///< requests answered 503 over memory_budget
  std::uint64_t budget_cuts = 0;      ///< slowest connections cut to stay within a budget
  // WebSockets (I/O thread): payload messages and bytes, closes by class.
  std::uint64_t ws_open = 0;               ///< accepted WebSockets open now
  std::uint64_t ws_upgrades_accepted = 0;  ///< upgrades the app accepted (101)
  std::uint64_t ws_upgrades_rejected = 0;  ///< bad handshakes answered 400/426
  std::uint64_t ws_upgrades_denied =
      0;  ///< valid upgrades the app denied (or the client left first)
  std::uint64_t ws_messages_in = 0;
  std::uint64_t ws_messages_out = 0;
  std::uint64_t ws_bytes_in = 0;
  std::uint64_t ws_bytes_out = 0;
  std::uint64_t ws_closes_normal = 0;    ///< 1000, 1001
  std::uint64_t ws_closes_protocol = 0;  ///< 1002, 1007, 1009
  std::uint64_t ws_closes_dropped = 0;   ///< 1006
  std::uint64_t ws_closes_other = 0;     ///< 1005, 1011, 1012, 3000+, ...
  // TLS (I/O thread): handshakes done, resumed, by version; failed by reason class.
  std::uint64_t tls_handshakes = 0;
  std::uint64_t tls_resumed = 0;
  std::uint64_t tls_v12 = 0;
  std::uint64_t tls_v13 = 0;
  std::uint64_t tls_fail_protocol = 0;     ///< no shared version/cipher, bad records, alerts
  std::uint64_t tls_fail_client_cert = 0;  ///< client certificate missing or refused
  std::uint64_t tls_fail_timeout = 0;      ///< handshake not done within request_line_timeout
  std::uint64_t tls_fail_plain_http = 0;   ///< plain HTTP sent to the TLS port (answered 400)
  std::uint64_t tls_fail_closed = 0;       ///< client gone mid-handshake, or too many bytes
  std::uint64_t io_passes = 0;
  std::uint64_t io_parks = 0;
  std::uint64_t spins = 0;
  std::uint64_t spin_hits = 0;
  std::uint64_t inbound_messages = 0;  ///< items ever published on the inbound ring
  std::uint64_t inbound_depth = 0;     ///< published by the I/O thread, not yet taken by the app
  std::uint64_t wakeups_to_app = 0;
  std::uint64_t solo_handoffs = 0;  ///< times the I/O thread gave the sockets to the app thread
  std::uint64_t solo_steals = 0;    ///< times it took them back from a busy app thread

  // App thread.
  std::uint64_t outbound_messages = 0;  ///< messages the app staged
  std::uint64_t outbound_depth = 0;     ///< published by the app, not yet taken by the I/O thread
  std::uint64_t wakeups_to_io = 0;
  std::uint64_t app_parks = 0;
  std::uint64_t loop_ticks = 0;
  std::uint64_t app_errors = 0;
  std::uint64_t concurrency_refusals = 0;  ///< 503s of limit_concurrency
  std::uint64_t solo_passes = 0;           ///< I/O passes the app thread ran itself

  // Watchdog.
  std::uint64_t stuck_episodes = 0;  ///< times the pair was marked stuck
  std::uint64_t io_beat_ms = 0;      ///< the I/O thread's last beat (CLOCK_MONOTONIC ms; 0: none)
  std::uint64_t stuck_since_ms =
      0;  ///< when it was marked stuck (CLOCK_MONOTONIC ms; 0: not stuck)

  // Latency (I/O thread): head handed to the app -> response queued whole.
  std::uint64_t latency_count = 0;
  std::uint64_t latency_sum_us = 0;
  std::array<std::uint64_t, latency_bucket_count> latency_buckets{};

  /// Exclusive upper bound in µs of bucket `i` (UINT64_MAX for the last,
  /// +Inf); see net::latency_buckets. Any thread.
  [[nodiscard]] static constexpr std::uint64_t bucket_upper_us(std::size_t i) noexcept {
    return net::latency_buckets::upper_bound_us(i);
  }
};

/// Copies a page with relaxed loads (acquire on the header). A page whose
/// header is not valid gives a snapshot with `valid == false`. Any thread.
[[nodiscard]] pair_stats_snapshot snapshot(const pair_stats_page& page) noexcept;

/// Adds `b`'s counters and histogram into `total` (the totals of several
/// pairs). Invalid snapshots are skipped. Identity of the total: index =
/// UINT32_MAX, pid = 0, started_unix_ms = the earliest, state = draining if
/// any pair drains, else starting if any starts, else stuck if any is stuck,
/// else serving if any serves, else stopped (or unused); io_beat_ms and
/// stuck_since_ms are 0. Any thread.
void merge(pair_stats_snapshot& total, const pair_stats_snapshot& b) noexcept;
/// The totals of `pairs` (see merge). Any thread.
[[nodiscard]] pair_stats_snapshot merge(std::span<const pair_stats_snapshot> pairs) noexcept;

/// The `q` quantile (0 < q <= 1, e.g. 0.5, 0.9, 0.99, 0.999) of the latency
/// histogram in µs: the upper bound of the bucket holding the ceil(q*n)-th
/// smallest duration. Error bound: never below the true quantile (of the
/// recorded, µs-truncated durations), and above it by at most 1/8 of it
/// (12.5 %), or 1 µs below 8 µs. 0 when nothing was recorded; durations in
/// the overflow bucket (>= 2^32 µs) read as 2^32 µs. Any thread.
[[nodiscard]] double latency_percentile_us(const pair_stats_snapshot& s, double q) noexcept;

/// Percentiles every report shows.
struct latency_percentiles {
  double p50_us = 0;
  double p90_us = 0;
  double p99_us = 0;
  double p999_us = 0;
};
/// p50, p90, p99 and p99.9 of `s` (see latency_percentile_us). Any thread.
[[nodiscard]] latency_percentiles percentiles(const pair_stats_snapshot& s) noexcept;

/// N pages in one `mmap(MAP_SHARED | MAP_ANONYMOUS)` region. Create it in the
/// main process before forking workers: every child sees the same pages, so
/// page i written by pair i (in whichever process or interpreter) is read by
/// the main process directly. Page i starts as `init(i)` (unused).
///
/// Made and destroyed by one thread of the main process (destroy it only
/// after every pair placed on it has ended: its threads joined, or its worker
/// process gone; a forked child inherits the mapping and need not unmap it).
/// `page(i)` is safe to call from any thread; what each page allows is in
/// `pair_stats_page`.
class stats_region {
 public:
  /// Maps `pages` pages (at least 1). Throws std::system_error when mmap
  /// fails, std::invalid_argument for 0 pages.
  explicit stats_region(std::size_t pages);
  stats_region(const stats_region&) = delete;
  stats_region& operator=(const stats_region&) = delete;
  /// Unmaps the region (this process's view).
  ~stats_region();

  /// Number of pages. Any thread.
  [[nodiscard]] std::size_t size() const noexcept { return pages_; }
  /// Page `i` (< size(), else std::out_of_range). Any thread.
  [[nodiscard]] pair_stats_page& page(std::size_t i);
  [[nodiscard]] const pair_stats_page& page(std::size_t i) const;
  /// Snapshots of every page, in index order. Any thread.
  [[nodiscard]] std::vector<pair_stats_snapshot> snapshot_all() const;

 private:
  void* base_ = nullptr;
  std::size_t pages_ = 0;
  std::size_t bytes_ = 0;
};

}  // namespace cadeloop::runtime
