#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "cadeloop/http/date_cache.hpp"
#include "cadeloop/http/header.hpp"

namespace cadeloop::http {

/// Why an encoder call was refused. Plain data; any thread.
enum class encode_errc : std::uint8_t {
  ok,                  ///< no error
  bad_status,          ///< status outside 100..599, or 101 (only the WebSocket handshake sends it)
  bad_header_name,     ///< a header name that is not an RFC 9110 token
  bad_header_value,    ///< a header value with CR, LF, NUL or another CTL except HTAB
  bad_content_length,  ///< content-length that is not 1*DIGIT fitting 64 bits
  conflicting_content_length,  ///< several content-length headers with different values
  forbidden_header,            ///< a header the encoder owns where the caller may not set it
  control_payload_too_long,    ///< a WebSocket control frame payload over 125 bytes
  bad_close_code,              ///< a WebSocket close code that may not be sent
  bad_state,                   ///< the call does not fit the response's progress
  body_too_long,               ///< more body bytes than content-length declared
  body_too_short,              ///< the response finished before content-length bytes were written
};

/// The outcome of an encoder call. `header` names the offending header (a view
/// into the caller's header list) when the error is about one. Plain data.
struct encode_status {
  encode_errc code = encode_errc::ok;  ///< what went wrong, or `ok`
  std::string_view header{};           ///< the offending header's name, when there is one

  /// True when the call succeeded. Any thread.
  [[nodiscard]] bool ok() const noexcept { return code == encode_errc::ok; }
  /// A one-line description for logs, e.g. "invalid value for header 'x-id'". Any thread.
  [[nodiscard]] std::string message() const;
};

/// The reason phrase registered for `status` (IANA HTTP status code
/// registry), or "" for an unregistered code. Any thread.
[[nodiscard]] std::string_view reason_phrase(unsigned status) noexcept;

/// True when `name` is a non-empty RFC 9110 token. Any thread.
[[nodiscard]] bool is_valid_header_name(std::string_view name) noexcept;

/// True when `value` has no CTL other than HTAB (so no CR, LF, NUL, DEL).
/// Bytes 0x80..0xFF (obs-text) are allowed. Any thread.
[[nodiscard]] bool is_valid_header_value(std::string_view value) noexcept;

/// ASCII case-insensitive comparison of a header name with a lower-case name. Any thread.
[[nodiscard]] bool header_name_equals(std::string_view name, std::string_view lower) noexcept;

/// True when the comma-separated token list `value` contains `lower_token`
/// (ASCII case-insensitive, optional whitespace around elements). Any thread.
[[nodiscard]] bool header_has_token(std::string_view value, std::string_view lower_token) noexcept;

/// What the response encoder needs to know about the request it answers. Plain data.
struct request_context {
  bool is_head = false;         ///< the request method was HEAD: no body bytes are written
  std::uint8_t http_minor = 1;  ///< 0 for HTTP/1.0, 1 for HTTP/1.1
  /// The client allows reuse: HTTP/1.1 without `Connection: close`, or
  /// HTTP/1.0 with `Connection: keep-alive`.
  bool client_keep_alive = true;
  bool server_closing = false;  ///< the server closes after this response anyway (draining, limits)
};

/// App header fields as checked and formatted once: an app that sends the
/// same headers with every response ("content-type: text/plain") has each
/// one validated, classified and formatted the first time, and the encoders
/// that share this table look it up by its bytes afterwards. What an entry
/// holds depends on the field's bytes alone, and only fields that passed
/// validation are kept, so a hit writes exactly what validation would have.
/// A direct-mapped table of `slots` entries of at most `max_field` bytes of
/// name and value; a field that collides replaces the entry. Owned and used
/// by one thread, like the encoders using it (about 16 KiB).
class header_line_cache {
 public:
  static constexpr std::size_t slots = 64;       ///< entries (a power of two)
  static constexpr std::size_t max_field = 120;  ///< name + value bytes of a field it keeps
  static_assert((slots & (slots - 1)) == 0, "index_of masks with slots - 1");
  static_assert(max_field + 4 <= 255, "entry lengths are one byte");

  /// One kept field: its bytes as the app sent them, what the encoder must
  /// know of it, and its line. Plain data.
  struct entry {
    std::uint8_t name_len = 0;  ///< 0: the slot is empty (a valid name is never empty)
    std::uint8_t value_len = 0;
    std::uint8_t kind = 0;      ///< which header the encoder owns, if any (response_encoder.cpp)
    bool close = false;         ///< `connection` with a `close` token
    std::uint8_t line_len = 0;  ///< 0 for a field the encoder does not write as it came
    std::uint64_t length = 0;   ///< a `content-length` field's value
    std::array<char, max_field> key{};       ///< name, then value
    std::array<char, max_field + 4> line{};  ///< "name: value\r\n", value trimmed
  };

  /// The entry for `f`, or null when it is not kept. Owner thread.
  [[nodiscard]] const entry* find(const header_field& f) const noexcept;
  /// The slot `f` goes to when kept, or null when it is too long to keep. Owner thread.
  [[nodiscard]] entry* slot_for(const header_field& f) noexcept;

 private:
  /// Whether `f` can be kept at all: a name (an empty one is refused) and
  /// at most max_field bytes.
  [[nodiscard]] static bool keepable(const header_field& f) noexcept {
    return !f.name.empty() && f.name.size() + f.value.size() <= max_field;
  }
  [[nodiscard]] static std::size_t index_of(const header_field& f) noexcept;
  std::array<entry, slots> table_{};
};

/// Process-wide choices for every response. Plain data; the views must
/// outlive the encoders using them (string literals or configuration storage).
struct encoder_options {
  std::string_view server = "cadeloop";  ///< `Server` header value; empty sends none
  bool send_date = true;                 ///< add `Date` unless the app set one
  /// Header lines added to every response head the encoder writes for an app,
  /// already formatted ("X-Frame-Options: DENY\r\n..."; the `headers` setting).
  std::string_view extra_headers{};
  /// Where app header fields checked once are kept (see header_line_cache),
  /// or null to check each one every time. It must outlive the encoders and
  /// be used by their thread only.
  header_line_cache* lines = nullptr;
};

/// The response head an app asked for. The views must stay valid for the call only.
struct response_head {
  /// Status code, 100..599.
  unsigned status = 200;
  /// App headers, any case; see `response_encoder::write_head`.
  std::span<const header_field> headers{};
  /// The whole body's length when known up front.
  std::optional<std::uint64_t> body_size{};
  /// The app will send trailers (forces chunked on HTTP/1.1).
  bool trailers = false;
};

/// How a response body is delimited on the wire. Plain data.
enum class response_framing : std::uint8_t {
  none,             ///< no body bytes at all (HEAD, 1xx, 204, 304)
  content_length,   ///< exactly `Content-Length` bytes follow
  chunked,          ///< chunked transfer coding
  close_delimited,  ///< the body ends when the connection closes (HTTP/1.0, length unknown)
};

/// The framing around one body part, for callers that write the body bytes
/// from their own buffer (writev) instead of copying them. Plain data.
struct body_part_framing {
  encode_status status{};         ///< not ok: nothing was appended and the body must not be sent
  bool send_body = false;         ///< write the part's bytes after what was appended
  std::string_view after_body{};  ///< static bytes to write after the part's bytes ("\r\n" or "")
};

/// Turns one request's response into HTTP/1.1 wire bytes. One per connection,
/// owned and used by the connection's I/O thread (or by the app thread that
/// builds response buffers; never by two threads at once). Output is appended
/// to a caller-provided `std::string`; no other allocation is made, so a
/// reused output buffer makes steady-state encoding allocation-free.
///
/// Sequence per request: `start()`, optional `write_continue()`, any number of
/// interim (1xx) heads, one final `write_head()`, body parts, `finish()`,
/// then read `keep_alive()`.
class response_encoder {
 public:
  /// An encoder reading `Date` from `dates` (which must outlive it). Owner thread.
  explicit response_encoder(date_cache& dates, encoder_options options = {}) noexcept;

  /// Begins the response to a new request described by `context`. Owner thread.
  void start(const request_context& context) noexcept;

  /// Appends `HTTP/1.1 100 Continue` for a 1.1 client that sent
  /// `Expect: 100-continue`; HTTP/1.0 clients get nothing. Only before the
  /// final head. Owner thread.
  encode_status write_continue(std::string& out);

  /// Appends the status line and headers.
  ///
  /// Every app header is validated (name a token; value without CTLs except
  /// HTAB; surrounding whitespace trimmed); on any refusal nothing is
  /// appended and the encoder stays ready for another head (e.g. a 500).
  /// The encoder owns the framing and connection headers: app
  /// `transfer-encoding` and `connection` headers are not written (a
  /// `close` token in `connection` makes the response close the
  /// connection); one validated `content-length` is written (duplicates
  /// must agree) and chooses the framing. `Date` and `Server` are added
  /// unless the app set them.
  ///
  /// Framing: no body for HEAD, 1xx, 204 and 304 (headers kept, except
  /// content-length on 204); else app content-length; else `body_size`
  /// (unless trailers) as Content-Length; else chunked on HTTP/1.1 and
  /// close-delimited on HTTP/1.0.
  ///
  /// 1xx (except 101, refused) are interim: they add no Date, Server or
  /// framing, are dropped for HTTP/1.0 clients, and leave the encoder waiting
  /// for the final head. Owner thread.
  encode_status write_head(const response_head& head, std::string& out);

  /// Appends one body part (framing and bytes). An empty part appends
  /// nothing. Bodies that must not be sent (HEAD, 204, 304) are dropped.
  /// Owner thread.
  encode_status write_body(std::string_view data, std::string& out);

  /// Appends only the framing that precedes a body part of `size` bytes (a
  /// chunk-size line when chunked) so the caller can send the part's bytes
  /// from its own buffer, followed by the returned `after_body` bytes.
  /// Owner thread.
  body_part_framing frame_body_part(std::uint64_t size, std::string& out);

  /// Ends the body: the last chunk with `trailers` when chunked (trailers are
  /// validated, and dropped for other framings); checks that a
  /// content-length body is complete. Owner thread.
  encode_status finish(std::span<const header_field> trailers, std::string& out);

  /// Whether the connection may carry another request after this response.
  /// Meaningful once the final head is written; false after any body error.
  /// Owner thread.
  [[nodiscard]] bool keep_alive() const noexcept { return keep_alive_; }

  /// The framing chosen by the final head. Owner thread.
  [[nodiscard]] response_framing framing() const noexcept { return framing_; }

 private:
  enum class phase : std::uint8_t { idle, head_sent, body, finished };

  date_cache& dates_;
  encoder_options options_;
  request_context context_;
  phase phase_ = phase::idle;
  response_framing framing_ = response_framing::none;
  bool keep_alive_ = false;
  std::uint64_t declared_length_ = 0;
  std::uint64_t written_length_ = 0;
};

/// Appends a complete, connection-closing error response for a protocol
/// error answered by the I/O thread (400, 408, 413, 414, 431, 500, 501, 505,
/// ...): status line, `Content-Type: text/plain; charset=utf-8`,
/// Content-Length, `Connection: close`, Date, Server, `extra` headers, and
/// `text` (the reason phrase and a newline when empty) as the body, omitted
/// for HEAD. A status outside 400..599 becomes 500. On an invalid `extra`
/// header nothing is appended. Owner thread of `dates`.
encode_status encode_error_response(unsigned status, std::string_view text, date_cache& dates,
                                    std::string& out, const encoder_options& options = {},
                                    std::span<const header_field> extra = {}, bool is_head = false);

}  // namespace cadeloop::http
