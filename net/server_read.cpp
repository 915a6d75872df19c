// http_server::impl, the read side: waiting for readability, reading into
// pooled buffers, feeding the parser, and handing heads and body pieces to
// the app in order; parse errors; lingering reads after a close.

#include "server_impl.hpp"
#include "socket_calls.hpp"

#include <sys/epoll.h>

#include <cstring>
#include <span>
#include <utility>

namespace cadeloop::net {

// Waits for readability rather than reading into a buffer: an idle
// connection holds no read buffer, and not re-arming is how reading stops
// (the kernel's receive window then pushes back on the client). A plain
// connection's wait is one of ours on the socket's reactor registration,
// armed without a system call (conn_poller.hpp); an edge seen while reading
// was paused is read at once, in a handler of its own, so settle() never
// recurses into a read.
void http_server::impl::arm_read(connection& c) {
  if (c.read_armed) {
    return;
  }
  c.read_armed = true;
  if (tls_arm_read(c)) {
    return;
  }
  const connection_id id = c.id();
  if (c.polled) {
    if (c.rd_ready) {
      if (!c.ready_posted) {
        c.ready_posted = true;
        asio::post(io_, [this, id] { take_polled(id); });
      }
    } else {
      c.rwait.start(io_, *c.socket, &impl::on_socket_ready, this, key_of(id));
    }
    return;
  }
  c.socket->async_wait(asio::socket_base::wait_read,
                       [this, id](const error_code& ec) { on_readable(id, ec); });
}

void http_server::impl::on_readable(connection_id id, const error_code& ec) {
  connection* c = lookup(id, true);
  if (c == nullptr) {
    return;  // closed meanwhile (the wait completed with operation_aborted)
  }
  c->read_armed = false;
  if (ec) {
    close_now(*c);
    return;
  }
  readable(*c);
}

// An edge on the socket (the read wait completed), or the peer's FIN or an
// error (from the server's set): read now if reading waits, else remember.
// Keys carry the generation: an event for a closed connection whose slot
// was reused names another generation and is dropped.
void http_server::impl::on_socket_ready(void* self, std::uint64_t key) {
  auto& s = *static_cast<impl*>(self);
  if (connection* c = s.lookup(id_of_key(key), true); c != nullptr && c->polled) {
    s.socket_ready(*c);
  }
}

void http_server::impl::socket_ready(connection& c) {
  c.rd_ready = true;
  if (c.read_armed && !c.ready_posted) {
    c.read_armed = false;
    readable(c);
  }
}

void http_server::impl::on_polled(void* self, std::span<const epoll_event> events) {
  auto& s = *static_cast<impl*>(self);
  for (const epoll_event& ev : events) {
    if (connection* c = s.lookup(id_of_key(ev.data.u64), true); c != nullptr && c->polled) {
      c->rd_hup = true;
      s.socket_ready(*c);
    }
  }
}

void http_server::impl::take_polled(connection_id id) {
  connection* c = lookup(id, true);
  if (c == nullptr) {
    return;
  }
  c->ready_posted = false;
  if (!c->read_armed || !c->rd_ready) {
    return;
  }
  c->read_armed = false;
  readable(*c);
}

void http_server::impl::readable(connection& c) {
  if (c.phase == conn_phase::lingering) {
    linger_read(c);
    return;
  }
  if (ws_active(c)) {
    if (!c.polled) {
      ws_on_readable(c);
      return;
    }
    // ws_on_readable reads at most once, into what is left of the buffer;
    // the edge stays remembered unless that read came back short.
    const ws_state& w = *c.ws;
    const std::size_t room = c.rbuf ? opt_.read_buffer_size - c.rend : opt_.read_buffer_size;
    if (room == 0 || c.read_eof || w.close_received ||
        (!w.close_sent && w.queued >= opt_.ws.max_queue)) {
      ws_on_readable(c);  // paused or full: no read, the edge is kept
      return;
    }
    const connection_id id = c.id();
    const std::uint64_t before = ctr_.bytes_in.get();
    const bool hup = c.rd_hup;
    c.rd_ready = false;
    ws_on_readable(c);
    connection* after = lookup(id, true);
    if (after != nullptr && (hup || ctr_.bytes_in.get() - before == room)) {
      after->rd_ready = true;
      if (after->read_armed) {
        after->read_armed = false;
        arm_read(*after);
      }
    }
    return;
  }
  if (!want_read(c)) {
    return;  // reading was paused after the wait was armed; settle() re-arms
  }
  read_available(c);
}

// One non-blocking read and what follows from it (parsing, settling).
void http_server::impl::read_available(connection& c) {
  if (!c.rbuf) {
    c.rbuf = take_buffer();
  }
  error_code read_ec;
  const std::size_t room = opt_.read_buffer_size - c.rend;
  const std::size_t n = recv_some(c, c.rbuf.get() + c.rend, room, read_ec);
  // Edge-triggered: a short read or EAGAIN leaves nothing behind; a full
  // buffer, or a FIN or error not yet seen, means reading again.
  c.rd_ready = c.polled && !read_ec && (n == room || c.rd_hup);
  if (would_block(read_ec)) {
    settle(c);
    return;
  }
  if (read_ec == asio::error::eof) {
    c.read_eof = true;
    settle(c);
    return;
  }
  if (read_ec) {
    close_now(c);  // reset by peer and the like: nothing can be answered
    return;
  }
  ctr_.bytes_in.add(n);
  c.rend += n;
  // Only body bytes are progress: framing that never delivers one (a chunk
  // size of endless zeros) must not hold the app's receive() for ever, so
  // the body deadline and body_min_rate count what the parser gave as body.
  const bool body_clock = c.tkind == timer_kind::body;
  const std::uint64_t body_before = c.body_in;
  const connection_id id = c.id();
  process_input(c, clock_type::now());
  if (body_clock && c.body_in != body_before && lookup(id, false) == &c &&
      c.tkind == timer_kind::body && note_body_progress(c, c.body_in - body_before)) {
    return;  // cut: slower than body_min_rate
  }
  settle(c);
}

void http_server::impl::linger_read(connection& c) {
  error_code ec;
  const std::size_t n = recv_one(c.socket->native_handle(), discard_.get(), discard_size, ec);
  c.rd_ready = c.polled && !ec && (n == discard_size || c.rd_hup);
  if (would_block(ec)) {
    arm_read(c);
    return;
  }
  if (ec) {
    close_now(c);  // eof: the client read our answer and closed; the normal end
    return;
  }
  c.lingered += n;
  if (c.lingered > opt_.linger_max_bytes) {
    close_now(c);
    return;
  }
  arm_read(c);
}

std::unique_ptr<char[]> http_server::impl::take_buffer() {
  if (!buffer_pool_.empty()) {
    auto b = std::move(buffer_pool_.back());
    buffer_pool_.pop_back();
    return b;
  }
  return std::make_unique_for_overwrite<char[]>(opt_.read_buffer_size);
}

void http_server::impl::give_buffer(connection& c) {
  if (c.rbuf && buffer_pool_.size() < read_buffer_pool_max) {
    buffer_pool_.push_back(std::move(c.rbuf));
  }
  c.rbuf.reset();
}

void http_server::impl::process_input(connection& c, clock_type::time_point now) {
  while (c.phase == conn_phase::open && !c.no_more_requests && c.rbeg < c.rend) {
    const std::string_view input{c.rbuf.get() + c.rbeg, c.rend - c.rbeg};
    const http::feed_result r = c.parser.feed(input);
    c.parser_paused = false;
    dispatch_events(c, now);
    c.rbeg += r.consumed;
    bool again = false;
    switch (r.status) {
      case http::feed_status::ok:
        again = true;
        break;
      case http::feed_status::paused:
        // Credit spent: keep the rest, stop reading, resume in finish_hol().
        c.parser_paused = true;
        break;
      case http::feed_status::closing:
        c.peer_closes = true;
        [[fallthrough]];
      case http::feed_status::upgraded:
        // A non-persistent request, or an upgrade: its response is the last.
        // What follows is ignored, unless the app may accept the WebSocket:
        // then it is its first frames, kept for ws_accept.
        c.no_more_requests = true;
        if (!c.ws) {
          c.rbeg = c.rend;
        }
        break;
      case http::feed_status::error:
        on_parse_error(c);
        c.rbeg = c.rend;
        break;
    }
    if (!again) {
      break;
    }
  }
  if (c.rbeg == c.rend) {
    c.rbeg = c.rend = 0;
    give_buffer(c);
  } else if (c.rbeg != 0) {
    std::memmove(c.rbuf.get(), c.rbuf.get() + c.rbeg, c.rend - c.rbeg);
    c.rend -= c.rbeg;
    c.rbeg = 0;
  }
}

void http_server::impl::dispatch_events(connection& c, clock_type::time_point now) {
  const std::span<const http::parse_event> events = c.parser.events();
  for (std::size_t i = 0; i < events.size(); ++i) {
    const http::parse_event& ev = events[i];
    switch (ev.kind) {
      case http::parse_event_kind::head:
        dispatch_head(c, ev, now);
        break;
      case http::parse_event_kind::body: {
        // One buffer for the run of body pieces this feed produced.
        std::size_t j = i;
        std::size_t total = 0;
        while (j < events.size() && events[j].kind == http::parse_event_kind::body) {
          total += events[j].body.size();
          ++j;
        }
        const bool complete =
            j < events.size() && events[j].kind == http::parse_event_kind::message_complete;
        if (!c.skipping && c.body_open) {
          emit_body(c, events.subspan(i, j - i), total, !complete);
        }
        i = j - 1;
        if (complete) {
          ++i;
          on_message_complete(c, true);
        }
        break;
      }
      case http::parse_event_kind::message_complete:
        on_message_complete(c, false);
        break;
    }
  }
}

void http_server::impl::dispatch_head(connection& c, const http::parse_event& ev,
                                      clock_type::time_point now) {
  if (c.stop_dispatch) {
    c.skipping = true;  // parsed behind the last request: never answered
    return;
  }
  if (refuse_over_budget(c)) {
    return;  // 503: the pair is over its memory budget
  }
  c.skipping = false;
  const bool body = has_body(*ev.head);
  request_info info{c.client, c.server, body, draining_, c.tls.active()};
  info.tls_info = c.tls.details;
  if (ev.head->websocket_upgrade() && opt_.ws.enabled) {
    if (!ws_prepare(c, *ev.head)) {
      c.skipping = true;  // refused with 400/426: the app never sees it
      return;
    }
    info.websocket = true;
  }
  std::unique_ptr<http::request_head> head = c.parser.take_head(ev);
  const std::uint32_t seq = c.next_seq;
  // The record first, so an allocation failure leaves nothing handed over.
  c.records.emplace_back();
  if (log_) {
    log_->capture(*head, c.records.back().log);  // the head itself goes to the app
  }
  try {
    sink_.on_request(c.id(), seq, std::move(head), info);
  } catch (...) {
    c.records.pop_back();
    throw;
  }
  c.records.back().dispatched = now;
  ++c.next_seq;
  ++in_flight_total_;
  c.ever_dispatched = true;
  ctr_.requests.add();
  ctr_.requests_in_flight.add();
  if (draining_) {
    c.stop_dispatch = true;
    c.last_request = true;
  }
  if (body) {
    c.body_open = true;
    c.body_seq = seq;
  }
}

void http_server::impl::emit_body(connection& c, std::span<const http::parse_event> pieces,
                                  std::size_t total, bool more_body) {
  c.body_in += total;
  if (c.body_seq - c.hol_seq >= c.in_flight()) {
    return;  // its response is already finished: nobody reads this body
  }
  byte_buffer bytes = lend_read_buffer(c, pieces, total);
  if (bytes.empty() && total != 0) {
    bytes = byte_buffer{total};
    std::size_t at = 0;
    for (const http::parse_event& p : pieces) {
      if (!p.body.empty()) {
        std::memcpy(bytes.data() + at, p.body.data(), p.body.size());
        at += p.body.size();
      }
    }
  }
  sink_.on_body(c.id(), c.body_seq, std::move(bytes), more_body);
  c.body_unacked += total;
  unread_total_ += total;
}

// A big body piece that ends the bytes read (nothing after it to parse)
// goes to the app in the read buffer itself: the buffer becomes the body
// (its bytes from the piece's start), and the next read takes another one.
// Small pieces are copied: a fresh read buffer costs more than their copy,
// and a piece keeps its whole buffer alive until the app takes it.
byte_buffer http_server::impl::lend_read_buffer(connection& c,
                                                std::span<const http::parse_event> pieces,
                                                std::size_t total) {
  if (total < opt_.read_buffer_size / 4 || !c.rbuf || c.tls.active()) {
    return {};
  }
  const char* base = c.rbuf.get();
  const char* start = nullptr;
  const char* end = nullptr;
  for (const http::parse_event& p : pieces) {
    if (p.body.empty()) {
      continue;
    }
    if (start == nullptr) {
      start = p.body.data();
    } else if (p.body.data() != end) {
      return {};  // not one run (chunked framing between the pieces)
    }
    end = p.body.data() + p.body.size();
  }
  if (start < base || end != base + c.rend) {
    return {};
  }
  const auto offset = static_cast<std::size_t>(start - base);
  return byte_buffer::adopt(c.rbuf.release(), total, offset);
}

void http_server::impl::on_message_complete(connection& c, bool body_sent) {
  if (c.skipping) {
    return;
  }
  if (c.body_open) {
    if (!body_sent) {
      emit_body(c, {}, 0, false);
    }
    c.body_open = false;
  }
  if (c.last_request) {
    c.no_more_requests = true;
  }
}

void http_server::impl::on_parse_error(connection& c) {
  const http::parse_error& err = c.parser.error();
  ctr_.protocol_errors.add();
  if (c.stop_dispatch || c.no_more_requests) {
    c.no_more_requests = true;  // behind the last request: closing anyway
    return;
  }
  c.no_more_requests = true;
  if (c.body_open) {
    // The body of a request the app already has went bad. The app learns
    // it as a disconnect; only when that request heads the line and
    // nothing of its response is out can the error still answer it.
    const bool answerable = c.body_seq == c.hol_seq && !c.hol_started;
    abandon_in_flight(c, true);
    if (answerable) {
      queue_error_response(c, err.status, err.reason);
    }
    return;
  }
  c.error_status = err.status;
  c.error_reason = err.reason;
  if (const http::request_head* rejected = c.parser.rejected_head(); log_ && rejected != nullptr) {
    log_->capture(*rejected, c.error_log);  // its access log line names the method and path
  }
}

}  // namespace cadeloop::net
