#pragma once

// permessage-deflate (RFC 7692): the negotiation of its parameters from a
// client's `Sec-WebSocket-Extensions` offers, and the zlib streams that
// compress the server's messages and decompress the client's.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace cadeloop::http {

/// The parameters the server agreed to. Plain data.
struct ws_deflate_params {
  /// The server resets its compressor after each message. The server always
  /// asks for it (RFC 7692 7.1.1.1 lets it): one compressor per I/O thread
  /// then serves every connection, instead of ~256 KiB per connection.
  bool server_no_context_takeover = true;
  /// The client resets its compressor after each message (it offered it):
  /// the server's decompressor is then shared by the I/O thread too.
  bool client_no_context_takeover = false;
  /// LZ77 window of the server's compressor, 9..15 (the client may ask for
  /// less than 15; 8 cannot be honoured by zlib's raw deflate, so an offer
  /// asking for 8 is declined).
  std::uint8_t server_max_window_bits = 15;
  /// LZ77 window the client may use, 8..15 (15 unless the response says less).
  std::uint8_t client_max_window_bits = 15;
};

/// The window the server asks a client's compressor to stay within when
/// the client offers `client_max_window_bits` (4 KiB: the per-connection
/// decompressor of a client with context takeover then holds ~11 KiB, not ~39).
inline constexpr std::uint8_t ws_deflate_client_window_bits = 12;

/// Picks the first permessage-deflate offer the server can honour among the
/// `Sec-WebSocket-Extensions` header values `offers` (each a comma-separated
/// list of extensions with `;` parameters). On success writes the response's
/// header value to `response` and returns true; false (and `response`
/// empty) when there is no acceptable offer: unknown or repeated parameters,
/// bad values and server_max_window_bits=8 decline that offer. Any thread.
[[nodiscard]] bool negotiate_ws_deflate(std::span<const std::string_view> offers,
                                        ws_deflate_params& params, std::string& response);

/// The outcome of one decompression. Plain data.
enum class ws_inflate_status : std::uint8_t { ok, too_big, bad_data };

/// The server's compressor (raw deflate, RFC 7692 7.2.1): one message at a
/// time. Owned and used by one thread.
class ws_deflater {
 public:
  /// A compressor with an LZ77 window of `window_bits` (9..15) that forgets
  /// its context after each message when `no_context_takeover`. Throws
  /// std::bad_alloc. Owner thread.
  ws_deflater(int window_bits, bool no_context_takeover);
  ws_deflater(const ws_deflater&) = delete;
  ws_deflater& operator=(const ws_deflater&) = delete;
  ~ws_deflater();

  /// Appends the compressed form of `message` to `out`, without the
  /// trailing 00 00 FF FF (RFC 7692 7.2.1). False on a zlib failure (the
  /// stream is reset; send the message uncompressed). Owner thread.
  bool compress(std::string_view message, std::string& out);

 private:
  struct stream;
  std::unique_ptr<stream> s_;
  bool reset_each_message_;
};

/// The server's decompressor for a client's messages. Owned and used by one thread.
class ws_inflater {
 public:
  /// A decompressor for raw deflate with windows up to `window_bits` (8..15;
  /// 9 is used for 8, which decodes the same streams) that forgets its
  /// context after each message when `no_context_takeover`. Throws
  /// std::bad_alloc. Owner thread.
  ws_inflater(int window_bits, bool no_context_takeover);
  ws_inflater(const ws_inflater&) = delete;
  ws_inflater& operator=(const ws_inflater&) = delete;
  ~ws_inflater();

  /// Decompresses one message (the trailing 00 00 FF FF is added here) into
  /// `out` (replaced). Stops as soon as the output would pass `max_size`
  /// bytes (too_big: a decompression bomb costs at most `max_size`). After
  /// too_big or bad_data the connection is failed; the stream is reset.
  /// Owner thread.
  ws_inflate_status decompress(std::string_view message, std::size_t max_size, std::string& out);

 private:
  struct stream;
  std::unique_ptr<stream> s_;
  bool reset_each_message_;
};

}  // namespace cadeloop::http
