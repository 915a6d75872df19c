// Private to net/: the per-connection record of an I/O thread's HTTP/1.1
// server (read side, requests in flight, write side, deadline links) and the
// small helpers the server's parts share.
#pragma once

#include "conn_poller.hpp"
#include "fifo.hpp"
#include "file_part.hpp"
#include "tls_stream.hpp"
#include "ws_connection.hpp"

#include <cadeloop/http/request_parser.hpp>
#include <cadeloop/net/byte_buffer.hpp>
#include <cadeloop/net/connection_id.hpp>

#include <boost/asio/error.hpp>
#include <boost/asio/generic/stream_protocol.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cadeloop::net {

namespace asio = boost::asio;
using socket_type = asio::generic::stream_protocol::socket;
using clock_type = std::chrono::steady_clock;
using error_code = boost::system::error_code;

enum class conn_phase : std::uint8_t { free, open, lingering };

// Which deadline a connection waits for. Every connection in one list has the
// same timeout, so deadlines grow along a list and it is kept in insertion
// order: insert at the tail, expire from the head, remove from anywhere, all O(1).
// The ws_* kinds belong to accepted WebSockets (server_websocket.cpp).
enum class timer_kind : std::uint8_t {
  none = 0,
  head = 1,
  idle = 2,
  linger = 3,
  ws_ping = 4,   // no frame from the client for ping_interval: send a ping
  ws_pong = 5,   // nothing from the client for ping_timeout after a ping: drop
  ws_close = 6,  // our close frame got no answer within close_timeout: close
  body = 7,      // no request body byte for body_timeout while the app waits for it: 408
  write = 8,     // no byte of pending output written for write_timeout: close
};
constexpr std::size_t timer_kind_count = 9;

// writev takes at most this many pieces per call (Asio's own limit as well).
constexpr std::size_t max_write_pieces = 64;
// Accepts per readiness of a listener, so one busy listener cannot starve the loop.
constexpr std::size_t accepts_per_wake = 64;
// Idle read buffers kept for reuse.
constexpr std::size_t read_buffer_pool_max = 256;

inline bool would_block(const error_code& ec) noexcept {
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
  std::unique_ptr<file_part> file;  // sent after `parts` (pathsend); it ends the response
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
    no_more_requests = stop_dispatch = last_request = skipping = peer_closes = false;
    ever_dispatched = disconnect_sent = wrote_any = false;
    body_unacked = 0;
    next_seq = hol_seq = 0;
    body_open = false;
    body_seq = 0;
    hol_started = false;
    error_status = 0;
    error_reason = {};
    error_log.clear();
    later.clear();
    records.clear();
    out.clear();
    out_offset = 0;
    unsent = 0;
    write_armed = dirty = drain_wanted = fin_corked = false;
    lingered = 0;
    client_text.clear();
    ws.reset();
    body_since = {};
    body_got = 0;
    body_in = 0;
    tls = {};
    file.reset();
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
  bool no_more_requests =
      false;                   // parse nothing more; close when the in-flight responses are written
  bool stop_dispatch = false;  // heads parsed from now on are not handed to the app
  bool last_request = false;   // the request being received is the last one (drain)
  bool skipping = false;       // events of a head that was not dispatched
  bool peer_closes = false;    // the client's last request was not keep-alive (it closes after it)
  bool ever_dispatched = false;  // the app knows this connection: it gets one disconnect
  bool disconnect_sent = false;
  bool wrote_any = false;
  std::uint64_t body_unacked = 0;

  // Requests: [hol_seq, next_seq) are in flight; hol_seq is the head of the line.
  std::uint32_t next_seq = 0;
  std::uint32_t hol_seq = 0;
  bool body_open = false;  // body events of request body_seq are still coming
  std::uint32_t body_seq = 0;
  bool hol_started = false;        // bytes of the head-of-line response are queued
  std::uint16_t error_status = 0;  // an error to answer once nothing is in flight
  std::string_view error_reason{};
  std::string error_log;       // access_log::capture() of a head rejected by the parser (413, ...)
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
  // The connection's last bytes went out with MSG_MORE: the kernel holds
  // their tail until our FIN (a shutdown or the close), which then leaves in
  // the same segment (write_once, begin_close).
  bool fin_corked = false;
  std::uint64_t lingered = 0;

  // A WebSocket upgrade handed to the app, then the accepted WebSocket
  // (server_websocket.cpp); null for plain HTTP.
  std::unique_ptr<ws_state> ws;

  // Deadline list membership. tkind is the deadline the connection waits
  // for. A keep-alive connection whose next request arrived is parked rather
  // than unlinked: tkind is none, it stays in the idle list (tparked) and
  // leaves it when its next deadline is linked or the idle list's head
  // reaches it (server_close.cpp), one list operation per request, not two.
  timer_kind tkind = timer_kind::none;
  bool tparked = false;
  clock_type::time_point deadline{};
  connection* tprev = nullptr;
  connection* tnext = nullptr;

  // Request body progress (server_timeouts.cpp): since when the connection
  // waits for body bytes the app asked for, and how many came since.
  clock_type::time_point body_since{};
  std::uint64_t body_got = 0;
  // Request body bytes parsed so far (emit_body): a read moves the body
  // deadline only when this grows, not for framing bytes alone.
  std::uint64_t body_in = 0;
  // TLS (server_tls.cpp); inactive on a plain connection.
  tls_stream tls;
  // The file the head-of-line response sends once `out` is written
  // (server_pathsend.cpp); the response finishes with its last byte.
  std::unique_ptr<file_part> file;
  // Readiness of our own (conn_poller.hpp), plain connections only; set in
  // open_connection, not by reset().
  bool polled = false;        // registered in the server's set; reads never use Asio's waits
  bool rd_ready = false;      // an edge not yet read to a short read or EAGAIN
  bool rd_hup = false;        // the peer's FIN or an error was reported: read until it shows
  bool ready_posted = false;  // a read for rd_ready is posted (take_polled)
  socket_read_wait rwait;     // queued while reading waits for an edge
};

// The data of a connection's readiness events: slot and generation.
inline std::uint64_t key_of(connection_id id) noexcept {
  return (std::uint64_t{id.generation} << 32) | std::uint64_t{id.slot};
}

/// The connection a key_of() names.
inline connection_id id_of_key(std::uint64_t key) noexcept {
  return connection_id{static_cast<std::uint32_t>(key), static_cast<std::uint32_t>(key >> 32)};
}

inline bool has_body(const http::request_head& head) noexcept {
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

}  // namespace cadeloop::net
