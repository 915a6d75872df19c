// The core pair and the app thread's end of it: `app_side` (staging commands
// on the outbound ring, adopting inbound messages, flush and park) and
// `core_pair` (placing the stats page, starting and stopping the I/O thread,
// freeing what is left in the rings).
#include "cadeloop/runtime/core_pair.hpp"

#include "io_thread.hpp"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <utility>

namespace cadeloop::runtime {

namespace {

// Response bytes are allocated on the app thread and freed on the I/O
// thread once written. With glibc's default thresholds a freed 64 KiB
// response at the top of the heap is given back to the kernel at once, and
// the next one faults its 16 pages in again (16 page faults per 64 KiB
// response, measured: bench/results/2026-12-01-http-perf-ab.md). Keeping up
// to 32 MiB of freed heap, and taking blocks up to 4 MiB from the heap
// rather than from mmap, ends that churn. Once per process; glibc's own
// environment variables, when set, win.
void keep_freed_heap() {
#if defined(__GLIBC__)
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("MALLOC_TRIM_THRESHOLD_") == nullptr &&
        std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) {
      (void)::mallopt(M_MMAP_THRESHOLD, 4 << 20);
      (void)::mallopt(M_TRIM_THRESHOLD, 32 << 20);
    }
  });
#endif
}

}  // namespace

// ---------------------------------------------------------------- app side

inbound_message app_side::adopt(const inbound_event& ev) noexcept {
  inbound_message m;
  m.kind = ev.kind;
  m.conn = ev.conn;
  m.request = ev.request;
  switch (ev.kind) {
    case inbound_kind::request:
      m.head.reset(static_cast<http::request_head*>(ev.data));
      m.info = net::request_info{ev.client,         ev.server, ev.has_body,
                                 ev.server_closing, ev.tls,    ev.websocket};
      m.info.tls_info = net::tls_ref::adopt(ev.tls_info);
      break;
    case inbound_kind::ws_message:
      m.body = net::byte_buffer::adopt(static_cast<char*>(ev.data), ev.size);
      m.text = ev.text;
      break;
    case inbound_kind::ws_close:
      m.body = net::byte_buffer::adopt(static_cast<char*>(ev.data), ev.size);
      m.code = ev.code;
      break;
    case inbound_kind::body:
      m.body = net::byte_buffer::adopt(static_cast<char*>(ev.data), ev.size, ev.offset);
      m.more_body = ev.more_body;
      break;
    case inbound_kind::drained:
      m.unsent = ev.size;
      break;
    case inbound_kind::disconnect:
    case inbound_kind::peer_eof:
      break;
  }
  return m;
}

void app_side::stage(const outbound_command& cmd) {
  ch_.outbound.stage(cmd);
  ch_.page.app.outbound_staged.add();
}

namespace {

// What send() and send_file() stage alike: a part of the response to
// `request` of `conn` carrying `bytes` (the ring owns them once staged).
outbound_command response_part(outbound_kind kind, net::connection_id conn, std::uint32_t request,
                               net::byte_buffer& bytes, send_options options) noexcept {
  outbound_command cmd;
  cmd.kind = kind;
  cmd.conn = conn;
  cmd.request = request;
  cmd.keep_alive = options.keep_alive;
  cmd.status = options.status;
  cmd.data = bytes.data();
  cmd.size = bytes.size();
  cmd.pooled = bytes.pooled();
  cmd.owner = bytes.owner();
  return cmd;
}

}  // namespace

void app_side::send(net::connection_id conn, std::uint32_t request, net::byte_buffer&& bytes,
                    send_options options) {
  outbound_command cmd = response_part(outbound_kind::send, conn, request, bytes, options);
  cmd.end_of_response = options.end_of_response;
  cmd.notify_drained = options.notify_drained;
  const bool carries_head = held_head_ != nullptr && held_conn_ == conn;
  if (carries_head) {
    cmd.head = held_head_;  // the I/O thread gives it back before it sends
  }
  stage(cmd);
  (void)bytes.release();  // the ring owns them now
  if (carries_head) {
    held_head_ = nullptr;
  }
}

void app_side::send_file(net::connection_id conn, std::uint32_t request, int fd,
                         std::uint64_t offset, std::uint64_t length, send_options options) {
  net::byte_buffer spec{sizeof(file_send)};
  const file_send f{fd, offset, length};
  std::memcpy(spec.data(), &f, sizeof f);
  outbound_command cmd = response_part(outbound_kind::send_file, conn, request, spec, options);
  cmd.end_of_response = true;
  stage(cmd);
  (void)spec.release();  // the ring owns them now
}

void app_side::consumed(net::connection_id conn, std::uint64_t bytes) {
  outbound_command cmd;
  cmd.kind = outbound_kind::consumed;
  cmd.conn = conn;
  cmd.size = bytes;
  stage(cmd);
}

void app_side::close(net::connection_id conn) {
  outbound_command cmd;
  cmd.kind = outbound_kind::close;
  cmd.conn = conn;
  stage(cmd);
}

void app_side::abort(net::connection_id conn) {
  outbound_command cmd;
  cmd.kind = outbound_kind::abort;
  cmd.conn = conn;
  stage(cmd);
}

void app_side::recycle(net::connection_id conn, std::unique_ptr<http::request_head>&& head) {
  if (!head) {
    return;
  }
  if (held_head_ != nullptr) {
    stage_held_alone();  // the one held before (may throw: `head` is not taken)
  }
  held_conn_ = conn;
  held_head_ = head.release();
}

void app_side::stage_held_alone() {
  outbound_command cmd;
  cmd.kind = outbound_kind::recycle;
  cmd.conn = held_conn_;
  cmd.head = held_head_;
  stage(cmd);
  held_head_ = nullptr;
}

void app_side::stage_held_head() noexcept {
  if (held_head_ == nullptr) {
    return;
  }
  try {
    stage_held_alone();
  } catch (const std::bad_alloc&) {
    // Still held: the next publish stages it.
  }
}

app_side::~app_side() {
  delete held_head_;  // never staged: nothing else owns it
}

void app_side::ws_accept(net::connection_id conn, std::uint32_t request,
                         std::string_view subprotocol, std::string_view extra_headers) {
  if (subprotocol.size() > UINT16_MAX) {
    subprotocol = {};  // not a token the I/O thread would take; accepted without one
  }
  net::byte_buffer bytes{subprotocol.size() + extra_headers.size()};
  if (!subprotocol.empty()) {
    std::memcpy(bytes.data(), subprotocol.data(), subprotocol.size());
  }
  if (!extra_headers.empty()) {
    std::memcpy(bytes.data() + subprotocol.size(), extra_headers.data(), extra_headers.size());
  }
  outbound_command cmd;
  cmd.kind = outbound_kind::ws_accept;
  cmd.conn = conn;
  cmd.request = request;
  cmd.code = static_cast<std::uint16_t>(subprotocol.size());
  cmd.data = bytes.data();
  cmd.size = bytes.size();
  stage(cmd);
  (void)bytes.release();
}

void app_side::ws_send(net::connection_id conn, net::byte_buffer&& payload, bool text,
                       bool notify_drained) {
  outbound_command cmd;
  cmd.kind = outbound_kind::ws_send;
  cmd.conn = conn;
  cmd.text = text;
  cmd.notify_drained = notify_drained;
  cmd.data = payload.data();
  cmd.size = payload.size();
  stage(cmd);
  (void)payload.release();
}

void app_side::ws_consumed(net::connection_id conn) {
  outbound_command cmd;
  cmd.kind = outbound_kind::ws_consumed;
  cmd.conn = conn;
  stage(cmd);
}

void app_side::ws_close(net::connection_id conn, std::uint16_t code, std::string_view reason) {
  net::byte_buffer bytes = net::byte_buffer::copy_of(reason);
  outbound_command cmd;
  cmd.kind = outbound_kind::ws_close;
  cmd.conn = conn;
  cmd.code = code;
  cmd.data = bytes.data();
  cmd.size = bytes.size();
  stage(cmd);
  (void)bytes.release();
}

std::size_t app_side::flush() noexcept {
  app_counters& ctr = ch_.page.app;
  ctr.loop_ticks.add();
  stage_held_head();
  const std::size_t n = ch_.outbound.publish();
  if (n != 0) {
    ctr.outbound_published.add(n);
    // Solo mode: this thread has the sockets, so it applies the batch and
    // writes it now.
    if (solo_ && serve_sockets(false)) {
      return n;
    }
    if (ch_.io_parker.wake()) {  // a system call only if the I/O thread announced a sleep
      ctr.wakeups_to_io.add();
    }
  } else if (solo_dirty_) {
    (void)serve_sockets(false);
  }
  return n;
}

// ---------------------------------------------------------------- solo mode

bool app_side::enable_solo() noexcept {
  if (ch_.io_host == nullptr || ch_.solo_max_batch == 0 || ch_.io_host->ready_fd() < 0) {
    return false;
  }
  solo_ = true;
  ch_.solo_ready.store(true, std::memory_order_release);
  return true;
}

void app_side::disable_solo() noexcept {
  if (!solo_) {
    return;
  }
  ch_.solo_ready.store(false, std::memory_order_seq_cst);
  io_owner expected = io_owner::app;
  if (ch_.owner.compare_exchange_strong(expected, io_owner::io, std::memory_order_acq_rel,
                                        std::memory_order_acquire)) {
    give_sockets_back();
  }
  solo_ = false;
  sockets_ready_ = false;
  solo_dirty_ = false;
}

int app_side::solo_fd() const noexcept {
  return ch_.io_host != nullptr ? ch_.io_host->ready_fd() : -1;
}

void app_side::write_through() noexcept {
  if (solo_last_read_ > 1 || !serves_sockets()) {
    return;
  }
  stage_held_head();
  const std::size_t n = ch_.outbound.publish();
  if (n != 0) {
    ch_.page.app.outbound_published.add(n);
    (void)serve_sockets(false);
  }
}

bool app_side::poll_sockets() noexcept {
  sockets_ready_ = false;
  idled_ = true;  // the loop's spin: it had nothing else to do
  return serve_sockets(true) && ch_.inbound.has_pending();
}

void app_side::serve_ready_sockets() noexcept {
  sockets_ready_ = false;
  (void)serve_sockets(true);
}

bool app_side::serve_sockets(bool poll) noexcept {
  io_owner expected = io_owner::app;
  if (!ch_.owner.compare_exchange_strong(expected, io_owner::app_busy, std::memory_order_acquire,
                                         std::memory_order_relaxed)) {
    solo_dirty_ = false;
    return false;  // the I/O thread has them (it took them back, or never gave them)
  }
  bool dirty = false;
  std::size_t units = 0;  // requests and WebSocket messages the pass read
  std::size_t handlers = 0;
  try {
    units = ch_.io_host->solo_pass(poll, dirty, handlers);
  } catch (...) {
    // Only allocation failure gets here, as on the I/O thread: the pair
    // cannot continue in any sound state.
    std::terminate();
  }
  ch_.page.app.solo_passes.add();
  solo_dirty_ = dirty;
  if (poll) {
    solo_last_read_ = units;
    if (units != 0) {
      busy_finds_ = idled_ ? 0 : busy_finds_ + 1;
      idled_ = false;
    }
  }
  // Back to `app`, unless the pass did a batch the two threads serve better
  // (more than solo_max_batch requests, or as many socket handlers: TLS
  // handshakes publish nothing), or requests kept coming while the loop was
  // busy for solo_busy_passes passes in a row (many clients, one request per
  // pass), or the I/O thread asked for them.
  expected = io_owner::app_busy;
  if (std::max(units, handlers) > ch_.solo_max_batch ||
      (ch_.solo_busy_passes != 0 && busy_finds_ >= ch_.solo_busy_passes) ||
      !ch_.owner.compare_exchange_strong(expected, io_owner::app, std::memory_order_release,
                                         std::memory_order_relaxed)) {
    ch_.owner.store(io_owner::io, std::memory_order_seq_cst);
    busy_finds_ = 0;
    give_sockets_back();
  }
  return true;
}

void app_side::give_sockets_back() noexcept {
  solo_dirty_ = false;
  sockets_ready_ = false;
  if (ch_.solo_parker.wake()) {
    ch_.page.app.wakeups_to_io.add();
  }
}

bool app_side::try_park() noexcept {
  const auto work_visible = [this] {
    return ch_.inbound.has_pending() || ch_.io_stopped.load(std::memory_order_seq_cst) ||
           ch_.owners.waiting();
  };
  idled_ = true;  // the loop has nothing else to do
  const bool serving = serves_sockets();
  if (serving && (solo_dirty_ || sockets_ready_ || ch_.outbound.has_pending())) {
    // Output to write, events to collect or commands to apply first.
    sockets_ready_ = false;
    (void)serve_sockets(true);
    return false;
  }
  // While this thread serves the sockets, the I/O thread sleeps: no window.
  if (!serving && ch_.shared_cpu_yield.count() > 0) {
    if (!cpu_known_) {
      cpu_known_ = true;
      ch_.app_cpu.store(sole_cpu(), std::memory_order_relaxed);
    }
    // The I/O thread shares this CPU: while it is inside a pass (not parked,
    // not idle), give it the CPU and look again, so the batch it is making is
    // taken without it writing our eventfd (it writes only when we announced
    // a sleep). Not while it is idle: then the next request may be far off,
    // and the two threads would only hand the CPU to each other until it
    // comes (measured: 3 times the context switches, 10-14 % more CPU per
    // request at one connection). The loop's GIL is held meanwhile; the
    // window is bounded.
    if (ch_.share_one_cpu() && yield_.run(ch_.shared_cpu_yield, work_visible, [this] {
          return ch_.io_parker.parked() || ch_.io_idle.load(std::memory_order_relaxed);
        }) == shared_cpu_yield::outcome::found) {
      return false;
    }
  }
  const bool sleep = ch_.app_parker.try_park(work_visible);
  if (sleep) {
    ch_.page.app.parks.add();
    // Asleep: no work, so no progress is owed to the watchdog.
    ch_.page.watchdog.app_busy.store(0, std::memory_order_relaxed);
  }
  return sleep;
}

void app_side::unpark(bool signalled) noexcept {
  ch_.page.watchdog.app_busy.store(1, std::memory_order_relaxed);
  ch_.app_parker.unpark(signalled);
}

// ---------------------------------------------------------------- core pair

namespace {

void dispose(const inbound_event& ev) noexcept {
  if (ev.kind == inbound_kind::request) {
    delete static_cast<http::request_head*>(ev.data);
  } else if (ev.kind == inbound_kind::body || ev.kind == inbound_kind::ws_message ||
             ev.kind == inbound_kind::ws_close) {
    delete[] static_cast<char*>(ev.data);
  }
}

void dispose(const outbound_command& cmd, owner_return& owners) noexcept {
  if (cmd.owner != nullptr) {
    owners.give(cmd.owner);  // borrowed bytes: never ours to free
    delete cmd.head;
    return;
  }
  if (cmd.kind == outbound_kind::send_file && cmd.size >= sizeof(file_send)) {
    file_send f;  // the file the I/O thread would have sent and closed
    std::memcpy(&f, cmd.data, sizeof f);
    if (f.fd >= 0) {
      ::close(f.fd);
    }
  }
  delete[] cmd.data;
  delete cmd.head;
}

}  // namespace

namespace {

pair_stats_page& place(core_pair_options& options, std::unique_ptr<pair_stats_page>& private_page) {
  pair_stats_page* page = options.stats_page;
  if (page == nullptr) {
    private_page = std::make_unique<pair_stats_page>();
    private_page->init(options.index);
    page = private_page.get();
  }
  page->claim();  // counters from zero, this process, state starting
  options.stats_page = page;
  options.server.access_log.pair = options.index;
  return *page;
}

}  // namespace

core_pair::core_pair(core_pair_options options)
    : options_{std::move(options)},
      ch_{std::make_unique<pair_channels>(options_.ring_capacity, place(options_, private_page_))},
      app_{*ch_},
      io_{std::make_unique<io_thread>(*ch_, options_)} {
  ch_->shared_cpu_yield = options_.shared_cpu_yield;
}

core_pair::~core_pair() {
  io_.reset();  // stops and joins the thread if it still runs
  ch_->inbound.dispose_all([](const inbound_event& ev) { dispose(ev); });
  ch_->outbound.dispose_all([this](const outbound_command& cmd) { dispose(cmd, ch_->owners); });
}

std::string core_pair::start() {
  std::string error = io_->open_listener(local_, description_);
  if (!error.empty()) {
    return error;
  }
  keep_freed_heap();
  io_->start();
  return {};
}

void core_pair::request_stop() noexcept {
  io_->request_stop();
}

void core_pair::join() {
  io_->join();
}

void core_pair::stop() {
  request_stop();
  join();
}

core_pair_stats core_pair::stats() const noexcept {
  return snapshot(ch_->page);
}

}  // namespace cadeloop::runtime
