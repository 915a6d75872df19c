#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cadeloop/http/header.hpp"
#include "cadeloop/http/response_encoder.hpp"

namespace cadeloop::http {

// ---------------------------------------------------------------------------
// Opening handshake (RFC 6455 section 4)
// ---------------------------------------------------------------------------

/// The parts of an upgrade request the handshake looks at. Header names must
/// be lower case (as the request parser stores them). Views must outlive the call.
struct ws_handshake_request {
  std::string_view method{};                ///< request method, case-sensitive ("GET")
  std::uint8_t http_major = 1;              ///< HTTP version, major
  std::uint8_t http_minor = 1;              ///< HTTP version, minor
  std::span<const header_field> headers{};  ///< request headers, lower-case names
};

/// The verdict on an upgrade request. On success `status` is 101; otherwise
/// it is 400 (or 426 for an unsupported `Sec-WebSocket-Version`) and `reason`
/// says why. Views point into the request's headers or static text.
struct ws_handshake_result {
  unsigned status = 400;                         ///< 101 accepted; 400 or 426 refused
  std::string_view reason{};                     ///< static text; empty on success
  std::string_view key{};                        ///< the `Sec-WebSocket-Key`, whitespace trimmed
  std::vector<std::string_view> subprotocols{};  ///< `Sec-WebSocket-Protocol` tokens, in order

  /// True when the upgrade may be accepted. Any thread.
  [[nodiscard]] bool ok() const noexcept { return status == 101; }
};

/// Checks an upgrade request: GET, HTTP/1.1 or later, `Upgrade` listing
/// `websocket`, `Connection` listing `upgrade`, a `Sec-WebSocket-Key` that
/// is base64 of 16 bytes, `Sec-WebSocket-Version: 13`. Any thread.
[[nodiscard]] ws_handshake_result validate_ws_handshake(const ws_handshake_request& request);

/// base64(SHA-1(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11")), the
/// `Sec-WebSocket-Accept` value for `key`. Any thread.
[[nodiscard]] std::array<char, 28> ws_accept_key(std::string_view key) noexcept;

/// Appends the `101 Switching Protocols` response for a validated request:
/// Upgrade, Connection, Sec-WebSocket-Accept, the chosen `subprotocol` (if
/// not empty; must be a token) and `extra` headers (validated like response
/// headers; the ones the handshake owns are refused). On a refusal nothing
/// is appended. Any thread.
///
/// `extensions` (if not empty) is the negotiated `Sec-WebSocket-Extensions`
/// value, written by the server itself; the app may not set that header.
encode_status encode_ws_accept(std::string_view key, std::string_view subprotocol,
                               std::span<const header_field> extra, std::string& out,
                               std::string_view extensions = {});

/// Appends the error response for a refused handshake (400, or 426 with
/// `Sec-WebSocket-Version: 13`), closing the connection. Owner thread of `dates`.
void encode_ws_reject(const ws_handshake_result& result, date_cache& dates, std::string& out,
                      const encoder_options& options = {});

// ---------------------------------------------------------------------------
// Frames (RFC 6455 section 5)
// ---------------------------------------------------------------------------

/// Frame opcodes. Plain data.
enum class ws_opcode : std::uint8_t {
  continuation = 0x0,
  text = 0x1,
  binary = 0x2,
  close = 0x8,
  ping = 0x9,
  pong = 0xA,
};

/// Which end of the connection a codec serves: a server receives masked
/// frames and sends unmasked ones; a client the reverse. Plain data.
enum class ws_role : std::uint8_t { server, client };

/// Close status codes used by the codec. Plain data.
namespace ws_close_code {
inline constexpr std::uint16_t normal = 1000;          ///< normal closure
inline constexpr std::uint16_t going_away = 1001;      ///< server shutting down, page left
inline constexpr std::uint16_t protocol_error = 1002;  ///< the peer broke RFC 6455
inline constexpr std::uint16_t no_status = 1005;       ///< never sent: a close frame without a code
inline constexpr std::uint16_t invalid_payload = 1007;  ///< text or close reason not UTF-8
inline constexpr std::uint16_t message_too_big = 1009;  ///< message over `max_message`
inline constexpr std::uint16_t internal_error = 1011;   ///< the app failed
}  // namespace ws_close_code

/// True for a close code a peer may put in a close frame: 1000-1003,
/// 1007-1014 and 3000-4999. Any thread.
[[nodiscard]] bool is_valid_ws_close_code(std::uint16_t code) noexcept;

/// Incremental UTF-8 validator (RFC 3629: no overlongs, no surrogates,
/// nothing above U+10FFFF). Fails at the first byte that cannot start or
/// continue a valid sequence. Owned by one thread.
class utf8_validator {
 public:
  /// Feeds more bytes; false once the input so far cannot be valid UTF-8
  /// whatever follows. Owner thread.
  bool feed(std::string_view bytes) noexcept;
  /// True when the bytes so far end on a character boundary. Owner thread.
  [[nodiscard]] bool complete() const noexcept { return state_ == 0; }
  /// Forgets everything fed so far. Owner thread.
  void reset() noexcept { state_ = 0; }

 private:
  std::uint8_t state_ = 0;
};

/// True when `bytes` is complete, valid UTF-8. Any thread.
[[nodiscard]] bool is_valid_utf8(std::string_view bytes) noexcept;

/// What the frame parser reports. Plain data.
enum class ws_event_kind : std::uint8_t { text, binary, ping, pong, close, error };

/// One parser event. `payload` is the assembled message, the ping/pong
/// payload, the close reason, or the error's reason text; it stays valid until
/// the parser's next call. `code` is the received close code (1005 when the
/// close frame had none) or, for an error, the close code to send.
struct ws_event {
  ws_event_kind kind = ws_event_kind::error;  ///< what happened
  std::uint16_t code = 0;                     ///< close code received, or to send on error
  std::string_view payload{};                 ///< message, ping/pong data, close or error reason
  /// For text and binary: the first frame had RSV1 set (a permessage-deflate
  /// message, still compressed; its UTF-8 is checked after decompression).
  bool compressed = false;
};

/// Frame parser limits and role. Plain data.
struct ws_parser_options {
  ws_role role = ws_role::server;  ///< server: frames must be masked; client: must not be
  std::size_t max_message = 16U * 1024U * 1024U;  ///< largest assembled message, bytes (else 1009)
  /// RSV bits (0x40, 0x20, 0x10) a negotiated extension may set. RSV1 (0x40,
  /// permessage-deflate) is only allowed on the first frame of a text or
  /// binary message (RFC 7692 section 6): on a control frame or a
  /// continuation it is a protocol error.
  std::uint8_t allowed_rsv = 0;
};

/// Push-based, incremental WebSocket frame parser. Any split of the input
/// yields the same events. After a close or an error event it accepts
/// nothing more. Owned and used by one thread (the connection's I/O thread).
class ws_parser {
 public:
  /// A parser with `options`. Owner thread.
  explicit ws_parser(ws_parser_options options = {});

  /// Consumes bytes from the front of `input` until one event is complete
  /// (returned, and `input` advanced past its last byte) or `input` is used
  /// up (nullptr). Returns nullptr without consuming once `finished()`. The
  /// event and its payload stay valid until the next call. Owner thread.
  const ws_event* next(std::string_view& input);

  /// Feeds all of `input`, calling `on_event(const ws_event&)` for each
  /// event. Stops at a close or an error. Owner thread.
  template <class OnEvent>
  void feed(std::string_view input, OnEvent&& on_event) {
    while (const ws_event* e = next(input)) {
      on_event(*e);
    }
  }

  /// True after a close or an error event. Owner thread.
  [[nodiscard]] bool finished() const noexcept { return phase_ == phase::finished; }

 private:
  enum class phase : std::uint8_t { header, payload, finished };

  const ws_event* fail(std::uint16_t code, std::string_view reason);
  const ws_event* start_frame();
  const ws_event* end_frame();

  ws_parser_options options_;
  phase phase_ = phase::header;
  bool release_message_ = false;

  std::array<std::uint8_t, 14> header_{};
  std::size_t header_have_ = 0;
  std::size_t header_need_ = 2;

  bool fin_ = false;
  ws_opcode opcode_ = ws_opcode::continuation;
  bool masked_ = false;
  std::array<std::uint8_t, 4> mask_{};
  std::uint64_t remaining_ = 0;
  std::size_t mask_offset_ = 0;

  bool in_message_ = false;
  bool rsv1_ = false;        // RSV1 of the frame being read
  bool compressed_ = false;  // the message being assembled had RSV1 on its first frame
  ws_opcode message_opcode_ = ws_opcode::binary;
  std::string message_;
  utf8_validator utf8_;

  // A control frame's payload (at most 125 bytes): allocated when one with a
  // payload starts and freed at the next call after its event, so an idle
  // connection holds none.
  std::unique_ptr<char[]> control_;
  std::size_t control_size_ = 0;
  bool release_control_ = false;

  ws_event event_;
};

/// A client's masking key. Plain data.
using ws_mask_key = std::array<std::uint8_t, 4>;

/// Appends a frame header for a payload of `payload_size` bytes; with a
/// `mask` the header carries it and the caller must mask the payload (see
/// `encode_ws_frame`). Server frames have no mask, so the payload can follow
/// from the caller's own buffer (writev). Any thread.
void encode_ws_frame_header(std::string& out, ws_opcode opcode, std::uint64_t payload_size,
                            bool fin = true, const ws_mask_key* mask = nullptr);

/// Appends one whole frame, masking the payload when `mask` is given. Any thread.
void encode_ws_frame(std::string& out, ws_opcode opcode, std::string_view payload, bool fin = true,
                     const ws_mask_key* mask = nullptr);

/// Appends a text or binary message, split into frames of at most
/// `fragment_size` payload bytes (0: one frame). An empty message is one
/// empty frame. Any thread.
void encode_ws_message(std::string& out, ws_opcode opcode, std::string_view payload,
                       std::size_t fragment_size = 0, const ws_mask_key* mask = nullptr);

/// Appends a ping or pong; refused (nothing appended) when the payload is
/// over 125 bytes. Any thread.
encode_status encode_ws_control(std::string& out, ws_opcode opcode, std::string_view payload,
                                const ws_mask_key* mask = nullptr);

/// Appends a close frame. `code` 1005 sends an empty close payload; any
/// other code must satisfy `is_valid_ws_close_code`. `reason` is cut to 123
/// bytes at a UTF-8 character boundary. Any thread.
encode_status encode_ws_close(std::string& out, std::uint16_t code, std::string_view reason = {},
                              const ws_mask_key* mask = nullptr);

/// XORs `size` bytes of `src` with `mask` starting at mask position
/// `offset` (0..3) into `dst` (may equal `src`); returns the next offset.
/// Eight bytes at a time. Any thread.
std::size_t ws_apply_mask(char* dst, const char* src, std::size_t size, const ws_mask_key& mask,
                          std::size_t offset) noexcept;

}  // namespace cadeloop::http
