// The I/O thread of a core pair: its loop (poll, apply the app's commands,
// write, publish, park), the inbound events it stages for the app thread and
// the graceful stop.
#include "io_thread.hpp"
#include "cadeloop/runtime/cpu_relax.hpp"
#include "cadeloop/runtime/server_log.hpp"
#include "cadeloop/runtime/shared_cpu.hpp"

#include <boost/asio/executor_work_guard.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace cadeloop::runtime {

namespace asio = boost::asio;
using clock_type = std::chrono::steady_clock;

namespace {

// Commands applied per pass, so a flood from the app cannot starve socket
// readiness and timers; the rest stays pending and the loop does not park.
constexpr std::size_t outbound_per_pass = 4096;

// Solo mode: how often the I/O thread, while the app thread has the sockets,
// looks whether the app thread still serves them. Awake without serving for
// two looks in a row (5-10 ms), it is running Python: the I/O thread takes
// the sockets back. While the app thread sleeps (it then wakes for any
// socket event itself), the looks back off to one per 25 ms, which bounds
// how late a wait that began while it slept is noticed.
constexpr int solo_look_ms = 5;
constexpr int solo_look_max_ms = 25;

// Whether the calling thread may run on one CPU only (the server confined with
// taskset, or a pair pinned to one CPU): then the app thread, which has the
// same affinity, can only run when this thread gives the CPU up.
bool confined_to_one_cpu() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) {
    return false;
  }
  return CPU_COUNT(&set) == 1;
}

}  // namespace

io_thread::io_thread(pair_channels& channels, const core_pair_options& options)
    // One thread at a time runs this context (the I/O thread, or the app
    // thread while it holds the sockets in solo mode; `owner`'s seq_cst
    // hand-off orders the two) and nothing is posted to it from another, so
    // the scheduler and the reactor run without their mutexes.
    : ch_{channels},
      options_{options},
      io_{BOOST_ASIO_CONCURRENCY_HINT_UNSAFE},
      wake_fd_{io_},
      grace_timer_{io_},
      watchdog_timer_{io_} {
  server_ = std::make_unique<net::http_server>(io_, *this, options_.server, ch_.page.io);
  server_->set_block_sink(&block_return::give_to, &ch_.blocks);
  reactor_fd_ = server_->reactor_descriptor();
  ch_.io_host = this;
  ch_.solo_max_batch = options_.solo_max_batch;
  ch_.solo_busy_passes = options_.solo_busy_passes;
  ch_.solo_spin = options_.solo_spin;
  // A duplicate, so the descriptor object may close its copy while the
  // parker keeps (and finally closes) the original. Close-on-exec like the
  // original (dup() would drop the flag and a child process would inherit it).
  const int fd = ::fcntl(ch_.io_parker.fd(), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) {
    throw std::system_error(errno, std::generic_category(), "dup(parker fd)");
  }
  wake_fd_.assign(fd);
}

io_thread::~io_thread() {
  if (thread_.joinable()) {
    request_stop();
    thread_.join();
  }
  server_.reset();
}

std::string io_thread::open_listener(net::socket_address& local, std::string& description) {
  std::string error;
  listener_ = net::open_listener(io_, options_.listen, error);
  if (listener_) {
    local = listener_->local_address();
    description = listener_->description();
  }
  return error;
}

void io_thread::start() {
  thread_ = std::thread{[this] { run(); }};
}

void io_thread::request_stop() noexcept {
  // seq_cst store, then wake: pairs with the flag check inside try_park.
  ch_.stop_requested.store(true, std::memory_order_seq_cst);
  ch_.io_parker.wake();
  ch_.solo_parker.wake();  // asleep while the app thread has the sockets
}

void io_thread::join() {
  if (thread_.joinable()) {
    thread_.join();
  }
}

void io_thread::run() noexcept {
  try {
    loop();
  } catch (const std::exception& e) {
    // Only allocation failure gets here; the pair cannot continue in any sound state.
    server_log::write(server_log::log_level::error, "I/O thread failed", e.what());
    std::terminate();
  }
}

void io_thread::loop() {
  auto work = asio::make_work_guard(io_);
  if (listener_) {
    server_->add_listener(std::move(listener_));
  }
  arm_wake_wait();
  ch_.io_cpu.store(sole_cpu(), std::memory_order_relaxed);
  ch_.page.set_state(pair_state::serving);
  arm_watchdog();
  bool draining = false;
  clock_type::time_point deadline{};

  for (;;) {
    // The app's answers go out before this pass reads: the clients they
    // wake send their next requests while we read, and a client's sends
    // are also when its CPU frees the buffers of the requests we read
    // (Linux hands a received buffer back to the CPU that made it, and
    // interrupts that CPU once 32 wait). Reading a whole batch first left
    // the client's CPU idle meanwhile: about one interrupt per 37 requests
    // at 64 connections, each a VM exit on our CPU (docs/architecture.md).
    std::size_t done = 0;
    if (ch_.outbound.has_pending()) {
      done = drain_outbound();
      server_->flush_writes();
    }
    done += io_.poll();
    after_wake_handlers();
    done += drain_outbound();
    // Writes before publishing: drained notices and disconnects caused by a
    // write go out in this pass's batch.
    server_->flush_writes();

    if (!draining && ch_.stop_requested.load(std::memory_order_acquire)) {
      draining = true;
      draining_ = true;
      ch_.page.set_state(pair_state::draining);
      deadline = clock_type::now() + options_.grace;
      server_->begin_drain();
      server_->flush_writes();
      // Wakes run_one() at the deadline if nothing else does.
      grace_timer_.expires_at(deadline);
      grace_timer_.async_wait([](const boost::system::error_code&) {});
      ++done;
    }
    if (draining) {
      if (server_->connection_count() == 0) {
        break;
      }
      if (clock_type::now() >= deadline) {
        server_->abort_all();
        break;
      }
    }
    flush_inbound();
    ch_.page.io_loop.passes.add();

    if (done == 0 && !server_->has_dirty()) {
      ch_.io_idle.store(true, std::memory_order_relaxed);
      park();
      ch_.io_idle.store(false, std::memory_order_relaxed);
    }
  }

  flush_inbound();  // the last disconnects
  grace_timer_.cancel();
  watchdog_timer_.cancel();
  server_.reset();  // closes every socket on this thread
  boost::system::error_code ec;
  wake_fd_.close(ec);
  ch_.page.set_state(pair_state::stopped);
  // seq_cst store then wake: the app's try_park() re-checks this flag.
  ch_.io_stopped.store(true, std::memory_order_seq_cst);
  ch_.app_parker.wake();
}

void io_thread::park() {
  io_loop_counters& ctr = ch_.page.io_loop;
  if (solo_allowed()) {
    give_sockets_to_app();
    return;
  }
  // An explicit io_spin_us keeps its own spin (below); the shared-CPU
  // window is the I/O side's default when the pair shares one CPU.
  if (options_.spin.count() == 0 && ch_.shared_cpu_yield.count() > 0 && ch_.share_one_cpu()) {
    // The app thread shares this CPU: while it is awake (its answer is
    // coming), yield to it and keep serving the sockets, so the answer is
    // taken without it writing our eventfd. io_idle is set meanwhile: the app
    // parks rather than yield back (see app_side::try_park).
    const auto outcome = yield_.run(
        ch_.shared_cpu_yield,
        [this] {
          return ch_.outbound.has_pending() ||
                 (!draining_ && ch_.stop_requested.load(std::memory_order_seq_cst)) ||
                 io_.poll() > 0;
        },
        [this] { return ch_.app_parker.parked(); });
    if (outcome != shared_cpu_yield::outcome::skipped) {
      ctr.spins.add();
    }
    if (outcome == shared_cpu_yield::outcome::found) {
      ctr.spin_hits.add();
      return;  // the next pass runs after_wake_handlers() if a poll ran the wake handler
    }
  } else if (options_.spin.count() > 0) {
    ctr.spins.add();
    const auto until = clock_type::now() + options_.spin;
    bool hit = false;
    static thread_local const bool one_cpu = confined_to_one_cpu();
    if (one_cpu) {
      // The app thread shares this CPU, so burning it would only delay the
      // app: yield it instead, and keep serving the sockets meanwhile, so the
      // app's answer is taken without an eventfd round trip and the next
      // request without a sleep.
      while (!(hit = ch_.outbound.has_pending()) && clock_type::now() < until) {
        if (io_.poll() > 0) {
          hit = true;
          break;
        }
        ::sched_yield();
      }
    } else {
      while (!(hit = ch_.outbound.has_pending()) && clock_type::now() < until) {
        cpu_relax();
      }
    }
    if (hit) {
      ctr.spin_hits.add();
      return;
    }
  }
  const bool sleep = ch_.io_parker.try_park([this] {
    // A stop request is news only until the drain began: during the drain
    // the loop sleeps like any other (the grace timer ends the sleep).
    return ch_.outbound.has_pending() ||
           (!draining_ && ch_.stop_requested.load(std::memory_order_seq_cst));
  });
  if (!sleep) {
    return;
  }
  ctr.parks.add();
  // Blocks in epoll until a socket, a timer or the parker's eventfd is ready,
  // and runs that one handler.
  io_.run_one();
  if (wake_fired_) {
    after_wake_handlers();
  } else {
    ch_.io_parker.unpark(false);
  }
}

// ------------------------------------------------------------------ solo mode

bool io_thread::solo_allowed() const noexcept {
  // After a steal, not again until the app thread parked or served a pass:
  // one still busy in Python would only have them stolen back.
  if (options_.solo_max_batch == 0 || reactor_fd_ < 0 || draining_ ||
      !ch_.solo_ready.load(std::memory_order_acquire)) {
    return false;
  }
  if (stolen_ && app_progress() == progress_at_steal_) {
    return false;
  }
  // Only while few requests are in flight: with many, the app thread has a
  // batch to work through and the two threads serve it better.
  return ch_.page.io.requests_in_flight.get() <= options_.solo_max_batch &&
         !ch_.stop_requested.load(std::memory_order_acquire) && !ch_.outbound.has_pending() &&
         !server_->has_ready_handlers();
}

void io_thread::give_sockets_to_app() {
  io_loop_counters& ctr = ch_.page.io_loop;
  // Everything this thread did to the sockets happens before the app
  // thread's first pass (its acquire of `owner`).
  ch_.owner.store(io_owner::app, std::memory_order_seq_cst);
  // The app thread may have opted out since solo_allowed() asked: it then
  // found the sockets with us (its CAS failed) and will not serve them.
  if (!ch_.solo_ready.load(std::memory_order_seq_cst)) {
    io_owner expected = io_owner::app;
    if (ch_.owner.compare_exchange_strong(expected, io_owner::io, std::memory_order_acq_rel,
                                          std::memory_order_acquire)) {
      return;
    }
  }
  ctr.solo_handoffs.add();
  // A parked app thread learns it at once (it then watches ready_fd()); an
  // awake one at its next park, which re-checks `owner`.
  (void)ch_.app_parker.wake();

  std::uint64_t seen = ch_.page.app.solo_passes.get();
  bool awake_without_pass = false;
  int look_ms = solo_look_ms;
  for (;;) {
    if (ch_.owner.load(std::memory_order_acquire) == io_owner::io) {
      return;  // given back
    }
    if (ch_.stop_requested.load(std::memory_order_seq_cst) && take_sockets_back()) {
      return;  // the drain is this thread's
    }
    // Woken by the app thread giving the sockets back, or by a stop (which
    // takes them back at once from an app thread between passes, and asks
    // one inside a pass with app_busy_wanted: it gives them back at its end).
    const bool sleep = ch_.solo_parker.try_park([this] {
      const io_owner o = ch_.owner.load(std::memory_order_seq_cst);
      return o == io_owner::io ||
             (o == io_owner::app && ch_.stop_requested.load(std::memory_order_seq_cst));
    });
    if (!sleep) {
      continue;
    }
    ctr.parks.add();
    pollfd p{ch_.solo_parker.fd(), POLLIN, 0};
    const int n = ::poll(&p, 1, look_ms);
    ch_.solo_parker.unpark(n > 0);
    if (n > 0) {
      continue;
    }
    // A look: does the app thread still serve the sockets?
    const std::uint64_t passes = ch_.page.app.solo_passes.get();
    const bool app_asleep = ch_.app_parker.parked();
    if (passes != seen || app_asleep) {
      seen = passes;
      awake_without_pass = false;
      look_ms = app_asleep ? std::min(look_ms * 2, solo_look_max_ms) : solo_look_ms;
      continue;
    }
    look_ms = solo_look_ms;
    if (!awake_without_pass) {
      awake_without_pass = true;
      continue;
    }
    // Awake and no pass for two looks: it runs Python (or left its loop).
    // Take the sockets unless it is inside a pass right now.
    io_owner expected = io_owner::app;
    if (ch_.owner.compare_exchange_strong(expected, io_owner::io, std::memory_order_acq_rel,
                                          std::memory_order_acquire)) {
      ctr.solo_steals.add();
      stolen_ = true;
      progress_at_steal_ = app_progress();
      return;
    }
    awake_without_pass = false;
  }
}

std::uint64_t io_thread::app_progress() const noexcept {
  return ch_.page.app.parks.get() + ch_.page.app.solo_passes.get();
}

bool io_thread::take_sockets_back() noexcept {
  io_owner o = ch_.owner.load(std::memory_order_acquire);
  for (;;) {
    if (o == io_owner::io) {
      return true;
    }
    if (o == io_owner::app_busy_wanted) {
      return false;
    }
    const io_owner want = o == io_owner::app ? io_owner::io : io_owner::app_busy_wanted;
    if (ch_.owner.compare_exchange_weak(o, want, std::memory_order_acq_rel,
                                        std::memory_order_acquire)) {
      return want == io_owner::io;
    }
  }
}

std::size_t io_thread::solo_pass(bool poll, bool& dirty, std::size_t& handlers) {
  handlers = 0;
  work_units_ = 0;
  if (poll) {
    handlers = io_.poll();
    after_wake_handlers();
  }
  (void)drain_outbound();
  server_->flush_writes();
  // Handlers a command or a write posted (a read wait that found bytes
  // already there, a connection that may read its next request): nothing
  // makes ready_fd() readable for them, so they run now, a few rounds at
  // most; what is left makes the caller pass again before it sleeps.
  for (int round = 0; round < 4 && server_->has_ready_handlers(); ++round) {
    io_.poll();
    server_->flush_writes();
  }
  flush_inbound();
  ch_.page.io_loop.passes.add();
  dirty = server_->has_dirty() || server_->has_ready_handlers();
  return work_units_;
}

void io_thread::arm_wake_wait() {
  if (wake_armed_) {
    return;
  }
  wake_armed_ = true;
  wake_fd_.async_wait(asio::posix::stream_descriptor::wait_read,
                      [this](const boost::system::error_code& ec) {
                        wake_armed_ = false;
                        if (!ec) {
                          wake_fired_ = true;
                        }
                      });
}

void io_thread::after_wake_handlers() noexcept {
  if (!wake_fired_) {
    return;
  }
  wake_fired_ = false;
  // Drains the eventfd counter so the next sleep is not cut short.
  ch_.io_parker.unpark(true);
  arm_wake_wait();
}

std::size_t io_thread::drain_outbound() {
  const std::size_t n =
      ch_.outbound.drain([this](const outbound_command& cmd) { apply(cmd); }, outbound_per_pass);
  ch_.page.io_loop.outbound_taken.add(n);
  return n;
}

void io_thread::apply(const outbound_command& cmd) {
  // Adopt every pointer first, so nothing leaks if applying throws.
  net::byte_buffer bytes =
      cmd.owner != nullptr
          ? net::byte_buffer::borrow(cmd.data, cmd.size, cmd.owner, ch_.owners.sink())
      : cmd.pooled ? net::byte_buffer::adopt_pooled(cmd.data, cmd.size)
                   : net::byte_buffer::adopt(cmd.data, cmd.size);
  std::unique_ptr<http::request_head> head{cmd.head};
  if (head) {
    // A head given back (a recycle, or carried by its request's response):
    // before the command, which may close the connection and its pool.
    server_->recycle_head(cmd.conn, std::move(head));
  }
  switch (cmd.kind) {
    case outbound_kind::send:
      server_->send(
          cmd.conn, cmd.request, std::move(bytes),
          net::send_flags{cmd.end_of_response, cmd.keep_alive, cmd.notify_drained, cmd.status});
      break;
    case outbound_kind::consumed:
      server_->consume(cmd.conn, cmd.size);
      break;
    case outbound_kind::close:
      server_->close(cmd.conn);
      break;
    case outbound_kind::abort:
      server_->abort(cmd.conn);
      break;
    case outbound_kind::recycle:
      break;
    case outbound_kind::ws_accept: {
      const std::string_view all{bytes.data(), bytes.size()};
      const std::size_t split = std::min<std::size_t>(cmd.code, all.size());
      server_->ws_accept(cmd.conn, cmd.request, all.substr(0, split), all.substr(split));
      break;
    }
    case outbound_kind::ws_send:
      server_->ws_send(cmd.conn, std::move(bytes), cmd.text, cmd.notify_drained);
      break;
    case outbound_kind::ws_consumed:
      server_->ws_consumed(cmd.conn);
      break;
    case outbound_kind::ws_close:
      server_->ws_close(cmd.conn, cmd.code, std::string_view{bytes.data(), bytes.size()});
      break;
    case outbound_kind::send_file: {
      file_send f;
      std::memcpy(&f, bytes.data(), std::min(sizeof f, bytes.size()));
      server_->send_file(cmd.conn, cmd.request, f.fd, f.offset, f.length,
                         net::send_flags{true, cmd.keep_alive, false, cmd.status});
      break;
    }
  }
}

void io_thread::flush_inbound() noexcept {
  const std::size_t n = ch_.inbound.publish();
  if (n != 0) {
    io_loop_counters& ctr = ch_.page.io_loop;
    ctr.inbound_published.add(n);
    if (ch_.app_parker.wake()) {  // a system call only if the app announced a sleep
      ctr.wakeups_to_app.add();
    }
  }
}

void io_thread::on_request(net::connection_id conn, std::uint32_t request,
                           std::unique_ptr<http::request_head>&& head,
                           const net::request_info& info) {
  inbound_event ev;
  ev.kind = inbound_kind::request;
  ev.conn = conn;
  ev.request = request;
  ev.has_body = info.has_body;
  ev.server_closing = info.server_closing;
  ev.tls = info.tls;
  ev.websocket = info.websocket;
  ev.client = info.client;
  ev.server = info.server;
  ev.tls_info = net::tls_ref{info.tls_info}.release();
  ev.data = head.get();
  ch_.inbound.stage(ev);
  (void)head.release();  // the ring owns it now
  ++work_units_;
}

void io_thread::on_body(net::connection_id conn, std::uint32_t request, net::byte_buffer&& bytes,
                        bool more_body) {
  inbound_event ev;
  ev.kind = inbound_kind::body;
  ev.conn = conn;
  ev.request = request;
  ev.more_body = more_body;
  ev.size = bytes.size();
  ev.offset = bytes.offset();
  ev.data = bytes.data() - bytes.offset();  // the allocation (null when empty)
  ch_.inbound.stage(ev);
  (void)bytes.release();
}

void io_thread::on_disconnect(net::connection_id conn) {
  inbound_event ev;
  ev.kind = inbound_kind::disconnect;
  ev.conn = conn;
  ch_.inbound.stage(ev);
}

void io_thread::on_peer_eof(net::connection_id conn) {
  inbound_event ev;
  ev.kind = inbound_kind::peer_eof;
  ev.conn = conn;
  ch_.inbound.stage(ev);
}

void io_thread::on_ws_message(net::connection_id conn, net::byte_buffer&& payload, bool text) {
  inbound_event ev;
  ev.kind = inbound_kind::ws_message;
  ev.conn = conn;
  ev.text = text;
  ev.size = payload.size();
  ev.data = payload.data();
  ch_.inbound.stage(ev);
  (void)payload.release();
  ++work_units_;
}

void io_thread::on_ws_close(net::connection_id conn, std::uint16_t code, std::string&& reason) {
  net::byte_buffer bytes = net::byte_buffer::copy_of(reason);
  inbound_event ev;
  ev.kind = inbound_kind::ws_close;
  ev.conn = conn;
  ev.code = code;
  ev.size = bytes.size();
  ev.data = bytes.data();
  ch_.inbound.stage(ev);
  (void)bytes.release();
}

void io_thread::on_drained(net::connection_id conn, std::uint64_t unsent) {
  inbound_event ev;
  ev.kind = inbound_kind::drained;
  ev.conn = conn;
  ev.size = unsent;
  ch_.inbound.stage(ev);
}

}  // namespace cadeloop::runtime
