#include <cadeloop/http/request_parser.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace cadeloop::http {

namespace {

constexpr std::array<char, 256> lower_table = [] {
  std::array<char, 256> t{};
  for (std::size_t i = 0; i < t.size(); ++i) {
    const auto c = static_cast<unsigned char>(i);
    t[i] = static_cast<char>(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
  }
  return t;
}();

// Lower-cases the ASCII letters of a word of bytes (SWAR): for a byte
// b < 0x80, b + (0x80 - 'A') sets its top bit iff b >= 'A', and
// b + (0x7f - 'Z') sets it iff b > 'Z'; bytes >= 0x80 are left alone.
template <class Word>
Word lower_word(Word x) noexcept {
  constexpr Word ones = static_cast<Word>(~Word{0}) / 0xff;
  constexpr Word high = ones * 0x80;
  const Word low7 = x & static_cast<Word>(~high);
  const Word ge_a = static_cast<Word>(low7 + ones * (0x80 - 'A'));
  const Word gt_z = static_cast<Word>(low7 + ones * (0x7f - 'Z'));
  const Word upper = ge_a & static_cast<Word>(~gt_z) & static_cast<Word>(~x) & high;
  return static_cast<Word>(x | (upper >> 2));
}

template <class Word>
void copy_lower_word(char* out, const char* in) noexcept {
  Word x;
  std::memcpy(&x, in, sizeof x);
  x = lower_word(x);
  std::memcpy(out, &x, sizeof x);
}

// Copies n bytes, lower-casing ASCII letters, a word at a time. The last word
// may overlap the previous one (it recomputes the same bytes), so nothing is
// read or written outside [in, in + n) and [out, out + n).
void copy_lower(char* out, const char* in, std::size_t n) noexcept {
  if (n >= 8) {
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      copy_lower_word<std::uint64_t>(out + i, in + i);
    }
    if (i < n) {
      copy_lower_word<std::uint64_t>(out + n - 8, in + n - 8);
    }
  } else if (n >= 4) {
    copy_lower_word<std::uint32_t>(out, in);
    copy_lower_word<std::uint32_t>(out + n - 4, in + n - 4);
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      out[i] = lower_table[static_cast<unsigned char>(in[i])];
    }
  }
}

constexpr bool is_ows(char c) noexcept { return c == ' ' || c == '\t'; }

// ASCII case-insensitive comparison against an already lower-case literal.
bool equals_lower(std::string_view s, std::string_view lower) noexcept {
  if (s.size() != lower.size()) {
    return false;
  }
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (lower_table[static_cast<unsigned char>(s[i])] != lower[i]) {
      return false;
    }
  }
  return true;
}

std::string_view trim_ows(std::string_view s) noexcept {
  while (!s.empty() && is_ows(s.front())) {
    s.remove_prefix(1);
  }
  while (!s.empty() && is_ows(s.back())) {
    s.remove_suffix(1);
  }
  return s;
}

// Splits a comma-separated field value into its non-empty, trimmed elements
// (RFC 9110 5.6.1) and calls `fn` on each until it returns non-zero.
template <class Fn>
int for_each_element(std::string_view value, Fn&& fn) {
  for (;;) {
    const std::size_t comma = value.find(',');
    const std::string_view element = trim_ows(value.substr(0, comma));
    if (!element.empty()) {
      if (const int rc = fn(element); rc != 0) {
        return rc;
      }
    }
    if (comma == std::string_view::npos) {
      return 0;
    }
    value.remove_prefix(comma + 1);
  }
}

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

constexpr std::uint64_t max_position_limit = std::uint64_t{1} << 30;
constexpr std::size_t initial_head_arena = 1024;
constexpr std::size_t initial_head_fields = 32;
constexpr std::size_t initial_trailer_arena = 256;
constexpr std::size_t initial_trailer_fields = 8;

}  // namespace

// ---------------------------------------------------------------- header_block

std::optional<std::string_view> header_block::find(std::string_view lower_name) const noexcept {
  for (const entry& e : entries_) {
    if (slice(e.name_off, e.name_len) == lower_name) {
      return slice(e.value_off, e.value_len);
    }
  }
  return std::nullopt;
}

std::size_t header_block::count(std::string_view lower_name) const noexcept {
  std::size_t n = 0;
  for (const entry& e : entries_) {
    if (slice(e.name_off, e.name_len) == lower_name) {
      ++n;
    }
  }
  return n;
}

header_block::header_block(const header_block& other)
    : bytes_{other.size_ == 0 ? nullptr : std::make_unique<char[]>(other.size_)},
      size_{other.size_},
      capacity_{other.size_},
      entries_{other.entries_} {
  if (size_ != 0) {
    std::memcpy(bytes_.get(), other.bytes_.get(), size_);
  }
}

header_block& header_block::operator=(const header_block& other) {
  if (this != &other) {
    header_block copy{other};
    *this = std::move(copy);
  }
  return *this;
}

header_block::header_block(header_block&& other) noexcept
    : bytes_{std::move(other.bytes_)},
      size_{std::exchange(other.size_, 0)},
      capacity_{std::exchange(other.capacity_, 0)},
      entries_{std::move(other.entries_)} {
  other.entries_.clear();
}

header_block& header_block::operator=(header_block&& other) noexcept {
  if (this != &other) {
    bytes_ = std::move(other.bytes_);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
    entries_ = std::move(other.entries_);
    other.entries_.clear();
  }
  return *this;
}

void header_block::grow(std::size_t n) {
  std::size_t want = std::max<std::size_t>(std::size_t{capacity_} * 2, 256);
  while (want - size_ < n) {
    want *= 2;
  }
  if (want > UINT32_MAX) {
    throw std::length_error{"header_block arena over 4 GiB"};
  }
  auto bigger = std::make_unique_for_overwrite<char[]>(want);
  if (size_ != 0) {
    std::memcpy(bigger.get(), bytes_.get(), size_);
  }
  bytes_ = std::move(bigger);
  capacity_ = static_cast<std::uint32_t>(want);
}

void header_block::reserve(std::size_t bytes, std::size_t fields) {
  if (bytes > capacity_) {
    grow(bytes - size_);
  }
  entries_.reserve(fields);
}

// ---------------------------------------------------------------- request_head

void request_head::clear() noexcept {
  fields_.clear();
  method_name_ = {};
  content_length_ = 0;
  target_len_ = 0;
  path_off_ = 0;
  path_len_ = 0;
  query_off_ = 0;
  query_len_ = 0;
  method_ = request_method::other;
  framing_ = body_framing::none;
  version_major_ = 0;
  version_minor_ = 0;
  keep_alive_ = false;
  expect_continue_ = false;
  websocket_upgrade_ = false;
}

// ---------------------------------------------------------------- request_parser

template <int (request_parser::*Member)()>
int request_parser::trampoline(llhttp_t* parser) noexcept {
  auto* self = static_cast<request_parser*>(parser->data);
  // No exception may unwind through llhttp's C frames: record it as an error.
  try {
    return (self->*Member)();
  } catch (...) {
    return self->fail_internal();
  }
}

template <int (request_parser::*Member)(const char*, std::size_t)>
int request_parser::data_trampoline(llhttp_t* parser, const char* at, std::size_t len) noexcept {
  auto* self = static_cast<request_parser*>(parser->data);
  try {
    return (self->*Member)(at, len);
  } catch (...) {
    return self->fail_internal();
  }
}

const llhttp_settings_t& request_parser::settings() noexcept {
  static const llhttp_settings_t instance = [] {
    llhttp_settings_t s;
    llhttp_settings_init(&s);
    s.on_message_begin = &trampoline<&request_parser::on_message_begin>;
    s.on_method = &data_trampoline<&request_parser::on_method>;
    s.on_url = &data_trampoline<&request_parser::on_url>;
    s.on_url_complete = &trampoline<&request_parser::on_url_complete>;
    s.on_protocol = &data_trampoline<&request_parser::on_protocol>;
    s.on_version = &data_trampoline<&request_parser::on_version>;
    s.on_version_complete = &trampoline<&request_parser::on_version_complete>;
    s.on_header_field = &data_trampoline<&request_parser::on_header_field>;
    s.on_header_value = &data_trampoline<&request_parser::on_header_value>;
    s.on_header_value_complete = &trampoline<&request_parser::on_header_value_complete>;
    s.on_headers_complete = &trampoline<&request_parser::on_headers_complete>;
    s.on_body = &data_trampoline<&request_parser::on_body>;
    s.on_chunk_header = &trampoline<&request_parser::on_chunk_header>;
    s.on_chunk_extension_name = &data_trampoline<&request_parser::on_chunk_extension>;
    s.on_chunk_extension_value = &data_trampoline<&request_parser::on_chunk_extension>;
    s.on_chunk_extension_name_complete = &trampoline<&request_parser::on_chunk_extension_complete>;
    s.on_chunk_extension_value_complete = &trampoline<&request_parser::on_chunk_extension_complete>;
    s.on_message_complete = &trampoline<&request_parser::on_message_complete>;
    return s;
  }();
  return instance;
}

request_parser::request_parser(const request_limits& limits)
    : limits_{limits},
      max_header_bytes_{std::min<std::uint64_t>(limits.max_header_bytes, max_position_limit)},
      max_url_{std::min<std::uint64_t>(limits.max_url, max_position_limit)} {
  events_.reserve(64);
  heads_.reserve(16);
  trailers_.reserve(4);
  free_heads_.reserve(16);
  free_trailers_.reserve(4);
  reset();
}

void request_parser::reset() noexcept {
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
  trailer_block_ = nullptr;
  feed_begin_ = nullptr;
  stream_base_ = 0;
  start_message();
}

void request_parser::add_credit(std::uint32_t messages) noexcept {
  if (credit_ == unlimited_credit) {
    return;
  }
  credit_ = messages >= unlimited_credit - credit_ ? unlimited_credit - 1 : credit_ + messages;
}

std::unique_ptr<request_head> request_parser::take_head(const parse_event& event) noexcept {
  if (event.kind != parse_event_kind::head || event.slot >= heads_.size() ||
      heads_[event.slot].get() != event.head) {
    return nullptr;
  }
  return std::move(heads_[event.slot]);
}

void request_parser::recycle_head(std::unique_ptr<request_head> head) {
  if (head) {
    head->clear();
    free_heads_.push_back(std::move(head));
  }
}

std::unique_ptr<header_block> request_parser::take_trailers(const parse_event& event) noexcept {
  if (event.kind != parse_event_kind::message_complete || event.trailers == nullptr ||
      event.slot >= trailers_.size() || trailers_[event.slot].get() != event.trailers) {
    return nullptr;
  }
  return std::move(trailers_[event.slot]);
}

void request_parser::recycle_trailers(std::unique_ptr<header_block> trailers) {
  if (trailers) {
    trailers->clear();
    free_trailers_.push_back(std::move(trailers));
  }
}

void request_parser::begin_feed() noexcept {
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

request_head& request_parser::acquire_head() {
  if (heads_used_ == heads_.size()) {
    heads_.emplace_back();
  }
  std::unique_ptr<request_head>& slot = heads_[heads_used_];
  if (!slot) {
    if (!free_heads_.empty()) {
      slot = std::move(free_heads_.back());
      free_heads_.pop_back();
    } else {
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

header_block& request_parser::acquire_trailers() {
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

header_block& request_parser::trailer_fields() {
  if (trailer_block_ == nullptr) {
    trailer_block_ = &acquire_trailers();
  }
  return *trailer_block_;
}

void request_parser::start_message() noexcept {
  head_start_known_ = false;
  url_open_ = false;
  limit_end_ = UINT64_MAX;
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
  protocol_len_ = 0;
  version_len_ = 0;
  body_declared_ = 0;
  chunk_ext_bytes_ = 0;
  trailer_bytes_ = 0;
}

feed_result request_parser::feed(std::string_view input) noexcept {
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
  const llhttp_errno_t err = llhttp_execute(&parser_, input.data(), input.size());
  if (err == HPE_OK) {
    stream_base_ += input.size();
    return {feed_status::ok, input.size()};
  }

  std::size_t consumed = 0;
  if (const char* pos = llhttp_get_error_pos(&parser_);
      pos != nullptr && pos >= input.data() && pos <= input.data() + input.size()) {
    consumed = static_cast<std::size_t>(pos - input.data());
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
    classify_llhttp_error(err, stream_base_);
  }
  state_ = state::failed;
  return {feed_status::error, consumed};
}

int request_parser::fail(std::uint16_t status, const char* reason) noexcept {
  error_ = {status, reason, true};
  llhttp_set_error_reason(&parser_, reason);
  return HPE_USER;
}

int request_parser::fail_internal() noexcept {
  return fail(500, "internal error while parsing the request");
}

std::uint16_t request_parser::head_limit_violation(std::uint64_t end, const char** reason) const noexcept {
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
  if (url_open_ && end > method_end_ + 1 + max_url_ && method_end_ + 1 + max_url_ < first) {
    status = 414;
    *reason = "request target longer than max_url";
  }
  return status;
}

int request_parser::check_head_limits_slow(std::uint64_t end) noexcept {
  const char* reason = nullptr;
  if (const std::uint16_t status = head_limit_violation(end, &reason); status != 0) {
    return fail(status, reason);
  }
  return 0;
}

void request_parser::classify_llhttp_error(llhttp_errno_t err, std::uint64_t pos) noexcept {
  // llhttp may stop at a bad byte that lies past a limit before the span
  // holding it was reported; the limit was crossed first, so it decides.
  if (phase_ == phase::head) {
    const char* reason = nullptr;
    if (const std::uint16_t status = head_limit_violation(pos, &reason); status != 0) {
      error_ = {status, reason, true};
      return;
    }
  }
  const char* reason = llhttp_get_error_reason(&parser_);
  if (reason == nullptr) {
    reason = "malformed request";
  }
  std::uint16_t status = 400;
  const bool http_protocol = protocol_len_ == 4 && std::memcmp(protocol_, "HTTP", 4) == 0;
  if (err == HPE_INVALID_VERSION && http_protocol && version_len_ == 3 && version_[0] >= '0' && version_[0] <= '9' &&
      version_[1] == '.' && version_[2] >= '0' && version_[2] <= '9' &&
      !(version_[0] == '1' && (version_[2] == '0' || version_[2] == '1'))) {
    // Well-formed "HTTP/d.d" that llhttp does not know: a version we don't speak.
    status = 505;
    reason = "HTTP version not supported";
  } else if (err == HPE_PAUSED_H2_UPGRADE) {
    status = 505;
    reason = "HTTP/2 is not supported";
  } else if (err == HPE_PAUSED_UPGRADE) {
    status = 501;
    reason = "upgrade not supported";
  }
  error_ = {status, reason, true};
}

// ---------------------------------------------------------------- callbacks

inline header_block& request_parser::field_block() {
  return phase_ == phase::head ? head_->fields_ : trailer_fields();
}

inline int request_parser::check_head_limits(std::uint64_t end) noexcept {
  return end <= limit_end_ ? 0 : check_head_limits_slow(end);
}

int request_parser::on_message_begin() {
  phase_ = phase::head;
  start_message();
  head_ = &acquire_head();
  return 0;
}

int request_parser::on_method(const char* at, std::size_t len) {
  const std::uint64_t start = stream_pos(at);
  if (!head_start_known_) {
    head_start_ = start;
    head_start_known_ = true;
  }
  method_end_ = start + len;
  // From here until the target is complete both the head and the URL limit apply.
  url_open_ = true;
  limit_end_ = std::min(head_start_ + max_header_bytes_, method_end_ + 1 + max_url_);
  return check_head_limits(method_end_);
}

int request_parser::on_url(const char* at, std::size_t len) {
  if (const int rc = check_head_limits(stream_pos(at) + len); rc != 0) {
    return rc;
  }
  header_block& block = head_->fields_;
  std::memcpy(block.reserve_tail(len), at, len);
  block.size_ += static_cast<std::uint32_t>(len);
  head_->target_len_ += static_cast<std::uint32_t>(len);
  return 0;
}

int request_parser::on_url_complete() {
  url_open_ = false;
  limit_end_ = head_start_ + max_header_bytes_;
  const auto method = static_cast<llhttp_method_t>(parser_.method);
  if (method == HTTP_CONNECT) {
    return fail(501, "CONNECT is not supported");
  }
  request_head& h = *head_;
  h.method_ = to_request_method(method);
  h.method_name_ = llhttp_method_name(method);

  const std::string_view target = h.target();
  const std::size_t n = target.size();
  constexpr auto npos = std::string_view::npos;
  std::size_t path_begin = 0;
  if (n != 0 && target.front() != '/' && target.front() != '*') {
    // absolute-form: the path starts after "scheme://authority"
    const std::size_t scheme_end = target.find("://");
    path_begin = scheme_end == npos ? n : std::min(target.find_first_of("/?#", scheme_end + 3), n);
  }
  // memchr-based scans: a fragment is rare, so look for '?' and '#' separately.
  const std::size_t fragment = std::min(target.find('#', path_begin), n);
  const std::size_t question = std::min(target.find('?', path_begin), fragment);
  const std::size_t path_end = question;
  std::size_t query_begin = path_end;
  std::size_t query_end = path_end;
  if (question < fragment) {
    query_begin = question + 1;
    query_end = fragment;
  }
  h.path_off_ = static_cast<std::uint32_t>(path_begin);
  h.path_len_ = static_cast<std::uint32_t>(path_end - path_begin);
  h.query_off_ = static_cast<std::uint32_t>(query_begin);
  h.query_len_ = static_cast<std::uint32_t>(query_end - query_begin);
  return 0;
}

int request_parser::on_protocol(const char* at, std::size_t len) {
  if (const int rc = check_head_limits(stream_pos(at) + len); rc != 0) {
    return rc;
  }
  for (std::size_t i = 0; i < len; ++i) {
    if (protocol_len_ < sizeof(protocol_)) {
      protocol_[protocol_len_] = at[i];
    }
    protocol_len_ = static_cast<std::uint8_t>(std::min<std::size_t>(protocol_len_ + 1u, sizeof(protocol_) + 1));
  }
  return 0;
}

int request_parser::on_version(const char* at, std::size_t len) {
  if (const int rc = check_head_limits(stream_pos(at) + len); rc != 0) {
    return rc;
  }
  for (std::size_t i = 0; i < len; ++i) {
    if (version_len_ < sizeof(version_)) {
      version_[version_len_] = at[i];
    }
    version_len_ = static_cast<std::uint8_t>(std::min<std::size_t>(version_len_ + 1u, sizeof(version_) + 1));
  }
  return 0;
}

int request_parser::on_version_complete() {
  // llhttp also takes RTSP/ and ICE/ request lines, and HTTP 0.9 and 2.0.
  if (protocol_len_ != 4 || std::memcmp(protocol_, "HTTP", 4) != 0) {
    return fail(400, "unsupported protocol (only HTTP)");
  }
  if (parser_.http_major != 1 || parser_.http_minor > 1) {
    return fail(505, "HTTP version not supported");
  }
  head_->version_major_ = parser_.http_major;
  head_->version_minor_ = parser_.http_minor;
  return 0;
}

int request_parser::on_header_field(const char* at, std::size_t len) {
  if (phase_ == phase::head) {
    if (const int rc = check_head_limits(stream_pos(at) + len); rc != 0) {
      return rc;
    }
  } else {
    // Trailers: counted, copied while under the limit, rejected at the end of
    // the value (a fixed stream position, so the verdict is split-independent).
    trailer_bytes_ += len + (in_field_ ? 0u : 4u);
    if (trailer_bytes_ > max_header_bytes_) {
      trailers_over_ = true;
    }
    if (trailers_over_) {
      in_field_ = true;
      return 0;
    }
  }
  header_block& block = field_block();
  if (!in_field_) {
    in_field_ = true;
    block.entries_.push_back({block.size_, 0, block.size_, 0});
  }
  copy_lower(block.reserve_tail(len), at, len);
  block.size_ += static_cast<std::uint32_t>(len);
  block.entries_.back().name_len += static_cast<std::uint32_t>(len);
  return 0;
}

int request_parser::on_header_value(const char* at, std::size_t len) {
  // llhttp reports every value, even an empty one, so the first piece of a
  // value also marks the end of its name.
  if (phase_ == phase::head) {
    if (const int rc = check_head_limits(stream_pos(at) + len); rc != 0) {
      return rc;
    }
  } else {
    trailer_bytes_ += len;
    if (trailer_bytes_ > max_header_bytes_) {
      trailers_over_ = true;
    }
    if (trailers_over_) {
      in_field_ = false;
      in_value_ = true;
      return 0;
    }
  }
  header_block& block = field_block();
  header_block::entry& e = block.entries_.back();
  if (!in_value_) {
    in_value_ = true;
    in_field_ = false;
    e.value_off = block.size_;
    e.value_len = 0;
  }
  std::memcpy(block.reserve_tail(len), at, len);
  block.size_ += static_cast<std::uint32_t>(len);
  e.value_len += static_cast<std::uint32_t>(len);
  return 0;
}

int request_parser::on_header_value_complete() {
  in_value_ = false;
  in_field_ = false;
  if (phase_ != phase::head && trailers_over_) {
    return fail(431, "trailer section larger than max_header_bytes");
  }
  header_block& block = field_block();
  if (block.entries_.size() > limits_.max_headers) {
    return fail(431, phase_ == phase::head ? "more header fields than max_headers" : "more trailer fields than max_headers");
  }
  header_block::entry& e = block.entries_.back();
  // llhttp drops the whitespace before a value but keeps the whitespace after it.
  const char* value = block.bytes_.get() + e.value_off;
  while (e.value_len > 0 && is_ows(value[e.value_len - 1])) {
    --e.value_len;
  }
  if (phase_ == phase::head) {
    return interpret_head_field(block.slice(e.name_off, e.name_len), block.slice(e.value_off, e.value_len));
  }
  return 0;
}

int request_parser::interpret_head_field(std::string_view name, std::string_view value) {
  // Content-Length and Connection are validated and tracked by llhttp itself
  // (parser_.flags, parser_.content_length).
  switch (name.size()) {
    case 4:
      if (name == "host" && ++host_count_ > 1) {
        return fail(400, "more than one Host header");
      }
      break;
    case 6:
      if (name == "expect" && equals_lower(value, "100-continue")) {
        expect_continue_ = true;
      }
      break;
    case 7:
      if (name == "upgrade") {
        for_each_element(value, [this](std::string_view protocol) {
          if (equals_lower(protocol, "websocket")) {
            websocket_token_ = true;
          }
          return 0;
        });
      }
      break;
    case 17:
      if (name == "transfer-encoding") {
        te_seen_ = true;
        // Only "chunked" is supported; whether it appears exactly once is
        // decided with the whole head (several fields may carry codings).
        return for_each_element(value, [this](std::string_view coding) {
          if (!equals_lower(coding, "chunked")) {
            return fail(501, "unsupported transfer coding");
          }
          chunked_count_ = static_cast<std::uint8_t>(std::min(chunked_count_ + 1, 2));
          return 0;
        });
      }
      break;
    default:
      break;
  }
  return 0;
}

int request_parser::on_headers_complete() {
  phase_ = phase::body;
  request_head& h = *head_;
  const auto flags = parser_.flags;
  if (h.version_minor_ == 1 && host_count_ == 0) {
    return fail(400, "missing Host header");
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
  // this as an ordinary request instead of pausing after it.
  websocket_ = parser_.upgrade != 0 && websocket_token_ && (flags & F_CONNECTION_UPGRADE) != 0 &&
               h.method_ == request_method::get && h.version_minor_ == 1 &&
               (h.framing_ == body_framing::none ||
                (h.framing_ == body_framing::content_length && h.content_length_ == 0));
  parser_.upgrade = websocket_ ? 1 : 0;
  h.websocket_upgrade_ = websocket_;

  events_.push_back({parse_event_kind::head, static_cast<std::uint32_t>(heads_used_ - 1), head_, {}, nullptr});
  return 0;
}

int request_parser::on_body(const char* at, std::size_t len) {
  events_.push_back({parse_event_kind::body, 0, nullptr, std::string_view{at, len}, nullptr});
  return 0;
}

int request_parser::on_chunk_header() {
  const std::uint64_t size = parser_.content_length;
  if (size == 0) {
    phase_ = phase::trailers;
    return 0;
  }
  // Refuse as soon as the declared sizes pass the limit, before the data arrives.
  if (size > limits_.max_body - body_declared_) {
    return fail(413, "chunked body larger than max_body");
  }
  body_declared_ += size;
  return 0;
}

int request_parser::on_chunk_extension(const char*, std::size_t len) {
  chunk_ext_bytes_ += len;
  return 0;
}

int request_parser::on_chunk_extension_complete() {
  if (chunk_ext_bytes_ > limits_.max_chunk_extension_bytes) {
    return fail(413, "chunk extensions larger than max_chunk_extension_bytes");
  }
  return 0;
}

int request_parser::on_message_complete() {
  // Only queue here: the caller dispatches after llhttp_execute returns.
  parse_event event{parse_event_kind::message_complete, 0, nullptr, {}, nullptr};
  if (trailer_block_ != nullptr) {
    event.trailers = trailer_block_;
    event.slot = static_cast<std::uint32_t>(trailers_used_ - 1);
  }
  events_.push_back(event);
  phase_ = phase::idle;
  head_ = nullptr;
  trailer_block_ = nullptr;
  head_start_known_ = false;
  url_open_ = false;
  limit_end_ = UINT64_MAX;
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

}  // namespace cadeloop::http
