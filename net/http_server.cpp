#include "cadeloop/net/http_server.hpp"

#include <cadeloop/http/date_cache.hpp>
#include <cadeloop/http/request_parser.hpp>
#include <cadeloop/http/response_encoder.hpp>

#include <boost/asio/buffer.hpp>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include "fifo.hpp"
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace cadeloop::net {

namespace asio = boost::asio;

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
using socket_type = asio::generic::stream_protocol::socket;
using clock_type = std::chrono::steady_clock;
using error_code = boost::system::error_code;

namespace {

enum class conn_phase : std::uint8_t { free, open, lingering };

// Which deadline a connection waits for. Every connection in one list has the
// same timeout, so deadlines grow along a list and it is kept in insertion
// order: insert at the tail, expire from the head, remove from anywhere, all O(1).
enum class timer_kind : std::uint8_t { none = 0, head = 1, idle = 2, linger = 3 };
constexpr std::size_t timer_kind_count = 4;

// writev takes at most this many pieces per call (Asio's own limit as well).
constexpr std::size_t max_write_pieces = 64;
// Accepts per readiness of a listener, so one busy listener cannot starve the loop.
constexpr std::size_t accepts_per_wake = 64;
// Idle read buffers kept for reuse.
constexpr std::size_t read_buffer_pool_max = 256;

bool would_block(const error_code& ec) noexcept {
  return ec == asio::error::would_block || ec == asio::error::try_again;
}

// What the server remembers of one request in flight until its response
// ends: for the latency histogram, the status class and the access log.
struct request_record {
  clock_type::time_point dispatched{};  // when the head was handed to the app
  std::uint64_t bytes = 0;              // response bytes the app sent for it
  std::uint16_t status = 0;             // as carried by send_flags::status
  std::string log;                      // access_log::capture()'s fields ("" when the log is off)
};

// A response for a request behind the head of the line: held until every
// earlier response is finished.
struct later_response {
  std::vector<byte_buffer> parts;
  bool ended = false;
  bool keep_alive = true;
};

struct connection {
  connection(std::uint32_t s, const http::request_limits& limits) : slot{s}, parser{limits} {}

  [[nodiscard]] connection_id id() const noexcept { return {slot, generation}; }
  [[nodiscard]] std::uint32_t in_flight() const noexcept { return next_seq - hol_seq; }

  // Everything but identity, parser pools and the socket back to a fresh connection.
  void reset(std::uint32_t max_pipelined) noexcept {
    parser.reset();
    parser.set_credit(max_pipelined);
    rbeg = rend = 0;
    read_armed = read_eof = parser_paused = drain_probed = false;
    no_more_requests = stop_dispatch = last_request = skipping = false;
    ever_dispatched = disconnect_sent = wrote_any = false;
    body_unacked = 0;
    next_seq = hol_seq = 0;
    body_open = false;
    body_seq = 0;
    hol_started = false;
    error_status = 0;
    error_reason = {};
    later.clear();
    records.clear();
    out.clear();
    out_offset = 0;
    unsent = 0;
    write_armed = dirty = drain_wanted = false;
    lingered = 0;
    client_text.clear();
  }

  std::uint32_t slot;
  std::uint32_t generation = 1;
  conn_phase phase = conn_phase::free;
  std::optional<socket_type> socket;
  socket_address client;
  socket_address server;
  std::string client_text;  // client.to_string(), made when the access log first needs it
  http::request_parser parser;

  // Read side. Unparsed bytes stay in [rbeg, rend) only while the parser is
  // paused for credit; otherwise the buffer is empty (and back in the pool).
  std::unique_ptr<char[]> rbuf;
  std::size_t rbeg = 0;
  std::size_t rend = 0;
  bool read_armed = false;
  bool read_eof = false;
  bool drain_probed = false;  // the drain looked for bytes already sent before closing it idle
  bool parser_paused = false;
  bool no_more_requests = false;  // parse nothing more; close when the in-flight responses are written
  bool stop_dispatch = false;     // heads parsed from now on are not handed to the app
  bool last_request = false;      // the request being received is the last one (drain)
  bool skipping = false;          // events of a head that was not dispatched
  bool ever_dispatched = false;   // the app knows this connection: it gets one disconnect
  bool disconnect_sent = false;
  bool wrote_any = false;
  std::uint64_t body_unacked = 0;

  // Requests: [hol_seq, next_seq) are in flight; hol_seq is the head of the line.
  std::uint32_t next_seq = 0;
  std::uint32_t hol_seq = 0;
  bool body_open = false;  // body events of request body_seq are still coming
  std::uint32_t body_seq = 0;
  bool hol_started = false;  // bytes of the head-of-line response are queued
  std::uint16_t error_status = 0;  // an error to answer once nothing is in flight
  std::string_view error_reason{};
  fifo<later_response> later;  // index i is request hol_seq + 1 + i
  fifo<request_record> records;  // one per request in flight: index i is request hol_seq + i

  // Write side: out holds the bytes in wire order; the first one is written
  // from out_offset. unsent counts out and later.
  fifo<byte_buffer> out;
  std::size_t out_offset = 0;
  std::uint64_t unsent = 0;
  bool write_armed = false;
  bool dirty = false;
  bool drain_wanted = false;
  std::uint64_t lingered = 0;

  // Deadline list membership.
  timer_kind tkind = timer_kind::none;
  clock_type::time_point deadline{};
  connection* tprev = nullptr;
  connection* tnext = nullptr;
};

bool has_body(const http::request_head& head) noexcept {
  switch (head.framing()) {
    case http::body_framing::none:
      return false;
    case http::body_framing::content_length:
      return head.content_length() != 0;
    case http::body_framing::chunked:
      return true;
  }
  return false;
}

}  // namespace

class http_server::impl {
 public:
  impl(asio::io_context& io, event_sink& sink, server_options options, server_counters& counters)
      : io_{io},
        sink_{sink},
        opt_{std::move(options)},
        ctr_{counters},
        accept_retry_{io},
        discard_{std::make_unique_for_overwrite<char[]>(discard_size)},
        timer_{io} {
    opt_.max_pipelined = std::max<std::uint32_t>(opt_.max_pipelined, 1);
    opt_.read_buffer_size = std::max<std::size_t>(opt_.read_buffer_size, 1024);
    if (opt_.access_log.enabled) {
      log_ = std::make_unique<access_log>(opt_.access_log);
    }
  }

  ~impl() {
    // No sink calls from a destructor: the sink may be half gone.
    for (auto& c : conns_) {
      if (c->socket) {
        error_code ec;
        c->socket->close(ec);
      }
    }
  }

  void add_listener(std::unique_ptr<listener> l) {
    listeners_.push_back(std::make_unique<listener_state>());
    listeners_.back()->l = std::move(l);
    arm_accept(*listeners_.back());
  }

  std::string listener_description() const {
    std::string out;
    for (const auto& ls : listeners_) {
      if (!out.empty()) {
        out += ", ";
      }
      out += ls->l->description();
    }
    return out;
  }

  // ------------------------------------------------------------ app commands

  bool send(connection_id id, std::uint32_t seq, byte_buffer&& bytes, send_flags flags) {
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
      if (c->later.size() < index) {
        c->later.resize(index);
      }
      later_response& r = c->later[index - 1];
      if (r.ended) {
        ctr_.stale_messages.add();
        return false;
      }
      if (!bytes.empty()) {
        c->unsent += bytes.size();
        ctr_.unsent_bytes.add(bytes.size());
        r.parts.push_back(std::move(bytes));
      }
      if (flags.end_of_response) {
        r.ended = true;
        r.keep_alive = flags.keep_alive;
      }
    }
    if (c->phase == conn_phase::open) {
      check_drained(*c);
      settle(*c);
    }
    return true;
  }

  bool consume(connection_id id, std::uint64_t bytes) {
    connection* c = lookup(id, false);
    if (c == nullptr) {
      ctr_.stale_messages.add();
      return false;
    }
    c->body_unacked -= std::min(bytes, c->body_unacked);
    settle(*c);
    return true;
  }

  bool close(connection_id id) {
    connection* c = lookup(id, false);
    if (c == nullptr) {
      ctr_.stale_messages.add();
      return false;
    }
    abandon_in_flight(*c, false);
    c->no_more_requests = true;
    settle(*c);
    return true;
  }

  bool abort(connection_id id) {
    connection* c = lookup(id, true);
    if (c == nullptr) {
      ctr_.stale_messages.add();
      return false;
    }
    close_now(*c);
    return true;
  }

  void recycle_head(connection_id id, std::unique_ptr<http::request_head> head) {
    if (connection* c = lookup(id, true); c != nullptr && head) {
      c->parser.recycle_head(std::move(head));
    }
  }

  // ------------------------------------------------------------ writes

  void flush_writes() {
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
      if (!c->write_armed && !c->out.empty()) {
        write_once(*c);
      }
    }
    dirty_swap_.clear();
  }

  [[nodiscard]] bool has_dirty() const noexcept { return !dirty_.empty(); }

  // ------------------------------------------------------------ lifecycle

  void begin_drain() {
    if (draining_) {
      return;
    }
    draining_ = true;
    for (auto& ls : listeners_) {
      ls->l->close();
    }
    for (auto& c : conns_) {
      if (c->phase == conn_phase::open) {
        settle(*c);
      }
    }
  }

  void abort_all() {
    for (auto& c : conns_) {
      if (c->phase != conn_phase::free) {
        close_now(*c);
      }
    }
  }

  [[nodiscard]] std::size_t connection_count() const noexcept { return open_count_; }

 private:
  struct listener_state {
    std::unique_ptr<listener> l;
    bool armed = false;
  };
  struct deadline_list {
    connection* head = nullptr;
    connection* tail = nullptr;
  };
  static constexpr std::size_t discard_size = 16 * 1024;

  // ------------------------------------------------------------ lookup

  // The connection `id` names, or nullptr when it is gone. Lingering
  // connections only answer when `lingering_ok` (the app already got its
  // disconnect; its late messages are stale).
  connection* lookup(connection_id id, bool lingering_ok) noexcept {
    if (id.slot >= conns_.size()) {
      return nullptr;
    }
    connection* c = conns_[id.slot].get();
    if (c->generation != id.generation || c->phase == conn_phase::free ||
        (c->phase == conn_phase::lingering && !lingering_ok)) {
      return nullptr;
    }
    return c;
  }

  // ------------------------------------------------------------ accepting

  [[nodiscard]] bool budget_spent() const noexcept {
    return open_count_ >= opt_.max_connections || in_flight_total_ >= opt_.max_requests_in_flight;
  }

  void arm_accept(listener_state& ls) {
    if (ls.armed || draining_ || accept_paused_ || accept_backoff_ || !ls.l->acceptor().is_open()) {
      return;
    }
    ls.armed = true;
    ls.l->acceptor().async_wait(asio::socket_base::wait_read, [this, &ls](const error_code& ec) {
      ls.armed = false;
      if (ec) {
        return;  // operation_aborted: closed for the drain; anything else: the listener is broken
      }
      on_acceptable(ls);
    });
  }

  void on_acceptable(listener_state& ls) {
    for (std::size_t i = 0; i < accepts_per_wake && !draining_; ++i) {
      if (budget_spent()) {
        // Resumed by maybe_resume_accept() when a connection closes or a response ends.
        accept_paused_ = true;
        ctr_.accept_pauses.add();
        return;
      }
      socket_type peer{io_};
      error_code ec;
      ls.l->acceptor().accept(peer, ec);
      if (would_block(ec)) {
        break;
      }
      if (ec) {
        if (ec == asio::error::connection_aborted) {
          continue;
        }
        // Out of descriptors or memory: retrying at once would spin. Back off.
        accept_backoff_ = true;
        accept_retry_.expires_after(std::chrono::milliseconds{50});
        accept_retry_.async_wait([this](const error_code& wait_ec) {
          accept_backoff_ = false;
          if (!wait_ec) {
            resume_accepting();
          }
        });
        return;
      }
      open_connection(std::move(peer), ls.l->is_tcp());
    }
    arm_accept(ls);
  }

  void resume_accepting() {
    for (auto& ls : listeners_) {
      arm_accept(*ls);
    }
  }

  void maybe_resume_accept() {
    if (accept_paused_ && !budget_spent() && !draining_) {
      accept_paused_ = false;
      resume_accepting();
    }
  }

  void open_connection(socket_type peer, bool tcp) {
    error_code ec;
    peer.non_blocking(true, ec);
    if (ec) {
      return;
    }
    if (tcp) {
      const int one = 1;
      ::setsockopt(peer.native_handle(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    std::uint32_t slot = 0;
    if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
    } else {
      slot = static_cast<std::uint32_t>(conns_.size());
      conns_.push_back(std::make_unique<connection>(slot, opt_.limits));
      conns_.back()->parser.use_pool(&head_pool_);
    }
    connection& c = *conns_[slot];
    c.reset(opt_.max_pipelined);
    const auto remote = peer.remote_endpoint(ec);
    c.client = ec ? socket_address{} : socket_address::from_sockaddr(remote.data(), remote.size());
    const auto local = peer.local_endpoint(ec);
    c.server = ec ? socket_address{} : socket_address::from_sockaddr(local.data(), local.size());
    c.socket.emplace(std::move(peer));
    c.phase = conn_phase::open;
    ++open_count_;
    ctr_.connections_accepted.add();
    ctr_.connections_open.add();
    settle(c);
  }

  // ------------------------------------------------------------ reading

  [[nodiscard]] bool want_read(const connection& c) const noexcept {
    return c.phase == conn_phase::open && !c.read_eof && !c.no_more_requests && !c.parser_paused &&
           c.error_status == 0 && c.body_unacked <= opt_.body_window;
  }

  // Waits for readability rather than reading into a buffer: an idle
  // connection holds no read buffer, and not re-arming is how reading stops
  // (the kernel's receive window then pushes back on the client).
  void arm_read(connection& c) {
    if (c.read_armed) {
      return;
    }
    c.read_armed = true;
    const connection_id id = c.id();
    c.socket->async_wait(asio::socket_base::wait_read, [this, id](const error_code& ec) { on_readable(id, ec); });
  }

  void on_readable(connection_id id, const error_code& ec) {
    connection* c = lookup(id, true);
    if (c == nullptr) {
      return;  // closed meanwhile (the wait completed with operation_aborted)
    }
    c->read_armed = false;
    if (ec) {
      close_now(*c);
      return;
    }
    if (c->phase == conn_phase::lingering) {
      linger_read(*c);
      return;
    }
    if (!want_read(*c)) {
      return;  // reading was paused after the wait was armed; settle() re-arms
    }
    read_available(*c);
  }

  // One non-blocking read and what follows from it (parsing, settling).
  void read_available(connection& c) {
    if (!c.rbuf) {
      c.rbuf = take_buffer();
    }
    error_code read_ec;
    const std::size_t n =
        c.socket->read_some(asio::buffer(c.rbuf.get() + c.rend, opt_.read_buffer_size - c.rend), read_ec);
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
    process_input(c);
    settle(c);
  }

  void linger_read(connection& c) {
    error_code ec;
    const std::size_t n = c.socket->read_some(asio::buffer(discard_.get(), discard_size), ec);
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

  std::unique_ptr<char[]> take_buffer() {
    if (!buffer_pool_.empty()) {
      auto b = std::move(buffer_pool_.back());
      buffer_pool_.pop_back();
      return b;
    }
    return std::make_unique_for_overwrite<char[]>(opt_.read_buffer_size);
  }

  void give_buffer(connection& c) {
    if (c.rbuf && buffer_pool_.size() < read_buffer_pool_max) {
      buffer_pool_.push_back(std::move(c.rbuf));
    }
    c.rbuf.reset();
  }

  void process_input(connection& c) {
    while (c.phase == conn_phase::open && !c.no_more_requests && c.rbeg < c.rend) {
      const std::string_view input{c.rbuf.get() + c.rbeg, c.rend - c.rbeg};
      const http::feed_result r = c.parser.feed(input);
      c.parser_paused = false;
      dispatch_events(c);
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
        case http::feed_status::upgraded:
          // A non-persistent request (or an upgrade, whose codec is not wired
          // yet): its response is the last; what follows is ignored.
          c.no_more_requests = true;
          c.rbeg = c.rend;
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

  void dispatch_events(connection& c) {
    const std::span<const http::parse_event> events = c.parser.events();
    for (std::size_t i = 0; i < events.size(); ++i) {
      const http::parse_event& ev = events[i];
      switch (ev.kind) {
        case http::parse_event_kind::head:
          dispatch_head(c, ev);
          break;
        case http::parse_event_kind::body: {
          // One buffer for the run of body pieces this feed produced.
          std::size_t j = i;
          std::size_t total = 0;
          while (j < events.size() && events[j].kind == http::parse_event_kind::body) {
            total += events[j].body.size();
            ++j;
          }
          const bool complete = j < events.size() && events[j].kind == http::parse_event_kind::message_complete;
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

  void dispatch_head(connection& c, const http::parse_event& ev) {
    if (c.stop_dispatch) {
      c.skipping = true;  // parsed behind the last request: never answered
      return;
    }
    c.skipping = false;
    const bool body = has_body(*ev.head);
    request_info info{c.client, c.server, body, draining_, false};
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
    c.records.back().dispatched = clock_type::now();
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

  void emit_body(connection& c, std::span<const http::parse_event> pieces, std::size_t total, bool more_body) {
    if (c.body_seq - c.hol_seq >= c.in_flight()) {
      return;  // its response is already finished: nobody reads this body
    }
    byte_buffer bytes{total};
    std::size_t at = 0;
    for (const http::parse_event& p : pieces) {
      if (!p.body.empty()) {
        std::memcpy(bytes.data() + at, p.body.data(), p.body.size());
        at += p.body.size();
      }
    }
    sink_.on_body(c.id(), c.body_seq, std::move(bytes), more_body);
    c.body_unacked += total;
  }

  void on_message_complete(connection& c, bool body_sent) {
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

  void on_parse_error(connection& c) {
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
  }

  // ------------------------------------------------------------ responses

  void append_out(connection& c, byte_buffer&& bytes) {
    c.unsent += bytes.size();
    ctr_.unsent_bytes.add(bytes.size());
    c.out.push_back(std::move(bytes));
    c.wrote_any = true;
    mark_dirty(c);
  }

  void queue_error_response(connection& c, std::uint16_t status, std::string_view reason) {
    ctr_.count_status(status);
    scratch_.clear();
    append_error_response(status, reason, dates_, opt_.server_header, scratch_);
    if (log_) {
      log_line(c, {}, status, scratch_.size(), 0);
    }
    append_out(c, byte_buffer::copy_of(scratch_));
    c.error_status = 0;
    c.no_more_requests = true;
  }

  // The head-of-line response finished: move on to the next request, whose
  // response may already be waiting (pipelining), and give the parser credit.
  void finish_hol(connection& c, bool keep_alive) {
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
        process_input(c);
      } else {
        // Paused at the end of the input, with nothing kept: the credit is
        // back, so reading resumes (the parser resumes at its next feed).
        c.parser_paused = false;
      }
    }
  }

  // The head-of-line response ended: its status class, its latency.
  void complete_record(connection& c, clock_type::time_point now) {
    if (c.records.empty()) {
      return;
    }
    const request_record& rec = c.records.front();
    ctr_.count_status(rec.status);
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(now - rec.dispatched).count();
    const std::uint64_t duration = us > 0 ? static_cast<std::uint64_t>(us) : 0;
    ctr_.latency.record(duration);
    if (log_) {
      log_line(c, rec.log, rec.status, rec.bytes, duration);
    }
    c.records.pop_front();
  }

  // Queues one access-log line; a full queue drops it (counted), never waits.
  void log_line(connection& c, std::string_view captured, unsigned status, std::uint64_t bytes,
                std::uint64_t duration_us) {
    if (c.client_text.empty()) {
      c.client_text = c.client.to_string();
    }
    if (const std::size_t dropped = log_->write(captured, c.client_text, status, bytes, duration_us); dropped != 0) {
      ctr_.access_log_dropped.add(dropped);
    }
  }

  // Forgets every request in flight (their responses will be dropped as stale).
  void abandon_in_flight(connection& c, bool send_disconnect) {
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

  void check_drained(connection& c) {
    if (c.drain_wanted && c.unsent <= opt_.drain_low_mark) {
      c.drain_wanted = false;
      if (!c.disconnect_sent) {
        sink_.on_drained(c.id(), c.unsent);
      }
    }
  }

  void mark_dirty(connection& c) {
    if (!c.dirty && !c.write_armed) {
      c.dirty = true;
      dirty_.push_back(c.id());
    }
  }

  void arm_write(connection& c) {
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
  void write_once(connection& c) {
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
    error_code ec;
    std::size_t n = c.socket->write_some(iov_, ec);
    ctr_.write_calls.add();
    if (would_block(ec)) {
      n = 0;
    } else if (ec) {
      close_now(c);  // broken pipe, reset: the client is gone
      return;
    }
    ctr_.bytes_out.add(n);
    c.unsent -= n;
    ctr_.unsent_bytes.sub(n);
    while (n > 0) {
      const std::size_t left = c.out.front().size() - c.out_offset;
      if (n >= left) {
        n -= left;
        c.out.pop_front();
        c.out_offset = 0;
      } else {
        c.out_offset += n;
        n = 0;
      }
    }
    if (!c.out.empty()) {
      arm_write(c);
    }
    check_drained(c);
    settle(c);
  }

  // ------------------------------------------------------------ closing

  // Every decision about a connection's next step is made here, after each
  // event that may change it, so the rules live in one place.
  void settle(connection& c) {
    if (c.phase != conn_phase::open) {
      return;
    }
    if (c.error_status != 0 && c.in_flight() == 0) {
      queue_error_response(c, c.error_status, c.error_reason);
    }
    if (c.read_eof && !c.no_more_requests && c.rbeg == c.rend) {
      if (c.parser.mid_message()) {
        close_now(c);  // EOF inside a request: drop it (the app, if it had the head, gets a disconnect)
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
      }
      return;  // otherwise the last write calls settle() again
    }
    if (draining_ && c.in_flight() == 0 && c.out.empty() && !c.parser.mid_message() && c.rbeg == c.rend) {
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
  void begin_close(connection& c) {
    if (!c.wrote_any || c.read_eof) {
      close_now(c);
      return;
    }
    // Shut our side and keep reading a little: closing with unread input
    // would send a reset that can destroy the response before the client
    // reads it (a 413 answered before the body was read, for instance).
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

  void close_now(connection& c) {
    if (c.phase == conn_phase::free) {
      return;
    }
    unlink_timer(c);
    if (c.socket) {
      error_code ec;
      c.socket->close(ec);  // pending waits complete with operation_aborted; their ids are stale by then
      c.socket.reset();
    }
    const std::uint32_t n = c.in_flight();
    in_flight_total_ -= n;
    ctr_.requests_in_flight.sub(n);
    ctr_.unsent_bytes.sub(c.unsent);
    const connection_id id = c.id();
    const bool tell = c.ever_dispatched && !c.disconnect_sent;
    give_buffer(c);
    c.reset(opt_.max_pipelined);
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

  // ------------------------------------------------------------ deadlines

  [[nodiscard]] clock_type::duration timeout_of(timer_kind k) const noexcept {
    switch (k) {
      case timer_kind::head:
        return opt_.request_line_timeout;
      case timer_kind::idle:
        return opt_.keepalive_idle;
      case timer_kind::linger:
        return opt_.linger_timeout;
      case timer_kind::none:
        break;
    }
    return {};
  }

  void update_timer(connection& c) {
    timer_kind want = timer_kind::none;
    if (c.in_flight() == 0 && c.unsent == 0 && !c.no_more_requests && c.error_status == 0) {
      want = c.parser.mid_message() || c.rbeg != c.rend ? timer_kind::head : timer_kind::idle;
    }
    if (want != c.tkind) {
      unlink_timer(c);
      if (want != timer_kind::none) {
        link_timer(c, want);
      }
    }
  }

  void link_timer(connection& c, timer_kind k) {
    deadline_list& l = lists_[static_cast<std::size_t>(k)];
    c.tkind = k;
    c.deadline = clock_type::now() + timeout_of(k);
    c.tprev = l.tail;
    c.tnext = nullptr;
    if (l.tail != nullptr) {
      l.tail->tnext = &c;
    } else {
      l.head = &c;
    }
    l.tail = &c;
    arm_timer(c.deadline);
  }

  void unlink_timer(connection& c) {
    if (c.tkind == timer_kind::none) {
      return;
    }
    deadline_list& l = lists_[static_cast<std::size_t>(c.tkind)];
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
  }

  // One Asio timer for all connections, set to the earliest deadline. It is
  // moved only when a new deadline is earlier than the one it waits for; a
  // deadline that was removed meanwhile just makes it fire early.
  void arm_timer(clock_type::time_point at) {
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

  void on_timer() {
    const auto now = clock_type::now();
    for (std::size_t k = 1; k < timer_kind_count; ++k) {
      deadline_list& l = lists_[k];
      while (l.head != nullptr && l.head->deadline <= now) {
        connection& c = *l.head;
        unlink_timer(c);
        expire(c, static_cast<timer_kind>(k));
      }
    }
    for (std::size_t k = 1; k < timer_kind_count; ++k) {
      if (lists_[k].head != nullptr) {
        arm_timer(lists_[k].head->deadline);
      }
    }
  }

  void expire(connection& c, timer_kind k) {
    switch (k) {
      case timer_kind::head:
        // A head trickling in for too long while nothing is in flight: 408.
        ctr_.timeouts.add();
        queue_error_response(c, 408, "request head not received in time");
        settle(c);
        break;
      case timer_kind::idle:
        ctr_.timeouts.add();
        close_now(c);
        break;
      case timer_kind::linger:
      case timer_kind::none:
        close_now(c);
        break;
    }
  }

  asio::io_context& io_;
  event_sink& sink_;
  server_options opt_;
  server_counters& ctr_;
  std::unique_ptr<access_log> log_;  // null when the access log is off
  http::date_cache dates_;

  // Spare request heads for every connection's parser; declared before the
  // connections, so it outlives them.
  http::head_pool head_pool_;
  std::vector<std::unique_ptr<connection>> conns_;
  std::vector<std::uint32_t> free_slots_;
  std::size_t open_count_ = 0;
  std::uint64_t in_flight_total_ = 0;

  std::vector<std::unique_ptr<listener_state>> listeners_;
  bool draining_ = false;
  bool accept_paused_ = false;
  bool accept_backoff_ = false;
  asio::steady_timer accept_retry_;

  std::vector<connection_id> dirty_;
  std::vector<connection_id> dirty_swap_;
  std::vector<asio::const_buffer> iov_;
  std::vector<std::unique_ptr<char[]>> buffer_pool_;
  std::unique_ptr<char[]> discard_;
  std::string scratch_;

  std::array<deadline_list, timer_kind_count> lists_{};
  asio::steady_timer timer_;
  bool timer_armed_ = false;
  clock_type::time_point timer_at_{};
  std::uint64_t timer_epoch_ = 0;
};

http_server::http_server(asio::io_context& io, event_sink& sink, server_options options, server_counters& counters)
    : impl_{std::make_unique<impl>(io, sink, std::move(options), counters)} {}

http_server::~http_server() = default;

void http_server::add_listener(std::unique_ptr<listener> l) { impl_->add_listener(std::move(l)); }

bool http_server::send(connection_id conn, std::uint32_t request, byte_buffer&& bytes, send_flags flags) {
  return impl_->send(conn, request, std::move(bytes), flags);
}

bool http_server::consume(connection_id conn, std::uint64_t bytes) { return impl_->consume(conn, bytes); }

bool http_server::close(connection_id conn) { return impl_->close(conn); }

bool http_server::abort(connection_id conn) { return impl_->abort(conn); }

void http_server::recycle_head(connection_id conn, std::unique_ptr<http::request_head> head) {
  impl_->recycle_head(conn, std::move(head));
}

void http_server::flush_writes() { impl_->flush_writes(); }

void http_server::begin_drain() { impl_->begin_drain(); }

void http_server::abort_all() { impl_->abort_all(); }

std::size_t http_server::connection_count() const noexcept { return impl_->connection_count(); }

bool http_server::has_dirty() const noexcept { return impl_->has_dirty(); }

std::string http_server::listener_description() const { return impl_->listener_description(); }

}  // namespace cadeloop::net
