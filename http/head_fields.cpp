// request_parser, the head's header fields: the llhttp field callbacks a head
// cut across feeds goes through, the one-pass scan of a head that arrived in
// one input (scan_head_fields), the four fields the parser acts on
// (interpret_head_field), and the chunked body's trailer fields.

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

constexpr int retry_with_callbacks = -2;

// Bytes copied ahead of the field scan at a time (scan_head_fields): one
// copy for a typical head, and never much more than the head.
constexpr std::size_t head_copy_chunk = 512;

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

}  // namespace cadeloop::http
