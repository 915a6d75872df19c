#pragma once

// A core pair as its users see it: `core_pair` (built, started and stopped
// by a control thread) and `app_side`, the app thread's end of the rings.
// What both threads share (ring messages, options, channels) is in
// pair_channels.hpp; the I/O thread itself is private to runtime.

#include <cadeloop/net/byte_buffer.hpp>
#include <cadeloop/net/connection_id.hpp>
#include <cadeloop/net/http_server.hpp>
#include <cadeloop/net/listener.hpp>
#include <cadeloop/runtime/pair_channels.hpp>
#include <cadeloop/runtime/shared_cpu.hpp>
#include <cadeloop/runtime/stats/stats_page.hpp>

#include <cadeloop/http/request.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace cadeloop::runtime {

/// One inbound message in owning form, as `app_side::drain_inbound` hands it
/// to the app thread, which owns (and destroys) everything in it.
///
/// Per connection, messages arrive in this order: `request` (seq 0), its body
/// pieces if any, `request` (seq 1), ... interleaved with `drained`; a
/// connection that produced a `request` ends with exactly one `disconnect`
/// (at most one `peer_eof` may come before it). A WebSocket upgrade
/// (`info.websocket`) has no body; once accepted, `ws_message`s follow, then
/// at most one `ws_close`, then the `disconnect`.
struct inbound_message {
  inbound_kind kind = inbound_kind::disconnect;
  /// The connection; use it (and `request`) in every reply.
  net::connection_id conn{};
  /// request/body: the request's number on its connection (0, 1, 2, ...).
  std::uint32_t request = 0;
  /// request: the head. May be given back with `app_side::recycle`.
  std::unique_ptr<http::request_head> head;
  /// request: addresses and flags (`has_body`; `server_closing`: the server
  /// drains, answer with `Connection: close` (response_encoder's request_context::server_closing)).
  net::request_info info{};
  /// body: the bytes (report them with `app_side::consumed` once used);
  /// ws_message: the message (report it with `app_side::ws_consumed` once
  /// taken); ws_close: the reason (UTF-8 as the client sent it).
  net::byte_buffer body;
  /// body: more pieces follow.
  bool more_body = false;
  /// ws_message: a text message (its bytes are valid UTF-8).
  bool text = false;
  /// ws_close: the close code (1005: the client sent none; 1006: the connection dropped).
  std::uint16_t code = 0;
  /// drained: bytes still unsent on the connection (<= the low mark).
  std::uint64_t unsent = 0;
};

/// Options of `app_side::send`. Plain data.
struct send_options {
  /// The response is complete after these bytes.
  bool end_of_response = false;
  /// With end_of_response: the connection may carry another request (the
  /// encoder's `keep_alive()`); false closes it after this response.
  bool keep_alive = true;
  /// Ask for an `inbound_kind::drained` message once the connection's unsent
  /// output is at or below the low mark. Set it when the bytes the app sent
  /// since the last notice pass its high mark, then wait for the notice.
  bool notify_drained = false;
  /// The response's final status (100..599), set on the send that carries
  /// the response head (0 on the others, and on interim 1xx bytes such as
  /// `100 Continue`). The I/O thread only sees bytes: this is how it counts
  /// responses by status class and writes the access log's status.
  std::uint16_t status = 0;
};

/// Counters of one core pair: a snapshot of its stats page (see
/// stats/stats_page.hpp). Plain data.
using core_pair_stats = pair_stats_snapshot;

// =============================================================== app side

/// The app thread's end of a core pair: the contract the ASGI bridge (or any
/// other consumer) implements. Every member is for the app thread only,
/// except `parker_fd()`.
///
/// The app thread's loop, per pass:
///   1. `drain_inbound(fn)`: take the messages (heads, body pieces, drained
///      notices, disconnects) in order and act on them.
///   2. answer with `send()` (bytes encoded with http::response_encoder; one
///      encoder per request context), `consumed()` after using body bytes,
///      `close()`/`abort()`, `recycle()` for heads it is done with. These only
///      stage messages.
///   3. `flush()` once: publishes the batch and wakes the I/O thread if it sleeps.
///   4. before sleeping: `if (try_park()) { wait until parker_fd() is
///      readable or other work arrives; unpark(fd_was_readable); }` —
///      try_park() re-checks the ring after announcing the sleep, so a
///      message published meanwhile is never missed. The fd is an eventfd:
///      register it (level-triggered, readable) in the loop's epoll.
///
/// Obligations: answer every request (its responses are written in request
/// order per connection, so an unanswered request blocks the ones behind
/// it); report consumed body bytes (or the connection stops reading after
/// `server_options::body_window` bytes); count the bytes sent per connection
/// and, past a high mark, set `notify_drained` and pause that response until
/// the `drained` message; forget a connection at its `disconnect` (later
/// messages naming it are dropped by the I/O thread).
class app_side {
 public:
  app_side(const app_side&) = delete;
  app_side& operator=(const app_side&) = delete;
  ~app_side();

  /// Takes up to `max` published messages, oldest first, calling
  /// `fn(inbound_message&&)` for each; returns how many. If `fn` throws, the
  /// message it was given is destroyed, the exception propagates and later
  /// messages stay queued. App thread.
  template <class Fn>
  std::size_t drain_inbound(Fn&& fn, std::size_t max = SIZE_MAX) {
    if (sockets_ready_) {
      serve_ready_sockets();  // solo mode: what the sockets brought is published first
    }
    net::single_writer_counter& taken = ch_.page.app.inbound_taken;
    return ch_.inbound.drain(
        [&fn, &taken](const inbound_event& ev) {
          taken.add();  // taken before fn sees it, as the ring counts it
          fn(adopt(ev));
        },
        max);
  }

  /// Whether inbound messages are waiting (seq_cst load: valid as the
  /// re-check after announcing a sleep). App thread.
  [[nodiscard]] bool has_inbound() const noexcept { return ch_.inbound.has_pending(); }

  /// A buffer of `size` uninitialised bytes for send(): a block written out
  /// before when it fits one (block_return), else a new allocation. Throws
  /// std::bad_alloc. App thread.
  [[nodiscard]] net::byte_buffer take_buffer(std::size_t size) {
    if (size == 0 || size > block_return::block_size) {
      return net::byte_buffer{size};
    }
    char* block = ch_.blocks.take();
    if (block == nullptr) {
      block = new char[block_return::block_size];
    }
    return net::byte_buffer::adopt_pooled(block, size);
  }
  /// Blocks written out and given back, waiting for take_buffer. Any thread.
  [[nodiscard]] std::size_t blocks_returned() const noexcept { return ch_.blocks.size(); }
  /// The sink to borrow response bytes with (net::byte_buffer::borrow): a
  /// borrowed buffer given to send() carries its owner to the I/O thread,
  /// and the owner comes back for take_owners() once the bytes are written
  /// or dropped. Any thread.
  [[nodiscard]] const net::owner_sink* owner_sink() const noexcept { return ch_.owners.sink(); }
  /// Whether owners of borrowed bytes wait for take_owners (a hint). Any thread.
  [[nodiscard]] bool owners_waiting() const noexcept { return ch_.owners.waiting(); }
  /// Appends the owners given back so far to `out`, for the caller to
  /// release. Throws std::bad_alloc. App thread.
  void take_owners(std::vector<void*>& out) { ch_.owners.take_all(out); }
  /// Stages response bytes for `request` of `conn`. Throws std::bad_alloc
  /// before taking `bytes` (the caller keeps them then). App thread.
  void send(net::connection_id conn, std::uint32_t request, net::byte_buffer&& bytes,
            send_options options = {});
  /// Stages "send `length` bytes of the open file `fd` from `offset` as the
  /// rest of the response" (after the head, sent with `send`); the I/O
  /// thread writes them as the socket takes them and closes `fd` (see
  /// net::http_server::send_file). `options.end_of_response` is implied.
  /// Throws std::bad_alloc before taking `fd` (the caller closes it then). App thread.
  void send_file(net::connection_id conn, std::uint32_t request, int fd, std::uint64_t offset,
                 std::uint64_t length, send_options options = {});
  /// Stages "the app consumed `bytes` body bytes of `conn`". May throw
  /// std::bad_alloc. App thread.
  void consumed(net::connection_id conn, std::uint64_t bytes);
  /// Stages "close `conn` after what was sent". May throw std::bad_alloc. App thread.
  void close(net::connection_id conn);
  /// Stages "close `conn` now". May throw std::bad_alloc. App thread.
  void abort(net::connection_id conn);
  /// Gives a head back to the I/O thread's parser pool: it rides with the
  /// next send() for `conn` (the request's answer, usually), or goes as a
  /// command of its own before the next publish. Throws std::bad_alloc
  /// before taking `head`. App thread.
  void recycle(net::connection_id conn, std::unique_ptr<http::request_head>&& head);

  /// Stages "accept the WebSocket upgrade `request` of `conn`" with the chosen
  /// `subprotocol` ("" for none; at most 65535 bytes) and `extra_headers`
  /// ("name: value\r\n" lines) for the 101 response (see
  /// net::http_server::ws_accept). May throw std::bad_alloc. App thread.
  void ws_accept(net::connection_id conn, std::uint32_t request, std::string_view subprotocol,
                 std::string_view extra_headers);
  /// Stages one WebSocket message. `notify_drained` as for `send`. Throws
  /// std::bad_alloc before taking `payload`. App thread.
  void ws_send(net::connection_id conn, net::byte_buffer&& payload, bool text, bool notify_drained);
  /// Stages "the app took one `ws_message` of `conn`". May throw std::bad_alloc. App thread.
  void ws_consumed(net::connection_id conn);
  /// Stages "close the WebSocket `conn` with `code` and `reason`". May throw
  /// std::bad_alloc. App thread.
  void ws_close(net::connection_id conn, std::uint16_t code, std::string_view reason);

  /// Publishes everything staged and wakes the I/O thread if it is parked.
  /// Returns how many messages were published. Call it once per pass of the
  /// app's loop: each call counts one loop tick. App thread.
  std::size_t flush() noexcept;

  /// The eventfd to watch while sleeping (readable after a wake). Any thread.
  [[nodiscard]] int parker_fd() const noexcept { return ch_.app_parker.fd(); }
  /// Announces a sleep and re-checks the ring (and the I/O thread's end).
  /// When the pair's threads share one CPU and `shared_cpu_yield` is set, it
  /// first yields the CPU to the awake I/O thread for up to that long,
  /// returning false as soon as a message is published.
  /// True: sleep now, then call unpark(). False: work arrived, don't sleep.
  /// App thread.
  bool try_park() noexcept;
  /// Ends a sleep; `signalled`: parker_fd() was readable. App thread.
  void unpark(bool signalled) noexcept;

  // ------------------------------------------------------------ solo mode
  // (docs/architecture.md, "One thread while little is in flight") While the
  // I/O thread has nothing to do, it may hand the pair's sockets to this
  // thread, which then serves them from its own loop: no hand-over between
  // threads per request. It gives them back when a pass reads more than
  // `solo_max_batch` requests, and the I/O thread takes them back when it
  // must drain, or when this thread stays awake without serving them (it
  // runs Python) for 5-10 ms. A consumer that opts in must, in each pass of
  // its loop:
  //   - watch solo_fd() (readable, level-triggered) while serves_sockets()
  //     is true, asking after its try_park() and before it sleeps; and only then;
  //   - call sockets_ready() when its poller reported solo_fd() readable;
  //     drain_inbound(), flush() and try_park() do the rest.

  /// Opts in; false when the pair does not offer solo mode. App thread.
  bool enable_solo() noexcept;
  /// Opts out, giving the sockets back if this thread has them. Call it
  /// before the loop stops running the passes. App thread.
  void disable_solo() noexcept;
  /// Whether this thread has the sockets now (then watch solo_fd()). App thread.
  [[nodiscard]] bool serves_sockets() const noexcept {
    return solo_ && ch_.owner.load(std::memory_order_seq_cst) != io_owner::io;
  }
  /// The descriptor to watch while serves_sockets() (-1 if none). Any thread.
  [[nodiscard]] int solo_fd() const noexcept;
  /// How long to poll solo_fd() before sleeping (core_pair_options::solo_spin). Any thread.
  [[nodiscard]] std::uint32_t solo_spin_us() const noexcept {
    return static_cast<std::uint32_t>(ch_.solo_spin.count());
  }
  /// Serves the sockets now if this thread has them (a pass that collects
  /// their events; it runs no Python, so the caller may hold no GIL). True
  /// when inbound messages are waiting afterwards. App thread.
  bool poll_sockets() noexcept;
  /// solo_fd() was reported readable: the next drain_inbound() serves the
  /// sockets first. App thread.
  void sockets_ready() noexcept { sockets_ready_ = solo_; }
  /// If this thread serves the sockets and its last read brought one
  /// request: publishes what is staged and writes it now, before the rest of
  /// the pass (a response that ends goes out while the app's task finishes).
  /// Otherwise nothing: flush() publishes it at the end of the pass, one
  /// batch for many responses. App thread.
  void write_through() noexcept;

  /// Counts an app error (an exception in the app, a malformed message) in
  /// the pair's stats page. App thread.
  void count_app_error() noexcept { ch_.page.app.app_errors.add(); }
  /// Counts a request or websocket refused by limit_concurrency. App thread.
  void count_concurrency_refusal() noexcept { ch_.page.app.concurrency_refusals.add(); }

  /// True once the pair was asked to stop: its I/O thread drains, closing
  /// each connection after the response in flight on it, so a response
  /// whose head is written now says `Connection: close`. Any thread.
  [[nodiscard]] bool stop_requested() const noexcept {
    return ch_.stop_requested.load(std::memory_order_relaxed);
  }

  /// True once the I/O thread has finished (after its last messages, which
  /// are published before this turns true). App thread (any thread may ask).
  [[nodiscard]] bool io_stopped() const noexcept {
    return ch_.io_stopped.load(std::memory_order_seq_cst);
  }

 private:
  friend class core_pair;
  explicit app_side(pair_channels& ch) noexcept : ch_{ch} {}
  static inbound_message adopt(const inbound_event& ev) noexcept;
  void stage(const outbound_command& cmd);
  // Stages the held head (recycle()) as a command of its own: the first
  // throws std::bad_alloc and keeps it held; the second, before a publish,
  // keeps it held for the next publish if that cannot allocate.
  void stage_held_alone();
  void stage_held_head() noexcept;
  void serve_ready_sockets() noexcept;
  bool serve_sockets(bool poll) noexcept;
  void give_sockets_back() noexcept;

  pair_channels& ch_;
  // The head recycle() took last, until a send() for its connection carries
  // it or a publish stages it alone: one command fewer per request.
  net::connection_id held_conn_{};
  http::request_head* held_head_ = nullptr;
  // The shared-CPU yield window before a park (try_park); cpu_known_: this
  // thread's CPU was written to ch_.app_cpu.
  shared_cpu_yield yield_;
  bool cpu_known_ = false;
  // Solo mode: opted in; solo_fd() was readable; the last pass left output
  // waiting for a write.
  bool solo_ = false;
  bool sockets_ready_ = false;
  bool solo_dirty_ = false;
  std::size_t solo_last_read_ = 0;  // requests the last pass that collected events read
  // Passes in a row that found requests while the loop was busy (it had not
  // come to sleep or spin since the last find): many clients at once.
  unsigned busy_finds_ = 0;
  bool idled_ = true;  // the loop came to sleep or spin since the last find
};

// =============================================================== core pair

class io_thread;  // the pair's native half (runtime/io_thread.hpp, private to runtime)

/// One core pair: the I/O thread (listener, connections, HTTP) and the rings
/// and parkers it shares with one app thread (which the caller runs, using
/// `app()`).
///
/// Created, started, stopped and destroyed by one control thread.
/// Destroy it only after the I/O thread was joined and the app thread
/// stopped using `app()`; messages still in the rings are freed then.
class core_pair {
 public:
  /// A pair that will listen as `options.listen` says. Control thread.
  explicit core_pair(core_pair_options options);
  core_pair(const core_pair&) = delete;
  core_pair& operator=(const core_pair&) = delete;
  /// Stops and joins the I/O thread if still running, frees ring leftovers.
  /// Control thread.
  ~core_pair();

  /// Opens the listener and starts the I/O thread. Returns "" on success or
  /// one line for the user ("cannot listen on 127.0.0.1:8000: address
  /// already in use"). Control thread, once.
  [[nodiscard]] std::string start();

  /// Begins the graceful stop: no more accepts, idle connections closed,
  /// later requests answered with `Connection: close`, responses in flight
  /// awaited up to `grace`, then everything closed. Returns at once. Any thread.
  void request_stop() noexcept;
  /// Waits for the I/O thread to finish. Control thread.
  void join();
  /// request_stop() then join(). Control thread.
  void stop();

  /// The app thread's end. The reference is valid as long as the pair.
  [[nodiscard]] app_side& app() noexcept { return app_; }
  /// The bound address (the real port when 0 was asked for), valid after a
  /// successful start(). Any thread.
  [[nodiscard]] const net::socket_address& local_address() const noexcept { return local_; }
  /// "127.0.0.1:43211", "unix:/path" or "fd 3 (...)". Any thread after start().
  [[nodiscard]] const std::string& description() const noexcept { return description_; }
  /// A snapshot of the counters (of its stats page). Any thread.
  [[nodiscard]] core_pair_stats stats() const noexcept;
  /// The page the pair writes (the one given in its options, or its private
  /// one). Any thread may read it; valid as long as the pair (or the region).
  [[nodiscard]] const pair_stats_page& stats_page() const noexcept { return ch_->page; }

 private:
  core_pair_options options_;
  std::unique_ptr<pair_stats_page> private_page_;  // when the options gave none
  std::unique_ptr<pair_channels> ch_;
  app_side app_;
  std::unique_ptr<io_thread> io_;
  net::socket_address local_{};
  std::string description_;
};

}  // namespace cadeloop::runtime
