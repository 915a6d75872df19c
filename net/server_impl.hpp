// Private to net/: class http_server::impl, the HTTP/1.1 server of one I/O
// thread. Its parts live in separate files: http_server.cpp (the facade, app
// commands, drain), server_accept.cpp (accepting), server_read.cpp (reading,
// parsing, dispatch to the app), server_write.cpp (responses in request
// order, writes), server_close.cpp (the settle() rules, closing, deadlines).
// Every member runs on the server's I/O thread.
#pragma once

#include "conn_poller.hpp"
#include "server_connection.hpp"

#include <cadeloop/http/date_cache.hpp>
#include <cadeloop/http/request_parser.hpp>
#include <cadeloop/net/access_log.hpp>
#include <cadeloop/net/http_server.hpp>
#include <cadeloop/net/listener.hpp>
#include <cadeloop/net/tls_context.hpp>

#include <sys/socket.h>

#include <boost/asio/buffer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cadeloop::net {

class http_server::impl {
 public:
  void set_block_sink(http_server::block_sink give, void* ctx) noexcept {
    block_sink_ = give;
    block_ctx_ = ctx;
  }
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
    if (opt_.tls.enabled()) {
      tls_ = tls_context::shared(opt_.tls);
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

  void add_listener(std::unique_ptr<listener> l);
  std::string listener_description() const;

  // ------------------------------------------------------------ app commands

  bool send(connection_id id, std::uint32_t seq, byte_buffer&& bytes, send_flags flags);
  bool send_file(connection_id id, std::uint32_t seq, std::unique_ptr<file_part> file,
                 std::uint64_t length);  // server_pathsend.cpp
  bool consume(connection_id id, std::uint64_t bytes);
  bool ws_accept(connection_id id, std::uint32_t request, std::string_view subprotocol,
                 std::string_view extra_headers);
  bool ws_send(connection_id id, byte_buffer&& payload, bool text, bool notify_drained);
  bool ws_consumed(connection_id id);
  bool ws_close(connection_id id, std::uint16_t code, std::string_view reason);
  bool close(connection_id id);
  bool abort(connection_id id);
  void recycle_head(connection_id id, std::unique_ptr<http::request_head> head);

  // ------------------------------------------------------------ writes

  void flush_writes();

  [[nodiscard]] bool has_dirty() const noexcept { return !dirty_.empty(); }
  [[nodiscard]] int reactor_descriptor() const noexcept { return reactor_fd_of(io_); }
  [[nodiscard]] bool has_ready_handlers() const noexcept { return net::has_ready_handlers(io_); }

  // ------------------------------------------------------------ lifecycle

  void begin_drain();
  void abort_all();
  void pause_listening();   // server_accept.cpp
  void resume_listening();  // server_accept.cpp

  [[nodiscard]] std::size_t connection_count() const noexcept { return open_count_; }

 private:
  struct listener_state {
    std::unique_ptr<listener> l;
    bool armed = false;
    // Its address while pause_listening() holds it shut down (see server_accept.cpp).
    sockaddr_storage paused_address{};
    socklen_t paused_length = 0;
    // Whether its accepted sockets come with TCP_NODELAY (Linux copies it
    // from the listener, where open_listener sets it): learnt from the first
    // one; until then, and when not, each gets its own setsockopt.
    enum class nodelay_kind : std::uint8_t { unknown, inherited, set_each } nodelay =
        nodelay_kind::unknown;
  };
  struct deadline_list {
    connection* head = nullptr;
    connection* tail = nullptr;
  };
  static constexpr std::size_t discard_size = 16 * 1024;
  // Pending output below this is never cut by the memory budget
  // (server_budget.cpp): cutting it would free next to nothing.
  static constexpr std::uint64_t budget_worth_cutting = 16 * 1024;

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

  // Requests in flight that are not waiting for their client's body: a
  // request whose body does not come costs the app a waiting coroutine, not
  // work, so it does not stop accepting (body_timeout ends it).
  [[nodiscard]] std::uint64_t busy_in_flight() const noexcept {
    return in_flight_total_ > body_waiting_ ? in_flight_total_ - body_waiting_ : 0;
  }

  [[nodiscard]] bool budget_spent() const noexcept {
    return open_count_ >= opt_.max_connections || busy_in_flight() >= opt_.max_requests_in_flight;
  }

  void arm_accept(listener_state& ls);
  void on_acceptable(listener_state& ls);
  void resume_accepting();

  void maybe_resume_accept() {
    if (accept_paused_ && !budget_spent() && !draining_) {
      accept_paused_ = false;
      resume_accepting();
    }
  }

  void open_connection(int fd, const sockaddr_storage& peer, socklen_t peer_length,
                       listener_state& ls);

  // ------------------------------------------------------------ reading

  [[nodiscard]] bool want_read(const connection& c) const noexcept {
    return c.phase == conn_phase::open && !c.read_eof && !c.no_more_requests && !c.parser_paused &&
           c.error_status == 0 && c.body_unacked <= opt_.body_window;
  }

  // Waits for readability rather than reading into a buffer: an idle
  // connection holds no read buffer, and not re-arming is how reading stops
  // (the kernel's receive window then pushes back on the client).
  void arm_read(connection& c);
  void on_readable(connection_id id, const error_code& ec);
  // (conn_poller.hpp's user, server_read.cpp) Plain connections: readiness
  // from a read wait of our own and FINs from our own set; `rd_ready`
  // remembers an edge until a short read (or EAGAIN) shows the socket drained.
  static void on_polled(void* self, std::span<const epoll_event> events);
  static void on_socket_ready(void* self, std::uint64_t key);
  void take_polled(connection_id id);
  // An edge (or the peer's FIN) on a polled connection: read now if reading waits.
  void socket_ready(connection& c);
  void readable(connection& c);

  // One non-blocking read and what follows from it (parsing, settling).
  void read_available(connection& c);
  void linger_read(connection& c);
  std::unique_ptr<char[]> take_buffer();
  void give_buffer(connection& c);
  /// Parses what c's buffer holds and dispatches it; `now`: when it was read
  /// (the dispatch time of its requests, for their latency).
  void process_input(connection& c, clock_type::time_point now);
  void dispatch_events(connection& c, clock_type::time_point now);
  void dispatch_head(connection& c, const http::parse_event& ev, clock_type::time_point now);
  void emit_body(connection& c, std::span<const http::parse_event> pieces, std::size_t total,
                 bool more_body);
  byte_buffer lend_read_buffer(connection& c, std::span<const http::parse_event> pieces,
                               std::size_t total);
  void on_message_complete(connection& c, bool body_sent);
  void on_parse_error(connection& c);

  // ------------------------------------------------------------ responses

  void append_out(connection& c, byte_buffer&& bytes);
  // The held response of request hol_seq + index (index >= 1), made on first
  // use; nullptr (counted stale) when that response already ended.
  later_response* later_slot(connection& c, std::uint32_t index);
  void queue_error_response(connection& c, std::uint16_t status, std::string_view reason);

  // The head-of-line response finished: move on to the next request, whose
  // response may already be waiting (pipelining), and give the parser credit.
  void finish_hol(connection& c, bool keep_alive);

  // The head-of-line response ended: its status class, its latency.
  void complete_record(connection& c, clock_type::time_point now);

  // Queues one access-log line; a full queue drops it (counted), never waits.
  void log_line(connection& c, std::string_view captured, unsigned status, std::uint64_t bytes,
                std::uint64_t duration_us);

  // Forgets every request in flight (their responses will be dropped as stale).
  void abandon_in_flight(connection& c, bool send_disconnect);
  void check_drained(connection& c);

  void mark_dirty(connection& c) {
    if (!c.dirty && !c.write_armed) {
      c.dirty = true;
      dirty_.push_back(c.id());
    }
  }

  void arm_write(connection& c);

  // One writev of as much pending output as fits; the rest waits for writability.
  void write_once(connection& c);
  // Sends from the head-of-line file once `out` is written (server_pathsend.cpp);
  // false when the connection was closed.
  bool pump_file(connection& c);

  // ------------------------------------------------------------ closing

  // Every decision about a connection's next step is made here, after each
  // event that may change it, so the rules live in one place.
  void settle(connection& c);

  // Graceful end after the last byte was written.
  void begin_close(connection& c);
  void close_now(connection& c);

  // ------------------------------------------------------------ deadlines

  [[nodiscard]] clock_type::duration timeout_of(timer_kind k) const noexcept {
    switch (k) {
      case timer_kind::head:
        return opt_.request_line_timeout;
      case timer_kind::idle:
        return opt_.keepalive_idle;
      case timer_kind::linger:
        return opt_.linger_timeout;
      case timer_kind::ws_ping:
        return opt_.ws.ping_interval;
      case timer_kind::ws_pong:
        return opt_.ws.ping_timeout;
      case timer_kind::ws_close:
        return opt_.ws.close_timeout;
      case timer_kind::body:
        return opt_.body_timeout;
      case timer_kind::write:
        return opt_.write_timeout;
      case timer_kind::none:
        break;
    }
    return {};
  }

  void update_timer(connection& c);
  void link_timer(connection& c, timer_kind k);
  void unlink_timer(connection& c);

  // One Asio timer for all connections, set to the earliest deadline. It is
  // moved only when a new deadline is earlier than the one it waits for; a
  // deadline that was removed meanwhile just makes it fire early.
  void arm_timer(clock_type::time_point at);
  // (server_timeouts.cpp) Which progress deadline a connection with work
  // waits for; body bytes and written bytes refresh theirs; their expiry.
  [[nodiscard]] timer_kind progress_timer(const connection& c) const noexcept;
  bool note_body_progress(connection& c, std::size_t n);
  void note_write_progress(connection& c, std::size_t n);
  void expire_body(connection& c);
  void expire_write(connection& c);
  // (server_budget.cpp) The pair's memory budget (unsent + unread bytes):
  // refusing with 503, cutting the slowest clients.
  [[nodiscard]] bool over_memory_budget() const noexcept {
    return ctr_.unsent_bytes.get() + unread_total_ > opt_.memory_budget;
  }
  bool refuse_over_budget(connection& c);
  void enforce_memory_budget(const connection& sender);

  void on_timer();
  void expire(connection& c, timer_kind k);

  // ------------------------------------------------------------ WebSockets
  // (server_websocket.cpp, ws_deflate via ws_codec_for)

  // A head that asks for a WebSocket upgrade: false when the handshake is
  // refused (answered 400/426 here; nothing reaches the app).
  bool ws_prepare(connection& c, const http::request_head& head);
  [[nodiscard]] static bool ws_active(const connection& c) noexcept { return c.ws && c.ws->open; }
  void ws_on_readable(connection& c);
  void ws_process(connection& c);
  void ws_on_event(connection& c, const http::ws_event& e);
  void ws_deliver(connection& c, const http::ws_event& e);
  void ws_settle(connection& c);
  void ws_expire(connection& c, timer_kind k);
  void ws_send_close(connection& c, std::uint16_t code, std::string_view reason);
  void ws_fail(connection& c, std::uint16_t code);
  void ws_report(connection& c, std::uint16_t code, std::string_view reason);
  // close_now's part: the app's on_ws_close (1006 if the end was not
  // reported) and the counters of an upgrade that ends.
  void ws_release(connection& c);
  void ws_refuse_accept(connection& c, std::string_view why);
  void ws_queue_frame(connection& c, http::ws_opcode op, std::string_view payload);
  http::ws_deflater& ws_shared_deflater(int window_bits);
  http::ws_inflater& ws_inflater_for(connection& c);

  // ------------------------------------------------------------ TLS
  // (server_tls.cpp; every call is a plain socket call on a plain connection)

  // A new connection's SSL: false when it cannot be made (close it).
  bool tls_open(connection& c);
  // What read_some / write_some are on a plain connection; the handshake
  // runs inside the first reads.
  std::size_t recv_some(connection& c, char* p, std::size_t n, error_code& ec);
  // `flags`: extra send(2) flags on a plain connection (MSG_MORE for its last
  // bytes, see write_once); a TLS connection ignores them.
  std::size_t send_some(connection& c, const std::vector<asio::const_buffer>& iov, error_code& ec,
                        int flags = 0);
  // arm_read's part: true when the read was armed here (bytes held inside
  // OpenSSL, or a read that waits for writability).
  bool tls_arm_read(connection& c);
  void tls_close_notify(connection& c);
  // expire(head)'s part: a handshake that took too long is cut (true).
  bool tls_expire(connection& c);
  void tls_note_handshake(connection& c);
  void tls_fail(connection& c, std::size_t reason_class);
  std::unique_ptr<tls_details> make_details(ssl_st* s);
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
  std::uint64_t unread_total_ = 0;  // body bytes handed to the app, not yet consumed
  std::uint64_t body_waiting_ = 0;  // connections in the body deadline list
  std::vector<std::unique_ptr<listener_state>> listeners_;
  bool draining_ = false;
  bool accept_paused_ = false;
  bool accept_backoff_ = false;
  bool listening_paused_ = false;  // pause_listening(): the watchdog's pause of a stuck pair
  asio::steady_timer accept_retry_;
  std::vector<connection_id> dirty_;
  std::vector<connection_id> dirty_swap_;
  std::vector<asio::const_buffer> iov_;
  http_server::block_sink block_sink_ = nullptr;  // set_block_sink
  void* block_ctx_ = nullptr;
  std::vector<std::unique_ptr<char[]>> buffer_pool_;
  std::unique_ptr<char[]> discard_;
  std::string scratch_;
  std::string ws_scratch_;
  std::vector<http::header_field> ws_fields_;
  // Shared by every connection of this thread: the server always resets its
  // compressor per message (one per window size), and a client that resets
  // its own lets one decompressor serve all such clients.
  std::array<std::unique_ptr<http::ws_deflater>, 16> ws_deflaters_{};
  std::unique_ptr<http::ws_inflater> ws_shared_inflater_;

  std::array<deadline_list, timer_kind_count> lists_{};
  asio::steady_timer timer_;
  bool timer_armed_ = false;
  clock_type::time_point timer_at_{};
  std::uint64_t timer_epoch_ = 0;

  std::shared_ptr<tls_context> tls_;  // null: plain TCP
  std::string tls_scratch_;           // small pieces coalesced into one record
  // The PEM of the server certificate of the context last seen.
  const void* tls_pem_ctx_ = nullptr;
  std::shared_ptr<const std::string> tls_server_pem_;

  // Last: destroyed first, while the io_context it waits in is alive.
  conn_poller poller_{io_, &impl::on_polled, this};
};

}  // namespace cadeloop::net
