// The per-pair stats page: claiming and zeroing a page, snapshots (relaxed
// loads of every counter), merging snapshots into totals, latency
// percentiles from the histogram, and `stats_region`, the MAP_SHARED mapping
// of pages that outlives a fork.
#include "cadeloop/runtime/stats/stats_page.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <system_error>

namespace cadeloop::runtime {

namespace {

constexpr std::uint32_t page_size_value = static_cast<std::uint32_t>(sizeof(pair_stats_page));

void zero(net::single_writer_counter& c) noexcept {
  c.value.store(0, std::memory_order_relaxed);
}

void zero(net::server_counters& c) noexcept {
  for (auto* x :
       {&c.connections_accepted, &c.connections_open, &c.requests, &c.responses,
        &c.requests_in_flight, &c.bytes_in, &c.bytes_out, &c.unsent_bytes, &c.protocol_errors,
        &c.timeouts, &c.stale_messages, &c.accept_pauses, &c.write_calls, &c.access_log_dropped,
        &c.body_timeouts, &c.write_timeouts, &c.budget_refusals, &c.budget_cuts}) {
    zero(*x);
  }
  for (auto* x :
       {&c.ws_open, &c.ws_upgrades_accepted, &c.ws_upgrades_rejected, &c.ws_upgrades_not_accepted,
        &c.ws_messages_in, &c.ws_messages_out, &c.ws_bytes_in, &c.ws_bytes_out}) {
    zero(*x);
  }
  for (auto& x : c.ws_closes_by_class) {
    zero(x);
  }
  zero(c.tls_handshakes);
  zero(c.tls_resumed);
  for (auto& x : c.tls_versions) {
    zero(x);
  }
  for (auto& x : c.tls_failures) {
    zero(x);
  }
  for (auto& x : c.responses_by_class) {
    zero(x);
  }
  for (auto& x : c.latency.buckets) {
    zero(x);
  }
  zero(c.latency.count);
  zero(c.latency.sum_us);
}

void zero(io_loop_counters& c) noexcept {
  for (auto* x : {&c.passes, &c.parks, &c.spins, &c.spin_hits, &c.inbound_published,
                  &c.outbound_taken, &c.wakeups_to_app, &c.solo_handoffs, &c.solo_steals}) {
    zero(*x);
  }
}

void zero(app_counters& c) noexcept {
  for (auto* x :
       {&c.outbound_staged, &c.outbound_published, &c.inbound_taken, &c.parks, &c.wakeups_to_io,
        &c.loop_ticks, &c.app_errors, &c.concurrency_refusals, &c.solo_passes}) {
    zero(*x);
  }
}

// Published minus taken, read taken first: `published` only grows and is
// never behind `taken`, so the later load of it cannot be smaller (the clamp
// guards against the loads being reordered all the same).
std::uint64_t depth(const net::single_writer_counter& published,
                    const net::single_writer_counter& taken) noexcept {
  const std::uint64_t t = taken.get();
  const std::uint64_t p = published.get();
  return p > t ? p - t : 0;
}

std::uint64_t now_unix_ms() noexcept {
  const auto since = std::chrono::system_clock::now().time_since_epoch();
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(since).count());
}

void zero(watchdog_beats& w) noexcept {
  w.app_busy.store(0, std::memory_order_relaxed);
  w.io_beat_ms.store(0, std::memory_order_relaxed);
  w.stuck_since_ms.store(0, std::memory_order_relaxed);
  zero(w.stuck_episodes);
}

int state_rank(pair_state s) noexcept {
  switch (s) {
    case pair_state::draining:
      return 5;
    case pair_state::starting:
      return 4;
    case pair_state::stuck:
      return 3;
    case pair_state::serving:
      return 2;
    case pair_state::stopped:
      return 1;
    case pair_state::unused:
      break;
  }
  return 0;
}

}  // namespace

std::string_view state_name(pair_state s) noexcept {
  switch (s) {
    case pair_state::unused:
      return "unused";
    case pair_state::starting:
      return "starting";
    case pair_state::serving:
      return "serving";
    case pair_state::draining:
      return "draining";
    case pair_state::stopped:
      return "stopped";
    case pair_state::stuck:
      return "stuck";
  }
  return "unknown";
}

// ---------------------------------------------------------------- page

void pair_stats_page::init(std::uint32_t index) noexcept {
  header.magic.store(0, std::memory_order_relaxed);
  header.version.store(layout_version, std::memory_order_relaxed);
  header.page_size.store(page_size_value, std::memory_order_relaxed);
  header.index.store(index, std::memory_order_relaxed);
  header.pid.store(0, std::memory_order_relaxed);
  header.state.store(static_cast<std::uint32_t>(pair_state::unused), std::memory_order_relaxed);
  header.started_unix_ms.store(0, std::memory_order_relaxed);
  zero(io);
  zero(io_loop);
  zero(app);
  zero(watchdog);
  header.magic.store(magic_value, std::memory_order_release);
}

void pair_stats_page::claim() noexcept {
  // Invalid while the counters go back to zero, so a reader never mixes the
  // previous pair's counters with this one's identity.
  header.magic.store(0, std::memory_order_release);
  zero(io);
  zero(io_loop);
  zero(app);
  zero(watchdog);
  // The app thread is busy until it first sleeps: a pair whose app blocks
  // before its loop ever parked is still watched.
  watchdog.app_busy.store(1, std::memory_order_relaxed);
  header.version.store(layout_version, std::memory_order_relaxed);
  header.page_size.store(page_size_value, std::memory_order_relaxed);
  header.pid.store(static_cast<std::int32_t>(::getpid()), std::memory_order_relaxed);
  header.started_unix_ms.store(now_unix_ms(), std::memory_order_relaxed);
  header.state.store(static_cast<std::uint32_t>(pair_state::starting), std::memory_order_relaxed);
  header.magic.store(magic_value, std::memory_order_release);
}

bool pair_stats_page::valid() const noexcept {
  return header.magic.load(std::memory_order_acquire) == magic_value &&
         header.version.load(std::memory_order_relaxed) == layout_version &&
         header.page_size.load(std::memory_order_relaxed) == page_size_value;
}

// ---------------------------------------------------------------- snapshots

pair_stats_snapshot snapshot(const pair_stats_page& page) noexcept {
  pair_stats_snapshot s;
  if (!page.valid()) {
    return s;
  }
  s.valid = true;
  const page_header& h = page.header;
  s.index = h.index.load(std::memory_order_relaxed);
  s.pid = h.pid.load(std::memory_order_relaxed);
  s.state = static_cast<pair_state>(h.state.load(std::memory_order_acquire));
  s.started_unix_ms = h.started_unix_ms.load(std::memory_order_relaxed);

  const net::server_counters& c = page.io;
  s.requests = c.requests.get();
  s.responses = c.responses.get();
  s.responses_1xx = c.responses_by_class[0].get();
  s.responses_2xx = c.responses_by_class[1].get();
  s.responses_3xx = c.responses_by_class[2].get();
  s.responses_4xx = c.responses_by_class[3].get();
  s.responses_5xx = c.responses_by_class[4].get();
  s.bytes_in = c.bytes_in.get();
  s.bytes_out = c.bytes_out.get();
  s.unsent_bytes = c.unsent_bytes.get();
  s.connections_open = c.connections_open.get();
  s.connections_accepted = c.connections_accepted.get();
  s.requests_in_flight = c.requests_in_flight.get();
  s.protocol_errors = c.protocol_errors.get();
  s.timeouts = c.timeouts.get();
  s.stale_messages = c.stale_messages.get();
  s.accept_pauses = c.accept_pauses.get();
  s.write_calls = c.write_calls.get();
  s.access_log_dropped = c.access_log_dropped.get();
  s.body_timeouts = c.body_timeouts.get();
  s.write_timeouts = c.write_timeouts.get();
  s.budget_refusals = c.budget_refusals.get();
  s.budget_cuts = c.budget_cuts.get();
  s.ws_open = c.ws_open.get();
  s.ws_upgrades_accepted = c.ws_upgrades_accepted.get();
  s.ws_upgrades_rejected = c.ws_upgrades_rejected.get();
  s.ws_upgrades_denied = c.ws_upgrades_not_accepted.get();
  s.ws_messages_in = c.ws_messages_in.get();
  s.ws_messages_out = c.ws_messages_out.get();
  s.ws_bytes_in = c.ws_bytes_in.get();
  s.ws_bytes_out = c.ws_bytes_out.get();
  s.ws_closes_normal = c.ws_closes_by_class[0].get();
  s.ws_closes_protocol = c.ws_closes_by_class[1].get();
  s.ws_closes_dropped = c.ws_closes_by_class[2].get();
  s.ws_closes_other = c.ws_closes_by_class[3].get();
  s.tls_handshakes = c.tls_handshakes.get();
  s.tls_resumed = c.tls_resumed.get();
  s.tls_v12 = c.tls_versions[0].get();
  s.tls_v13 = c.tls_versions[1].get();
  s.tls_fail_protocol = c.tls_failures[0].get();
  s.tls_fail_client_cert = c.tls_failures[1].get();
  s.tls_fail_timeout = c.tls_failures[2].get();
  s.tls_fail_plain_http = c.tls_failures[3].get();
  s.tls_fail_closed = c.tls_failures[4].get();

  const io_loop_counters& l = page.io_loop;
  const app_counters& a = page.app;
  s.io_passes = l.passes.get();
  s.io_parks = l.parks.get();
  s.spins = l.spins.get();
  s.spin_hits = l.spin_hits.get();
  s.inbound_messages = l.inbound_published.get();
  s.inbound_depth = depth(l.inbound_published, a.inbound_taken);
  s.wakeups_to_app = l.wakeups_to_app.get();
  s.solo_handoffs = l.solo_handoffs.get();
  s.solo_steals = l.solo_steals.get();
  s.solo_passes = a.solo_passes.get();

  s.outbound_messages = a.outbound_staged.get();
  s.outbound_depth = depth(a.outbound_published, l.outbound_taken);
  s.wakeups_to_io = a.wakeups_to_io.get();
  s.app_parks = a.parks.get();
  s.loop_ticks = a.loop_ticks.get();
  s.app_errors = a.app_errors.get();
  s.concurrency_refusals = a.concurrency_refusals.get();

  const watchdog_beats& w = page.watchdog;
  s.stuck_episodes = w.stuck_episodes.get();
  s.io_beat_ms = w.io_beat_ms.load(std::memory_order_relaxed);
  s.stuck_since_ms = w.stuck_since_ms.load(std::memory_order_relaxed);

  s.latency_count = c.latency.count.get();
  s.latency_sum_us = c.latency.sum_us.get();
  for (std::size_t i = 0; i < s.latency_buckets.size(); ++i) {
    s.latency_buckets[i] = c.latency.buckets[i].get();
  }
  return s;
}

void merge(pair_stats_snapshot& total, const pair_stats_snapshot& b) noexcept {
  if (!b.valid) {
    return;
  }
  if (!total.valid) {
    total.valid = true;
    total.started_unix_ms = b.started_unix_ms;
    total.state = b.state;
  } else {
    if (b.started_unix_ms != 0 &&
        (total.started_unix_ms == 0 || b.started_unix_ms < total.started_unix_ms)) {
      total.started_unix_ms = b.started_unix_ms;
    }
    if (state_rank(b.state) > state_rank(total.state)) {
      total.state = b.state;
    }
  }
  total.index = std::numeric_limits<std::uint32_t>::max();
  total.pid = 0;
  for (auto field :
       {&pair_stats_snapshot::requests,           &pair_stats_snapshot::responses,
        &pair_stats_snapshot::responses_1xx,      &pair_stats_snapshot::responses_2xx,
        &pair_stats_snapshot::responses_3xx,      &pair_stats_snapshot::responses_4xx,
        &pair_stats_snapshot::responses_5xx,      &pair_stats_snapshot::bytes_in,
        &pair_stats_snapshot::bytes_out,          &pair_stats_snapshot::unsent_bytes,
        &pair_stats_snapshot::connections_open,   &pair_stats_snapshot::connections_accepted,
        &pair_stats_snapshot::requests_in_flight, &pair_stats_snapshot::protocol_errors,
        &pair_stats_snapshot::timeouts,           &pair_stats_snapshot::stale_messages,
        &pair_stats_snapshot::accept_pauses,      &pair_stats_snapshot::write_calls,
        &pair_stats_snapshot::access_log_dropped, &pair_stats_snapshot::io_passes,
        &pair_stats_snapshot::io_parks,           &pair_stats_snapshot::spins,
        &pair_stats_snapshot::spin_hits,          &pair_stats_snapshot::inbound_messages,
        &pair_stats_snapshot::inbound_depth,      &pair_stats_snapshot::wakeups_to_app,
        &pair_stats_snapshot::outbound_messages,  &pair_stats_snapshot::outbound_depth,
        &pair_stats_snapshot::wakeups_to_io,      &pair_stats_snapshot::app_parks,
        &pair_stats_snapshot::loop_ticks,         &pair_stats_snapshot::app_errors,
        &pair_stats_snapshot::latency_count,      &pair_stats_snapshot::latency_sum_us,
        &pair_stats_snapshot::body_timeouts,      &pair_stats_snapshot::write_timeouts,
        &pair_stats_snapshot::budget_refusals,    &pair_stats_snapshot::budget_cuts}) {
    total.*field += b.*field;
  }
  for (auto field :
       {&pair_stats_snapshot::ws_open, &pair_stats_snapshot::ws_upgrades_accepted,
        &pair_stats_snapshot::ws_upgrades_rejected, &pair_stats_snapshot::ws_upgrades_denied,
        &pair_stats_snapshot::ws_messages_in, &pair_stats_snapshot::ws_messages_out,
        &pair_stats_snapshot::ws_bytes_in, &pair_stats_snapshot::ws_bytes_out,
        &pair_stats_snapshot::ws_closes_normal, &pair_stats_snapshot::ws_closes_protocol,
        &pair_stats_snapshot::ws_closes_dropped, &pair_stats_snapshot::ws_closes_other,
        &pair_stats_snapshot::stuck_episodes, &pair_stats_snapshot::concurrency_refusals,
        &pair_stats_snapshot::solo_handoffs, &pair_stats_snapshot::solo_steals,
        &pair_stats_snapshot::solo_passes}) {
    total.*field += b.*field;
  }
  for (auto field :
       {&pair_stats_snapshot::tls_handshakes, &pair_stats_snapshot::tls_resumed,
        &pair_stats_snapshot::tls_v12, &pair_stats_snapshot::tls_v13,
        &pair_stats_snapshot::tls_fail_protocol, &pair_stats_snapshot::tls_fail_client_cert,
        &pair_stats_snapshot::tls_fail_timeout, &pair_stats_snapshot::tls_fail_plain_http,
        &pair_stats_snapshot::tls_fail_closed}) {
    total.*field += b.*field;
  }
  for (std::size_t i = 0; i < total.latency_buckets.size(); ++i) {
    total.latency_buckets[i] += b.latency_buckets[i];
  }
}

pair_stats_snapshot merge(std::span<const pair_stats_snapshot> pairs) noexcept {
  pair_stats_snapshot total;
  for (const pair_stats_snapshot& p : pairs) {
    merge(total, p);
  }
  if (total.valid) {
    total.index = std::numeric_limits<std::uint32_t>::max();
  }
  return total;
}

double latency_percentile_us(const pair_stats_snapshot& s, double q) noexcept {
  // The buckets, not latency_count: a snapshot taken while the I/O thread
  // records may see them a moment apart.
  std::uint64_t n = 0;
  for (const std::uint64_t b : s.latency_buckets) {
    n += b;
  }
  if (n == 0 || !(q > 0.0)) {
    return 0.0;
  }
  q = std::min(q, 1.0);
  auto rank = static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(n)));
  rank = std::clamp<std::uint64_t>(rank, 1, n);
  std::uint64_t seen = 0;
  for (std::size_t i = 0; i < s.latency_buckets.size(); ++i) {
    seen += s.latency_buckets[i];
    if (seen >= rank) {
      const std::size_t last = s.latency_buckets.size() - 1;
      return static_cast<double>(i == last ? net::latency_buckets::lower_bound_us(last)
                                           : net::latency_buckets::upper_bound_us(i));
    }
  }
  return static_cast<double>(net::latency_buckets::lower_bound_us(s.latency_buckets.size() - 1));
}

latency_percentiles percentiles(const pair_stats_snapshot& s) noexcept {
  return {latency_percentile_us(s, 0.5), latency_percentile_us(s, 0.9),
          latency_percentile_us(s, 0.99), latency_percentile_us(s, 0.999)};
}

// ---------------------------------------------------------------- region

stats_region::stats_region(std::size_t pages) : pages_{pages} {
  if (pages == 0) {
    throw std::invalid_argument("a stats region needs at least one page");
  }
  const auto system_page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  bytes_ = (pages * sizeof(pair_stats_page) + system_page - 1) / system_page * system_page;
  base_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    throw std::system_error(errno, std::generic_category(), "mmap of the stats region");
  }
  // mmap gives page-aligned memory, and sizeof(pair_stats_page) is a multiple
  // of its 64-byte alignment, so every page is aligned.
  auto* first = static_cast<pair_stats_page*>(base_);
  for (std::size_t i = 0; i < pages; ++i) {
    pair_stats_page* p = std::construct_at(first + i);
    p->init(static_cast<std::uint32_t>(i));
  }
}

stats_region::~stats_region() {
  if (base_ != nullptr) {
    // The pages hold atomics only: nothing to destroy before unmapping.
    ::munmap(base_, bytes_);
  }
}

pair_stats_page& stats_region::page(std::size_t i) {
  if (i >= pages_) {
    throw std::out_of_range("stats page index out of range");
  }
  return static_cast<pair_stats_page*>(base_)[i];
}

const pair_stats_page& stats_region::page(std::size_t i) const {
  if (i >= pages_) {
    throw std::out_of_range("stats page index out of range");
  }
  return static_cast<const pair_stats_page*>(base_)[i];
}

std::vector<pair_stats_snapshot> stats_region::snapshot_all() const {
  std::vector<pair_stats_snapshot> out;
  out.reserve(pages_);
  for (std::size_t i = 0; i < pages_; ++i) {
    out.push_back(snapshot(page(i)));
  }
  return out;
}

}  // namespace cadeloop::runtime
