// The WebSocket (RFC 6455) codec: the opening handshake's accept key and
// response, frame parsing with unmasking, fragmentation and control-frame
// rules, UTF-8 checks of text and close reasons, and frame encoding.

#include "cadeloop/http/websocket.hpp"

#include <openssl/evp.h>
#include <openssl/sha.h>

#include <algorithm>
#include <cstring>

namespace cadeloop::http {

namespace {

constexpr std::string_view ws_guid = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

constexpr std::size_t retained_message_capacity = 64U * 1024U;

std::string_view trim_ows(std::string_view v) noexcept {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) {
    v.remove_prefix(1);
  }
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) {
    v.remove_suffix(1);
  }
  return v;
}

bool is_base64_char(char c) noexcept {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' ||
         c == '/';
}

// 16 bytes encode to 22 significant characters and "==" of padding; any
// other shape decodes to some other length (or not at all).
bool is_valid_ws_key(std::string_view key) noexcept {
  if (key.size() != 24 || key[22] != '=' || key[23] != '=') {
    return false;
  }
  return std::all_of(key.begin(), key.begin() + 22, is_base64_char);
}

// Appends each element of a comma-separated token list; false on an element
// that is not a token. Empty elements are skipped, as RFC 9110 5.6.1 asks.
bool split_token_list(std::string_view value, std::vector<std::string_view>& out) {
  while (true) {
    const std::size_t comma = value.find(',');
    const std::string_view element = trim_ows(value.substr(0, comma));
    if (!element.empty()) {
      if (!is_valid_header_name(element)) {
        return false;
      }
      out.push_back(element);
    }
    if (comma == std::string_view::npos) {
      return true;
    }
    value.remove_prefix(comma + 1);
  }
}

bool is_control(ws_opcode op) noexcept {
  return (static_cast<std::uint8_t>(op) & 0x8U) != 0;
}

}  // namespace

ws_handshake_result validate_ws_handshake(const ws_handshake_request& request) {
  ws_handshake_result result;
  if (request.method != "GET") {
    result.reason = "WebSocket upgrade needs a GET request";
    return result;
  }
  if (request.http_major != 1 || request.http_minor < 1) {
    result.reason = "WebSocket upgrade needs HTTP/1.1";
    return result;
  }
  bool upgrade = false;
  bool connection = false;
  bool protocols_ok = true;
  int keys = 0;
  int versions = 0;
  std::string_view version;
  for (const header_field& f : request.headers) {
    if (f.name == "upgrade") {
      upgrade = upgrade || header_has_token(f.value, "websocket");
    } else if (f.name == "connection") {
      connection = connection || header_has_token(f.value, "upgrade");
    } else if (f.name == "sec-websocket-key") {
      ++keys;
      result.key = trim_ows(f.value);
    } else if (f.name == "sec-websocket-version") {
      ++versions;
      version = trim_ows(f.value);
    } else if (f.name == "sec-websocket-protocol") {
      protocols_ok = split_token_list(f.value, result.subprotocols) && protocols_ok;
    }
  }
  if (!upgrade) {
    result.reason = "missing 'Upgrade: websocket'";
  } else if (!connection) {
    result.reason = "missing 'Connection: upgrade'";
  } else if (versions != 1 || version != "13") {
    // RFC 6455 4.2.2: an unsupported version is answered with 426 and the
    // versions the server speaks, so the client can retry.
    result.status = 426;
    result.reason = "unsupported Sec-WebSocket-Version (13 is supported)";
  } else if (keys != 1 || !is_valid_ws_key(result.key)) {
    result.reason = "Sec-WebSocket-Key must be base64 of 16 bytes";
  } else if (!protocols_ok) {
    result.reason = "Sec-WebSocket-Protocol must be a list of tokens";
  } else {
    result.status = 101;
    return result;
  }
  result.key = {};
  result.subprotocols.clear();
  return result;
}

std::array<char, 28> ws_accept_key(std::string_view key) noexcept {
  // The handshake key is 24 bytes, so the concatenation fits on the stack;
  // a longer key (never from a validated request) is hashed incrementally.
  std::array<unsigned char, SHA_DIGEST_LENGTH> digest{};
  std::array<char, 128> joined{};
  if (key.size() + ws_guid.size() <= joined.size()) {
    std::memcpy(joined.data(), key.data(), key.size());
    std::memcpy(joined.data() + key.size(), ws_guid.data(), ws_guid.size());
    SHA1(reinterpret_cast<const unsigned char*>(joined.data()), key.size() + ws_guid.size(),
         digest.data());
  } else {
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    unsigned int size = 0;
    if (ctx == nullptr || EVP_DigestInit_ex(ctx, EVP_sha1(), nullptr) != 1 ||
        EVP_DigestUpdate(ctx, key.data(), key.size()) != 1 ||
        EVP_DigestUpdate(ctx, ws_guid.data(), ws_guid.size()) != 1 ||
        EVP_DigestFinal_ex(ctx, digest.data(), &size) != 1) {
      digest.fill(0);
    }
    EVP_MD_CTX_free(ctx);
  }
  std::array<unsigned char, 29> encoded{};  // 28 characters and the NUL EVP_EncodeBlock adds
  EVP_EncodeBlock(encoded.data(), digest.data(), static_cast<int>(digest.size()));
  std::array<char, 28> result{};
  std::memcpy(result.data(), encoded.data(), result.size());
  return result;
}

encode_status encode_ws_accept(std::string_view key, std::string_view subprotocol,
                               std::span<const header_field> extra, std::string& out,
                               std::string_view extensions) {
  if (!subprotocol.empty() && !is_valid_header_name(subprotocol)) {
    return {encode_errc::bad_header_value, "sec-websocket-protocol"};
  }
  for (const header_field& f : extra) {
    if (!is_valid_header_name(f.name)) {
      return {encode_errc::bad_header_name, f.name};
    }
    if (!is_valid_header_value(f.value)) {
      return {encode_errc::bad_header_value, f.name};
    }
    for (const std::string_view owned :
         {std::string_view{"upgrade"}, std::string_view{"connection"},
          std::string_view{"sec-websocket-accept"}, std::string_view{"sec-websocket-protocol"},
          std::string_view{"sec-websocket-extensions"}, std::string_view{"content-length"},
          std::string_view{"transfer-encoding"}}) {
      if (header_name_equals(f.name, owned)) {
        return {encode_errc::forbidden_header, f.name};
      }
    }
  }
  const std::array<char, 28> accept = ws_accept_key(key);
  out.append(
      "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
      "Sec-WebSocket-Accept: ");
  out.append(accept.data(), accept.size());
  out.append("\r\n");
  if (!subprotocol.empty()) {
    out.append("Sec-WebSocket-Protocol: ");
    out.append(subprotocol);
    out.append("\r\n");
  }
  if (!extensions.empty()) {
    out.append("Sec-WebSocket-Extensions: ");
    out.append(extensions);
    out.append("\r\n");
  }
  for (const header_field& f : extra) {
    out.append(f.name);
    out.append(": ");
    out.append(trim_ows(f.value));
    out.append("\r\n");
  }
  out.append("\r\n");
  return {};
}

void encode_ws_reject(const ws_handshake_result& result, date_cache& dates, std::string& out,
                      const encoder_options& options) {
  const unsigned status = result.status == 426 ? 426U : 400U;
  const header_field version{"Sec-WebSocket-Version", "13"};
  std::span<const header_field> extra;
  if (status == 426) {
    extra = {&version, 1};
  }
  std::string text{result.reason.empty() ? std::string_view{"bad WebSocket handshake"}
                                         : result.reason};
  text.push_back('\n');
  (void)encode_error_response(status, text, dates, out, options, extra);
}

bool is_valid_ws_close_code(std::uint16_t code) noexcept {
  return (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1014) ||
         (code >= 3000 && code <= 4999);
}

// States: 0 accept; 1..3 need that many continuation bytes (80..BF); 4 after
// E0 (next A0..BF, no overlong); 5 after ED (next 80..9F, no surrogates);
// 6 after F0 (next 90..BF, no overlong); 7 after F4 (next 80..8F, nothing
// above U+10FFFF); 8 rejected for good.
bool utf8_validator::feed(std::string_view bytes) noexcept {
  constexpr std::uint8_t reject = 8;
  std::uint8_t s = state_;
  if (s == reject) {
    return false;
  }
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const auto* const end = p + bytes.size();
  while (p != end) {
    if (s == 0) {
      // Text is mostly ASCII: skip it eight bytes at a time.
      while (end - p >= 8) {
        std::uint64_t w = 0;
        std::memcpy(&w, p, 8);
        if ((w & 0x8080808080808080ULL) != 0) {
          break;
        }
        p += 8;
      }
      if (p == end) {
        break;
      }
      const unsigned c = *p++;
      if (c < 0x80) {
        continue;
      }
      if (c < 0xC2) {
        s = reject;
      } else if (c < 0xE0) {
        s = 1;
      } else if (c == 0xE0) {
        s = 4;
      } else if (c == 0xED) {
        s = 5;
      } else if (c < 0xF0) {
        s = 2;
      } else if (c == 0xF0) {
        s = 6;
      } else if (c < 0xF4) {
        s = 3;
      } else if (c == 0xF4) {
        s = 7;
      } else {
        s = reject;
      }
    } else {
      const unsigned c = *p++;
      switch (s) {
        case 1:
        case 2:
        case 3:
          s = (c & 0xC0U) == 0x80U ? static_cast<std::uint8_t>(s - 1) : reject;
          break;
        case 4:
          s = (c >= 0xA0 && c <= 0xBF) ? 1 : reject;
          break;
        case 5:
          s = (c >= 0x80 && c <= 0x9F) ? 1 : reject;
          break;
        case 6:
          s = (c >= 0x90 && c <= 0xBF) ? 2 : reject;
          break;
        case 7:
          s = (c >= 0x80 && c <= 0x8F) ? 2 : reject;
          break;
        default:
          s = reject;
          break;
      }
    }
    if (s == reject) {
      state_ = reject;
      return false;
    }
  }
  state_ = s;
  return true;
}

bool is_valid_utf8(std::string_view bytes) noexcept {
  utf8_validator v;
  return v.feed(bytes) && v.complete();
}

std::size_t ws_apply_mask(char* dst, const char* src, std::size_t size, const ws_mask_key& mask,
                          std::size_t offset) noexcept {
  std::size_t i = 0;
  if (size >= 8) {
    // A 64-bit mask rotated to the current offset; 8 is a multiple of the
    // key length, so the rotation holds for every word.
    std::array<std::uint8_t, 8> rotated{};
    for (std::size_t k = 0; k < rotated.size(); ++k) {
      rotated[k] = mask[(offset + k) & 3U];
    }
    std::uint64_t m = 0;
    std::memcpy(&m, rotated.data(), sizeof m);
    for (; size - i >= 8; i += 8) {
      std::uint64_t w = 0;
      std::memcpy(&w, src + i, sizeof w);
      w ^= m;
      std::memcpy(dst + i, &w, sizeof w);
    }
  }
  for (; i < size; ++i) {
    dst[i] = static_cast<char>(static_cast<unsigned char>(src[i]) ^ mask[(offset + i) & 3U]);
  }
  return (offset + size) & 3U;
}

ws_parser::ws_parser(ws_parser_options options) : options_(options) {}

const ws_event* ws_parser::fail(std::uint16_t code, std::string_view reason) {
  phase_ = phase::finished;
  in_message_ = false;
  event_ = {ws_event_kind::error, code, reason, false};
  return &event_;
}

const ws_event* ws_parser::next(std::string_view& input) {
  if (release_message_) {
    // The previous event's payload viewed message_; it is dead now. Clearing
    // keeps the capacity, so steady traffic does not reallocate; only an
    // unusually large buffer is given back, so an idle connection does not
    // keep the memory of its biggest message.
    message_.clear();
    if (message_.capacity() > retained_message_capacity) {
      message_.shrink_to_fit();
    }
    release_message_ = false;
  }
  if (release_control_) {
    // The previous event viewed the control payload (or was a close): dead now.
    control_.reset();
    control_size_ = 0;
    release_control_ = false;
  }
  while (phase_ != phase::finished) {
    if (phase_ == phase::header) {
      if (header_have_ < 2) {
        const std::size_t take = std::min<std::size_t>(2 - header_have_, input.size());
        std::memcpy(header_.data() + header_have_, input.data(), take);
        input.remove_prefix(take);
        header_have_ += take;
        if (header_have_ < 2) {
          return nullptr;
        }
        // Checks on the first two bytes run as soon as they arrive, so a bad
        // frame is refused before its length and payload are awaited.
        const std::uint8_t b0 = header_[0];
        const std::uint8_t b1 = header_[1];
        fin_ = (b0 & 0x80U) != 0;
        opcode_ = static_cast<ws_opcode>(b0 & 0x0FU);
        masked_ = (b1 & 0x80U) != 0;
        rsv1_ = (b0 & 0x40U) != 0;
        const unsigned len7 = b1 & 0x7FU;
        if ((b0 & 0x70U & ~static_cast<unsigned>(options_.allowed_rsv)) != 0) {
          return fail(ws_close_code::protocol_error,
                      "reserved bits set without a negotiated extension");
        }
        if (rsv1_ && (is_control(opcode_) || opcode_ == ws_opcode::continuation)) {
          return fail(ws_close_code::protocol_error,
                      "RSV1 set on a control frame or a continuation");
        }
        switch (opcode_) {
          case ws_opcode::continuation:
            if (!in_message_) {
              return fail(ws_close_code::protocol_error,
                          "continuation frame without a message to continue");
            }
            break;
          case ws_opcode::text:
          case ws_opcode::binary:
            if (in_message_) {
              return fail(ws_close_code::protocol_error,
                          "new data frame inside a fragmented message");
            }
            break;
          case ws_opcode::close:
          case ws_opcode::ping:
          case ws_opcode::pong:
            if (!fin_) {
              return fail(ws_close_code::protocol_error, "fragmented control frame");
            }
            if (len7 > 125) {
              return fail(ws_close_code::protocol_error, "control frame payload over 125 bytes");
            }
            break;
          default:
            return fail(ws_close_code::protocol_error, "reserved opcode");
        }
        if (options_.role == ws_role::server && !masked_) {
          return fail(ws_close_code::protocol_error, "client frame not masked");
        }
        if (options_.role == ws_role::client && masked_) {
          return fail(ws_close_code::protocol_error, "server frame masked");
        }
        header_need_ = 2 + (len7 == 126 ? 2U : len7 == 127 ? 8U : 0U) + (masked_ ? 4U : 0U);
      }
      if (header_have_ < header_need_) {
        const std::size_t take = std::min(header_need_ - header_have_, input.size());
        std::memcpy(header_.data() + header_have_, input.data(), take);
        input.remove_prefix(take);
        header_have_ += take;
        if (header_have_ < header_need_) {
          return nullptr;
        }
      }
      if (const ws_event* e = start_frame()) {
        return e;
      }
      continue;
    }

    if (remaining_ != 0) {
      if (input.empty()) {
        return nullptr;
      }
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(remaining_, input.size()));
      if (is_control(opcode_)) {
        char* dst = control_.get() + control_size_;
        if (masked_) {
          mask_offset_ = ws_apply_mask(dst, input.data(), n, mask_, mask_offset_);
        } else {
          std::memcpy(dst, input.data(), n);
        }
        control_size_ += n;
      } else {
        const std::size_t old = message_.size();
        message_.resize(old + n);
        if (masked_) {
          mask_offset_ = ws_apply_mask(message_.data() + old, input.data(), n, mask_, mask_offset_);
        } else {
          std::memcpy(message_.data() + old, input.data(), n);
        }
        // Validated as it arrives, so invalid text fails at the first bad
        // byte rather than after the whole message was buffered.
        if (message_opcode_ == ws_opcode::text && !compressed_ &&
            !utf8_.feed({message_.data() + old, n})) {
          return fail(ws_close_code::invalid_payload, "invalid UTF-8 in a text message");
        }
      }
      input.remove_prefix(n);
      remaining_ -= n;
      if (remaining_ != 0) {
        return nullptr;
      }
    }
    if (const ws_event* e = end_frame()) {
      return e;
    }
  }
  return nullptr;
}

const ws_event* ws_parser::start_frame() {
  const unsigned len7 = header_[1] & 0x7FU;
  std::size_t at = 2;
  std::uint64_t length = len7;
  if (len7 == 126) {
    length = (static_cast<std::uint64_t>(header_[2]) << 8) | header_[3];
    at = 4;
  } else if (len7 == 127) {
    length = 0;
    for (std::size_t i = 2; i < 10; ++i) {
      length = (length << 8) | header_[i];
    }
    at = 10;
    if ((length >> 63) != 0) {
      return fail(ws_close_code::protocol_error, "64-bit payload length with the top bit set");
    }
  }
  if (masked_) {
    std::memcpy(mask_.data(), header_.data() + at, 4);
  }
  header_have_ = 0;
  header_need_ = 2;
  remaining_ = length;
  mask_offset_ = 0;
  phase_ = phase::payload;

  if (is_control(opcode_)) {
    control_size_ = 0;
    if (length != 0 && !control_) {
      control_ = std::make_unique_for_overwrite<char[]>(125);
    }
    return nullptr;
  }
  // Checked against the announced length, before any payload is buffered,
  // so an oversized message costs no memory.
  const std::size_t already = in_message_ ? message_.size() : 0;
  if (length > options_.max_message - already) {
    return fail(ws_close_code::message_too_big, "message larger than the configured maximum");
  }
  if (opcode_ != ws_opcode::continuation) {
    in_message_ = true;
    compressed_ = rsv1_;
    message_opcode_ = opcode_;
    message_.clear();
    utf8_.reset();
  }
  return nullptr;
}

const ws_event* ws_parser::end_frame() {
  phase_ = phase::header;
  // A control frame's event (or error) is returned now: its payload goes at the next call.
  release_control_ = is_control(opcode_);
  switch (opcode_) {
    case ws_opcode::ping:
    case ws_opcode::pong:
      event_ = {opcode_ == ws_opcode::ping ? ws_event_kind::ping : ws_event_kind::pong,
                0,
                {control_.get(), control_size_},
                false};
      return &event_;
    case ws_opcode::close: {
      if (control_size_ == 1) {
        return fail(ws_close_code::protocol_error, "close frame with a 1-byte payload");
      }
      std::uint16_t code = ws_close_code::no_status;
      std::string_view reason;
      if (control_size_ >= 2) {
        code = static_cast<std::uint16_t>((static_cast<unsigned char>(control_[0]) << 8) |
                                          static_cast<unsigned char>(control_[1]));
        if (!is_valid_ws_close_code(code)) {
          return fail(ws_close_code::protocol_error, "invalid close code");
        }
        reason = {control_.get() + 2, control_size_ - 2};
        if (!is_valid_utf8(reason)) {
          return fail(ws_close_code::invalid_payload, "close reason is not valid UTF-8");
        }
      }
      phase_ = phase::finished;
      in_message_ = false;
      event_ = {ws_event_kind::close, code, reason, false};
      return &event_;
    }
    default:
      break;
  }
  if (!fin_) {
    return nullptr;
  }
  if (message_opcode_ == ws_opcode::text && !compressed_ && !utf8_.complete()) {
    return fail(ws_close_code::invalid_payload, "text message ends inside a UTF-8 sequence");
  }
  in_message_ = false;
  release_message_ = true;
  event_ = {message_opcode_ == ws_opcode::text ? ws_event_kind::text : ws_event_kind::binary,
            0,
            {message_.data(), message_.size()},
            compressed_};
  return &event_;
}

void encode_ws_frame_header(std::string& out, ws_opcode opcode, std::uint64_t payload_size,
                            bool fin, const ws_mask_key* mask) {
  std::array<char, 14> h{};
  std::size_t n = 2;
  h[0] = static_cast<char>((fin ? 0x80U : 0U) | static_cast<unsigned>(opcode));
  const unsigned mask_bit = mask != nullptr ? 0x80U : 0U;
  if (payload_size < 126) {
    h[1] = static_cast<char>(mask_bit | static_cast<unsigned>(payload_size));
  } else if (payload_size <= 0xFFFF) {
    h[1] = static_cast<char>(mask_bit | 126U);
    h[2] = static_cast<char>((payload_size >> 8) & 0xFFU);
    h[3] = static_cast<char>(payload_size & 0xFFU);
    n = 4;
  } else {
    h[1] = static_cast<char>(mask_bit | 127U);
    for (std::size_t i = 0; i < 8; ++i) {
      h[2 + i] = static_cast<char>((payload_size >> (56 - 8 * i)) & 0xFFU);
    }
    n = 10;
  }
  if (mask != nullptr) {
    std::memcpy(h.data() + n, mask->data(), 4);
    n += 4;
  }
  out.append(h.data(), n);
}

void encode_ws_frame(std::string& out, ws_opcode opcode, std::string_view payload, bool fin,
                     const ws_mask_key* mask) {
  encode_ws_frame_header(out, opcode, payload.size(), fin, mask);
  if (mask == nullptr) {
    out.append(payload);
    return;
  }
  const std::size_t old = out.size();
  out.resize(old + payload.size());
  ws_apply_mask(out.data() + old, payload.data(), payload.size(), *mask, 0);
}

void encode_ws_message(std::string& out, ws_opcode opcode, std::string_view payload,
                       std::size_t fragment_size, const ws_mask_key* mask) {
  if (fragment_size == 0 || payload.size() <= fragment_size) {
    encode_ws_frame(out, opcode, payload, true, mask);
    return;
  }
  ws_opcode op = opcode;
  while (!payload.empty()) {
    const std::size_t n = std::min(fragment_size, payload.size());
    encode_ws_frame(out, op, payload.substr(0, n), n == payload.size(), mask);
    payload.remove_prefix(n);
    op = ws_opcode::continuation;
  }
}

encode_status encode_ws_control(std::string& out, ws_opcode opcode, std::string_view payload,
                                const ws_mask_key* mask) {
  if (opcode != ws_opcode::ping && opcode != ws_opcode::pong) {
    return {encode_errc::bad_state, {}};
  }
  if (payload.size() > 125) {
    return {encode_errc::control_payload_too_long, {}};
  }
  encode_ws_frame(out, opcode, payload, true, mask);
  return {};
}

encode_status encode_ws_close(std::string& out, std::uint16_t code, std::string_view reason,
                              const ws_mask_key* mask) {
  if (code == ws_close_code::no_status) {
    encode_ws_frame(out, ws_opcode::close, {}, true, mask);
    return {};
  }
  if (!is_valid_ws_close_code(code)) {
    return {encode_errc::bad_close_code, {}};
  }
  if (reason.size() > 123) {
    // Cut before a continuation byte would split a character and make the
    // peer fail the close with 1007.
    std::size_t cut = 123;
    while (cut > 0 && (static_cast<unsigned char>(reason[cut]) & 0xC0U) == 0x80U) {
      --cut;
    }
    reason = reason.substr(0, cut);
  }
  std::array<char, 125> payload{};
  payload[0] = static_cast<char>(code >> 8);
  payload[1] = static_cast<char>(code & 0xFFU);
  if (!reason.empty()) {
    std::memcpy(payload.data() + 2, reason.data(), reason.size());  // an empty view may be null
  }
  encode_ws_frame(out, ws_opcode::close, {payload.data(), reason.size() + 2}, true, mask);
  return {};
}

}  // namespace cadeloop::http
