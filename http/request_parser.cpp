// request_parser: llhttp set-up and trampolines, feeding and its outcome,
// the pools of heads and trailer blocks, limits and error classification,
// the request line (method, target, version), the end of the head (framing,
// keep-alive, upgrade) and the body callbacks. The header fields are read in
// head_fields.cpp.

#include <cadeloop/http/request_parser.hpp>

#include "byte_scan.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

namespace cadeloop::http {

using namespace detail;

namespace {

template <std::size_t Cap>
void append_capped(char (&buf)[Cap], std::uint8_t& n, const char* at, std::size_t len) noexcept {
  if (n < Cap) {
    std::memcpy(buf + n, at, std::min<std::size_t>(len, Cap - n));
  }
  n = static_cast<std::uint8_t>(std::min<std::size_t>(n + len, Cap + 1));
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

// How a head is parsed. Most heads arrive in one read, and for those three
// llhttp callbacks per header field (name, value, end of value) are most of
// the cost. So each head starts with head_in_one_piece_settings(), which has
// none of them: llhttp still validates every byte, and at the end of the head
// scan_head_fields() reads the fields from the input in one pass, making the
// same checks at the same stream positions the callbacks would have, and
// copies the head to its arena once. If the input ends inside the head, or
// llhttp or a callback rejects it, nothing of the fast path is trusted:
// reparse_head() parses the head again from its first byte with every
// callback (which then also carry it over to the next feed), so those cases
// behave exactly as with every callback from the start.
const llhttp_settings_t& request_parser::head_in_one_piece_settings() noexcept {
  // The same minus the three per-field callbacks, which are most of the cost
  // of a typical head (scan_head_fields() does their work in one pass), and
  // the protocol and version spans (read_protocol_and_version()).
  static const llhttp_settings_t instance = [] {
    llhttp_settings_t s = settings();
    s.on_header_field = nullptr;
    s.on_header_value = nullptr;
    s.on_header_value_complete = nullptr;
    s.on_protocol = nullptr;  // read by read_protocol_and_version
    s.on_version = nullptr;
    return s;
  }();
  return instance;
}

request_parser::request_parser(const request_limits& limits)
    : limits_{limits},
      max_header_bytes_{std::min<std::uint64_t>(limits.max_header_bytes, max_position_limit)},
      max_url_{std::min<std::uint64_t>(limits.max_url, max_position_limit)} {
  // No reservations: a parser exists per connection slot, and what it would
  // reserve up front (64 events, 16 head slots ...) is memory every idle
  // connection would hold. The vectors grow on first use and keep it.
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
  feed_end_ = nullptr;
  stream_base_ = 0;
  one_piece_ = false;
  reparsing_ = false;
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
  set_limit_end(UINT64_MAX);
  head_base_ = nullptr;
  head_begin_ = nullptr;
  version_end_ = nullptr;
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
  feed_end_ = input.data() + input.size();
  limit_addr_ = limit_address();
  // Which heads to parse one_piece_: a head cut by the end of the input would
  // be parsed twice (reparse_head), so only those expected to end in it. An
  // input that ends with an empty line ends with a complete head or body; in
  // any other, a head that starts 4 KiB or more before its end.
  constexpr std::size_t far_from_the_end = 4096;
  one_piece_before_ = input.ends_with("\r\n\r\n") ? feed_end_
                      : input.size() > far_from_the_end ? feed_end_ - far_from_the_end
                                                        : input.data();
  llhttp_errno_t err = llhttp_execute(&parser_, input.data(), input.size());
  if (one_piece_ && phase_ == phase::head) [[unlikely]] {
    err = reparse_head(err);
  }
  if (err == HPE_OK) {
    stream_base_ += input.size();
    if (head_base_ != nullptr) {
      // The head goes on in the next feed: its bytes so far must outlive this input.
      try {
        materialize_head(feed_end_);
      } catch (...) {
        fail_internal();
        head_base_ = nullptr;
        state_ = state::failed;
        return {feed_status::error, input.size()};
      }
    }
    return {feed_status::ok, input.size()};
  }
  head_base_ = nullptr;  // whatever stopped llhttp, no head is open past this input

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

llhttp_errno_t request_parser::reparse_head(llhttp_errno_t first) noexcept {
  // The head that began in this input was parsed without field callbacks and
  // did not end in it (the input ran out, or llhttp or a callback rejected
  // it). Parse it again from its first byte with every callback: the fields
  // are then stored for the next feed to continue, or the verdict is exactly
  // that of a parse with every callback. A new llhttp parser over the same
  // bytes behaves as the first pass did: llhttp resets its per-message state
  // when a message starts, and no lenient flag is ever set.
  one_piece_ = false;
  parser_.settings = const_cast<llhttp_settings_t*>(&settings());
  if (head_begin_ == nullptr) {
    return first;  // the method has not even been reported: nothing was missed
  }
  const char* from = head_begin_;
  --heads_used_;  // on_message_begin takes the same slot, and head, again
  error_ = {};
  llhttp_init(&parser_, HTTP_REQUEST, &settings());
  parser_.data = this;
  reparsing_ = true;
  const llhttp_errno_t err = llhttp_execute(&parser_, from, static_cast<std::size_t>(feed_end_ - from));
  reparsing_ = false;
  return err;
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

std::uintptr_t request_parser::limit_address() const noexcept {
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
void request_parser::materialize_head(const char* end) {
  // The arena is empty while the head is deferred, so offsets from
  // head_base_ become arena offsets unchanged. Names are lower-cased here, in
  // place; pieces appended after this are lower-cased as they are copied.
  header_block& block = head_->fields_;
  const auto n = static_cast<std::size_t>(end - head_base_);
  char* out = block.reserve_tail(n);
  std::memcpy(out, head_base_, n);
  block.size_ = static_cast<std::uint32_t>(n);
  for (std::size_t i = 0; i < block.count_; ++i) {
    const header_block::entry& e = block.entries_[i];
    lower_name_in_place(out, e.name_off, e.name_len);
  }
  head_base_ = nullptr;
}

int request_parser::on_message_begin() {
  phase_ = phase::head;
  start_message();
  head_ = &acquire_head();
  one_piece_ = false;  // decided with the first byte's address, in on_method
  return 0;
}

int request_parser::on_method(const char* at, std::size_t len) {
  if (!head_start_known_) {
    head_start_ = stream_pos(at);
    head_start_known_ = true;
    // Nothing of this head is stored yet (the method's bytes are not kept),
    // so it can be deferred from its first byte.
    head_base_ = at;
    head_begin_ = at;
    // A head expected to end in this input is parsed without field
    // callbacks, unless this is the second pass over it (reparse_head).
    if (at < one_piece_before_ && !reparsing_) {
      one_piece_ = true;
      parser_.settings = const_cast<llhttp_settings_t*>(&head_in_one_piece_settings());
    }
  }
  method_end_ = stream_pos(at) + len;
  // From here until the target is complete both the head and the URL limit apply.
  url_open_ = true;
  set_limit_end(std::min(head_start_ + max_header_bytes_, method_end_ + 1 + max_url_));
  return check_head_span(at, len);
}

int request_parser::on_url(const char* at, std::size_t len) {
  if (const int rc = check_head_span(at, len); rc != 0) {
    return rc;
  }
  request_head& h = *head_;
  const auto n = static_cast<std::uint32_t>(len);
  if (head_base_ != nullptr) {
    const auto off = static_cast<std::uint32_t>(at - head_base_);
    if (h.target_len_ == 0) {
      h.target_off_ = off;
      h.target_len_ = n;
      return 0;
    }
    if (off == h.target_off_ + h.target_len_) {
      h.target_len_ += n;
      return 0;
    }
    // A piece that does not follow the previous one: store the head so far,
    // ending with that piece, and append this one right after it.
    materialize_head(head_base_ + h.target_off_ + h.target_len_);
  }
  header_block& block = h.fields_;
  char* out = block.reserve_tail(len);
  if (h.target_len_ == 0) {
    h.target_off_ = block.size_;
  }
  std::memcpy(out, at, len);
  block.size_ += n;
  h.target_len_ += n;
  return 0;
}

int request_parser::on_url_complete() {
  url_open_ = false;
  set_limit_end(head_start_ + max_header_bytes_);
  const auto method = static_cast<llhttp_method_t>(parser_.method);
  if (method == HTTP_CONNECT) {
    return fail(501, "CONNECT is not supported");
  }
  request_head& h = *head_;
  h.method_ = to_request_method(method);
  h.method_name_ = llhttp_method_name(method);

  // The target's bytes: in this input while the head is deferred, else in the arena.
  const char* readable = head_base_ != nullptr ? feed_begin_ : h.fields_.bytes_.get();
  const char* bytes = head_base_ != nullptr ? head_base_ : h.fields_.bytes_.get();
  const std::string_view target{bytes + h.target_off_, h.target_len_};
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
  // Arena offsets (a deferred head's offsets are its future arena offsets).
  h.path_off_ = h.target_off_ + static_cast<std::uint32_t>(path_begin);
  h.path_len_ = static_cast<std::uint32_t>(path_end - path_begin);
  h.query_off_ = h.target_off_ + static_cast<std::uint32_t>(query_begin);
  h.query_len_ = static_cast<std::uint32_t>(query_end - query_begin);
  return 0;
}

int request_parser::on_protocol(const char* at, std::size_t len) {
  if (const int rc = check_head_span(at, len); rc != 0) {
    return rc;
  }
  append_capped(protocol_, protocol_len_, at, len);
  return 0;
}

int request_parser::on_version(const char* at, std::size_t len) {
  if (const int rc = check_head_span(at, len); rc != 0) {
    return rc;
  }
  append_capped(version_, version_len_, at, len);
  version_end_ = at + len;
  return 0;
}

int request_parser::read_protocol_and_version() {
  // A one-piece head: llhttp has accepted "<target> <protocol>/<d>.<d>" and
  // did not report the protocol and version spans; read them from the input.
  // Anything else is handed back (HPE_USER with one_piece_ still set), and
  // feed() parses the head again with every callback.
  if (head_base_ == nullptr) [[unlikely]] {
    return HPE_USER;
  }
  // The usual "HTTP/d.d" after one space is all that is taken here.
  const char* const protocol = head_base_ + head_->target_off_ + head_->target_len_ + 1;
  const char* const slash = protocol + sizeof(protocol_);
  const auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  if (feed_end_ - slash < 4 || protocol[-1] != ' ' || *slash != '/' || !is_digit(slash[1]) || slash[2] != '.' ||
      !is_digit(slash[3])) [[unlikely]] {
    return HPE_USER;
  }
  version_end_ = slash + 4;
  // The protocol's end (its '/') comes first; with the target complete only
  // the head limit applies, so one check gives the verdict of two.
  if (!within_limits(version_end_, 0)) [[unlikely]] {
    return check_head_limits_slow(stream_pos(version_end_));
  }
  std::memcpy(protocol_, protocol, sizeof(protocol_));
  protocol_len_ = sizeof(protocol_);
  std::memcpy(version_, slash + 1, sizeof(version_));
  version_len_ = sizeof(version_);
  return 0;
}

int request_parser::on_version_complete() {
  if (one_piece_) {
    if (const int rc = read_protocol_and_version(); rc != 0) {
      return rc;
    }
  }
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

int request_parser::on_headers_complete() {
  phase_ = phase::body;
  request_head& h = *head_;
  if (one_piece_) {
    // Body and trailers are parsed with every callback.
    one_piece_ = false;
    parser_.settings = const_cast<llhttp_settings_t*>(&settings());
    if (const int rc = scan_head_fields(); rc != 0) {
      if (rc == retry_with_callbacks) {
        // Not the head scan_head_fields expects: give it back to feed(),
        // which parses it again with every callback (reparse_head).
        phase_ = phase::head;
        one_piece_ = true;
        return HPE_USER;
      }
      return rc;
    }
  }
  if (head_base_ != nullptr) {
    // The whole head is in this input: copy it to the arena in one piece,
    // up to the end of the last byte it keeps.
    std::uint32_t end = h.target_off_ + h.target_len_;
    if (h.fields_.count_ != 0) {
      const header_block::entry& e = h.fields_.last_entry();
      end = std::max({end, e.name_off + e.name_len, e.value_off + e.value_len});
    }
    materialize_head(head_base_ + end);
  }
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

}  // namespace cadeloop::http
