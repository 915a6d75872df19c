// Private to net/: what one WebSocket connection adds to a `connection`,
// from the validated upgrade (handed to the app, not yet accepted) to the
// end of its close handshake. Allocated only for an upgrade; small, so an
// idle WebSocket costs little beyond its socket and connection record.
#pragma once

#include <cadeloop/http/websocket.hpp>
#include <cadeloop/http/ws_deflate.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace cadeloop::net {

// Until ws_accept: the handshake's key and what the server will answer to
// the client's permessage-deflate offer ("" when none); freed at the accept.
struct ws_handshake {
  std::array<char, 24> key{};
  std::string extensions;
};

struct ws_state {
  explicit ws_state(const http::ws_parser_options& options) : parser{options} {}

  std::unique_ptr<ws_handshake> handshake;  // until ws_accept
  http::ws_deflate_params deflate{};
  bool deflate_on = false;

  bool open = false;             // accepted: the connection speaks WebSocket
  bool close_sent = false;       // our close frame is queued (no frame may follow it)
  bool close_received = false;   // the client's close frame (or a protocol error) ended reading
  bool reported = false;         // on_ws_close was called
  std::uint16_t close_code = 0;  // the code on_ws_close reports once the handshake completes
  std::uint32_t queued = 0;      // messages handed to the app, not yet ws_consumed

  http::ws_parser parser;
  // The client's compressor keeps its context: this connection's own
  // decompressor, made at its first compressed message.
  std::unique_ptr<http::ws_inflater> inflater;

  std::chrono::steady_clock::time_point opened{};
  std::uint64_t payload_out = 0;  // message bytes sent (before compression), for the log
  std::string log;                // the access log's capture of the upgrade request
};

}  // namespace cadeloop::net
