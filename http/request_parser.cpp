// request_parser: llhttp set-up and trampolines, feeding and its outcome,
// the pools of heads and trailer blocks, limits and error classification,
// the request line (method, target, version), the end of the head (framing,
// keep-alive, upgrade) and the body callbacks. The header fields are read in
// head_fields.cpp.

#include <cadeloop/http/request_parser.hpp>

#include "byte_scan.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

namespace cadeloop::http {

using namespace detail;

namespace {

request_method to_request_method(llhttp_method_t m) noexcept {
  switch (m) {
    case HTTP_GET:
      return request_method::get;
    case HTTP_HEAD:
      return request_method::head;
    case HTTP_POST:
      return request_method::post;
    case HTTP_PUT:
      return request_method::put;
    case HTTP_DELETE:
      return request_method::delete_;
    case HTTP_PATCH:
      return request_method::patch;
    case HTTP_OPTIONS:
      return request_method::options;
    case HTTP_TRACE:
      return request_method::trace;
    case HTTP_CONNECT:
      return request_method::connect;
    default:
      return request_method::other;
  }
}

// RFC 3986 section 3.2.2 (as RFC 9112 section 3.2 asks of Host and of an
// absolute-form target's authority): an IP literal in brackets or a
// reg-name, then an optional ":" port of digits. A comma is refused though
// it is a sub-delim: "Host: a, b" is two hosts, not one. No userinfo.
// The bytes of a reg-name: unreserved, '%' of a pct-encoding, and the
// sub-delims but ','.
constexpr std::array<bool, 256> reg_name_chars = [] {
  std::array<bool, 256> t{};
  for (int c = 'a'; c <= 'z'; ++c) {
    t[static_cast<std::size_t>(c)] = true;
    t[static_cast<std::size_t>(c - 'a' + 'A')] = true;
  }
  for (int c = '0'; c <= '9'; ++c) {
    t[static_cast<std::size_t>(c)] = true;
  }
  for (const char c : std::string_view{"-._~%!$&'()*+;="}) {
    t[static_cast<unsigned char>(c)] = true;
  }
  return t;
}();

bool valid_host(std::string_view v) noexcept {
  std::size_t i = 0;
  const std::size_t n = v.size();
  if (n != 0 && v[0] == '[') {
    const std::size_t close = v.find(']');
    if (close == std::string_view::npos || close < 2) {
      return false;
    }
    for (i = 1; i < close; ++i) {
      const char ch = v[i];
      const bool ok = (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') ||
                      (ch >= 'A' && ch <= 'F') || ch == ':' || ch == '.' || ch == 'v' || ch == 'V';
      if (!ok) {
        return false;
      }
    }
    i = close + 1;
  } else {
    for (; i < n && v[i] != ':'; ++i) {
      if (!reg_name_chars[static_cast<unsigned char>(v[i])]) {
        return false;
      }
    }
  }
  if (i == n) {
    return true;
  }
  if (v[i] != ':') {
    return false;
  }
  for (++i; i < n; ++i) {
    if (v[i] < '0' || v[i] > '9') {
      return false;
    }
  }
  return true;
}

constexpr std::uint64_t max_position_limit = std::uint64_t{1} << 30;
constexpr std::size_t initial_head_arena = 1024;
constexpr std::size_t initial_head_fields = 32;
constexpr std::size_t initial_trailer_arena = 256;
constexpr std::size_t initial_trailer_fields = 8;

}  // namespace

// ---------------------------------------------------------------- request_parser_state

template <int (request_parser_state::*Member)()>
int request_parser_state::trampoline(llhttp_t* parser) noexcept {
  auto* self = static_cast<request_parser_state*>(parser->data);
  // No exception may unwind through llhttp's C frames: record it as an error.
  try {
    return (self->*Member)();
  } catch (...) {
    return self->fail_internal();
  }
}

template <int (request_parser_state::*Member)(const char*, std::size_t)>
int request_parser_state::data_trampoline(llhttp_t* parser, const char* at,
                                          std::size_t len) noexcept {
  auto* self = static_cast<request_parser_state*>(parser->data);
  try {
    return (self->*Member)(at, len);
  } catch (...) {
    return self->fail_internal();
  }
}

// A head's fields and its protocol and version have no callbacks: llhttp
// validates them, and scan_head_fields() and on_version_complete() read
// them from the head's bytes (see head_fields.cpp). Three callbacks per
// field were most of the cost of a typical head.
const llhttp_settings_t& request_parser_state::settings() noexcept {
  static const llhttp_settings_t instance = [] {
    llhttp_settings_t s;
    llhttp_settings_init(&s);
    s.on_message_begin = &trampoline<&request_parser_state::on_message_begin>;
    s.on_method = &data_trampoline<&request_parser_state::on_method>;
    s.on_url = &data_trampoline<&request_parser_state::on_url>;
    s.on_url_complete = &trampoline<&request_parser_state::on_url_complete>;
    s.on_version_complete = &trampoline<&request_parser_state::on_version_complete>;
    s.on_headers_complete = &trampoline<&request_parser_state::on_headers_complete>;
    s.on_body = &data_trampoline<&request_parser_state::on_body>;
    s.on_chunk_header = &trampoline<&request_parser_state::on_chunk_header>;
    s.on_chunk_extension_name = &data_trampoline<&request_parser_state::on_chunk_extension>;
    s.on_chunk_extension_value = &data_trampoline<&request_parser_state::on_chunk_extension>;
    s.on_message_complete = &trampoline<&request_parser_state::on_message_complete>;
    return s;
  }();
  return instance;
}

// After the last chunk of a chunked body: the same plus the field callbacks,
// which there report trailer fields (rare, after the body, often in another
// feed; they are copied as they arrive).
const llhttp_settings_t& request_parser_state::trailer_settings() noexcept {
  static const llhttp_settings_t instance = [] {
    llhttp_settings_t s = settings();
    s.on_header_field = &data_trampoline<&request_parser_state::on_trailer_field>;
    s.on_header_value = &data_trampoline<&request_parser_state::on_trailer_value>;
    s.on_header_value_complete = &trampoline<&request_parser_state::on_trailer_value_complete>;
    return s;
  }();
  return instance;
}

request_parser_state::request_parser_state(const request_limits& limits)
    : limits_{limits},
      max_header_bytes_{std::min<std::uint64_t>(limits.max_header_bytes, max_position_limit)},
      max_url_{std::min<std::uint64_t>(limits.max_url, max_position_limit)} {
  // No reservations: a parser exists per connection slot, and what it would
  // reserve up front (64 events, 16 head slots ...) is memory every idle
  // connection would hold. The vectors grow on first use and keep it.
  reset();
}

void request_parser_state::reset() noexcept {
  // Lenient flags stay at llhttp's default (all off): every one of them
  // reopens a request smuggling or cache poisoning hole.
  llhttp_init(&parser_, HTTP_REQUEST, &settings());
  parser_.data = this;
  state_ = state::parsing;
  phase_ = phase::idle;
  pause_reason_ = pause_reason::none;
  error_ = {};
  events_.clear();
  heads_used_ = 0;
  trailers_used_ = 0;
  head_ = nullptr;
  rejected_head_ = nullptr;
  trailer_block_ = nullptr;
  feed_begin_ = nullptr;
  feed_end_ = nullptr;
  stream_base_ = 0;
  start_message();
}

void request_parser_state::add_credit(std::uint32_t messages) noexcept {
  if (credit_ == unlimited_credit) {
    return;
  }
  credit_ = messages >= unlimited_credit - credit_ ? unlimited_credit - 1 : credit_ + messages;
}

std::unique_ptr<request_head> request_parser_state::take_head(const parse_event& event) noexcept {
  if (event.kind != parse_event_kind::head || event.slot >= heads_.size() ||
      heads_[event.slot].get() != event.head) {
    return nullptr;
  }
  return std::move(heads_[event.slot]);
}

void request_parser_state::recycle_head(std::unique_ptr<request_head> head) {
  if (!head) {
    return;
  }
  if (pool_ != nullptr) {
    pool_->give(std::move(head));
    return;
  }
  head->clear();
  free_heads_.push_back(std::move(head));
}

std::unique_ptr<header_block> request_parser_state::take_trailers(
    const parse_event& event) noexcept {
  if (event.kind != parse_event_kind::message_complete || event.trailers == nullptr ||
      event.slot >= trailers_.size() || trailers_[event.slot].get() != event.trailers) {
    return nullptr;
  }
  return std::move(trailers_[event.slot]);
}

void request_parser_state::recycle_trailers(std::unique_ptr<header_block> trailers) {
  if (trailers) {
    trailers->clear();
    free_trailers_.push_back(std::move(trailers));
  }
}

void request_parser_state::begin_feed() noexcept {
  events_.clear();
  // A head (or trailer section) still being parsed survives the feed; the
  // slots of everything already reported are reused from here on.
  if (phase_ == phase::head && heads_used_ > 0) {
    std::swap(heads_[0], heads_[heads_used_ - 1]);
    heads_used_ = 1;
  } else {
    heads_used_ = 0;
  }
  if (phase_ == phase::trailers && trailer_block_ != nullptr) {
    std::swap(trailers_[0], trailers_[trailers_used_ - 1]);
    trailers_used_ = 1;
  } else {
    trailers_used_ = 0;
  }
}

request_head& request_parser_state::acquire_head() {
  if (heads_used_ == heads_.size()) {
    heads_.emplace_back();
  }
  std::unique_ptr<request_head>& slot = heads_[heads_used_];
  if (!slot) {
    if (pool_ != nullptr) {
      slot = pool_->take();
    } else if (!free_heads_.empty()) {
      slot = std::move(free_heads_.back());
      free_heads_.pop_back();
    }
    if (!slot) {
      slot = std::make_unique<request_head>();
      // Room for a typical browser request, so a new slot does not grow (and
      // allocate) again while the pools rotate.
      slot->fields_.reserve(initial_head_arena, initial_head_fields);
    }
  }
  ++heads_used_;
  slot->clear();
  return *slot;
}

header_block& request_parser_state::acquire_trailers() {
  if (trailers_used_ == trailers_.size()) {
    trailers_.emplace_back();
  }
  std::unique_ptr<header_block>& slot = trailers_[trailers_used_];
  if (!slot) {
    if (!free_trailers_.empty()) {
      slot = std::move(free_trailers_.back());
      free_trailers_.pop_back();
    } else {
      slot = std::make_unique<header_block>();
      slot->reserve(initial_trailer_arena, initial_trailer_fields);
    }
  }
  ++trailers_used_;
  slot->clear();
  return *slot;
}

header_block& request_parser_state::trailer_fields() {
  if (trailer_block_ == nullptr) {
    trailer_block_ = &acquire_trailers();
  }
  return *trailer_block_;
}

void request_parser_state::start_message() noexcept {
  rejected_head_ = nullptr;
  head_start_known_ = false;
  url_open_ = false;
  set_limit_end(UINT64_MAX);
  head_base_ = nullptr;
  head_bytes_ = nullptr;
  head_end_ = nullptr;
  head_readable_ = nullptr;
  fields_off_ = 0;
  head_cut_ = false;
  scanned_to_ = 0;
  in_field_ = false;
  in_value_ = false;
  te_seen_ = false;
  websocket_token_ = false;
  expect_continue_ = false;
  keep_alive_ = false;
  websocket_ = false;
  trailers_over_ = false;
  host_count_ = 0;
  chunked_count_ = 0;
  body_declared_ = 0;
  chunk_ext_bytes_ = 0;
  trailer_bytes_ = 0;
}

feed_result request_parser_state::feed(std::string_view input) noexcept {
  begin_feed();
  switch (state_) {
    case state::failed:
      return {feed_status::error, 0};
    case state::closing:
      return {feed_status::closing, 0};
    case state::upgraded:
      return {feed_status::upgraded, 0};
    case state::paused:
      if (credit_ == 0) {
        return {feed_status::paused, 0};
      }
      llhttp_resume(&parser_);
      state_ = state::parsing;
      pause_reason_ = pause_reason::none;
      break;
    case state::parsing:
      if (credit_ == 0) {
        return {feed_status::paused, 0};
      }
      break;
  }

  feed_begin_ = input.data();
  feed_end_ = input.data() + input.size();
  limit_addr_ = limit_address();
  try {
    if (phase_ == phase::head && head_start_known_) {
      keep_head_input();  // a head carried over from the last feed
    }
  } catch (...) {
    fail_internal();
    state_ = state::failed;
    return {feed_status::error, 0};
  }
  const llhttp_errno_t err = llhttp_execute(&parser_, input.data(), input.size());
  if (err == HPE_OK) {
    if (phase_ == phase::head && head_start_known_) {
      // The head goes on in the next feed: keep its bytes, check what of it arrived.
      int rc = 0;
      try {
        rc = end_feed_in_head();
      } catch (...) {
        rc = fail_internal();
      }
      if (rc != 0) {
        state_ = state::failed;
        stream_base_ += input.size();
        return {feed_status::error, input.size()};
      }
    }
    stream_base_ += input.size();
    return {feed_status::ok, input.size()};
  }
  const char* const error_at = llhttp_get_error_pos(&parser_);
  if (phase_ == phase::head && head_start_known_ && error_.status == 0 && err != HPE_PAUSED &&
      error_at != nullptr && error_at >= input.data() && error_at <= feed_end_) {
    // llhttp rejected a byte of the head: the lines it finished before get their checks first.
    try {
      (void)scan_before_error(error_at);
    } catch (...) {
      fail_internal();
    }
  }
  head_base_ = nullptr;  // whatever stopped llhttp, no head is open past this input

  std::size_t consumed = 0;
  if (error_at != nullptr && error_at >= input.data() && error_at <= feed_end_) {
    consumed = static_cast<std::size_t>(error_at - input.data());
  }
  stream_base_ += consumed;

  if (err == HPE_PAUSED && pause_reason_ == pause_reason::closing) {
    state_ = state::closing;
    return {feed_status::closing, consumed};
  }
  if (err == HPE_PAUSED && pause_reason_ == pause_reason::credit) {
    state_ = state::paused;
    return {feed_status::paused, consumed};
  }
  if (err == HPE_PAUSED_UPGRADE && websocket_) {
    state_ = state::upgraded;
    return {feed_status::upgraded, consumed};
  }
  if (error_.status == 0) {
    classify_llhttp_error(err, stream_base_, consumed);
  }
  state_ = state::failed;
  return {feed_status::error, consumed};
}

int request_parser_state::fail(std::uint16_t status, const char* reason) noexcept {
  error_ = {status, reason, true};
  llhttp_set_error_reason(&parser_, reason);
  return HPE_USER;
}

int request_parser_state::fail_internal() noexcept {
  return fail(500, "internal error while parsing the request");
}

std::uint16_t request_parser_state::head_limit_violation(std::uint64_t end, const char** reason,
                                                         std::uint64_t target_end) const noexcept {
  // `end` is one past the last head byte consumed. Each limit is violated at
  // a fixed stream position; the earliest one wins, so the verdict does not
  // depend on where the stream was split into feeds.
  std::uint16_t status = 0;
  std::uint64_t first = UINT64_MAX;
  if (head_start_known_ && end > head_start_ + max_header_bytes_) {
    first = head_start_ + max_header_bytes_;
    status = 431;
    *reason = "request head larger than max_header_bytes";
  }
  if (url_open_ && target_end > method_end_ + 1 + max_url_ && method_end_ + 1 + max_url_ < first) {
    status = 414;
    *reason = "request target longer than max_url";
  }
  return status;
}

int request_parser_state::check_head_limits_slow(std::uint64_t end) noexcept {
  const char* reason = nullptr;
  if (const std::uint16_t status = head_limit_violation(end, &reason, end); status != 0) {
    return fail(status, reason);
  }
  return 0;
}

// Where the target ends when llhttp stopped at `pos` with the target still
// open: where the reported bytes end if an earlier feed went past them, else
// at the first SP, CR or LF after them in the `consumed` bytes of this feed
// that end at `pos`; else at `pos` (every byte before it was a target byte).
std::uint64_t request_parser_state::target_end_before(std::uint64_t pos,
                                                      std::size_t consumed) const noexcept {
  if (!url_open_) {
    return pos;
  }
  const std::uint64_t feed_start = pos - consumed;
  // llhttp reports every target byte of a feed before the feed ends, so the
  // bytes an earlier feed consumed past the reported ones were no target bytes.
  bool in_target = url_seen_end_ != 0;
  if (in_target && url_seen_end_ < feed_start) {
    return url_seen_end_;
  }
  const std::uint64_t from = std::max({url_seen_end_, method_end_ + 1, feed_start});
  for (std::uint64_t q = from; q < pos; ++q) {
    const char ch = feed_begin_[q - feed_start];
    if (ch == ' ' || ch == '\r' || ch == '\n') {
      if (in_target) {
        return q;
      }
    } else {
      in_target = true;  // spaces before the target count against max_url, as they do unbroken
    }
  }
  return pos;
}

void request_parser_state::classify_llhttp_error(llhttp_errno_t err, std::uint64_t pos,
                                                 std::size_t consumed) noexcept {
  // llhttp may stop at a bad byte that lies past a limit before the span
  // holding it was reported; the limit was crossed first, so it decides.
  if (phase_ == phase::head) {
    const char* reason = nullptr;
    if (const std::uint16_t status =
            head_limit_violation(pos, &reason, target_end_before(pos, consumed));
        status != 0) {
      error_ = {status, reason, true};
      return;
    }
  }
  const char* reason = llhttp_get_error_reason(&parser_);
  if (reason == nullptr) {
    reason = "malformed request";
  }
  std::uint16_t status = 400;
  if (err == HPE_INVALID_VERSION && unknown_http_version_before(pos)) {
    // Well-formed "HTTP/d.d" that llhttp does not know: a version we don't speak.
    status = 505;
    reason = "HTTP version not supported";
  } else if (err == HPE_PAUSED_H2_UPGRADE) {
    status = 400;
    reason = "HTTP/2 is not supported";
  } else if (err == HPE_PAUSED_UPGRADE) {
    status = 501;
    reason = "upgrade not supported";
  }
  error_ = {status, reason, true};
}

bool request_parser_state::unknown_http_version_before(std::uint64_t pos) const noexcept {
  // llhttp checks the version right after its last digit and stops there,
  // so a well-formed "HTTP/d.d" that it does not know ends at `pos`.
  if (phase_ != phase::head || !head_start_known_ || head_bytes_ == nullptr ||
      pos < head_start_ + 9 || pos > head_pos(head_end_)) {
    return false;
  }
  const char* v = head_bytes_ + (pos - head_start_) - 9;
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  return std::memcmp(v, " HTTP/", 6) == 0 && digit(v[6]) && v[7] == '.' && digit(v[8]) &&
         !(v[6] == '1' && (v[8] == '0' || v[8] == '1'));
}

// ---------------------------------------------------------------- callbacks

std::uintptr_t request_parser_state::limit_address() const noexcept {
  if (limit_end_ < stream_base_) {
    return 0;  // every span of this feed ends past the limit
  }
  const std::uint64_t ahead = limit_end_ - stream_base_;
  const auto base = reinterpret_cast<std::uintptr_t>(feed_begin_);
  return ahead > UINTPTR_MAX - base ? UINTPTR_MAX : base + static_cast<std::uintptr_t>(ahead);
}

// Whether a head span ending at at + len is within the limits: the same
// verdict as comparing its stream position with limit_end_, both sides
// shifted by the address of the feed's first byte.
int request_parser_state::on_message_begin() {
  phase_ = phase::head;
  start_message();
  head_ = &acquire_head();
  return 0;
}

int request_parser_state::on_method(const char* at, std::size_t len) {
  if (!head_start_known_) {
    head_start_ = stream_pos(at);
    head_start_known_ = true;
    // The head's bytes are read where they are until the feed ends inside it.
    head_base_ = at;
    head_bytes_ = at;
    head_readable_ = feed_begin_;
    head_end_ = feed_end_;
  }
  method_end_ = stream_pos(at) + len;
  // From here until the target is complete both the head and the URL limit apply.
  url_open_ = true;
  url_seen_end_ = 0;
  set_limit_end(std::min(head_start_ + max_header_bytes_, method_end_ + 1 + max_url_));
  return check_head_span(at, len);
}

int request_parser_state::on_url(const char* at, std::size_t len) {
  if (const int rc = check_head_span(at, len); rc != 0) {
    return rc;
  }
  // Only offsets: the target's pieces follow each other in the head's bytes,
  // which are kept whole (in this input or in the arena).
  request_head& h = *head_;
  const auto off = static_cast<std::uint32_t>(stream_pos(at) - head_start_);
  if (h.target_len_ == 0) {
    h.target_off_ = off;
  }
  h.target_len_ = off + static_cast<std::uint32_t>(len) - h.target_off_;
  url_seen_end_ = stream_pos(at) + len;
  return 0;
}

int request_parser_state::on_url_complete() {
  url_open_ = false;
  set_limit_end(head_start_ + max_header_bytes_);
  const auto method = static_cast<llhttp_method_t>(parser_.method);
  if (method == HTTP_CONNECT) {
    return fail(501, "CONNECT is not supported");
  }
  request_head& h = *head_;
  h.method_ = to_request_method(method);
  h.method_name_ = llhttp_method_name(method);

  // The target's bytes: in this input, or in the arena for a cut head.
  const char* readable = head_readable_;
  const std::string_view target{head_bytes_ + h.target_off_, h.target_len_};
  const std::size_t n = target.size();
  constexpr auto npos = std::string_view::npos;
  std::size_t path_begin = 0;
  if (n != 0 && target.front() != '/' && target.front() != '*') {
    // absolute-form: the path starts after "scheme://authority"
    const std::size_t scheme_end = target.find("://");
    path_begin = scheme_end == npos ? n : std::min(target.find_first_of("/?#", scheme_end + 3), n);
  }
  // A fragment is rare, so look for '?' and '#' separately.
  const char* const t = target.data();
  const char* hash = find_byte(readable, t + path_begin, t + n, '#');
  const std::size_t fragment = hash != nullptr ? static_cast<std::size_t>(hash - t) : n;
  const char* mark = find_byte(readable, t + path_begin, t + fragment, '?');
  const std::size_t question = mark != nullptr ? static_cast<std::size_t>(mark - t) : fragment;
  const std::size_t path_end = question;
  std::size_t query_begin = path_end;
  std::size_t query_end = path_end;
  if (question < fragment) {
    query_begin = question + 1;
    query_end = fragment;
  }
  // Head offsets, which are arena offsets.
  h.path_off_ = h.target_off_ + static_cast<std::uint32_t>(path_begin);
  h.path_len_ = static_cast<std::uint32_t>(path_end - path_begin);
  h.query_off_ = h.target_off_ + static_cast<std::uint32_t>(query_begin);
  h.query_len_ = static_cast<std::uint32_t>(query_end - query_begin);
  return 0;
}

int request_parser_state::on_version_complete() {
  // llhttp has accepted "<target> <protocol>/<d>.<d>" (one space or more)
  // and checked the version's syntax; read both from the head's bytes. Only
  // a head kept in part (head_cut_) may end before them: then they lie past
  // the head limit.
  const char* p = head_bytes_ + head_->target_off_ + head_->target_len_;
  const char* slash = p + 5;
  bool http = head_end_ - p >= 9 &&
              std::memcmp(p + 1, "HTTP/", 5) == 0;  // the usual single space, then HTTP
  if (!http) [[unlikely]] {
    while (p < head_end_ && *p == ' ') {
      ++p;
    }
    const char* const protocol = p;
    while (p < head_end_ && *p != '/') {
      ++p;
    }
    if (head_end_ - p < 4) {
      return check_head_limits_slow(UINT64_MAX);
    }
    slash = p;
    http = slash - protocol == 4 && std::memcmp(protocol, "HTTP", 4) == 0;
  }
  const char* const version_end = slash + 4;
  // The protocol's end (its '/') comes first; with the target complete only
  // the head limit applies, so one check gives the verdict of two.
  if (head_pos(version_end) > limit_end_) [[unlikely]] {
    return check_head_limits_slow(head_pos(version_end));
  }
  fields_off_ = static_cast<std::uint32_t>(version_end + 2 - head_bytes_);  // after the CRLF
  // llhttp also takes RTSP/ and ICE/ request lines, and HTTP 0.9 and 2.0.
  if (!http) {
    return fail(400, "unsupported protocol (only HTTP)");
  }
  if (parser_.http_major == 2 && parser_.method == HTTP_PRI) {
    // An h2c client with prior knowledge: its mistake, so a client error (4xx).
    return fail(400, "HTTP/2 is not supported");
  }
  if (parser_.http_major != 1 || parser_.http_minor > 1) {
    return fail(505, "HTTP version not supported");
  }
  head_->version_major_ = parser_.http_major;
  head_->version_minor_ = parser_.http_minor;
  return 0;
}

int request_parser_state::on_headers_complete() {
  phase_ = phase::body;
  request_head& h = *head_;
  rejected_head_ = head_;  // until the head event below: a return before it rejects this head
  if (const int rc = scan_head_fields(nullptr); rc != 0) {
    return rc;
  }
  const auto flags = parser_.flags;
  if (h.version_major_ != 1) {
    return fail(400, "HTTP/0.9 request line (no HTTP version)");
  }
  if (h.version_minor_ == 1 && host_count_ == 0) {
    return fail(400, "missing Host header");
  }
  if (const int rc = check_host(); rc != 0) {
    return rc;
  }
  if (te_seen_) {
    if (h.version_minor_ == 0) {
      return fail(400, "Transfer-Encoding in an HTTP/1.0 request");
    }
    if ((flags & F_CONTENT_LENGTH) != 0) {
      return fail(400, "both Content-Length and Transfer-Encoding");
    }
    if (chunked_count_ == 0) {
      return fail(400, "Transfer-Encoding without a coding");
    }
    if (chunked_count_ > 1) {
      return fail(400, "chunked transfer coding applied twice");
    }
    h.framing_ = body_framing::chunked;
  } else if ((flags & F_CONTENT_LENGTH) != 0) {
    h.framing_ = body_framing::content_length;
    h.content_length_ = parser_.content_length;
    if (h.content_length_ > limits_.max_body) {
      return fail(413, "Content-Length larger than max_body");
    }
  }
  if (h.version_minor_ == 1) {
    keep_alive_ = (flags & F_CONNECTION_CLOSE) == 0;
  } else {
    keep_alive_ = (flags & F_CONNECTION_KEEP_ALIVE) != 0 && (flags & F_CONNECTION_CLOSE) == 0;
  }
  h.keep_alive_ = keep_alive_;
  h.expect_continue_ = expect_continue_;

  // llhttp sets `upgrade` for any Upgrade + Connection: upgrade. Only a
  // body-less WebSocket GET switches protocols; any other upgrade (h2c, ...)
  // is refused by not switching: clearing the flag makes llhttp carry on with
  // this as an ordinary request instead of pausing after it. An HTTP/1.0
  // WebSocket GET is flagged too, so the handshake check answers it 400
  // (RFC 6455 4.1: the handshake needs HTTP/1.1) instead of the app.
  websocket_ = parser_.upgrade != 0 && websocket_token_ && (flags & F_CONNECTION_UPGRADE) != 0 &&
               h.method_ == request_method::get &&
               (h.framing_ == body_framing::none ||
                (h.framing_ == body_framing::content_length && h.content_length_ == 0));
  parser_.upgrade = websocket_ ? 1 : 0;
  h.websocket_upgrade_ = websocket_;

  rejected_head_ = nullptr;
  events_.push_back(
      {parse_event_kind::head, static_cast<std::uint32_t>(heads_used_ - 1), head_, {}, nullptr});
  return 0;
}

int request_parser_state::check_host() {
  // RFC 9112 section 3.2: the Host field must be one valid host; the
  // asterisk form only for OPTIONS (section 3.2.4); with an absolute-form
  // target its authority is the host (section 3.2.2): the Host field's value
  // then names the target's authority, so the app sees the one that wins.
  request_head& h = *head_;
  const std::string_view target = h.fields_.slice(h.target_off_, h.target_len_);
  if (!target.empty() && target.front() == '*' && h.method_ != request_method::options) {
    return fail(400, "asterisk-form target for a method other than OPTIONS");
  }
  header_block::entry* host = nullptr;
  if (host_count_ != 0) {
    for (std::uint32_t i = 0; i < h.fields_.count_; ++i) {
      header_block::entry& e = h.fields_.entries_[i];
      if (e.name_len == 4 && std::memcmp(h.fields_.bytes_.get() + e.name_off, "host", 4) == 0) {
        host = &e;
        break;
      }
    }
    if (host != nullptr && !valid_host(h.fields_.slice(host->value_off, host->value_len))) {
      return fail(400, "invalid Host header");
    }
  }
  if (target.empty() || target.front() == '/' || target.front() == '*') {
    return 0;
  }
  const std::size_t scheme_end = target.find("://");
  if (scheme_end == std::string_view::npos) {
    return 0;
  }
  const std::size_t begin = scheme_end + 3;
  const std::size_t end = std::min(target.find_first_of("/?#", begin), target.size());
  std::string_view authority = target.substr(begin, end - begin);
  std::size_t at = begin;
  if (const std::size_t user = authority.rfind('@'); user != std::string_view::npos) {
    authority.remove_prefix(user + 1);  // userinfo is not part of the host
    at += user + 1;
  }
  if (authority.empty() || authority.front() == ':' || !valid_host(authority)) {
    return fail(400, "invalid host in an absolute-form target");
  }
  if (host != nullptr) {
    host->value_off = h.target_off_ + static_cast<std::uint32_t>(at);
    host->value_len = static_cast<std::uint32_t>(authority.size());
  }
  return 0;
}

int request_parser_state::on_body(const char* at, std::size_t len) {
  events_.push_back({parse_event_kind::body, 0, nullptr, std::string_view{at, len}, nullptr});
  return 0;
}

int request_parser_state::on_chunk_header() {
  const std::uint64_t size = parser_.content_length;
  if (size == 0) {
    phase_ = phase::trailers;
    parser_.settings = const_cast<llhttp_settings_t*>(&trailer_settings());
    return 0;
  }
  // Refuse as soon as the declared sizes pass the limit, before the data arrives.
  if (size > limits_.max_body - body_declared_) {
    return fail(413, "chunked body larger than max_body");
  }
  body_declared_ += size;
  return 0;
}

int request_parser_state::on_chunk_extension(const char*, std::size_t len) {
  // Checked as the bytes arrive, not only when a name or value ends: one
  // that never ends would otherwise be read for ever (Node's CVE-2024-22019).
  chunk_ext_bytes_ += len;
  if (chunk_ext_bytes_ > limits_.max_chunk_extension_bytes) {
    return fail(413, "chunk extensions larger than max_chunk_extension_bytes");
  }
  return 0;
}

int request_parser_state::on_message_complete() {
  // Only queue here: the caller dispatches after llhttp_execute returns.
  parse_event event{parse_event_kind::message_complete, 0, nullptr, {}, nullptr};
  if (trailer_block_ != nullptr) {
    event.trailers = trailer_block_;
    event.slot = static_cast<std::uint32_t>(trailers_used_ - 1);
  }
  events_.push_back(event);
  if (phase_ == phase::trailers) {
    parser_.settings = const_cast<llhttp_settings_t*>(&settings());
  }
  phase_ = phase::idle;
  head_ = nullptr;
  trailer_block_ = nullptr;
  head_start_known_ = false;
  url_open_ = false;
  set_limit_end(UINT64_MAX);
  if (credit_ != unlimited_credit && credit_ > 0) {
    --credit_;
  }
  if (websocket_) {
    return 0;  // llhttp stops with HPE_PAUSED_UPGRADE right after this
  }
  if (!keep_alive_) {
    // Nothing after a non-persistent request may be parsed (RFC 9112 9.6).
    pause_reason_ = pause_reason::closing;
    return HPE_PAUSED;
  }
  if (credit_ == 0) {
    pause_reason_ = pause_reason::credit;
    return HPE_PAUSED;
  }
  return 0;
}

// ---------------------------------------------------------------- request_parser

namespace {

// What error() reports when the parser's storage could not be made.
constexpr parse_error out_of_memory{500, "out of memory", true};
constexpr parse_error no_error{};

}  // namespace

bool request_parser::make_state() noexcept {
  if (released_) {
    return false;
  }
  try {
    state_ = std::make_unique<request_parser_state>(limits_);
  } catch (...) {
    out_of_memory_ = true;
    return false;
  }
  state_->set_credit(credit_);
  state_->use_pool(pool_);
  return true;
}

void request_parser::add_credit(std::uint32_t messages) noexcept {
  if (state_ != nullptr) {
    state_->add_credit(messages);
    return;
  }
  if (credit_ != unlimited_credit) {
    credit_ = messages >= unlimited_credit - credit_ ? unlimited_credit - 1 : credit_ + messages;
  }
}

void request_parser::recycle_head(std::unique_ptr<request_head> head) {
  if (state_ != nullptr) {
    state_->recycle_head(std::move(head));
  } else if (head && pool_ != nullptr) {
    pool_->give(std::move(head));
  }
}

void request_parser::recycle_trailers(std::unique_ptr<header_block> trailers) {
  if (state_ != nullptr) {
    state_->recycle_trailers(std::move(trailers));
  }
}

const parse_error& request_parser::error() const noexcept {
  if (state_ != nullptr) {
    return state_->error();
  }
  return out_of_memory_ ? out_of_memory : no_error;
}

}  // namespace cadeloop::http
