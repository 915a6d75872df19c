#pragma once

// What the two threads of a core pair share, and nothing else: the ring
// messages, the pair's options and `pair_channels` (the rings, the parkers,
// the stats page and the stop flags). core_pair.hpp (the pair and the app
// thread's end) and io_thread.hpp (the I/O thread, private to runtime) both
// build on this header; neither includes the other's header.

#include <cadeloop/net/connection_id.hpp>
#include <cadeloop/net/http_server.hpp>
#include <cadeloop/net/listener.hpp>
#include <cadeloop/runtime/block_return.hpp>
#include <cadeloop/runtime/owner_return.hpp>
#include <cadeloop/runtime/parker.hpp>
#include <cadeloop/runtime/ring.hpp>
#include <cadeloop/runtime/stats/stats_page.hpp>

#include <cadeloop/http/request.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace cadeloop::runtime {

// =============================================================== ring messages

/// What an inbound message (I/O thread -> app thread) carries.
enum class inbound_kind : std::uint8_t {
  request,     ///< a request head; body events follow when `info.has_body`
  body,        ///< a piece of a request body; the last has `more_body == false`
  disconnect,  ///< the connection is gone; the last message naming it
  drained,     ///< the connection's unsent output fell to the low mark (asked for by
               ///< `send_options::notify_drained`)
  peer_eof,    ///< the client closed its sending side while requests were in flight: it may be gone
               ///< (long-poll and streaming apps treat it as http.disconnect); answers may still be
               ///< sent
  ws_message,  ///< one whole message of an accepted WebSocket (`text`: a text frame's UTF-8)
  ws_close,    ///< an accepted WebSocket ended: `code` and the reason's bytes; before `disconnect`
};

/// The raw inbound ring item. Plain data: `data` is an `http::request_head*`
/// (request) or bytes from `new char[]` (body, ws_message, ws_close's
/// reason), owned by whoever holds the item. Internal to the core pair; the
/// app sees `inbound_message`.
struct inbound_event {
  inbound_kind kind = inbound_kind::disconnect;
  bool more_body = false;
  bool has_body = false;
  bool server_closing = false;
  bool tls = false;
  bool websocket = false;  ///< request: a valid WebSocket upgrade (request_info::websocket)
  bool text = false;       ///< ws_message: a text message
  std::uint16_t code = 0;  ///< ws_close: the close code
  std::uint32_t request = 0;
  net::connection_id conn{};
  void* data = nullptr;
  std::uint64_t size = 0;    ///< body, ws_message, ws_close: byte count; drained: unsent bytes
  std::uint64_t offset = 0;  ///< body: where the bytes start in `data` (net::byte_buffer::offset())
  net::socket_address client{};
  net::socket_address server{};
  /// request over TLS: one reference to its details (net::tls_ref), adopted by the app side.
  const net::tls_details* tls_info = nullptr;
};

/// What an outbound command (app thread -> I/O thread) does.
enum class outbound_kind : std::uint8_t {
  send,         ///< response bytes for a request (optionally ending it)
  consumed,     ///< the app consumed `size` body bytes (request-body credit)
  close,        ///< close after what was sent; requests in flight are abandoned
  abort,        ///< close now, dropping unsent bytes
  recycle,      ///< a request head given back for reuse
  ws_accept,    ///< accept the WebSocket upgrade `request`: `data` holds the subprotocol
                ///< (`code` bytes) and then the extra header lines ("name: value\r\n" each)
  ws_send,      ///< one WebSocket message (`text`; `notify_drained` as for send)
  ws_consumed,  ///< the app took one WebSocket message (reading resumes under the queue limit)
  ws_close,     ///< start the close handshake with `code` and the reason in `data`
  send_file,    ///< the rest of a response from a file: `data` holds a `file_send`
};

/// What a `send_file` command's `data` carries (copied in with memcpy).
struct file_send {
  int fd = -1;  ///< open for reading; the I/O thread closes it
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

/// The raw outbound ring item. Plain data: `data` is bytes from `new char[]`
/// (send, ws_accept, ws_send, ws_close), `head` an `http::request_head*`
/// (recycle, or returned along with a send). Internal to the core pair.
struct outbound_command {
  outbound_kind kind = outbound_kind::send;
  bool end_of_response = false;
  bool keep_alive = true;
  bool notify_drained = false;
  bool text = false;    ///< ws_send: a text message
  bool pooled = false;  ///< send: `data` is a block of `blocks` (app_side::take_buffer)
  std::uint16_t status =
      0;  ///< send: the response's final status, with the send that carries its head
  /// ws_close: the close code; ws_accept: the subprotocol's length (it opens `data`).
  std::uint16_t code = 0;
  std::uint32_t request = 0;
  net::connection_id conn{};
  char* data = nullptr;
  std::uint64_t size = 0;  ///< send: byte count; consumed: bytes consumed
  /// send: `data` is borrowed from this owner (net::byte_buffer::borrow), not
  /// a `new char[]`; it goes back through pair_channels::owners.
  void* owner = nullptr;
  http::request_head* head = nullptr;
};

// =============================================================== options and channels

/// Options of one core pair. Plain data; the thread that builds the pair reads it.
struct core_pair_options {
  /// Where this pair listens (each pair binds its own listener).
  net::listen_spec listen{};
  /// HTTP limits, budgets and timeouts.
  net::server_options server{};
  /// Busy-wait this long for app messages before the I/O thread parks (0: never spin).
  std::chrono::microseconds spin{0};
  /// How long a stop waits for responses in flight before closing everything.
  std::chrono::milliseconds grace{30000};
  /// Items each ring holds before it allocates more.
  std::size_t ring_capacity = 1024;
  /// The page the pair writes its counters into, e.g. `&region.page(i)` of a
  /// `stats_region` shared with a main process. It must outlive the pair and
  /// carry no other live pair. nullptr: the pair keeps a private page.
  pair_stats_page* stats_page = nullptr;
  /// The pair's index: written into its private page (a region's page keeps
  /// the index the region gave it) and the access log's `pair` field.
  std::uint32_t index = 0;
  /// The watchdog: the app thread making no progress this long while it has
  /// work marks the pair stuck (its listener paused until it progresses). 0: off.
  std::chrono::milliseconds stuck_timeout{10000};
  /// When >= 0, the I/O thread writes one byte here each time it marks the
  /// pair stuck (the app side logs the app thread's Python stack). Not owned.
  int stuck_notify_fd = -1;
  /// When the pair's two threads are confined to the same single CPU: how
  /// long each yields the CPU to the other and re-checks for work before it
  /// parks (runtime/include/cadeloop/runtime/shared_cpu.hpp). 0: park at once.
  std::chrono::microseconds shared_cpu_yield{50};
  /// Solo mode (docs/architecture.md, "One thread while little is in
  /// flight"): when the I/O thread has nothing to do it hands the pair's
  /// sockets to an app thread that opted in (`app_side::enable_solo`), which
  /// then serves them itself, and gives them back when one of its passes
  /// reads more than this many requests (or WebSocket messages). 0: never.
  std::uint32_t solo_max_batch = 4;
  /// Solo mode: the app thread also gives the sockets back after this many
  /// passes in a row found requests while its loop was busy. 0: not for that.
  std::uint32_t solo_busy_passes = 4;
  /// Solo mode: how long the app thread, serving the sockets, polls them
  /// before it sleeps (its loop's adaptive spin). 0: sleep at once.
  std::chrono::microseconds solo_spin{50};
};

/// Who serves the pair's sockets (its io_context) right now: only that
/// thread may touch them. The I/O thread gives them with `app`; the app
/// thread marks `app_busy` for each pass it runs over them and ends the pass
/// at `app`, or at `io` when it gives them back; the I/O thread takes them
/// back from `app` at once, or asks with `app_busy_wanted` during a pass.
enum class io_owner : int { io = 0, app = 1, app_busy = 2, app_busy_wanted = 3 };

/// What the app thread needs of the I/O thread's loop to run it itself
/// while it owns the sockets (implemented by the I/O thread).
class io_pass_host {
 public:
  /// The descriptor that is readable while the sockets have events to
  /// collect (the reactor's epoll set). Any thread.
  [[nodiscard]] virtual int ready_fd() const noexcept = 0;
  /// One pass of the I/O loop on the calling thread, which owns the sockets:
  /// collect readiness (if `poll`), apply the published outbound commands,
  /// write, publish the inbound batch. Returns the requests and WebSocket
  /// messages it published (body pieces and notices are part of their
  /// work); `dirty` tells whether output is still waiting for a write,
  /// `handlers` how many socket and timer handlers the collection ran.
  virtual std::size_t solo_pass(bool poll, bool& dirty, std::size_t& handlers) = 0;

 protected:
  ~io_pass_host() = default;
};

/// The state both threads of a pair share: the two rings, the two parkers
/// and the stats page. Owned by `core_pair`; internal.
struct pair_channels {
  ordered_ring<inbound_event> inbound;      ///< producer: I/O thread; consumer: app thread
  ordered_ring<outbound_command> outbound;  ///< producer: app thread; consumer: I/O thread
  /// Response blocks written out, back to the app thread (block_return.hpp).
  block_return blocks;
  parker io_parker;   ///< the I/O thread sleeps on it
  parker app_parker;  ///< the app thread sleeps on it
  /// Owners of borrowed response bytes, back to the app thread (owner_return.hpp).
  owner_return owners{app_parker};
  /// Counters: `io`/`io_loop` written by the I/O thread, `app` by the app thread.
  pair_stats_page& page;
  alignas(64) std::atomic<bool> stop_requested{false};  ///< control thread -> I/O thread
  alignas(64) std::atomic<bool> io_stopped{false};      ///< I/O thread -> app thread
  /// The single CPU each thread is confined to (-1: more than one, or not
  /// known yet), each written by its own thread when it starts; equal and >= 0:
  /// the two share one CPU and `shared_cpu_yield` applies.
  alignas(64) std::atomic<int> io_cpu{-1};
  std::atomic<int> app_cpu{-1};
  /// Set by the I/O thread while it has nothing to do (from the end of a
  /// pass that did nothing to its next work): the app thread yields to it
  /// only while it is inside a pass, when more work for the app is likely.
  std::atomic<bool> io_idle{false};
  /// core_pair_options::shared_cpu_yield; set before the I/O thread starts.
  std::chrono::microseconds shared_cpu_yield{0};

  /// Solo mode. `owner` (an io_owner) says who serves the sockets;
  /// `solo_parker` is what the I/O thread sleeps on while it does not (the
  /// app thread wakes it when it gives them back, a stop request too);
  /// `solo_ready` is set by an app thread that serves them when given
  /// (app_side::enable_solo); `io_host` is the I/O thread, set before it starts.
  alignas(64) std::atomic<io_owner> owner{io_owner::io};
  std::atomic<bool> solo_ready{false};
  parker solo_parker;
  io_pass_host* io_host = nullptr;
  std::uint32_t solo_max_batch = 0;
  std::uint32_t solo_busy_passes = 0;
  std::chrono::microseconds solo_spin{0};

  /// Whether both threads are confined to the same one CPU. Any thread.
  [[nodiscard]] bool share_one_cpu() const noexcept {
    const int io = io_cpu.load(std::memory_order_relaxed);
    return io >= 0 && io == app_cpu.load(std::memory_order_relaxed);
  }

  pair_channels(std::size_t capacity, pair_stats_page& stats)
      : inbound{capacity}, outbound{capacity}, page{stats} {}
};

}  // namespace cadeloop::runtime
