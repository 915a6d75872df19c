#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace cadeloop::net {

/// A relaxed counter with a single writer thread. Any thread (or process,
/// when it lives in shared memory) may read it. Standard layout: one
/// lock-free `std::atomic<std::uint64_t>`, no pointers.
struct single_writer_counter {
  std::atomic<std::uint64_t> value{0};
  /// Adds `n`. The writer thread only (load + store, no locked instruction).
  void add(std::uint64_t n = 1) noexcept {
    value.store(value.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  /// Subtracts `n`. The writer thread only.
  void sub(std::uint64_t n = 1) noexcept {
    value.store(value.load(std::memory_order_relaxed) - n, std::memory_order_relaxed);
  }
  /// Current value. Any thread.
  [[nodiscard]] std::uint64_t get() const noexcept { return value.load(std::memory_order_relaxed); }
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "counters shared between processes must be lock-free");

/// Bucket layout of the latency histograms: log-linear over whole
/// microseconds. Values 0..7 µs have a bucket each; from 8 µs on, every power
/// of two [2^e, 2^(e+1)) is split into 8 equal sub-buckets, up to 2^32 µs
/// (about 71.6 minutes); the last bucket holds everything longer.
///
/// A bucket's width is at most 1/8 of its lower bound, so a value read back as
/// its bucket's upper bound is at most 12.5 % (and, below 8 µs, 1 µs) above
/// the true value, and never below it.
struct latency_buckets {
  static constexpr unsigned sub_bits = 3;
  static constexpr std::uint64_t sub_count = 1u << sub_bits;  ///< sub-buckets per power of two
  static constexpr unsigned max_exponent = 32;                ///< values >= 2^32 µs overflow
  /// Buckets in all: 8 linear + 8 per power of two from 2^3 to 2^31 + 1 overflow.
  static constexpr std::size_t count = sub_count + (max_exponent - sub_bits) * sub_count + 1;

  /// The bucket of a duration of `us` microseconds. Any thread.
  [[nodiscard]] static constexpr std::size_t index_of(std::uint64_t us) noexcept {
    if (us < sub_count) {
      return static_cast<std::size_t>(us);
    }
    const auto e = static_cast<unsigned>(std::bit_width(us) - 1);  // us in [2^e, 2^(e+1)), e >= 3
    if (e >= max_exponent) {
      return count - 1;
    }
    const std::uint64_t sub = (us >> (e - sub_bits)) & (sub_count - 1);
    return static_cast<std::size_t>(sub_count + (e - sub_bits) * sub_count + sub);
  }

  /// The smallest duration (µs) bucket `i` holds. Any thread.
  [[nodiscard]] static constexpr std::uint64_t lower_bound_us(std::size_t i) noexcept {
    if (i < sub_count) {
      return i;
    }
    if (i >= count - 1) {
      return std::uint64_t{1} << max_exponent;
    }
    const std::uint64_t g = (i - sub_count) / sub_count;
    const std::uint64_t s = (i - sub_count) % sub_count;
    return (sub_count + s) << g;
  }

  /// The exclusive upper bound (µs) of bucket `i`: every duration counted in
  /// it is below this (so `le` = this value in Prometheus terms, durations
  /// being truncated to whole µs when recorded). The overflow bucket's bound
  /// is UINT64_MAX (+Inf). Any thread.
  [[nodiscard]] static constexpr std::uint64_t upper_bound_us(std::size_t i) noexcept {
    if (i >= count - 1) {
      return std::numeric_limits<std::uint64_t>::max();
    }
    return lower_bound_us(i + 1);
  }
};

static_assert(latency_buckets::count == 241);
static_assert(latency_buckets::index_of(7) == 7 && latency_buckets::index_of(8) == 8);
static_assert(latency_buckets::upper_bound_us(latency_buckets::count - 2) == std::uint64_t{1}
                                                                                 << 32);
static_assert(latency_buckets::index_of((std::uint64_t{1} << 32) - 1) ==
              latency_buckets::count - 2);
static_assert(latency_buckets::index_of(std::uint64_t{1} << 32) == latency_buckets::count - 1);

/// A latency histogram with a single writer thread (see latency_buckets).
/// `count` and `sum_us` are updated after the bucket, with relaxed stores:
/// a reader on another thread may see them a moment apart from the buckets.
struct latency_histogram {
  std::array<single_writer_counter, latency_buckets::count> buckets;
  single_writer_counter count;   ///< durations recorded
  single_writer_counter sum_us;  ///< their sum in µs

  /// Records one duration. The writer thread only.
  void record(std::uint64_t us) noexcept {
    buckets[latency_buckets::index_of(us)].add();
    count.add();
    sum_us.add(us);
  }
};

/// Per-pair I/O-side counters of net::http_server. Written only by the I/O
/// thread (relaxed stores); any thread (or, inside a shared stats page, any
/// process) may read them with relaxed loads. Standard layout, lock-free
/// atomics only, no pointers: it may live in shared memory
/// (runtime::pair_stats_page holds one).
struct alignas(64) server_counters {
  using counter = single_writer_counter;

  counter connections_accepted;  ///< connections accepted since start
  counter connections_open;      ///< connections in the table now (including lingering ones)
  counter requests;              ///< request heads handed to the app
  counter responses;             ///< responses the app finished
  counter requests_in_flight;    ///< heads handed over whose response has not finished
  counter bytes_in;              ///< bytes read from clients
  counter bytes_out;             ///< bytes written to clients
  counter unsent_bytes;          ///< response bytes held, not yet written (all connections)
  counter protocol_errors;  ///< requests refused by the parser (4xx/5xx written by the I/O thread)
  counter timeouts;         ///< 408 answers and idle closes
  counter stale_messages;   ///< app messages for a connection or request that is gone
  counter accept_pauses;    ///< times accepting stopped because a budget was spent
  counter write_calls;      ///< write system calls
  counter access_log_dropped;  ///< access-log lines dropped because the log's queue was full
  /// Final responses by status class, [0] = 1xx ... [4] = 5xx: the app's
  /// (status carried by its first send) and the I/O thread's own error answers.
  std::array<counter, 5> responses_by_class;

  // WebSockets (RFC 6455). Messages and bytes are payloads: after
  // decompression coming in, before compression going out.
  counter ws_open;                   ///< accepted WebSockets open now (gauge)
  counter ws_upgrades_accepted;      ///< upgrades the app accepted (101 written)
  counter ws_upgrades_rejected;      ///< bad handshakes answered 400/426 by the I/O thread
  counter ws_upgrades_not_accepted;  ///< valid upgrades the app denied (or the client left first)
  counter ws_messages_in;            ///< whole messages handed to the app
  counter ws_messages_out;           ///< messages the app sent
  counter ws_bytes_in;               ///< payload bytes of the messages handed to the app
  counter ws_bytes_out;              ///< payload bytes of the messages the app sent
  /// Ends of accepted WebSockets by the code on_ws_close reported:
  /// [0] normal (1000, 1001), [1] protocol (1002, 1007, 1009), [2] dropped
  /// (1006: no close handshake), [3] any other code (1005, 1011, 1012, 3000+...).
  std::array<counter, 4> ws_closes_by_class;
  /// From the moment a request head is handed to the app to the moment its
  /// whole response is queued for the socket (app responses only).
  alignas(64) latency_histogram latency;

  // Slow and hostile clients (server_timeouts.cpp, server_budget.cpp).
  counter body_timeouts;    ///< bodies cut by body_timeout or body_min_rate (also in timeouts)
  counter write_timeouts;   ///< connections closed by write_timeout (also in timeouts)
  counter budget_refusals;  ///< requests answered 503 because the pair was over memory_budget
  counter budget_cuts;      ///< slowest connections cut to keep the pair within its budgets
  // TLS (server_tls.cpp).
  counter tls_handshakes;  ///< handshakes completed
  counter tls_resumed;     ///< of those, sessions resumed (ticket or cache)
  /// Handshakes completed by version: [0] TLS 1.2, [1] TLS 1.3.
  std::array<counter, 2> tls_versions;
  /// Handshakes that failed, by reason class: [0] protocol (no shared
  /// version or cipher, bad records, alerts), [1] client certificate
  /// refused or missing, [2] timed out, [3] plain HTTP sent to the TLS port,
  /// [4] closed by the client or too many handshake bytes.
  std::array<counter, 5> tls_failures;

  /// Counts one final response of `status` in its class (others are ignored).
  /// The writer thread only.
  void count_status(unsigned status) noexcept {
    if (status >= 100 && status < 600) {
      responses_by_class[status / 100 - 1].add();
    }
  }

  /// Counts the end of an accepted WebSocket in its class (see
  /// ws_closes_by_class). The writer thread only.
  void count_ws_close(unsigned code) noexcept {
    std::size_t k = 3;
    if (code == 1000 || code == 1001) {
      k = 0;
    } else if (code == 1002 || code == 1007 || code == 1009) {
      k = 1;
    } else if (code == 1006) {
      k = 2;
    }
    ws_closes_by_class[k].add();
  }
};

}  // namespace cadeloop::net
