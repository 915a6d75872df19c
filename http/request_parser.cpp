#include <cadeloop/http/request_parser.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <stdexcept>
#include <utility>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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

// scan_head_fields: the head is not what it expects; parse it again with
// every callback instead (never returned to llhttp).
constexpr int retry_with_callbacks = -2;

// Bytes copied ahead of the field scan at a time (scan_head_fields): one
// copy for a typical head, and never much more than the head.
constexpr std::size_t head_copy_chunk = 512;

#if defined(__SSE2__)
// 16 0xff then 16 zero bytes: the 16 bytes from index 16 - k select the first k.
constexpr std::array<std::uint8_t, 32> first_bytes_mask = [] {
  std::array<std::uint8_t, 32> t{};
  for (std::size_t i = 0; i < 16; ++i) {
    t[i] = 0xff;
  }
  return t;
}();
#endif

#if defined(__GNUC__)
// 16 bytes as one value (GCC and Clang vector extension: SSE2 on x86-64,
// NEON on AArch64, plain words elsewhere).
using byte16 = std::uint8_t __attribute__((vector_size(16)));
using sbyte16 = std::int8_t __attribute__((vector_size(16)));

// 16 zero bytes then 16 0xff: the 16 bytes from index k select the last k.
constexpr std::array<std::uint8_t, 32> last_bytes_mask = [] {
  std::array<std::uint8_t, 32> t{};
  for (std::size_t i = 16; i < t.size(); ++i) {
    t[i] = 0xff;
  }
  return t;
}();

// Lower-cases the ASCII letters among the 16 bytes at p that `mine` selects.
inline void lower16(char* p, byte16 mine) noexcept {
  byte16 v;
  std::memcpy(&v, p, sizeof v);
  // v - 'A' + 0x80 is below 0x80 + 26 as a signed byte exactly for 'A'..'Z'.
  const auto shifted = std::bit_cast<sbyte16>(static_cast<byte16>(v + static_cast<std::uint8_t>(0x80 - 'A')));
  const auto upper = std::bit_cast<byte16>(shifted < static_cast<std::int8_t>(-128 + 26));
  v |= upper & mine & static_cast<std::uint8_t>(0x20);
  std::memcpy(p, &v, sizeof v);
}

// Lower-cases the header name of n bytes at buffer + off in place, 16 bytes
// at a time: a longer name in overlapping blocks, a shorter one as the end
// of the block that ends with it (the bytes before it are left as they are,
// so at least 16 bytes of the buffer must end with the name; when they
// don't, byte by byte).
inline void lower_name_in_place(char* buffer, std::size_t off, std::size_t n) noexcept {
  char* p = buffer + off;
  if (n <= 16 && off + n >= 16) {
    byte16 mine;
    std::memcpy(&mine, last_bytes_mask.data() + n, sizeof mine);
    lower16(p + n - 16, mine);
  } else if (n > 16) {
    const byte16 all = ~byte16{};
    for (std::size_t i = 0; i + 16 < n; i += 16) {
      lower16(p + i, all);
    }
    lower16(p + n - 16, all);
  } else {
    copy_lower(p, p, n);
  }
}
#else
inline void lower_name_in_place(char* buffer, std::size_t off, std::size_t n) noexcept {
  copy_lower(buffer + off, buffer + off, n);
}
#endif

template <class Word>
Word load_word(const char* p) noexcept {
  Word x;
  std::memcpy(&x, p, sizeof x);
  return x;
}

// Whether the n bytes at p (n >= 4) equal `lower` (n bytes, lower case),
// ignoring ASCII case. Compares whole words, the last one overlapping the
// previous, so nothing outside either range is read.
bool name_equals(const char* p, std::size_t n, const char* lower) noexcept {
  if (n < 8) {
    return (lower_word(load_word<std::uint32_t>(p)) == load_word<std::uint32_t>(lower)) &&
           (lower_word(load_word<std::uint32_t>(p + n - 4)) == load_word<std::uint32_t>(lower + n - 4));
  }
  for (std::size_t i = 0; i + 8 < n; i += 8) {
    if (lower_word(load_word<std::uint64_t>(p + i)) != load_word<std::uint64_t>(lower + i)) {
      return false;
    }
  }
  return lower_word(load_word<std::uint64_t>(p + n - 8)) == load_word<std::uint64_t>(lower + n - 8);
}

constexpr bool is_ows(char c) noexcept { return c == ' ' || c == '\t'; }

// The first c in [p, end), or nullptr; `begin` <= p is where the readable
// bytes start. Lines of a request head are short, so a library memchr's
// set-up costs more than the search: 16 bytes at a time, the last block
// ending at `end` (bytes before p masked off) when 16 bytes of the buffer end
// there, byte by byte otherwise.
inline const char* find_byte(const char* begin, const char* p, const char* end, char c) noexcept {
#if defined(__SSE2__)
  const __m128i wanted = _mm_set1_epi8(c);
  while (end - p >= 16) {
    const __m128i block = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if (const int hits = _mm_movemask_epi8(_mm_cmpeq_epi8(block, wanted)); hits != 0) {
      return p + std::countr_zero(static_cast<unsigned>(hits));
    }
    p += 16;
  }
  if (p != end && end - begin >= 16) {
    const char* last = end - 16;
    const __m128i block = _mm_loadu_si128(reinterpret_cast<const __m128i*>(last));
    const auto hits = static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(block, wanted))) >> (p - last);
    return hits != 0 ? p + std::countr_zero(hits) : nullptr;
  }
#endif
  for (; p != end; ++p) {
    if (*p == c) {
      return p;
    }
  }
  return nullptr;
}

// The first letter of the head fields interpret_head_field acts on, by name
// length (host, expect, upgrade, transfer-encoding); 0 (which no byte OR 0x20
// equals) for every other length.
constexpr std::array<char, 18> field_initial = [] {
  std::array<char, 18> t{};
  t[4] = 'h';
  t[6] = 'e';
  t[7] = 'u';
  t[17] = 't';
  return t;
}();

// Appends a span's bytes to a small fixed buffer: keeps the first `cap`
// bytes and counts up to cap + 1, so "too long" is still visible.
template <std::size_t Cap>
void append_capped(char (&buf)[Cap], std::uint8_t& n, const char* at, std::size_t len) noexcept {
  if (n < Cap) {
    std::memcpy(buf + n, at, std::min<std::size_t>(len, Cap - n));
  }
  n = static_cast<std::uint8_t>(std::min<std::size_t>(n + len, Cap + 1));
}

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
  for (std::size_t i = 0; i < count_; ++i) {
    const entry& e = entries_[i];
    if (slice(e.name_off, e.name_len) == lower_name) {
      return slice(e.value_off, e.value_len);
    }
  }
  return std::nullopt;
}

std::size_t header_block::count(std::string_view lower_name) const noexcept {
  std::size_t n = 0;
  for (std::size_t i = 0; i < count_; ++i) {
    const entry& e = entries_[i];
    if (slice(e.name_off, e.name_len) == lower_name) {
      ++n;
    }
  }
  return n;
}

header_block::header_block(const header_block& other)
    : bytes_{other.size_ == 0 ? nullptr : std::make_unique_for_overwrite<char[]>(other.size_)},
      size_{other.size_},
      capacity_{other.size_},
      count_{other.count_},
      entry_capacity_{other.count_},
      entries_{other.count_ == 0 ? nullptr : std::make_unique_for_overwrite<entry[]>(other.count_)} {
  if (size_ != 0) {
    std::memcpy(bytes_.get(), other.bytes_.get(), size_);
  }
  std::copy_n(other.entries_.get(), count_, entries_.get());
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
      count_{std::exchange(other.count_, 0)},
      entry_capacity_{std::exchange(other.entry_capacity_, 0)},
      entries_{std::move(other.entries_)} {}

header_block& header_block::operator=(header_block&& other) noexcept {
  if (this != &other) {
    bytes_ = std::move(other.bytes_);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
    count_ = std::exchange(other.count_, 0);
    entry_capacity_ = std::exchange(other.entry_capacity_, 0);
    entries_ = std::move(other.entries_);
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
  if (fields > entry_capacity_) {
    grow_entries(fields);
  }
}

void header_block::grow_entries(std::size_t at_least) {
  std::size_t want = std::max<std::size_t>(std::size_t{entry_capacity_} * 2, 8);
  while (want < at_least) {
    want *= 2;
  }
  if (want > UINT32_MAX) {
    throw std::length_error{"header_block over 4 G fields"};
  }
  auto bigger = std::make_unique_for_overwrite<entry[]>(want);
  std::copy_n(entries_.get(), count_, bigger.get());
  entries_ = std::move(bigger);
  entry_capacity_ = static_cast<std::uint32_t>(want);
}

// ---------------------------------------------------------------- request_head

void request_head::clear() noexcept {
  fields_.clear();
  method_name_ = {};
  content_length_ = 0;
  target_off_ = 0;
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

std::unique_ptr<request_head> head_pool::take() noexcept {
  if (free_.empty()) {
    return nullptr;
  }
  std::unique_ptr<request_head> head = std::move(free_.back());
  free_.pop_back();
  return head;
}

void head_pool::give(std::unique_ptr<request_head> head) {
  if (!head || free_.size() >= max_kept_) {
    return;  // freed here
  }
  head->clear();
  free_.push_back(std::move(head));
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
inline bool request_parser::within_limits(const char* at, std::size_t len) const noexcept {
  return reinterpret_cast<std::uintptr_t>(at) + len <= limit_addr_;
}

inline int request_parser::check_head_span(const char* at, std::size_t len) noexcept {
  return within_limits(at, len) ? 0 : check_head_limits_slow(stream_pos(at) + len);
}

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

// Head fields. llhttp reports a name or a value in one piece unless the
// input ends inside it (the rest then comes with the next feed); these take
// any number of pieces. While the head is deferred a piece only records
// offsets; a piece that does not follow the previous piece of the same name
// or value (llhttp never sends one in strict mode, but nothing here relies
// on that) ends the deferral.
// The common case, a whole name or value of a deferred head within the
// limits, only records offsets and calls nothing (a leaf function, no
// registers to save); everything else goes to the store_* paths, which
// check again from the start.
int request_parser::on_header_field(const char* at, std::size_t len) {
  if (phase_ == phase::head && head_base_ != nullptr && !in_field_ && within_limits(at, len)) [[likely]] {
    header_block& block = head_->fields_;
    if (block.count_ < block.entry_capacity_) [[likely]] {
      in_field_ = true;
      const auto off = static_cast<std::uint32_t>(at - head_base_);
      block.entries_[block.count_++] = {off, static_cast<std::uint32_t>(len), off, 0};
      return 0;
    }
  }
  return store_head_field(at, len);
}

int request_parser::store_head_field(const char* at, std::size_t len) {
  if (phase_ != phase::head) {
    return on_trailer_field(at, len);
  }
  if (const int rc = check_head_span(at, len); rc != 0) {
    return rc;
  }
  header_block& block = head_->fields_;
  const auto n = static_cast<std::uint32_t>(len);
  if (head_base_ != nullptr) {
    const auto off = static_cast<std::uint32_t>(at - head_base_);
    if (!in_field_) {
      in_field_ = true;
      block.add_entry({off, n, off, 0});
      return 0;
    }
    header_block::entry& e = block.last_entry();
    if (off == e.name_off + e.name_len) {
      e.name_len += n;
      return 0;
    }
    materialize_head(head_base_ + e.name_off + e.name_len);
  }
  if (!in_field_) {
    in_field_ = true;
    block.add_entry({block.size_, 0, block.size_, 0});
  }
  copy_lower(block.reserve_tail(len), at, len);
  block.size_ += n;
  block.last_entry().name_len += n;
  return 0;
}

int request_parser::on_header_value(const char* at, std::size_t len) {
  // llhttp reports every value, even an empty one, so the first piece of a
  // value also marks the end of its name.
  if (phase_ == phase::head && head_base_ != nullptr && !in_value_ && within_limits(at, len)) [[likely]] {
    in_value_ = true;
    in_field_ = false;
    header_block::entry& e = head_->fields_.last_entry();
    e.value_off = static_cast<std::uint32_t>(at - head_base_);
    e.value_len = static_cast<std::uint32_t>(len);
    return 0;
  }
  return store_head_value(at, len);
}

int request_parser::store_head_value(const char* at, std::size_t len) {
  if (phase_ != phase::head) {
    return on_trailer_value(at, len);
  }
  if (const int rc = check_head_span(at, len); rc != 0) {
    return rc;
  }
  header_block& block = head_->fields_;
  const auto n = static_cast<std::uint32_t>(len);
  if (head_base_ != nullptr) {
    const auto off = static_cast<std::uint32_t>(at - head_base_);
    header_block::entry& e = block.last_entry();
    if (!in_value_) {
      in_value_ = true;
      in_field_ = false;
      e.value_off = off;
      e.value_len = n;
      return 0;
    }
    if (off == e.value_off + e.value_len) {
      e.value_len += n;
      return 0;
    }
    materialize_head(head_base_ + e.value_off + e.value_len);
  }
  char* out = block.reserve_tail(len);
  header_block::entry& e = block.last_entry();
  if (!in_value_) {
    in_value_ = true;
    in_field_ = false;
    e.value_off = block.size_;
    e.value_len = 0;
  }
  std::memcpy(out, at, len);
  block.size_ += n;
  e.value_len += n;
  return 0;
}

int request_parser::on_header_value_complete() {
  if (phase_ != phase::head) [[unlikely]] {
    return on_trailer_value_complete();
  }
  in_value_ = false;
  in_field_ = false;
  header_block& block = head_->fields_;
  if (block.count_ > limits_.max_headers) [[unlikely]] {
    return fail(431, "more header fields than max_headers");
  }
  header_block::entry& e = block.last_entry();
  const char* bytes = head_base_ != nullptr ? head_base_ : block.bytes_.get();
  // llhttp drops the whitespace before a value but keeps the whitespace after it.
  const char* value = bytes + e.value_off;
  while (e.value_len > 0 && is_ows(value[e.value_len - 1])) {
    --e.value_len;
  }
  // Only four names mean something here (see interpret_head_field); their
  // length and first letter (in either case) turn every other name away.
  const char* name = bytes + e.name_off;
  if (e.name_len < field_initial.size() && (name[0] | 0x20) == field_initial[e.name_len]) {
    return interpret_head_field(name, e.name_len, {value, e.value_len});
  }
  return 0;
}

// Trailer fields are copied as they arrive (they are rare, and follow the
// body, often in another feed). They count against max_header_bytes and are
// rejected at the end of the value that crossed it (a fixed stream position,
// so the verdict is split-independent).
int request_parser::on_trailer_field(const char* at, std::size_t len) {
  trailer_bytes_ += len + (in_field_ ? 0u : 4u);
  if (trailer_bytes_ > max_header_bytes_) {
    trailers_over_ = true;
  }
  if (trailers_over_) {
    in_field_ = true;
    return 0;
  }
  header_block& block = trailer_fields();
  if (!in_field_) {
    in_field_ = true;
    block.add_entry({block.size_, 0, block.size_, 0});
  }
  copy_lower(block.reserve_tail(len), at, len);
  block.size_ += static_cast<std::uint32_t>(len);
  block.last_entry().name_len += static_cast<std::uint32_t>(len);
  return 0;
}

int request_parser::on_trailer_value(const char* at, std::size_t len) {
  trailer_bytes_ += len;
  if (trailer_bytes_ > max_header_bytes_) {
    trailers_over_ = true;
  }
  if (trailers_over_) {
    in_field_ = false;
    in_value_ = true;
    return 0;
  }
  header_block& block = trailer_fields();
  char* out = block.reserve_tail(len);
  header_block::entry& e = block.last_entry();
  if (!in_value_) {
    in_value_ = true;
    in_field_ = false;
    e.value_off = block.size_;
    e.value_len = 0;
  }
  std::memcpy(out, at, len);
  block.size_ += static_cast<std::uint32_t>(len);
  e.value_len += static_cast<std::uint32_t>(len);
  return 0;
}

int request_parser::on_trailer_value_complete() {
  in_value_ = false;
  in_field_ = false;
  if (trailers_over_) {
    return fail(431, "trailer section larger than max_header_bytes");
  }
  header_block& block = trailer_fields();
  if (block.count_ > limits_.max_headers) {
    return fail(431, "more trailer fields than max_headers");
  }
  header_block::entry& e = block.last_entry();
  const char* value = block.bytes_.get() + e.value_off;
  while (e.value_len > 0 && is_ows(value[e.value_len - 1])) {
    --e.value_len;
  }
  return 0;
}

int request_parser::scan_head_fields() {
  // The end of a head parsed without field callbacks (one_piece_): all of it
  // is in this input and llhttp has accepted every byte of it, in strict
  // mode. So each field line is a token, ':', optional whitespace, a value
  // without CR or LF, then CRLF, and an empty line ends the head. Each field
  // gets the checks the callbacks would have made, in the same stream order
  // and at the same stream positions: the limits at the end of the name
  // (its ':') and of the value (its CR; an empty value is reported by llhttp
  // after the line's LF), then the field count, then the field's meaning.
  //
  // The head is copied to the arena as the scan goes (ahead of it, in
  // chunks), so each name is lower-cased from the 16 bytes just searched for
  // its ':' and stored over its copy. Offsets are from head_base_ and become
  // arena offsets unchanged; head_base_ is cleared at the end.
  header_block& block = head_->fields_;
  if (head_base_ == nullptr) [[unlikely]] {
    return retry_with_callbacks;
  }
  const char* const base = head_base_;
  const char* const begin = feed_begin_;
  const char* const end = feed_end_;
  const auto available = static_cast<std::size_t>(end - base);
  std::size_t copied = 0;
  auto copy_ahead = [&](std::size_t need) {
    const std::size_t to = std::min(std::max(need, copied + head_copy_chunk), available);
    if (to > copied) {
      block.size_ = static_cast<std::uint32_t>(copied);  // what a growth must keep
      std::memcpy(block.reserve_tail(to - copied + 16), base + copied, to - copied);
      copied = to;
    }
  };

  const char* p = version_end_ != nullptr ? version_end_ : base + head_->target_off_ + head_->target_len_;
  p = find_byte(begin, p, end, '\n');
  if (p == nullptr) [[unlikely]] {
    return retry_with_callbacks;
  }
  ++p;
  while (*p != '\r') {
    const char* const name = p;
    const auto name_off = static_cast<std::size_t>(name - base);
    const char* colon = nullptr;
    const char* cr = nullptr;
    const char* cr_searched = name;  // no CR in [name, cr_searched)
#if defined(__SSE2__)
    if (end - name >= 16) {
      if (name_off + 16 > copied) {
        copy_ahead(name_off + 16);
      }
      const __m128i line = _mm_loadu_si128(reinterpret_cast<const __m128i*>(name));
      const auto colons = static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(line, _mm_set1_epi8(':'))));
      if (colons != 0) {
        const int k = std::countr_zero(colons);
        colon = name + k;
        // 'A'..'Z' among the first k bytes get 0x20; the rest is stored as it was.
        const __m128i shifted = _mm_add_epi8(line, _mm_set1_epi8(static_cast<char>(0x80 - 'A')));
        const __m128i upper = _mm_cmplt_epi8(shifted, _mm_set1_epi8(static_cast<char>(-128 + 26)));
        const __m128i in_name = _mm_loadu_si128(reinterpret_cast<const __m128i*>(first_bytes_mask.data() + 16 - k));
        const __m128i lowered =
            _mm_or_si128(line, _mm_and_si128(_mm_and_si128(upper, in_name), _mm_set1_epi8(0x20)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(block.bytes_.get() + name_off), lowered);
        // The value's CR is often in the same 16 bytes.
        const auto crs = static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(line, _mm_set1_epi8('\r'))));
        if (const unsigned after = crs >> k; after != 0) {
          cr = colon + std::countr_zero(after);
        } else {
          cr_searched = name + 16;
        }
      }
    }
#endif
    if (colon == nullptr) {
      // A long name, or the last 16 bytes of the input.
      colon = find_byte(begin, name, end, ':');
      if (colon == nullptr) [[unlikely]] {
        return retry_with_callbacks;
      }
      copy_ahead(static_cast<std::size_t>(colon - base) + 16);
      lower_name_in_place(block.bytes_.get(), name_off, static_cast<std::size_t>(colon - name));
    }
    const char* value = colon + 1;
    value += *value == ' ' ? 1 : 0;  // the usual single space, then any other whitespace
    while (is_ows(*value)) {
      ++value;
    }
    const char* reported_end = value + 2;  // an empty value: reported after its CRLF
    if (*value == '\r') {
      cr = value;
    } else {
      if (cr == nullptr || cr < value) {
        cr = find_byte(begin, std::max(value, cr_searched), end, '\r');
        if (cr == nullptr) [[unlikely]] {
          return retry_with_callbacks;
        }
      }
      reported_end = cr;
    }
    // The name's end (its ':') comes before the value's, and with the target
    // complete only the head limit applies: one check gives the verdict of two.
    if (!within_limits(reported_end, 0)) [[unlikely]] {
      return check_head_limits_slow(stream_pos(reported_end));
    }
    const char* value_end = cr;
    if (is_ows(value_end[-1])) [[unlikely]] {
      while (value_end != value && is_ows(value_end[-1])) {
        --value_end;
      }
    }
    const auto name_len = static_cast<std::uint32_t>(colon - name);
    const auto value_len = static_cast<std::uint32_t>(value_end - value);
    if (block.count_ == block.entry_capacity_) [[unlikely]] {
      block.grow_entries(std::size_t{block.count_} + 1);
    }
    header_block::entry& e = block.entries_[block.count_++];
    e.name_off = static_cast<std::uint32_t>(name_off);
    e.name_len = name_len;
    e.value_off = static_cast<std::uint32_t>(value - base);
    e.value_len = value_len;
    if (block.count_ > limits_.max_headers) [[unlikely]] {
      return fail(431, "more header fields than max_headers");
    }
    if (name_len < field_initial.size() && (name[0] | 0x20) == field_initial[name_len]) {
      if (const int rc = interpret_head_field(name, name_len, {value, value_len}); rc != 0) {
        return rc;
      }
    }
    p = cr + 2;  // strict llhttp: a CR in a head is always followed by LF
  }
  // Everything before the empty line that ends the head is kept.
  const auto head_len = static_cast<std::size_t>(p - base);
  copy_ahead(head_len);
  block.size_ = static_cast<std::uint32_t>(head_len);
  head_base_ = nullptr;
  return 0;
}

int request_parser::interpret_head_field(const char* name, std::size_t name_len, std::string_view value) {
  // Only four names matter here (the caller has matched their length and
  // first letter). Content-Length and Connection are validated and tracked
  // by llhttp itself (parser_.flags, parser_.content_length). The name may
  // not be lower-cased yet (a deferred head), so the comparisons ignore case.
  switch (name_len) {
    case 4:
      if (name_equals(name, 4, "host") && ++host_count_ > 1) {
        return fail(400, "more than one Host header");
      }
      break;
    case 6:
      if (name_equals(name, 6, "expect") && equals_lower(value, "100-continue")) {
        expect_continue_ = true;
      }
      break;
    case 7:
      if (name_equals(name, 7, "upgrade")) {
        for_each_element(value, [this](std::string_view protocol) {
          if (equals_lower(protocol, "websocket")) {
            websocket_token_ = true;
          }
          return 0;
        });
      }
      break;
    case 17:
      if (name_equals(name, 17, "transfer-encoding")) {
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
