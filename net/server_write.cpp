// http_server::impl, the write side: responses from the app kept in request
// order (pipelining), the head-of-line bookkeeping, error responses, the
// access log line and latency of each response, and the writes themselves.

#include "server_impl.hpp"

#include <sys/socket.h>

#include <cadeloop/http/response_encoder.hpp>

#include <chrono>
#include <string>
#include <utility>

namespace cadeloop::net {

namespace {

/// Appends the connection-closing error response the I/O thread answers a
/// protocol error with; the reason is the body, one line.
void append_error_response(unsigned status, std::string_view reason, http::date_cache& dates,
                           std::string_view server_header, std::string& out) {
  http::encoder_options options;
  options.server = server_header;
  std::string text;
  if (!reason.empty()) {
    text.append(reason);
    text.push_back('\n');
  }
  (void)http::encode_error_response(status, text, dates, out, options);
}

}  // namespace

bool http_server::impl::send(connection_id id, std::uint32_t seq, byte_buffer&& bytes,
                             send_flags flags) {
  connection* c = lookup(id, false);
  const std::uint32_t index = c == nullptr ? 0 : seq - c->hol_seq;
  if (c == nullptr || index >= c->in_flight()) {
    ctr_.stale_messages.add();
    return false;
  }
  if (flags.notify_drained) {
    c->drain_wanted = true;
  }
  if (index < c->records.size()) {
    request_record& rec = c->records[index];
    rec.bytes += bytes.size();
    if (flags.status != 0) {
      rec.status = flags.status;
    }
  }
  if (index == 0) {
    if (!bytes.empty()) {
      c->hol_started = true;
      append_out(*c, std::move(bytes));
    }
    if (flags.end_of_response) {
      finish_hol(*c, flags.keep_alive);
    }
  } else {
    later_response* r = later_slot(*c, index);
    if (r == nullptr) {
      return false;
    }
    if (!bytes.empty()) {
      c->unsent += bytes.size();
      ctr_.unsent_bytes.add(bytes.size());
      r->parts.push_back(std::move(bytes));
    }
    if (flags.end_of_response) {
      r->ended = true;
      r->keep_alive = flags.keep_alive;
    }
  }
  if (c->phase == conn_phase::open) {
    check_drained(*c);
    settle(*c);
  }
  enforce_memory_budget(*c);  // as bytes arrive, not only after writes
  return true;
}

void http_server::impl::flush_writes() {
  if (dirty_.empty()) {
    return;
  }
  // Writes may mark other connections dirty (a pipelined response that
  // became head of line); those wait for the next pass.
  dirty_swap_.swap(dirty_);
  for (const connection_id id : dirty_swap_) {
    connection* c = lookup(id, false);
    if (c == nullptr) {
      continue;
    }
    c->dirty = false;
    if (!c->write_armed && (!c->out.empty() || c->file)) {
      write_once(*c);
    }
  }
  dirty_swap_.clear();
}

later_response* http_server::impl::later_slot(connection& c, std::uint32_t index) {
  if (c.later.size() < index) {
    c.later.resize(index);
  }
  later_response& r = c.later[index - 1];
  if (r.ended) {
    ctr_.stale_messages.add();
    return nullptr;
  }
  return &r;
}

void http_server::impl::append_out(connection& c, byte_buffer&& bytes) {
  c.unsent += bytes.size();
  ctr_.unsent_bytes.add(bytes.size());
  c.out.push_back(std::move(bytes));
  c.wrote_any = true;
  mark_dirty(c);
}

void http_server::impl::queue_error_response(connection& c, std::uint16_t status,
                                             std::string_view reason) {
  ctr_.count_status(status);
  scratch_.clear();
  append_error_response(status, reason, dates_, opt_.server_header, scratch_);
  if (log_) {
    log_line(c, c.error_log, status, scratch_.size(), 0);
    c.error_log.clear();
  }
  append_out(c, byte_buffer::copy_of(scratch_));
  c.error_status = 0;
  c.no_more_requests = true;
}

// The head-of-line response finished: move on to the next request, whose
// response may already be waiting (pipelining), and give the parser credit.
void http_server::impl::finish_hol(connection& c, bool keep_alive) {
  const clock_type::time_point now = clock_type::now();
  for (;;) {
    complete_record(c, now);
    const std::uint32_t done = c.hol_seq;
    ++c.hol_seq;
    c.hol_started = false;
    --in_flight_total_;
    ctr_.requests_in_flight.sub();
    ctr_.responses.add();
    c.parser.add_credit(1);
    if (c.body_open && c.body_seq == done) {
      // Answered before its body arrived: rather than read and discard an
      // unbounded body, the connection closes after this response.
      c.body_open = false;
      c.no_more_requests = true;
    }
    if (!keep_alive) {
      abandon_in_flight(c, false);
      c.no_more_requests = true;
      break;
    }
    if (c.later.empty()) {
      break;
    }
    later_response next = std::move(c.later.front());
    c.later.pop_front();
    for (byte_buffer& part : next.parts) {
      c.out.push_back(std::move(part));  // already counted in unsent
      c.hol_started = true;
      c.wrote_any = true;
    }
    if (next.file) {  // its file follows; the response finishes with it (server_pathsend.cpp)
      c.file = std::move(next.file);
      c.hol_started = c.wrote_any = true;
      mark_dirty(c);
      break;
    }
    if (c.hol_started) {
      mark_dirty(c);
    }
    if (!next.ended) {
      break;
    }
    keep_alive = next.keep_alive;
  }
  maybe_resume_accept();
  if (c.parser_paused && !c.no_more_requests) {
    if (c.rbeg < c.rend) {
      process_input(c, now);
    } else {
      // Paused at the end of the input, with nothing kept: the credit is
      // back, so reading resumes (the parser resumes at its next feed).
      c.parser_paused = false;
    }
  }
}

// The head-of-line response ended: its status class, its latency.
void http_server::impl::complete_record(connection& c, clock_type::time_point now) {
  if (c.records.empty()) {
    return;
  }
  const request_record& rec = c.records.front();
  ctr_.count_status(rec.status);
  const auto us =
      std::chrono::duration_cast<std::chrono::microseconds>(now - rec.dispatched).count();
  const std::uint64_t duration = us > 0 ? static_cast<std::uint64_t>(us) : 0;
  ctr_.latency.record(duration);
  if (log_) {
    log_line(c, rec.log, rec.status, rec.bytes, duration);
  }
  c.records.pop_front();
}

// Queues one access-log line; a full queue drops it (counted), never waits.
void http_server::impl::log_line(connection& c, std::string_view captured, unsigned status,
                                 std::uint64_t bytes, std::uint64_t duration_us) {
  if (c.client_text.empty()) {
    c.client_text = c.client.to_string();
  }
  if (const std::size_t dropped = log_->write(captured, c.client_text, status, bytes, duration_us);
      dropped != 0) {
    ctr_.access_log_dropped.add(dropped);
  }
}

// Forgets every request in flight (their responses will be dropped as stale).
void http_server::impl::abandon_in_flight(connection& c, bool send_disconnect) {
  c.records.clear();
  const std::uint32_t n = c.in_flight();
  in_flight_total_ -= n;
  ctr_.requests_in_flight.sub(n);
  for (const later_response& r : c.later) {
    for (const byte_buffer& p : r.parts) {
      c.unsent -= p.size();
      ctr_.unsent_bytes.sub(p.size());
    }
  }
  c.later.clear();
  c.file.reset();
  c.hol_seq = c.next_seq;
  c.hol_started = false;
  c.body_open = false;
  c.stop_dispatch = true;
  if (send_disconnect && c.ever_dispatched && !c.disconnect_sent) {
    c.disconnect_sent = true;
    sink_.on_disconnect(c.id());
  }
  maybe_resume_accept();
}

void http_server::impl::check_drained(connection& c) {
  if (c.drain_wanted && c.unsent <= opt_.drain_low_mark) {
    c.drain_wanted = false;
    if (!c.disconnect_sent) {
      sink_.on_drained(c.id(), c.unsent);
    }
  }
}

void http_server::impl::arm_write(connection& c) {
  if (c.write_armed) {
    return;
  }
  c.write_armed = true;
  const connection_id id = c.id();
  c.socket->async_wait(asio::socket_base::wait_write, [this, id](const error_code& ec) {
    connection* conn = lookup(id, false);
    if (conn == nullptr) {
      return;
    }
    conn->write_armed = false;
    if (ec) {
      close_now(*conn);
      return;
    }
    mark_dirty(*conn);  // written by this pass's flush_writes()
  });
}

// One writev of as much pending output as fits; the rest waits for writability.
void http_server::impl::write_once(connection& c) {
  if (c.file && c.out.empty()) {  // a file body (server_pathsend.cpp)
    if (!pump_file(c)) {
      return;
    }
    if (c.out.empty()) {
      settle(c);
      return;
    }
  }
  iov_.clear();
  bool first = true;
  for (const byte_buffer& b : c.out) {
    if (iov_.size() == max_write_pieces) {
      break;
    }
    std::string_view v = b.view();
    if (first) {
      v.remove_prefix(c.out_offset);
      first = false;
    }
    iov_.emplace_back(v.data(), v.size());
  }
  // The connection's last bytes (no request will follow, every response is
  // queued, and this call carries all of it): MSG_MORE keeps the tail in
  // the kernel until begin_close() sends our FIN, which then rides in the
  // same segment. The client acknowledges both at once: two packets fewer
  // per connection than a response followed by a bare FIN.
  const bool last = c.no_more_requests && c.in_flight() == 0 && !c.file && !c.ws &&
                    !c.tls.active() && iov_.size() == c.out.size();
  error_code ec;
  std::size_t n = send_some(c, iov_, ec, last ? MSG_MORE : 0);
  ctr_.write_calls.add();
  if (would_block(ec)) {
    n = 0;
  } else if (ec) {
    close_now(c);  // broken pipe, reset: the client is gone
    return;
  }
  if (last && n > 0) {
    c.fin_corked = true;
  }
  ctr_.bytes_out.add(n);
  c.unsent -= n;
  ctr_.unsent_bytes.sub(n);
  note_write_progress(c, n);
  while (n > 0) {
    const std::size_t left = c.out.front().size() - c.out_offset;
    if (n >= left) {
      n -= left;
      if (byte_buffer& done = c.out.front(); done.pooled() && block_sink_ != nullptr) {
        char* block = done.release();
        if (!block_sink_(block_ctx_, block)) {
          delete[] block;
        }
      }
      c.out.pop_front();
      c.out_offset = 0;
    } else {
      c.out_offset += n;
      n = 0;
    }
  }
  if (!c.out.empty()) {
    arm_write(c);
  } else if (c.file) {
    mark_dirty(c);  // the file's next part, on the next pass
  }
  check_drained(c);
  settle(c);
}

}  // namespace cadeloop::net
