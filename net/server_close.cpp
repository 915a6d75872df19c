// http_server::impl, the connection's next step and its end: settle() (the
// one place that decides whether to read, answer, close or wait), graceful
// and immediate closing, and the deadline lists with their one timer.

#include "server_impl.hpp"

#include <sys/socket.h>

#include <time.h>

#include <chrono>

namespace cadeloop::net {

namespace {

// What deadlines count from: the kernel's coarse monotonic clock (the last
// tick, read without the TSC, a fraction of steady_clock::now()'s cost in
// this VM) plus its resolution, so a deadline is never set earlier than
// steady_clock::now() would set it, at most one tick later. Both clocks are
// CLOCK_MONOTONIC underneath, so on_timer() compares them directly.
clock_type::time_point deadline_origin() noexcept {
  static const clock_type::duration tick = [] {
    timespec res{};
    if (clock_getres(CLOCK_MONOTONIC_COARSE, &res) != 0) {
      return clock_type::duration{-1};
    }
    return std::chrono::duration_cast<clock_type::duration>(std::chrono::seconds(res.tv_sec) +
                                                            std::chrono::nanoseconds(res.tv_nsec));
  }();
  timespec now{};
  if (tick.count() < 0 || clock_gettime(CLOCK_MONOTONIC_COARSE, &now) != 0) {
    return clock_type::now();
  }
  return clock_type::time_point(std::chrono::duration_cast<clock_type::duration>(
             std::chrono::seconds(now.tv_sec) + std::chrono::nanoseconds(now.tv_nsec))) +
         tick;
}

}  // namespace

// Every decision about a connection's next step is made here, after each
// event that may change it, so the rules live in one place.
void http_server::impl::settle(connection& c) {
  if (c.phase != conn_phase::open) {
    return;
  }
  if (ws_active(c)) {
    ws_settle(c);
    return;
  }
  if (c.error_status != 0 && c.in_flight() == 0) {
    queue_error_response(c, c.error_status, c.error_reason);
  }
  if (c.read_eof && !c.no_more_requests && c.rbeg == c.rend) {
    if (c.parser.mid_message()) {
      close_now(
          c);  // EOF inside a request: drop it (the app, if it had the head, gets a disconnect)
      return;
    }
    c.no_more_requests = true;  // EOF between requests: answer what is in flight, then close
    if (c.in_flight() != 0 && c.ever_dispatched && !c.disconnect_sent) {
      sink_.on_peer_eof(c.id());  // a long-poll may want to stop: its client may be gone
    }
  }
  if (c.no_more_requests && c.in_flight() == 0) {
    if (c.out.empty()) {
      begin_close(c);
    } else {
      update_timer(c);  // the write timeout covers the last response
    }
    return;  // otherwise the last write calls settle() again
  }
  if (draining_ && c.in_flight() == 0 && c.out.empty() && !c.parser.mid_message() &&
      c.rbeg == c.rend) {
    if (!c.drain_probed && want_read(c)) {
      // A request the client sent before the drain began may sit unread in
      // the kernel (a connection accepted just before the listener closed):
      // look once, so it is answered (with Connection: close), not dropped.
      c.drain_probed = true;
      read_available(c);
      return;
    }
    close_now(c);  // idle during a drain
    return;
  }
  if (want_read(c)) {
    arm_read(c);
  }
  update_timer(c);
}

// Graceful end after the last byte was written.
void http_server::impl::begin_close(connection& c) {
  if (!c.wrote_any || c.read_eof) {
    close_now(c);
    return;
  }
  if (c.peer_closes && !c.tls.active() && c.rbeg == c.rend && !c.parser.mid_message()) {
    // The client said its request was its last (Connection: close, or 1.0
    // without keep-alive) and all of it was read: nothing more is coming, so
    // a close sends a FIN, not a reset, and there is nothing to linger for
    // (a shutdown, a read of the client's FIN and a wait less per connection).
    if (c.fin_corked) {
      // The response's tail waits for our FIN (write_once): the shutdown
      // sends both now. A close alone would too, unless bytes the client
      // sent after its last request are unread: then the close sends a
      // reset and the kernel drops what it still holds, our response.
      ::shutdown(c.socket->native_handle(), SHUT_WR);
    }
    close_now(c);
    return;
  }
  // Shut our side and keep reading a little: closing with unread input
  // would send a reset that can destroy the response before the client
  // reads it (a 413 answered before the body was read, for instance).
  tls_close_notify(c);
  error_code ec;
  c.socket->shutdown(asio::socket_base::shutdown_send, ec);
  if (ec) {
    close_now(c);
    return;
  }
  if (c.ever_dispatched && !c.disconnect_sent) {
    c.disconnect_sent = true;
    sink_.on_disconnect(c.id());
  }
  give_buffer(c);
  c.phase = conn_phase::lingering;
  unlink_timer(c);
  link_timer(c, timer_kind::linger);
  arm_read(c);
}

void http_server::impl::close_now(connection& c) {
  if (c.phase == conn_phase::free) {
    return;
  }
  if (c.ws) {
    ws_release(c);
  }
  unlink_timer(c);
  c.rwait.release();  // a queued wait is aborted by the close and frees itself
  if (c.socket) {
    error_code ec;
    c.socket->close(
        ec);  // pending waits complete with operation_aborted; their ids are stale by then
    c.socket.reset();
  }
  const std::uint32_t n = c.in_flight();
  in_flight_total_ -= n;
  ctr_.requests_in_flight.sub(n);
  ctr_.unsent_bytes.sub(c.unsent);
  unread_total_ -= c.body_unacked;
  const connection_id id = c.id();
  const bool tell = c.ever_dispatched && !c.disconnect_sent;
  give_buffer(c);
  c.reset(opt_.max_pipelined);
  c.polled = c.rd_ready = c.rd_hup = c.ready_posted = false;
  c.phase = conn_phase::free;
  if (++c.generation == 0) {
    c.generation = 1;
  }
  free_slots_.push_back(c.slot);
  --open_count_;
  ctr_.connections_open.sub();
  if (tell) {
    sink_.on_disconnect(id);
  }
  maybe_resume_accept();
}

void http_server::impl::update_timer(connection& c) {
  timer_kind want = progress_timer(c);
  if (want != timer_kind::body) {
    c.body_since = {};
  } else if (c.body_since == clock_type::time_point{}) {
    c.body_since = clock_type::now();  // body_min_rate counts from here
    c.body_got = 0;
  }
  if (want == timer_kind::none && c.in_flight() == 0 && c.unsent == 0 && !c.no_more_requests &&
      c.error_status == 0) {
    want = c.parser.mid_message() || c.rbeg != c.rend || c.tls.handshaking() ? timer_kind::head
                                                                             : timer_kind::idle;
  }
  if (want == timer_kind::write && c.dirty && !c.write_armed && !c.file &&
      c.unsent < budget_worth_cutting) {
    // This pass's flush_writes() writes the output and settles again: a small
    // response that goes out at once never needs the write deadline linked.
    // (mark_dirty() never marks a connection whose socket refused bytes and
    // waits for writability, so a stalled client keeps its deadline running
    // from the stall; `!c.write_armed` states it here too.)
    // (Larger output is linked now: the write list is where the memory
    // budget looks for what to cut, server_budget.cpp.)
    want = timer_kind::none;
  }
  if (want == c.tkind) {
    return;
  }
  if (want == timer_kind::none && c.tkind == timer_kind::idle) {
    c.tkind = timer_kind::none;  // parked: the next deadline or on_timer() unlinks it
    c.tparked = true;
    return;
  }
  unlink_timer(c);
  if (want != timer_kind::none) {
    link_timer(c, want);
  }
}

void http_server::impl::link_timer(connection& c, timer_kind k) {
  if (c.tparked) {
    unlink_timer(c);
  }
  deadline_list& l = lists_[static_cast<std::size_t>(k)];
  body_waiting_ += k == timer_kind::body ? 1 : 0;
  c.tkind = k;
  c.deadline = deadline_origin() + timeout_of(k);
  c.tprev = l.tail;
  c.tnext = nullptr;
  if (l.tail != nullptr) {
    l.tail->tnext = &c;
  } else {
    l.head = &c;
  }
  l.tail = &c;
  arm_timer(c.deadline);
  if (k == timer_kind::body) {
    maybe_resume_accept();  // a request waiting for its body no longer counts as busy
  }
}

void http_server::impl::unlink_timer(connection& c) {
  const timer_kind linked = c.tparked ? timer_kind::idle : c.tkind;
  if (linked == timer_kind::none) {
    return;
  }
  deadline_list& l = lists_[static_cast<std::size_t>(linked)];
  body_waiting_ -= linked == timer_kind::body ? 1 : 0;
  if (c.tprev != nullptr) {
    c.tprev->tnext = c.tnext;
  } else {
    l.head = c.tnext;
  }
  if (c.tnext != nullptr) {
    c.tnext->tprev = c.tprev;
  } else {
    l.tail = c.tprev;
  }
  c.tprev = c.tnext = nullptr;
  c.tkind = timer_kind::none;
  c.tparked = false;
}

// One Asio timer for all connections, set to the earliest deadline. It is
// moved only when a new deadline is earlier than the one it waits for; a
// deadline that was removed meanwhile just makes it fire early.
void http_server::impl::arm_timer(clock_type::time_point at) {
  if (timer_armed_ && timer_at_ <= at) {
    return;
  }
  timer_armed_ = true;
  timer_at_ = at;
  const std::uint64_t epoch = ++timer_epoch_;
  timer_.expires_at(at);
  timer_.async_wait([this, epoch](const error_code& ec) {
    if (epoch != timer_epoch_) {
      return;  // superseded by an earlier deadline
    }
    timer_armed_ = false;
    if (!ec) {
      on_timer();
    }
  });
}

void http_server::impl::on_timer() {
  const auto now = clock_type::now();
  for (std::size_t k = 1; k < timer_kind_count; ++k) {
    deadline_list& l = lists_[k];
    while (l.head != nullptr && (l.head->tparked || l.head->deadline <= now)) {
      connection& c = *l.head;
      const bool parked = c.tparked;
      unlink_timer(c);
      if (!parked) {
        expire(c, static_cast<timer_kind>(k));
      }
    }
  }
  for (std::size_t k = 1; k < timer_kind_count; ++k) {
    if (lists_[k].head != nullptr) {
      arm_timer(lists_[k].head->deadline);
    }
  }
}

void http_server::impl::expire(connection& c, timer_kind k) {
  switch (k) {
    case timer_kind::head:
      if (tls_expire(c)) {
        break;  // a handshake too slow: cut without a word
      }
      // A head trickling in for too long while nothing is in flight: 408.
      ctr_.timeouts.add();
      queue_error_response(c, 408, "request head not received in time");
      settle(c);
      break;
    case timer_kind::idle:
      ctr_.timeouts.add();
      close_now(c);
      break;
    case timer_kind::ws_ping:
    case timer_kind::ws_pong:
    case timer_kind::ws_close:
      ws_expire(c, k);
      break;
    case timer_kind::body:
      expire_body(c);
      break;
    case timer_kind::write:
      expire_write(c);
      break;
    case timer_kind::linger:
    case timer_kind::none:
      close_now(c);
      break;
  }
}

}  // namespace cadeloop::net
