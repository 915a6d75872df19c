// http_server::impl, the progress deadlines against slow clients: a request
// body that stalls (body_timeout) or trickles (body_min_rate), and output
// the client does not read (write_timeout). Both are progress-based: each
// byte that arrives or leaves moves the deadline, so a slow but moving
// transfer is never cut by the clock alone. Accepted WebSockets keep their
// own deadlines (ping/pong, close; server_websocket.cpp).

#include "server_impl.hpp"

#include <chrono>

namespace cadeloop::net {

// The progress deadline a connection with work waits for: output that could
// be written first (a client that does not read), then a request body the
// app waits for while the server is reading (not when reading paused because
// the app has not taken what it was given: that wait is the app's). A
// pipelined response held behind an unfinished head of the line counts in
// `unsent` but cannot be written yet: that wait is the app's too, so it
// runs no write deadline until it reaches `out`.
timer_kind http_server::impl::progress_timer(const connection& c) const noexcept {
  if (!c.out.empty() || c.file) {
    return timer_kind::write;
  }
  if (c.body_open && c.in_flight() != 0 && want_read(c)) {
    return timer_kind::body;
  }
  return timer_kind::none;
}

// `n` bytes arrived while a body is awaited: the deadline moves (settle()
// links it again), and past the grace period the average rate must reach
// body_min_rate. True when the connection was cut.
bool http_server::impl::note_body_progress(connection& c, std::size_t n) {
  unlink_timer(c);
  c.body_got += n;
  if (opt_.body_min_rate == 0 || c.body_since == clock_type::time_point{}) {
    return false;
  }
  const auto elapsed = clock_type::now() - c.body_since;
  if (elapsed <= opt_.body_timeout) {
    return false;
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count();
  if (c.body_got * 1000 >= opt_.body_min_rate * static_cast<std::uint64_t>(ms)) {
    return false;
  }
  expire_body(c);
  return true;
}

void http_server::impl::note_write_progress(connection& c, std::size_t n) {
  if (n != 0 && c.tkind == timer_kind::write) {
    unlink_timer(c);  // settle() links it again with a fresh deadline if output remains
  }
}

// A body that stalled: the app learns it as a disconnect; the client gets
// 408 when nothing of the response went out yet, otherwise the connection
// just closes.
void http_server::impl::expire_body(connection& c) {
  ctr_.timeouts.add();
  ctr_.body_timeouts.add();
  const bool answerable = c.body_seq == c.hol_seq && !c.hol_started;
  abandon_in_flight(c, true);
  c.no_more_requests = true;
  if (!answerable) {
    close_now(c);
    return;
  }
  queue_error_response(c, 408, "request body not received in time");
  settle(c);
}

// Output the client has not read for write_timeout: the client is gone or
// hostile. The app's pending send() sees the disconnect.
void http_server::impl::expire_write(connection& c) {
  ctr_.timeouts.add();
  ctr_.write_timeouts.add();
  close_now(c);
}

}  // namespace cadeloop::net
