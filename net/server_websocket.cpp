// http_server::impl's WebSocket side (RFC 6455, RFC 7692): the upgrade
// checked and handed to the app, accepted with its 101, then frames in and
// out in the I/O thread: messages to the app with a bounded queue, pongs
// answered here, pings on an interval with a timeout, permessage-deflate,
// and the close handshake with its timeout.

#include "server_impl.hpp"

#include <cadeloop/http/websocket.hpp>
#include <cadeloop/http/ws_deflate.hpp>

#include <chrono>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

namespace cadeloop::net {

namespace {

// Messages shorter than this are sent uncompressed (RSV1 is per message, so
// this is allowed): deflate would barely shrink them and costs a stream pass.
constexpr std::size_t ws_compress_min = 64;
// A message up to this size is framed into one buffer with its header; a
// larger one goes out as header + the app's own buffer (writev), uncopied.
constexpr std::size_t ws_copy_max = 1024;
// The decompression buffer is given back after a message bigger than this.
constexpr std::size_t ws_scratch_keep = 256U * 1024U;
// Reading a client stops while this much of our output to it is unread: each
// ping it sends queues a pong, so a client that pings and reads nothing
// would otherwise grow the pair's memory without end. TCP then holds it back.
constexpr std::uint64_t ws_unread_output_max = std::uint64_t{4} << 20;

// Frames are not read or parsed now: the app has max_queue messages it has not
// taken, or the client has not read ws_unread_output_max bytes of ours.
// Neither after our close frame (pings are no longer answered then, and the
// client's close is awaited).
bool ws_reading_paused(const connection& c, std::size_t max_queue) noexcept {
  const ws_state& w = *c.ws;
  return !w.close_sent && (w.queued >= max_queue || c.unsent >= ws_unread_output_max);
}

}  // namespace

// ------------------------------------------------------------------ upgrade

bool http_server::impl::ws_prepare(connection& c, const http::request_head& head) {
  ws_fields_.clear();
  for (const http::header_field f : head.headers()) {
    ws_fields_.push_back(f);
  }
  const http::ws_handshake_request request{head.method_name(), head.version_major(),
                                           head.version_minor(), ws_fields_};
  const http::ws_handshake_result verdict = http::validate_ws_handshake(request);
  if (!verdict.ok()) {
    // 400, or 426 with the version spoken; the connection closes after it.
    ctr_.ws_upgrades_rejected.add();
    ctr_.protocol_errors.add();
    ctr_.count_status(verdict.status);
    scratch_.clear();
    http::encoder_options eo;
    eo.server = opt_.server_header;
    http::encode_ws_reject(verdict, dates_, scratch_, eo);
    if (log_) {
      std::string captured;
      log_->capture(head, captured);
      log_line(c, captured, verdict.status, scratch_.size(), 0);
    }
    append_out(c, byte_buffer::copy_of(scratch_));
    c.no_more_requests = true;
    c.stop_dispatch = true;
    return false;
  }
  http::ws_parser_options po;
  po.role = http::ws_role::server;
  po.max_message = opt_.ws.max_message;
  http::ws_deflate_params deflate;
  std::string extensions;
  bool deflate_on = false;
  if (opt_.ws.per_message_deflate) {
    std::vector<std::string_view> offers;
    for (const http::header_field& f : ws_fields_) {
      if (f.name == "sec-websocket-extensions") {
        offers.push_back(f.value);
      }
    }
    deflate_on = !offers.empty() && http::negotiate_ws_deflate(offers, deflate, extensions);
  }
  po.allowed_rsv = deflate_on ? 0x40 : 0;
  auto w = std::make_unique<ws_state>(po);
  w->handshake = std::make_unique<ws_handshake>();
  ws_handshake& h = *w->handshake;
  std::memcpy(h.key.data(), verdict.key.data(), h.key.size());  // validated: 24 characters
  h.extensions = std::move(extensions);
  w->deflate = deflate;
  w->deflate_on = deflate_on;
  c.ws = std::move(w);
  return true;
}

bool http_server::impl::ws_accept(connection_id id, std::uint32_t request,
                                  std::string_view subprotocol, std::string_view extra_headers) {
  connection* c = lookup(id, false);
  if (c == nullptr || !c->ws || c->ws->open || !c->ws->handshake || request != c->hol_seq ||
      c->in_flight() != 1 || c->hol_started || c->records.empty()) {
    ctr_.stale_messages.add();
    return false;
  }
  ws_state& w = *c->ws;
  // The app's headers: "name: value\r\n" lines.
  ws_fields_.clear();
  bool well_formed = true;
  std::string_view rest = extra_headers;
  while (!rest.empty()) {
    const std::size_t eol = rest.find("\r\n");
    const std::string_view line = rest.substr(0, eol);
    const std::size_t colon = line.find(':');
    if (eol == std::string_view::npos || colon == std::string_view::npos) {
      well_formed = false;
      break;
    }
    ws_fields_.push_back({line.substr(0, colon), line.substr(colon + 1)});
    rest.remove_prefix(eol + 2);
  }
  ws_scratch_.clear();
  if (!well_formed ||
      !http::encode_ws_accept({w.handshake->key.data(), w.handshake->key.size()}, subprotocol,
                              ws_fields_, ws_scratch_, w.handshake->extensions)
           .ok()) {
    ws_refuse_accept(*c, "WebSocket accept refused: bad subprotocol or header");
    return false;
  }
  request_record& rec = c->records.front();
  rec.status = 101;
  rec.bytes = ws_scratch_.size();
  if (log_) {
    w.log = rec.log;  // for the line at the close
  }
  append_out(*c, byte_buffer::copy_of(ws_scratch_));
  // The upgrade request is answered: it leaves the requests in flight (its
  // access-log line, status 101, is written now).
  const clock_type::time_point now = clock_type::now();
  complete_record(*c, now);
  ++c->hol_seq;
  --in_flight_total_;
  ctr_.requests_in_flight.sub();
  ctr_.responses.add();
  w.open = true;
  w.opened = now;
  w.handshake.reset();
  c->parser.release();  // no more HTTP on this connection: its parser's storage goes
  ctr_.ws_open.add();
  ctr_.ws_upgrades_accepted.add();
  unlink_timer(*c);
  maybe_resume_accept();
  if (draining_) {
    ws_send_close(*c, 1012, "server restarting");
  }
  // Frames the client sent right after its head were kept for now.
  if (c->rbeg < c->rend) {
    ws_process(*c);
  }
  settle(*c);
  return true;
}

void http_server::impl::ws_refuse_accept(connection& c, std::string_view why) {
  abandon_in_flight(c, false);
  queue_error_response(c, 500, why);
  settle(c);
}

// ------------------------------------------------------------------ reading

void http_server::impl::ws_on_readable(connection& c) {
  ws_state& w = *c.ws;
  if (c.read_eof || w.close_received || ws_reading_paused(c, opt_.ws.max_queue)) {
    return;  // paused after the wait was armed; ws_settle re-arms
  }
  if (!c.rbuf) {
    c.rbuf = take_buffer();
  }
  if (c.rend == opt_.read_buffer_size) {
    ws_settle(c);
    return;
  }
  error_code ec;
  const std::size_t n = recv_some(c, c.rbuf.get() + c.rend, opt_.read_buffer_size - c.rend, ec);
  if (would_block(ec)) {
    if (c.rbeg == c.rend) {
      c.rbeg = c.rend = 0;
      give_buffer(c);
    }
    ws_settle(c);
    return;
  }
  if (ec == asio::error::eof) {
    c.read_eof = true;
    ws_settle(c);
    return;
  }
  if (ec) {
    close_now(c);  // reset: reported as 1006
    return;
  }
  ctr_.bytes_in.add(n);
  c.rend += n;
  // Traffic from the client: the ping clock starts again.
  if (c.tkind == timer_kind::ws_ping || c.tkind == timer_kind::ws_pong) {
    unlink_timer(c);
  }
  ws_process(c);
  settle(c);
}

void http_server::impl::ws_process(connection& c) {
  while (c.phase == conn_phase::open && c.rbeg < c.rend && !c.ws->close_received &&
         !ws_reading_paused(c, opt_.ws.max_queue)) {
    std::string_view in{c.rbuf.get() + c.rbeg, c.rend - c.rbeg};
    const std::size_t before = in.size();
    const http::ws_event* e = c.ws->parser.next(in);
    c.rbeg += before - in.size();
    if (e == nullptr) {
      break;
    }
    ws_on_event(c, *e);
  }
  if (c.phase != conn_phase::open) {
    return;  // closed while handling an event
  }
  if (c.ws->close_received) {
    c.rbeg = c.rend;  // nothing after a close frame counts
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

void http_server::impl::ws_on_event(connection& c, const http::ws_event& e) {
  ws_state& w = *c.ws;
  switch (e.kind) {
    case http::ws_event_kind::text:
    case http::ws_event_kind::binary:
      ws_deliver(c, e);
      break;
    case http::ws_event_kind::ping:
      if (!w.close_sent) {
        ws_queue_frame(c, http::ws_opcode::pong, e.payload);  // never reaches the app
      }
      break;
    case http::ws_event_kind::pong:
      break;  // its arrival already restarted the ping clock
    case http::ws_event_kind::close: {
      w.close_received = true;
      if (w.close_sent) {
        ws_report(c, w.close_code, {});  // our close handshake completed
      } else {
        // RFC 6455 5.5.1: echo the code (an empty close gets an empty one).
        ws_send_close(c, e.code, {});
        ws_report(c, e.code, e.payload);
      }
      break;
    }
    case http::ws_event_kind::error:
      ws_fail(c, e.code);
      break;
  }
}

void http_server::impl::ws_deliver(connection& c, const http::ws_event& e) {
  ws_state& w = *c.ws;
  if (w.close_sent) {
    return;  // the server is closing: late messages are not handed over
  }
  const bool text = e.kind == http::ws_event_kind::text;
  std::string_view payload = e.payload;
  if (e.compressed) {
    const http::ws_inflate_status st =
        ws_inflater_for(c).decompress(payload, opt_.ws.max_message, ws_scratch_);
    if (st != http::ws_inflate_status::ok) {
      ws_fail(c, st == http::ws_inflate_status::too_big ? http::ws_close_code::message_too_big
                                                        : http::ws_close_code::invalid_payload);
      return;
    }
    payload = ws_scratch_;
    if (text && !http::is_valid_utf8(payload)) {
      ws_fail(c, http::ws_close_code::invalid_payload);
      return;
    }
  }
  byte_buffer bytes = byte_buffer::copy_of(payload);
  if (ws_scratch_.capacity() > ws_scratch_keep) {
    std::string{}.swap(ws_scratch_);
  }
  ++w.queued;
  ctr_.ws_messages_in.add();
  ctr_.ws_bytes_in.add(bytes.size());
  sink_.on_ws_message(c.id(), std::move(bytes), text);
}

http::ws_inflater& http_server::impl::ws_inflater_for(connection& c) {
  ws_state& w = *c.ws;
  if (w.deflate.client_no_context_takeover) {
    if (!ws_shared_inflater_) {
      ws_shared_inflater_ = std::make_unique<http::ws_inflater>(15, true);
    }
    return *ws_shared_inflater_;
  }
  if (!w.inflater) {
    w.inflater = std::make_unique<http::ws_inflater>(w.deflate.client_max_window_bits, false);
  }
  return *w.inflater;
}

http::ws_deflater& http_server::impl::ws_shared_deflater(int window_bits) {
  auto& d = ws_deflaters_[static_cast<std::size_t>(window_bits) & 15U];
  if (!d) {
    d = std::make_unique<http::ws_deflater>(window_bits, true);
  }
  return *d;
}

// ------------------------------------------------------------------ writing

void http_server::impl::ws_queue_frame(connection& c, http::ws_opcode op,
                                       std::string_view payload) {
  scratch_.clear();
  http::encode_ws_frame(scratch_, op, payload);
  append_out(c, byte_buffer::copy_of(scratch_));
}

void http_server::impl::ws_send_close(connection& c, std::uint16_t code, std::string_view reason) {
  ws_state& w = *c.ws;
  scratch_.clear();
  if (!http::encode_ws_close(scratch_, code, reason).ok()) {
    // A code that may not go on the wire (1006, 1015, ...): a normal close.
    scratch_.clear();
    (void)http::encode_ws_close(scratch_, http::ws_close_code::normal, reason);
  }
  append_out(c, byte_buffer::copy_of(scratch_));
  w.close_sent = true;
  w.close_code = code;
}

void http_server::impl::ws_fail(connection& c, std::uint16_t code) {
  ws_state& w = *c.ws;
  w.close_received = true;  // nothing more is read
  if (!w.close_sent) {
    ws_send_close(c, code, {});
  }
  ws_report(c, code, {});
}

void http_server::impl::ws_report(connection& c, std::uint16_t code, std::string_view reason) {
  ws_state& w = *c.ws;
  if (w.reported) {
    return;
  }
  w.reported = true;
  ctr_.ws_open.sub();
  ctr_.count_ws_close(code);
  if (log_) {
    // The close line: the close code in the status field, the message bytes
    // sent, the time since the 101.
    const auto us =
        std::chrono::duration_cast<std::chrono::microseconds>(clock_type::now() - w.opened).count();
    log_line(c, w.log, code, w.payload_out, us > 0 ? static_cast<std::uint64_t>(us) : 0);
  }
  if (c.ever_dispatched && !c.disconnect_sent) {
    sink_.on_ws_close(c.id(), code, std::string{reason});
  }
}

bool http_server::impl::ws_send(connection_id id, byte_buffer&& payload, bool text,
                                bool notify_drained) {
  connection* c = lookup(id, false);
  if (c == nullptr || !ws_active(*c) || c->ws->close_sent || c->ws->close_received) {
    ctr_.stale_messages.add();
    return false;
  }
  ws_state& w = *c->ws;
  const std::size_t size = payload.size();
  ctr_.ws_messages_out.add();
  ctr_.ws_bytes_out.add(size);
  w.payload_out += size;
  const http::ws_opcode op = text ? http::ws_opcode::text : http::ws_opcode::binary;
  bool sent = false;
  if (w.deflate_on && size >= ws_compress_min) {
    ws_scratch_.clear();
    if (ws_shared_deflater(w.deflate.server_max_window_bits)
            .compress(payload.view(), ws_scratch_) &&
        ws_scratch_.size() < size) {
      scratch_.clear();
      http::encode_ws_frame_header(scratch_, op, ws_scratch_.size());
      scratch_[0] = static_cast<char>(static_cast<unsigned char>(scratch_[0]) | 0x40U);  // RSV1
      byte_buffer frame{scratch_.size() + ws_scratch_.size()};
      std::memcpy(frame.data(), scratch_.data(), scratch_.size());
      std::memcpy(frame.data() + scratch_.size(), ws_scratch_.data(), ws_scratch_.size());
      append_out(*c, std::move(frame));
      sent = true;
    }
    if (ws_scratch_.capacity() > ws_scratch_keep) {
      std::string{}.swap(ws_scratch_);
    }
  }
  if (!sent) {
    scratch_.clear();
    http::encode_ws_frame_header(scratch_, op, size);
    if (size <= ws_copy_max) {
      byte_buffer frame{scratch_.size() + size};
      std::memcpy(frame.data(), scratch_.data(), scratch_.size());
      if (size != 0) {
        std::memcpy(frame.data() + scratch_.size(), payload.data(), size);
      }
      append_out(*c, std::move(frame));
    } else {
      append_out(*c, byte_buffer::copy_of(scratch_));
      append_out(*c,
                 std::move(payload));  // server frames are unmasked: the app's bytes as they are
    }
  }
  if (notify_drained) {
    c->drain_wanted = true;
  }
  check_drained(*c);
  return true;
}

bool http_server::impl::ws_consumed(connection_id id) {
  connection* c = lookup(id, false);
  if (c == nullptr || !ws_active(*c)) {
    ctr_.stale_messages.add();
    return false;
  }
  ws_state& w = *c->ws;
  if (w.queued > 0) {
    --w.queued;
  }
  if (w.queued < opt_.ws.max_queue && c->rbeg < c->rend) {
    ws_process(*c);  // what was read before the pause
  }
  settle(*c);
  return true;
}

bool http_server::impl::ws_close(connection_id id, std::uint16_t code, std::string_view reason) {
  connection* c = lookup(id, false);
  if (c == nullptr) {
    ctr_.stale_messages.add();
    return false;
  }
  if (!ws_active(*c)) {
    return close(id);  // not accepted: the connection just closes
  }
  ws_state& w = *c->ws;
  if (!w.close_sent && !w.close_received) {
    ws_send_close(*c, code, reason);
    settle(*c);
  }
  return true;
}

// ------------------------------------------------------------------ next step

void http_server::impl::ws_settle(connection& c) {
  ws_state& w = *c.ws;
  if (w.close_received) {
    // The close handshake is over (or failed): close TCP once our close
    // frame is written; begin_close lingers so it is not lost to a reset.
    unlink_timer(c);
    if (c.out.empty()) {
      begin_close(c);
    }
    return;
  }
  if (c.read_eof) {
    // The client stopped sending without a close frame: dropped.
    ws_report(c, w.close_sent ? w.close_code : std::uint16_t{1006}, {});
    close_now(c);
    return;
  }
  if (c.rbeg < c.rend && !ws_reading_paused(c, opt_.ws.max_queue)) {
    ws_process(c);  // frames read before a pause for unread output (ws_consumed does the app's)
    if (c.phase != conn_phase::open || w.close_received) {
      settle(c);
      return;
    }
  }
  if (!ws_reading_paused(c, opt_.ws.max_queue)) {
    arm_read(c);
  }
  // Only a full queue (the app behind) stops the ping clock; while the client
  // reads nothing it runs on, so a client gone dark is dropped.
  const bool queue_full = !w.close_sent && w.queued >= opt_.ws.max_queue;
  timer_kind want = timer_kind::none;
  if (w.close_sent) {
    want = timer_kind::ws_close;
  } else if (!queue_full && opt_.ws.ping_interval.count() > 0) {
    want = c.tkind == timer_kind::ws_pong ? timer_kind::ws_pong : timer_kind::ws_ping;
  } else if (queue_full && c.unsent != 0) {
    // The app waits on a client that reads none of its output (its send()
    // for the drain, so it takes no message): write_timeout cuts it.
    want = timer_kind::write;
  }
  if (want != c.tkind) {
    unlink_timer(c);
    if (want != timer_kind::none) {
      link_timer(c, want);
    }
  }
}

void http_server::impl::ws_expire(connection& c, timer_kind k) {
  if (!ws_active(c) || c.phase != conn_phase::open) {
    close_now(c);
    return;
  }
  ws_state& w = *c.ws;
  switch (k) {
    case timer_kind::ws_ping:
      ws_queue_frame(c, http::ws_opcode::ping, {});
      link_timer(c, opt_.ws.ping_timeout.count() > 0 ? timer_kind::ws_pong : timer_kind::ws_ping);
      break;
    case timer_kind::ws_pong:
      ctr_.timeouts.add();
      ws_report(c, 1006, {});  // silent after a ping: dropped
      close_now(c);
      break;
    default:
      ws_report(c, w.close_code, {});  // no close frame in time: the close is ours
      close_now(c);
      break;
  }
}

void http_server::impl::ws_release(connection& c) {
  ws_state& w = *c.ws;
  if (!w.open) {
    ctr_.ws_upgrades_not_accepted.add();
    return;
  }
  ws_report(c, w.close_sent ? w.close_code : std::uint16_t{1006}, {});
}

}  // namespace cadeloop::net
