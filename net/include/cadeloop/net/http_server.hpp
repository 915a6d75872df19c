#pragma once

#include <cadeloop/net/access_log.hpp>
#include <cadeloop/net/byte_buffer.hpp>
#include <cadeloop/net/connection_id.hpp>
#include <cadeloop/net/listener.hpp>
#include <cadeloop/net/server_counters.hpp>
#include <cadeloop/net/tls_context.hpp>
#include <cadeloop/net/tls_details.hpp>

#include <cadeloop/http/request.hpp>

#include <boost/asio/io_context.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace cadeloop::net {

/// WebSocket (RFC 6455) options of one I/O thread. Plain data. Settings:
/// ws, ws_max_size, ws_max_queue, ws_ping_interval, ws_ping_timeout,
/// ws_per_message_deflate.
struct websocket_options {
  /// Off: an upgrade request is an ordinary HTTP request (the app sees an
  /// `http` scope, as a server without WebSockets would show it).
  bool enabled = true;
  /// Largest message (after decompression) a client may send; a bigger one
  /// is closed with 1009.
  std::size_t max_message = 16U * 1024U * 1024U;
  /// Messages handed to the app and not yet reported taken (`ws_consumed`)
  /// at which the connection stops reading.
  std::uint32_t max_queue = 32;
  /// A ping is sent after this long without a frame from the client (0: never).
  std::chrono::milliseconds ping_interval{20000};
  /// A client that sends nothing (no pong, no frame) this long after a ping
  /// is closed (1011 is not sent: the connection is dropped, the app sees 1006).
  std::chrono::milliseconds ping_timeout{20000};
  /// How long the server waits for the client's close frame after sending
  /// its own before it closes the TCP connection.
  std::chrono::milliseconds close_timeout{5000};
  /// Offer permessage-deflate (RFC 7692) when the client asks for it.
  bool per_message_deflate = true;
};

/// Limits, budgets and timeouts of one I/O thread's HTTP server. Plain data;
/// built on any thread, read by the I/O thread. Values come from config/.
struct server_options {
  /// Request limits enforced by the parser (answered with 413/414/431).
  http::request_limits limits{};
  /// Requests in flight per connection (pipelining): the parser stops after
  /// this many requests without a finished response. At least 1.
  std::uint32_t max_pipelined = 16;
  /// Bytes read per system call (and the read buffer's size). 64 KiB, so
  /// that a head and a body up to about 64 KiB that the client wrote at once
  /// (one loopback segment) come in one read, as one body piece. A buffer is
  /// held only while its connection has unparsed bytes (pooled otherwise).
  std::size_t read_buffer_size = 64 * 1024;
  /// Body bytes handed to the app and not yet reported consumed above which
  /// the connection stops reading (request-body backpressure).
  std::uint64_t body_window = 256 * 1024;
  /// A "drained" notice asked for by the app is sent once the connection's
  /// unsent output is at or below this many bytes.
  std::uint64_t drain_low_mark = 64 * 1024;
  /// Open connections above which the pair stops accepting.
  std::size_t max_connections = 10000;
  /// Requests in flight (all connections) above which the pair stops accepting.
  std::size_t max_requests_in_flight = 4096;
  /// From the first byte of a head to its end, when no request of the
  /// connection is in flight: a slower client gets 408 and is closed.
  std::chrono::milliseconds request_line_timeout{10000};
  /// A connection with nothing in flight and nothing received for this long
  /// is closed without a word (also a new connection that sends nothing).
  std::chrono::milliseconds keepalive_idle{5000};
  /// After the last response of a connection the server closes, it shuts its
  /// sending side and reads (discarding) for at most this long, so a client
  /// that is still sending does not get a reset before it read the answer.
  std::chrono::milliseconds linger_timeout{2000};
  /// Most bytes discarded while lingering before the socket is closed.
  std::uint64_t linger_max_bytes = 1024 * 1024;
  /// A request body with no byte for this long while the app waits for it:
  /// 408 (when nothing of the response went out) and the connection closes;
  /// the app sees a disconnect.
  std::chrono::milliseconds body_timeout{10000};
  /// After body_timeout from its first wait, a request body arriving slower
  /// than this many bytes per second on average is cut the same way (0: off).
  std::uint64_t body_min_rate = 240;
  /// Pending output of which no byte could be written for this long: the
  /// connection closes (the app sees a disconnect).
  std::chrono::milliseconds write_timeout{30000};
  /// Unsent response bytes plus body bytes not yet taken by the app, all
  /// connections of the pair: above it new requests get 503 and the
  /// connections whose writes made no progress the longest are cut.
  std::uint64_t memory_budget = std::uint64_t{64} << 20;
  /// `Server` header of the error responses the I/O thread writes ("" for none).
  std::string server_header = "cadeloop";
  /// The access log (off by default); see access_log.hpp.
  access_log_options access_log{};
  /// WebSockets.
  websocket_options ws{};
  /// TLS (on when tls.certfile is set): every connection is HTTPS / WSS.
  tls_options tls{};
};

/// Everything the app side must learn about one request head.
struct request_info {
  socket_address client;        ///< peer address (none for a Unix socket peer)
  socket_address server;        ///< local address (unix_socket for a Unix listener)
  bool has_body = false;        ///< body events follow; the last has more_body == false
  bool server_closing = false;  ///< the server is draining: answer with `Connection: close`
  bool tls = false;             ///< the connection is TLS: scheme https / wss
  /// A valid WebSocket upgrade (RFC 6455 section 4.2.1, checked by the I/O
  /// thread; a bad one is answered 400/426 and never reaches the sink): the
  /// app answers with `http_server::ws_accept`, or denies with an ordinary
  /// HTTP response through `send` (the connection closes after it). No body
  /// events follow (`has_body` is false).
  bool websocket = false;
  /// A TLS connection's version, cipher and certificates (null for plain TCP).
  tls_ref tls_info{};
};

/// Where the HTTP server delivers what the app must see. Implemented by the
/// core pair's I/O thread, which stages each call as a message on the
/// inbound ring. Every call is made on the I/O thread, in stream order per
/// connection. For a connection that produced at least one `on_request`,
/// exactly one `on_disconnect` is the last call naming it.
class event_sink {
 public:
  virtual ~event_sink() = default;
  /// A request head. `request` numbers the requests of one connection from 0.
  /// The sink takes `head` (it may leave it untouched if it throws). I/O thread.
  virtual void on_request(connection_id conn, std::uint32_t request,
                          std::unique_ptr<http::request_head>&& head, const request_info& info) = 0;
  /// A piece of the body of `request`; the last one has `more_body == false`
  /// (and may be empty). The sink takes `bytes`. I/O thread.
  virtual void on_body(connection_id conn, std::uint32_t request, byte_buffer&& bytes,
                       bool more_body) = 0;
  /// The connection is gone for the app: no more events, and messages naming
  /// it will be dropped. I/O thread.
  virtual void on_disconnect(connection_id conn) = 0;
  /// The connection's unsent output fell to `unsent` bytes (<= the low mark)
  /// after the app asked for a notice. I/O thread.
  virtual void on_drained(connection_id conn, std::uint64_t unsent) = 0;
  /// The client closed its sending side (EOF) while requests of the
  /// connection were in flight; it may have gone entirely, which only a
  /// write would reveal. At most once per connection, before its
  /// `on_disconnect`. I/O thread.
  virtual void on_peer_eof(connection_id /*conn*/) {}
  /// One whole message of an accepted WebSocket (reassembled from its
  /// fragments, decompressed, text already checked as UTF-8). The sink takes
  /// `payload` and reports it taken with `http_server::ws_consumed`. I/O thread.
  virtual void on_ws_message(connection_id /*conn*/, byte_buffer&& /*payload*/, bool /*text*/) {}
  /// An accepted WebSocket ended: the client's close frame (its code, 1005
  /// when it had none, and reason), a protocol error (the code the server sent:
  /// 1002, 1007, 1009), the server's own close completing (the code it sent),
  /// or the TCP connection dropping (1006). At most once per connection,
  /// before its `on_disconnect`. I/O thread.
  virtual void on_ws_close(connection_id /*conn*/, std::uint16_t /*code*/,
                           std::string&& /*reason*/) {}
};

/// Options of one `http_server::send`. Plain data.
struct send_flags {
  bool end_of_response = false;  ///< the response of `request` is complete after these bytes
  bool keep_alive = true;        ///< with end_of_response: the connection may carry another request
  bool notify_drained = false;   ///< send `on_drained` once unsent output is at the low mark
  /// The response's final status (100..599), given with the send that
  /// carries its head; 0: not given. Counted by class when the response
  /// ends; a later non-zero status replaces an earlier one (an interim 100
  /// sent as bytes before the final head is not a final status).
  std::uint16_t status = 0;
};

/// The HTTP/1.1 side of one I/O thread: accepts on its listeners, owns every
/// connection (socket, parser, buffers, deadlines), parses requests, answers
/// protocol errors and timeouts itself, streams heads and bodies to an
/// `event_sink`, and writes the responses the app hands back, strictly in
/// request order per connection.
///
/// Created, used and destroyed on the I/O thread that runs `io` (it may be
/// created on another thread before that thread starts). Not thread-safe.
/// Destroy it before `io` and never run `io` again after destroying it.
class http_server {
 public:
  /// A server that delivers to `sink` and counts into `counters` (both must
  /// outlive it). Opens the access log if `options` enable it (throws
  /// std::invalid_argument / std::runtime_error with one line when its format
  /// or file is refused). I/O thread.
  http_server(boost::asio::io_context& io, event_sink& sink, server_options options,
              server_counters& counters);
  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;
  /// Closes every socket (no further sink calls). I/O thread.
  ~http_server();

  /// Adds a listener and starts accepting on it. I/O thread.
  void add_listener(std::unique_ptr<listener> l);

  /// Queues response bytes for `request` of `conn` (responses are written in
  /// request order; bytes of a later response wait for the earlier ones).
  /// Returns false and drops the bytes when the connection or request is
  /// gone. I/O thread.
  bool send(connection_id conn, std::uint32_t request, byte_buffer&& bytes, send_flags flags);
  /// Takes a pool's block (byte_buffer::adopt_pooled) whose bytes are all
  /// written: true when kept, false when the caller is to delete it.
  using block_sink = bool (*)(void* ctx, char* block) noexcept;
  /// Where the writes hand back the pool blocks they finish with (nullptr:
  /// they are deleted like any buffer). Before the first send. I/O thread.
  void set_block_sink(block_sink give, void* ctx) noexcept;
  /// Sends `length` bytes of the open file `fd` from `offset` as the rest of
  /// the response of `request` (after the bytes sent for it before; ASGI
  /// `http.response.pathsend`): written as the socket takes them, with
  /// sendfile(2) on plain TCP and in bounded reads over TLS, under the write
  /// timeout. Takes `fd` (closed when done or on failure); `flags.end_of_response`
  /// must be set. Returns false when the connection or request is gone. I/O thread.
  bool send_file(connection_id conn, std::uint32_t request, int fd, std::uint64_t offset,
                 std::uint64_t length, send_flags flags);
  /// The app consumed `bytes` of body: reading resumes once the unconsumed
  /// bytes are within the window. Returns false when the connection is gone. I/O thread.
  bool consume(connection_id conn, std::uint64_t bytes);
  /// Closes `conn` once what it was given is written; requests still in
  /// flight are abandoned. Returns false when the connection is gone. I/O thread.
  bool close(connection_id conn);
  /// Closes `conn` now, dropping unsent output. Returns false when gone. I/O thread.
  bool abort(connection_id conn);
  /// Accepts the WebSocket upgrade `request` of `conn` (one with
  /// `request_info::websocket`): writes the 101 response (with the chosen
  /// `subprotocol` if not empty and the app's `extra_headers`, given as
  /// "name: value\r\n" lines; permessage-deflate negotiated by the server),
  /// and from then on the connection speaks WebSocket. Returns false (and
  /// the connection is closed with a 500 unless gone) when the connection or
  /// request is gone, the subprotocol is not a token or a header is refused.
  /// I/O thread.
  bool ws_accept(connection_id conn, std::uint32_t request, std::string_view subprotocol,
                 std::string_view extra_headers);
  /// Sends one message on an accepted WebSocket (framed, compressed when
  /// negotiated). With `notify_drained`, `on_drained` follows once unsent
  /// output is at the low mark. Returns false when the connection is gone or
  /// closing. I/O thread.
  bool ws_send(connection_id conn, byte_buffer&& payload, bool text, bool notify_drained);
  /// The app took one message handed over by `on_ws_message`: reading
  /// resumes once fewer than `max_queue` are outstanding. I/O thread.
  bool ws_consumed(connection_id conn);
  /// Starts the close handshake: sends a close frame with `code` (1005: an
  /// empty one) and `reason` (cut to 123 bytes), waits for the client's close
  /// (at most `close_timeout`), then closes TCP; `on_ws_close` then reports
  /// `code`. Returns false when the connection is gone. I/O thread.
  bool ws_close(connection_id conn, std::uint16_t code, std::string_view reason);
  /// Gives a head back for reuse by its connection's parser (freed when the
  /// connection is gone). I/O thread.
  void recycle_head(connection_id conn, std::unique_ptr<http::request_head> head);

  /// Writes every connection that has new output: at most one write system
  /// call per connection per call; what the socket does not take waits for
  /// writability. I/O thread.
  void flush_writes();

  /// Starts the graceful stop: closes the listeners, closes idle connections,
  /// marks every later head `server_closing` and closes each connection after
  /// its current response. I/O thread.
  void begin_drain();
  /// Closes every connection now (each app-visible one gets `on_disconnect`). I/O thread.
  void abort_all();
  /// Stops taking connections until `resume_listening()`: a TCP listener is
  /// shut down (it leaves its SO_REUSEPORT group, so the kernel gives new
  /// connections to the other pairs' listeners; the ones queued on it are
  /// reset), another kind is just not accepted from. Open connections carry
  /// on. The watchdog's pause of a stuck pair. I/O thread.
  void pause_listening();
  /// Listens again after `pause_listening()` (a TCP listener rejoins its
  /// group with listen(2)). I/O thread.
  void resume_listening();

  /// Connections in the table (including lingering ones). I/O thread.
  [[nodiscard]] std::size_t connection_count() const noexcept;
  /// Whether some connection has output waiting for the next `flush_writes`. I/O thread.
  [[nodiscard]] bool has_dirty() const noexcept;
  /// The epoll descriptor of the io_context's reactor (where every socket of
  /// this server, its timers and its wake-ups are registered): readable while
  /// the reactor has events not yet collected. Another thread's poller may
  /// watch it (level-triggered) to know when a `poll()` of the io_context has
  /// work. -1 if the reactor has none. Any thread.
  [[nodiscard]] int reactor_descriptor() const noexcept;
  /// Whether the io_context has handlers ready to run besides its reactor
  /// (a command applied outside a handler may post one). The thread that
  /// alone runs the io_context at the time.
  [[nodiscard]] bool has_ready_handlers() const noexcept;
  /// "127.0.0.1:43211" per listener, comma separated. I/O thread (or any
  /// thread before the I/O thread starts).
  [[nodiscard]] std::string listener_description() const;

  class impl;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace cadeloop::net
