// request_parser, the header fields: the one reader of a head's fields
// (scan_head_fields, run on the head's bytes wherever they are), how a head
// cut across feeds keeps its bytes and is checked at each feed's end, the
// four fields the parser acts on (interpret_head_field), and the chunked
// body's trailer fields.
//
// One path for a head's fields. llhttp runs without field callbacks: it
// validates every byte (strict mode) and tracks Content-Length, Connection
// and Upgrade itself, and at the end of the head scan_head_fields() reads
// the fields from the head's bytes in one pass, making the checks the
// callbacks would have made, in the same order and at the same stream
// positions (the limits at the end of a name, its ':', and of a value, its
// CR, an empty value at the byte after its line; then the field count, then
// the field's meaning, once llhttp has seen the byte after the line). A
// head that arrives in one input is read there and copied to its arena
// once. A head cut by the end of an input keeps its bytes in its arena (to
// just past the head limit: a longer head is refused anyway), and the same
// scan reads them there. The scan also runs at the end of each such feed,
// over the lines llhttp has finished, so limits, the field count, a second
// Host or a bad Transfer-Encoding are refused as the head arrives. When
// llhttp rejects a byte of a head, the lines finished before that byte are
// scanned first, so the earlier fault decides, wherever the input was cut.

#include <cadeloop/http/request_parser.hpp>

#include "byte_scan.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <string_view>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace cadeloop::http {

using namespace detail;

namespace {

// Bytes copied ahead of the field scan at a time (a head read from the
// input): one copy for a typical head, and never much more than the head.
constexpr std::size_t head_copy_chunk = 512;

// Bytes of a head kept past the head limit: a head within the limit ends at
// most 4 bytes after it (a value's CRLF, then the empty line).
constexpr std::uint64_t kept_past_limit = 8;

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

}  // namespace

// ---------------------------------------------------------------- the field scan

int request_parser_state::scan_head_fields(const char* until) {
  // Scans the field lines from fields_off_. With until == nullptr the head
  // is complete in [head_bytes_, head_end_) and llhttp has accepted every
  // byte of it, in strict mode: each field line is a token, ':', optional
  // whitespace, a value without CR or LF, then CRLF, and an empty line ends
  // the head. Otherwise only the lines whose next byte is before `until` are
  // finished; the scan stops at the first other line and resumes there
  // next time.
  //
  // A head read from the input is copied to the arena as the scan goes
  // (ahead of it, in chunks), so each name is lower-cased from the 16 bytes
  // just searched for its ':' and stored over its copy. A head already in
  // the arena is lower-cased in place. Offsets are from the head's first
  // byte, which is the arena's first byte.
  header_block& block = head_->fields_;
  const char* const base = head_bytes_;
  const char* const begin = head_readable_;
  const char* const end = head_end_;
  const auto available = static_cast<std::size_t>(end - base);
  const char* const stop = until != nullptr ? until : end;
  std::size_t copied = base == block.bytes_.get() ? available : 0;
  auto copy_ahead = [&](std::size_t need) {
    const std::size_t to = std::min(std::max(need, copied + head_copy_chunk), available);
    if (to > copied) {
      block.size_ = static_cast<std::uint32_t>(copied);  // what a growth must keep
      std::memcpy(block.reserve_tail(to - copied + 16), base + copied, to - copied);
      copied = to;
    }
  };
  // The head limit as an address among these bytes (saturated), so a
  // position's check is one compare.
  const auto base_addr = reinterpret_cast<std::uintptr_t>(base);
  const std::uint64_t limit_ahead = limit_end_ - std::min(limit_end_, head_start_);
  const std::uintptr_t limit =
      limit_ahead > UINTPTR_MAX - base_addr ? UINTPTR_MAX : base_addr + limit_ahead;

  if (fields_off_ == 0) [[unlikely]] {
    // A request line without a version (llhttp takes "GET /"): the fields
    // start after its LF.
    const char* target_end = base + head_->target_off_ + head_->target_len_;
    const char* lf = find_byte(begin, target_end, end, '\n');
    if (lf == nullptr) {
      return until != nullptr ? 0 : check_head_limits_slow(UINT64_MAX);
    }
    if (*target_end == '\r' || *target_end == '\n') {
      // HTTP/0.9, which is refused (RFC 9112 section 2.3 names only 1.x).
      return fail(400, "HTTP/0.9 request line (no HTTP version)");
    }
    fields_off_ = static_cast<std::uint32_t>(lf + 1 - base);
  }
  // A head in the arena is followed by a CR that is not part of it (see
  // keep_head_bytes), so, as in a complete head, every search for the end
  // of a line or of whitespace stops by the end of the bytes.
  const char* p = base + fields_off_;
  if (p > end) [[unlikely]] {
    return until != nullptr
               ? 0
               : check_head_limits_slow(UINT64_MAX);  // the request line's CRLF is still arriving
  }
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
      const auto colons =
          static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(line, _mm_set1_epi8(':'))));
      if (colons != 0) {
        const int k = std::countr_zero(colons);
        colon = name + k;
        // 'A'..'Z' among the first k bytes get 0x20; the rest is stored as it was.
        const __m128i shifted = _mm_add_epi8(line, _mm_set1_epi8(static_cast<char>(0x80 - 'A')));
        const __m128i upper = _mm_cmplt_epi8(shifted, _mm_set1_epi8(static_cast<char>(-128 + 26)));
        const __m128i in_name =
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(first_bytes_mask.data() + 16 - k));
        const __m128i lowered =
            _mm_or_si128(line, _mm_and_si128(_mm_and_si128(upper, in_name), _mm_set1_epi8(0x20)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(block.bytes_.get() + name_off), lowered);
        // The value's CR is often in the same 16 bytes.
        const auto crs =
            static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(line, _mm_set1_epi8('\r'))));
        if (const unsigned after = crs >> k; after != 0) {
          cr = colon + std::countr_zero(after);
        } else {
          cr_searched = name + 16;
        }
      }
    }
#endif
    if (colon == nullptr) {
      // A long name, or the last 16 bytes.
      colon = find_byte(begin, name, end, ':');
      if (colon == nullptr) [[unlikely]] {
        break;  // a name still arriving
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
          break;  // a value still arriving
        }
      }
      reported_end = cr;
    }
    // llhttp finishes a field when it sees the byte after its line (a
    // value ending at the bytes' end gets the CR after them: cut here too).
    const char* const next = cr + 2;
    if (next >= stop) [[unlikely]] {
      break;
    }
    // The name's end (its ':') comes before the value's, and with the target
    // complete only the head limit applies: one check gives the verdict of two.
    if (reinterpret_cast<std::uintptr_t>(reported_end) > limit) [[unlikely]] {
      return check_head_limits_slow(head_pos(reported_end));
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
    p = next;
  }
  fields_off_ = static_cast<std::uint32_t>(p - base);
  if (until != nullptr) {
    return 0;
  }
  if (p == end || *p != '\r') [[unlikely]] {
    // The kept bytes of a cut head stopped just past the head limit, before
    // its end: a span of the rest ends past the limit.
    return check_head_limits_slow(UINT64_MAX);
  }
  // Everything before the empty line that ends the head is kept.
  const auto head_len = static_cast<std::size_t>(p - base);
  copy_ahead(head_len);
  block.size_ = static_cast<std::uint32_t>(head_len);
  head_base_ = nullptr;
  return 0;
}

// ---------------------------------------------------------------- heads cut across feeds

void request_parser_state::keep_head_bytes(const char* from, const char* to) {
  // Appends the head's bytes [from, to) of this input to its arena, which
  // holds the head's first bytes in order; past the head limit only a few
  // are kept (head_cut_), enough for every verdict to be reached.
  header_block& block = head_->fields_;
  const std::uint64_t cap = max_header_bytes_ + kept_past_limit;
  if (!head_cut_) {
    auto n = static_cast<std::size_t>(to - from);
    if (block.size_ + n > cap) {
      n = static_cast<std::size_t>(cap - block.size_);
      head_cut_ = true;
    }
    char* out = block.reserve_tail(n + 1);
    std::memcpy(out, from, n);
    out[n] = '\r';  // after the bytes, not counted: stops the scan's searches
    block.size_ += static_cast<std::uint32_t>(n);
  }
  head_base_ = nullptr;
  head_bytes_ = block.bytes_.get();
  head_readable_ = head_bytes_;
  head_end_ = head_bytes_ + block.size_;
}

void request_parser_state::keep_head_input() {
  // A head carried over from the last feed: its bytes in this input, up to
  // its end if it ends here, join the arena before llhttp reads them, so the
  // callbacks and the scan find the whole head there. The head ends at the
  // first empty line, whose CRLFCRLF may begin in the kept bytes.
  const std::string_view input{feed_begin_, static_cast<std::size_t>(feed_end_ - feed_begin_)};
  const header_block& block = head_->fields_;
  const std::string_view kept{block.bytes_.get(), block.size_};
  constexpr std::string_view blank = "\r\n\r\n";
  const char* to = feed_end_;
  bool found = false;
  for (std::size_t k = 3; k >= 1 && !found; --k) {
    if (kept.ends_with(blank.substr(0, k)) && input.starts_with(blank.substr(k))) {
      to = feed_begin_ + (4 - k);
      found = true;
    }
  }
  if (!found) {
    if (const std::size_t at = input.find(blank); at != std::string_view::npos) {
      to = feed_begin_ + at + 4;
    }
  }
  keep_head_bytes(feed_begin_, to);
}

const char* request_parser_state::before_fold(const char* until) const noexcept {
  // A line followed by whitespace (an obs-fold, which llhttp refuses) is
  // never finished: a partial scan stops at the fold.
  const char* q = head_bytes_ +
                  std::min<std::size_t>(fields_off_, static_cast<std::size_t>(until - head_bytes_));
  for (; q + 1 < until; ++q) {
    if (q[0] == '\n' && is_ows(q[1])) {
      return q + 1;
    }
  }
  return until;
}

int request_parser_state::end_feed_in_head() {
  // The feed ended inside a head: keep its bytes, finish the lines llhttp
  // has finished, then check the line in progress against the limits.
  if (head_base_ != nullptr) {
    keep_head_bytes(head_base_, feed_end_);
  }
  // Only when a line may have been finished since the last look (an LF
  // with a byte after it arrived), so a line trickling in is not searched
  // again at every feed: the look starts where the last one stopped (at its
  // last byte, which had no byte after it then).
  const auto to = static_cast<std::uint32_t>(head_end_ - head_bytes_);
  if (fields_off_ == 0 && head_->target_len_ != 0) {
    // The request line ended without a version ("GET /\r\n", HTTP/0.9): a
    // 0.9 client waits for its answer, so it is refused now, not at the next byte.
    const std::uint32_t target_end = head_->target_off_ + head_->target_len_;
    if (to > target_end && (head_bytes_[target_end] == '\r' || head_bytes_[target_end] == '\n') &&
        std::memchr(head_bytes_ + target_end, '\n', to - target_end) != nullptr) {
      return fail(400, "HTTP/0.9 request line (no HTTP version)");
    }
  }
  const std::uint32_t from = scanned_to_ == 0 ? 0 : scanned_to_ - 1;
  if (to > from + 1) {
    const bool finished = std::memchr(head_bytes_ + from, '\n', to - 1 - from) != nullptr;
    scanned_to_ = to;
    if (finished) {
      if (const int rc = scan_head_fields(before_fold(head_end_)); rc != 0) {
        return rc;
      }
    }
  }
  return check_line_in_progress();
}

int request_parser_state::check_line_in_progress() {
  // llhttp reports a span cut by the end of the input up to that end: what
  // it reported last of the line still arriving must be within the limits.
  // Bytes no span covers yet (the whitespace after a ':', an empty value's
  // CRLF, the spaces before the protocol) count as the end of the span that
  // will cover them: once one lies past the limit, every continuation gets
  // 431, so it is given now and the line is not searched again.
  // Method and target are checked by their own callbacks (the request-line
  // branch finds nothing to check while the target is still arriving).
  if (!head_start_known_ || head_pos(head_end_) <= limit_end_) {
    return 0;
  }
  const char* const base = head_bytes_;
  const char* const end = head_end_;
  const char* reported = nullptr;
  if (fields_off_ == 0) {
    // The request line after its target: protocol, '/', version.
    const char* p = base + head_->target_off_ + head_->target_len_;
    if (p >= end || *p != ' ') {
      return 0;  // no protocol (a request line without a version)
    }
    while (p < end && *p == ' ') {
      ++p;
    }
    if (p == end) {
      // Spaces still arriving: the version will end past them. The target is
      // complete (llhttp may not have said so yet), so only the head limit applies.
      return head_pos(end) > head_start_ + max_header_bytes_
                 ? fail(431, "request head larger than max_header_bytes")
                 : 0;
    }
    const char* slash = std::find(p, end, '/');
    reported = slash == end || slash + 1 < end ? end : slash;
  } else if (const char* p = base + fields_off_; p < end && *p != '\r') {  // not the empty line
    const char* colon = std::find(p, end, ':');
    reported = colon;  // the name, whole or cut
    if (colon != end) {
      const char* value = colon + 1;
      while (value < end && is_ows(*value)) {
        ++value;
      }
      if (value == end || *value == '\r') {
        // No value byte yet, or an empty value: the value's span will end
        // past every byte here (an empty value's after its CRLF), so once
        // one of them lies past the limit the verdict is given.
        reported = std::min(value + 2, end);
      } else {
        reported = std::find(value, end, '\r');  // the value, up to its CR or the end
      }
    }
  }
  if (reported != nullptr && head_pos(reported) > limit_end_) {
    return check_head_limits_slow(head_pos(reported));
  }
  return 0;
}

int request_parser_state::scan_before_error(const char* error_at) {
  // llhttp rejected the byte at error_at (in this input) inside a head: the
  // lines it finished before (it finishes a line at the byte after it, even
  // when that byte is the bad one) get their checks first.
  const char* const to = std::min(error_at + 1, feed_end_);
  const std::uint64_t to_pos = stream_pos(to);
  if (head_base_ != nullptr) {
    keep_head_bytes(head_base_, to);
  }
  const char* until =
      head_bytes_ + std::min<std::uint64_t>(to_pos - head_start_, head_->fields_.size_);
  return scan_head_fields(before_fold(until));
}

int request_parser_state::interpret_head_field(const char* name, std::size_t name_len,
                                               std::string_view value) {
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

// ---------------------------------------------------------------- trailers

// Trailer fields are copied as they arrive (they are rare, and follow the
// body, often in another feed). They count against max_header_bytes and are
// rejected at the end of the value that crossed it (a fixed stream position,
// so the verdict is split-independent).
int request_parser_state::on_trailer_field(const char* at, std::size_t len) {
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

int request_parser_state::on_trailer_value(const char* at, std::size_t len) {
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

int request_parser_state::on_trailer_value_complete() {
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

}  // namespace cadeloop::http
