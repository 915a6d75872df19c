// The HTTP/1.1 response encoder: status line and header validation, framing
// (Content-Length or chunked), Connection and Date, error responses, the
// chunked coding of body pieces, and the reason phrases.

#include "cadeloop/http/response_encoder.hpp"

#include <cadeloop/http/token.hpp>

#include <array>
#include <charconv>
#include <cstring>

namespace cadeloop::http {

namespace {

constexpr std::string_view crlf = "\r\n";

// Bytes allowed in a field value: VCHAR, SP, HTAB, obs-text; no other CTL, no DEL.
constexpr std::array<bool, 256> value_chars = [] {
  std::array<bool, 256> t{};
  for (unsigned c = 0; c < t.size(); ++c) {
    t[c] = c == '\t' || (c >= 0x20 && c != 0x7f);
  }
  return t;
}();

constexpr char to_lower(char c) noexcept {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

constexpr bool is_ows(char c) noexcept {
  return c == ' ' || c == '\t';
}

std::string_view trim_ows(std::string_view v) noexcept {
  while (!v.empty() && is_ows(v.front())) {
    v.remove_prefix(1);
  }
  while (!v.empty() && is_ows(v.back())) {
    v.remove_suffix(1);
  }
  return v;
}

// Strict 1*DIGIT into 64 bits; anything else (sign, spaces inside, lists,
// overflow) is refused rather than guessed at, because a wrong length
// desynchronises the client's framing.
bool parse_content_length(std::string_view v, std::uint64_t& out) noexcept {
  if (v.empty()) {
    return false;
  }
  std::uint64_t n = 0;
  for (const char c : v) {
    if (c < '0' || c > '9') {
      return false;
    }
    const auto digit = static_cast<std::uint64_t>(c - '0');
    if (n > (UINT64_MAX - digit) / 10) {
      return false;
    }
    n = n * 10 + digit;
  }
  out = n;
  return true;
}

void append_decimal(std::string& out, std::uint64_t n) {
  std::array<char, 20> buf{};
  const auto r = std::to_chars(buf.data(), buf.data() + buf.size(), n);
  out.append(buf.data(), r.ptr);
}

void append_header(std::string& out, std::string_view name, std::string_view value) {
  out.append(name);
  out.append(": ");
  out.append(value);
  out.append(crlf);
}

void append_status_line(std::string& out, unsigned status) {
  // Every status line made once ("HTTP/1.1 200 OK\r\n"): one append each time.
  static const std::array<std::string, 500> lines = [] {
    std::array<std::string, 500> t;
    for (unsigned code = 100; code < 600; ++code) {
      std::string& line = t[code - 100];
      line = "HTTP/1.1 ";
      line += static_cast<char>('0' + code / 100);
      line += static_cast<char>('0' + code / 10 % 10);
      line += static_cast<char>('0' + code % 10);
      line += ' ';
      line += reason_phrase(code);
      line += crlf;
    }
    return t;
  }();
  out.append(lines[status - 100]);  // callers take 100..599 only
}

enum class owned_header : std::uint8_t {
  none,
  content_length,
  transfer_encoding,
  connection,
  date,
  server
};

owned_header classify(std::string_view name) noexcept {
  switch (name.size()) {
    case 4:
      return header_name_equals(name, "date") ? owned_header::date : owned_header::none;
    case 6:
      return header_name_equals(name, "server") ? owned_header::server : owned_header::none;
    case 10:
      return header_name_equals(name, "connection") ? owned_header::connection : owned_header::none;
    case 14:
      return header_name_equals(name, "content-length") ? owned_header::content_length
                                                        : owned_header::none;
    case 17:
      return header_name_equals(name, "transfer-encoding") ? owned_header::transfer_encoding
                                                           : owned_header::none;
    default:
      return owned_header::none;
  }
}

// Validates trailer fields and appends them. Framing and connection fields
// are refused: in a trailer they would be ignored at best and, at worst,
// taken by a careless intermediary as if they were in the head.
encode_status append_trailers(std::span<const header_field> trailers, std::string* out) {
  for (const header_field& f : trailers) {
    if (!is_valid_header_name(f.name)) {
      return {encode_errc::bad_header_name, f.name};
    }
    const std::string_view value = trim_ows(f.value);
    if (!is_valid_header_value(value)) {
      return {encode_errc::bad_header_value, f.name};
    }
    const owned_header kind = classify(f.name);
    if (kind == owned_header::content_length || kind == owned_header::transfer_encoding ||
        kind == owned_header::connection) {
      return {encode_errc::forbidden_header, f.name};
    }
    if (out != nullptr) {
      append_header(*out, f.name, value);
    }
  }
  return {};
}

// What write_head needs of one app header field, found by checking it.
struct field_facts {
  owned_header kind = owned_header::none;
  std::uint64_t length = 0;  // content-length
  bool close = false;        // connection: close
  std::string_view value{};  // trimmed
};

encode_status examine_field(const header_field& f, field_facts& out) noexcept {
  if (!is_valid_header_name(f.name)) {
    return {encode_errc::bad_header_name, f.name};
  }
  out.value = trim_ows(f.value);
  if (!is_valid_header_value(out.value)) {
    return {encode_errc::bad_header_value, f.name};
  }
  out.kind = classify(f.name);
  if (out.kind == owned_header::content_length && !parse_content_length(out.value, out.length)) {
    return {encode_errc::bad_content_length, f.name};
  }
  if (out.kind == owned_header::connection) {
    out.close = header_has_token(out.value, "close");
  }
  return {};
}

// Whether the encoder writes a field of this kind as it came (else it
// drops it or writes its own: the framing and connection headers).
constexpr bool written_as_is(owned_header k) noexcept {
  return k == owned_header::none || k == owned_header::date || k == owned_header::server;
}

}  // namespace

// ---------------------------------------------------------- header_line_cache

std::size_t header_line_cache::index_of(const header_field& f) noexcept {
  // Lengths and a few bytes (the name is never empty here): enough to tell
  // a response's fields apart, cheaper than hashing every byte, and a
  // collision only costs the check.
  std::size_t h = f.name.size() * 37 + f.value.size();
  h = h * 31 + static_cast<unsigned char>(f.name.back());
  if (!f.value.empty()) {
    h = h * 31 + static_cast<unsigned char>(f.value[f.value.size() / 2]);
    h = h * 31 + static_cast<unsigned char>(f.value.back());
  }
  return (h ^ (h >> 6)) & (slots - 1);
}

const header_line_cache::entry* header_line_cache::find(const header_field& f) const noexcept {
  if (!keepable(f)) {
    return nullptr;
  }
  const entry& e = table_[index_of(f)];
  if (e.name_len != f.name.size() || e.value_len != f.value.size() ||
      std::memcmp(e.key.data(), f.name.data(), f.name.size()) != 0 ||
      (!f.value.empty() &&
       std::memcmp(e.key.data() + f.name.size(), f.value.data(), f.value.size()) != 0)) {
    return nullptr;
  }
  return &e;
}

header_line_cache::entry* header_line_cache::slot_for(const header_field& f) noexcept {
  return keepable(f) ? &table_[index_of(f)] : nullptr;
}

std::string encode_status::message() const {
  std::string what;
  switch (code) {
    case encode_errc::ok:
      return "ok";
    case encode_errc::bad_status:
      return "status code must be 100..599 (101 only through the WebSocket handshake)";
    case encode_errc::bad_header_name:
      what = "invalid name for header";
      break;
    case encode_errc::bad_header_value:
      what = "invalid value (CR, LF, NUL or other control character) for header";
      break;
    case encode_errc::bad_content_length:
      what = "invalid value for header";
      break;
    case encode_errc::conflicting_content_length:
      what = "conflicting values for header";
      break;
    case encode_errc::forbidden_header:
      what = "header may not be set here:";
      break;
    case encode_errc::control_payload_too_long:
      return "WebSocket control frame payload over 125 bytes";
    case encode_errc::bad_close_code:
      return "WebSocket close code may not be sent";
    case encode_errc::bad_state:
      return "response encoder call out of order";
    case encode_errc::body_too_long:
      return "response body longer than its content-length";
    case encode_errc::body_too_short:
      return "response body shorter than its content-length";
  }
  what.append(" '");
  // The name may itself be invalid (control bytes); print those escaped so
  // the log line stays one line.
  for (const char c : header) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      constexpr std::string_view hex = "0123456789abcdef";
      what.append("\\x");
      what.push_back(hex[u >> 4]);
      what.push_back(hex[u & 0xf]);
    } else {
      what.push_back(c);
    }
  }
  what.push_back('\'');
  return what;
}

std::string_view reason_phrase(unsigned status) noexcept {
  // clang-format off: one registered code per line reads as the registry does.
  switch (status) {
    case 100:
      return "Continue";
    case 101:
      return "Switching Protocols";
    case 102:
      return "Processing";
    case 103:
      return "Early Hints";
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 202:
      return "Accepted";
    case 203:
      return "Non-Authoritative Information";
    case 204:
      return "No Content";
    case 205:
      return "Reset Content";
    case 206:
      return "Partial Content";
    case 207:
      return "Multi-Status";
    case 208:
      return "Already Reported";
    case 226:
      return "IM Used";
    case 300:
      return "Multiple Choices";
    case 301:
      return "Moved Permanently";
    case 302:
      return "Found";
    case 303:
      return "See Other";
    case 304:
      return "Not Modified";
    case 305:
      return "Use Proxy";
    case 307:
      return "Temporary Redirect";
    case 308:
      return "Permanent Redirect";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 402:
      return "Payment Required";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 406:
      return "Not Acceptable";
    case 407:
      return "Proxy Authentication Required";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 410:
      return "Gone";
    case 411:
      return "Length Required";
    case 412:
      return "Precondition Failed";
    case 413:
      return "Content Too Large";
    case 414:
      return "URI Too Long";
    case 415:
      return "Unsupported Media Type";
    case 416:
      return "Range Not Satisfiable";
    case 417:
      return "Expectation Failed";
    case 421:
      return "Misdirected Request";
    case 422:
      return "Unprocessable Content";
    case 423:
      return "Locked";
    case 424:
      return "Failed Dependency";
    case 425:
      return "Too Early";
    case 426:
      return "Upgrade Required";
    case 428:
      return "Precondition Required";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 451:
      return "Unavailable For Legal Reasons";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 505:
      return "HTTP Version Not Supported";
    case 506:
      return "Variant Also Negotiates";
    case 507:
      return "Insufficient Storage";
    case 508:
      return "Loop Detected";
    case 510:
      return "Not Extended";
    case 511:
      return "Network Authentication Required";
    default:
      return "";
  }
  // clang-format on
}

bool is_valid_header_name(std::string_view name) noexcept {
  return is_token(name);
}

bool is_valid_header_value(std::string_view value) noexcept {
  for (const char c : value) {
    if (!value_chars[static_cast<unsigned char>(c)]) {
      return false;
    }
  }
  return true;
}

bool header_name_equals(std::string_view name, std::string_view lower) noexcept {
  if (name.size() != lower.size()) {
    return false;
  }
  if (name == lower) {
    return true;  // apps mostly send names in lower case already
  }
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (to_lower(name[i]) != lower[i]) {
      return false;
    }
  }
  return true;
}

bool header_has_token(std::string_view value, std::string_view lower_token) noexcept {
  while (!value.empty()) {
    const std::size_t comma = value.find(',');
    const std::string_view element = trim_ows(value.substr(0, comma));
    if (header_name_equals(element, lower_token)) {
      return true;
    }
    if (comma == std::string_view::npos) {
      break;
    }
    value.remove_prefix(comma + 1);
  }
  return false;
}

response_encoder::response_encoder(date_cache& dates, encoder_options options) noexcept
    : dates_(dates), options_(options) {}

void response_encoder::start(const request_context& context) noexcept {
  context_ = context;
  phase_ = phase::idle;
  framing_ = response_framing::none;
  keep_alive_ = false;
  declared_length_ = 0;
  written_length_ = 0;
}

encode_status response_encoder::write_continue(std::string& out) {
  if (phase_ != phase::idle) {
    return {encode_errc::bad_state, {}};
  }
  // RFC 9110 15.2: a server must not send a 1xx response to an HTTP/1.0 client.
  if (context_.http_minor >= 1) {
    out.append("HTTP/1.1 100 Continue\r\n\r\n");
  }
  return {};
}

encode_status response_encoder::write_head(const response_head& head, std::string& out) {
  if (phase_ != phase::idle) {
    return {encode_errc::bad_state, {}};
  }
  const unsigned status = head.status;
  if (status < 100 || status > 599 || status == 101) {
    return {encode_errc::bad_status, {}};
  }
  const bool interim = status < 200;
  // Everything is appended optimistically and rolled back on a refusal, so
  // a refused head never reaches the wire and costs one pass on success.
  const std::size_t mark = out.size();
  append_status_line(out, status);

  bool have_length = false;
  std::uint64_t app_length = 0;
  bool app_close = false;
  bool app_date = false;
  bool app_server = false;
  header_line_cache* const cache = options_.lines;
  for (const header_field& f : head.headers) {
    // A field seen before comes from the cache as it was checked then; a
    // new one is checked, written and (when it passed) kept.
    const header_line_cache::entry* const seen = cache != nullptr ? cache->find(f) : nullptr;
    field_facts facts;
    if (seen != nullptr) {
      facts.kind = static_cast<owned_header>(seen->kind);
      facts.length = seen->length;
      facts.close = seen->close;
    } else if (const encode_status st = examine_field(f, facts); !st.ok()) {
      out.resize(mark);
      return st;
    }
    switch (facts.kind) {
      case owned_header::content_length:
        if (have_length && facts.length != app_length) {
          out.resize(mark);
          return {encode_errc::conflicting_content_length, f.name};
        }
        have_length = true;
        app_length = facts.length;
        break;
      case owned_header::connection:
        app_close = app_close || facts.close;
        break;
      case owned_header::date:
        app_date = true;
        break;
      case owned_header::server:
        app_server = true;
        break;
      case owned_header::transfer_encoding:
      case owned_header::none:
        break;
    }
    if (seen != nullptr) {
      out.append(seen->line.data(), seen->line_len);
      continue;
    }
    const std::size_t line_at = out.size();
    if (written_as_is(facts.kind)) {
      append_header(out, f.name, facts.value);
    }
    if (header_line_cache::entry* e = cache != nullptr ? cache->slot_for(f) : nullptr) {
      const std::string_view line = std::string_view(out).substr(line_at);
      e->name_len = static_cast<std::uint8_t>(f.name.size());
      e->value_len = static_cast<std::uint8_t>(f.value.size());
      std::memcpy(e->key.data(), f.name.data(), f.name.size());
      if (!f.value.empty()) {
        std::memcpy(e->key.data() + f.name.size(), f.value.data(), f.value.size());
      }
      e->kind = static_cast<std::uint8_t>(facts.kind);
      e->close = facts.close;
      e->length = facts.length;
      e->line_len = static_cast<std::uint8_t>(line.size());  // name + ": " + value + CRLF fits
      std::memcpy(e->line.data(), line.data(), line.size());
    }
  }

  if (interim) {
    if (context_.http_minor == 0) {
      out.resize(mark);
    } else {
      out.append(crlf);
    }
    return {};
  }

  bool keep = context_.client_keep_alive && !context_.server_closing && !app_close;
  const bool no_body = context_.is_head || status == 204 || status == 205 || status == 304;
  if (no_body) {
    framing_ = response_framing::none;
    // RFC 9110 8.6: never Content-Length on 204. On HEAD and 304 it states
    // the length a GET would have had, so the app's value is kept, and for
    // HEAD the known body size stands in for it. A 205 has no content (RFC
    // 9110 15.3.6) but is framed as any response (RFC 9112 6.3): length 0.
    if (status == 205) {
      out.append("Content-Length: 0\r\n");
    } else if (status != 204) {
      if (have_length) {
        out.append("Content-Length: ");
        append_decimal(out, app_length);
        out.append(crlf);
      } else if (context_.is_head && status != 304 && head.body_size.has_value()) {
        out.append("Content-Length: ");
        append_decimal(out, *head.body_size);
        out.append(crlf);
      }
    }
  } else if (have_length || (head.body_size.has_value() && !head.trailers)) {
    framing_ = response_framing::content_length;
    declared_length_ = have_length ? app_length : *head.body_size;
    out.append("Content-Length: ");
    append_decimal(out, declared_length_);
    out.append(crlf);
  } else if (context_.http_minor >= 1) {
    framing_ = response_framing::chunked;
    out.append("Transfer-Encoding: chunked\r\n");
  } else {
    framing_ = response_framing::close_delimited;
    keep = false;
  }

  if (!keep) {
    out.append("Connection: close\r\n");
  } else if (context_.http_minor == 0) {
    out.append("Connection: keep-alive\r\n");
  }
  if (options_.send_date && !app_date && !app_server) {
    out.append(dates_.closing_lines(options_.server, options_.extra_headers));  // the usual case
  } else {
    if (options_.send_date && !app_date) {
      append_header(out, "Date", dates_.value());
    }
    if (!options_.server.empty() && !app_server) {
      append_header(out, "Server", options_.server);
    }
    out.append(options_.extra_headers);
    out.append(crlf);
  }

  keep_alive_ = keep;
  written_length_ = 0;
  phase_ = phase::body;
  return {};
}

body_part_framing response_encoder::frame_body_part(std::uint64_t size, std::string& out) {
  body_part_framing result;
  if (phase_ != phase::body) {
    result.status = {encode_errc::bad_state, {}};
    return result;
  }
  switch (framing_) {
    case response_framing::none:
      break;
    case response_framing::content_length:
      if (size > declared_length_ - written_length_) {
        // The client would read the excess as the next response: this
        // connection can no longer be trusted for another request.
        keep_alive_ = false;
        result.status = {encode_errc::body_too_long, {}};
        return result;
      }
      written_length_ += size;
      result.send_body = size != 0;
      break;
    case response_framing::chunked:
      // A zero-size chunk would be the terminator; an empty part must not end the body.
      if (size != 0) {
        std::array<char, 16> buf{};
        const auto r = std::to_chars(buf.data(), buf.data() + buf.size(), size, 16);
        out.append(buf.data(), r.ptr);
        out.append(crlf);
        result.send_body = true;
        result.after_body = crlf;
      }
      break;
    case response_framing::close_delimited:
      result.send_body = size != 0;
      break;
  }
  return result;
}

encode_status response_encoder::write_body(std::string_view data, std::string& out) {
  const body_part_framing framing = frame_body_part(data.size(), out);
  if (framing.send_body) {
    out.append(data);
    out.append(framing.after_body);
  }
  return framing.status;
}

encode_status response_encoder::finish(std::span<const header_field> trailers, std::string& out) {
  if (phase_ != phase::body) {
    return {encode_errc::bad_state, {}};
  }
  if (framing_ == response_framing::chunked) {
    const std::size_t mark = out.size();
    out.append("0\r\n");
    const encode_status st = append_trailers(trailers, &out);
    if (!st.ok()) {
      out.resize(mark);
      return st;
    }
    out.append(crlf);
  } else {
    // Trailers cannot travel without chunked framing, but a bad one is still
    // the app's bug and is reported the same way.
    const encode_status st = append_trailers(trailers, nullptr);
    if (!st.ok()) {
      return st;
    }
  }
  phase_ = phase::finished;
  if (framing_ == response_framing::content_length && written_length_ != declared_length_) {
    keep_alive_ = false;
    return {encode_errc::body_too_short, {}};
  }
  return {};
}

encode_status encode_error_response(unsigned status, std::string_view text, date_cache& dates,
                                    std::string& out, const encoder_options& options,
                                    std::span<const header_field> extra, bool is_head) {
  for (const header_field& f : extra) {
    if (!is_valid_header_name(f.name)) {
      return {encode_errc::bad_header_name, f.name};
    }
    if (!is_valid_header_value(f.value)) {
      return {encode_errc::bad_header_value, f.name};
    }
    const owned_header kind = classify(f.name);
    if (kind == owned_header::content_length || kind == owned_header::transfer_encoding ||
        kind == owned_header::connection) {
      return {encode_errc::forbidden_header, f.name};
    }
  }
  if (status < 400 || status > 599) {
    status = 500;
  }
  const std::string_view reason = reason_phrase(status);
  append_status_line(out, status);
  out.append("Content-Type: text/plain; charset=utf-8\r\nContent-Length: ");
  const std::size_t body_size = text.empty() ? reason.size() + 1 : text.size();
  append_decimal(out, body_size);
  out.append("\r\nConnection: close\r\n");
  if (options.send_date) {
    append_header(out, "Date", dates.value());
  }
  if (!options.server.empty()) {
    append_header(out, "Server", options.server);
  }
  for (const header_field& f : extra) {
    append_header(out, f.name, f.value);
  }
  out.append(crlf);
  if (!is_head) {
    if (text.empty()) {
      out.append(reason);
      out.push_back('\n');
    } else {
      out.append(text);
    }
  }
  return {};
}

}  // namespace cadeloop::http
