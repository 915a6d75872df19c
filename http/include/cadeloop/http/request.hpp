#pragma once

#include <cadeloop/http/header.hpp>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

namespace cadeloop::http {

class request_parser_state;

/// Bounds the request parser enforces while it parses (inside llhttp's
/// callbacks, never after the fact). Plain data; any thread may build one and
/// hand it to the I/O thread that constructs a parser. Values come from the
/// settings table in config/, which owns their bounds (every limit must be at
/// least 32 so that a request line always fits its first span).
struct request_limits {
  /// Marks `max_body` as "no limit".
  static constexpr std::uint64_t unlimited = UINT64_MAX;

  /// Longest request target, counted from the byte after the method's first
  /// space to the end of the target (extra spaces before it count). 414 above.
  std::size_t max_url = 8 * 1024;
  /// Longest request head, counted from the first byte of the method to the
  /// end of the last header value (the closing empty line does not count).
  /// 431 above. The same bound applies to a chunked body's trailer section.
  std::size_t max_header_bytes = 64 * 1024;
  /// Most header fields in one head (and, separately, trailer fields). 431 above.
  std::size_t max_headers = 100;
  /// Largest body: a larger Content-Length is refused at the end of the head,
  /// a chunked body as soon as its declared chunk sizes pass it. 413 above.
  std::uint64_t max_body = std::uint64_t{1} << 30;
  /// Most chunk-extension bytes over one chunked body (they are parsed and
  /// dropped; unbounded extensions are a known slow-read attack). 413 above.
  std::size_t max_chunk_extension_bytes = 16 * 1024;
};

/// The methods the runtime treats specially; every other method llhttp knows
/// is `other` and keeps its name in `request_head::method_name()`.
enum class request_method : std::uint8_t {
  get,
  head,
  post,
  put,
  delete_,
  patch,
  options,
  trace,
  connect,
  other,
};

/// How the request body is delimited.
enum class body_framing : std::uint8_t {
  none,            ///< no body
  content_length,  ///< exactly `request_head::content_length()` bytes
  chunked,         ///< Transfer-Encoding: chunked, possibly with trailers
};

/// An ordered list of header (or trailer) fields whose bytes live in one
/// arena owned by this object. Names are lower-cased, values are raw (only
/// the surrounding optional whitespace is removed). Entries are stored as
/// offsets, so the object can be moved (and its arena grown) without leaving
/// a view dangling; views returned by the accessors are valid until the block
/// is modified, cleared or destroyed. Not synchronised: one thread at a time;
/// whichever thread owns it last destroys it.
class header_block {
 public:
  /// Forward iterator over the fields, yielding `header_field` by value.
  class const_iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = header_field;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = header_field;

    /// A singular iterator. Any thread.
    const_iterator() = default;
    /// The field under the iterator. Any thread holding the block.
    header_field operator*() const noexcept { return (*block_)[index_]; }
    /// Steps to the next field. Any thread holding the block.
    const_iterator& operator++() noexcept {
      ++index_;
      return *this;
    }
    /// Steps to the next field, returning the old position. Any thread holding the block.
    const_iterator operator++(int) noexcept {
      const_iterator old = *this;
      ++index_;
      return old;
    }
    /// Same block, same position. Any thread.
    friend bool operator==(const const_iterator& a, const const_iterator& b) noexcept {
      return a.block_ == b.block_ && a.index_ == b.index_;
    }

   private:
    friend class header_block;
    const_iterator(const header_block* block, std::size_t index) noexcept
        : block_{block}, index_{index} {}
    const header_block* block_ = nullptr;
    std::size_t index_ = 0;
  };

  /// Number of fields. Any thread holding the block.
  [[nodiscard]] std::size_t size() const noexcept { return count_; }
  /// True when there are no fields. Any thread holding the block.
  [[nodiscard]] bool empty() const noexcept { return count_ == 0; }
  /// The i-th field in arrival order (i < size()). Any thread holding the block.
  [[nodiscard]] header_field operator[](std::size_t i) const noexcept {
    const entry& e = entries_[i];
    return {slice(e.name_off, e.name_len), slice(e.value_off, e.value_len)};
  }
  /// Value of the first field named `lower_name` (which must be lower case),
  /// or nullopt. Any thread holding the block.
  [[nodiscard]] std::optional<std::string_view> find(std::string_view lower_name) const noexcept;
  /// Number of fields named `lower_name` (lower case). Any thread holding the block.
  [[nodiscard]] std::size_t count(std::string_view lower_name) const noexcept;
  /// First field. Any thread holding the block.
  [[nodiscard]] const_iterator begin() const noexcept { return {this, 0}; }
  /// One past the last field. Any thread holding the block.
  [[nodiscard]] const_iterator end() const noexcept { return {this, count_}; }
  /// Bytes held in the arena: the names and values and, for a head, the
  /// target; a head parsed from one buffer also keeps the bytes between them
  /// (its request line and head copied whole). Any thread holding the block.
  [[nodiscard]] std::size_t arena_bytes() const noexcept { return size_; }
  /// Drops every field, keeping the capacity so refilling allocates nothing.
  /// Any thread holding the block.
  void clear() noexcept {
    size_ = 0;
    count_ = 0;
  }

  /// An empty block. Any thread.
  header_block() = default;
  /// Deep copy (arena and fields). Any thread holding `other`.
  header_block(const header_block& other);
  /// Deep copy. Any thread holding both.
  header_block& operator=(const header_block& other);
  /// Steals the arena (its data pointer survives, so offsets stay valid);
  /// `other` is left empty. Any thread holding both.
  header_block(header_block&& other) noexcept;
  /// Steals the arena; `other` is left empty. Any thread holding both.
  header_block& operator=(header_block&& other) noexcept;
  /// Any thread holding the block.
  ~header_block() = default;

 private:
  friend class request_parser_state;
  friend class request_head;

  struct entry {
    std::uint32_t name_off;
    std::uint32_t name_len;
    std::uint32_t value_off;
    std::uint32_t value_len;
  };

  [[nodiscard]] std::string_view slice(std::uint32_t off, std::uint32_t len) const noexcept {
    return {bytes_.get() + off, len};
  }
  // Room for n more bytes at the end; returns where they go. Grows (doubling)
  // only when the capacity is short.
  char* reserve_tail(std::size_t n) {
    if (n > capacity_ - size_) {
      grow(n);
    }
    return bytes_.get() + size_;
  }
  void grow(std::size_t n);
  void reserve(std::size_t bytes, std::size_t fields);
  // Appends a field; grows (doubling, out of line) only when the array is full.
  entry& add_entry(const entry& e) {
    if (count_ == entry_capacity_) {
      grow_entries(std::size_t{count_} + 1);
    }
    entries_[count_] = e;
    return entries_[count_++];
  }
  [[nodiscard]] entry& last_entry() noexcept { return entries_[count_ - 1]; }
  [[gnu::noinline]] void grow_entries(std::size_t at_least);

  // A plain byte buffer rather than std::string: no zero-fill on growth, and
  // its data pointer never lives inside the object (no SSO), so moves keep it.
  std::unique_ptr<char[]> bytes_;
  std::uint32_t size_ = 0;
  std::uint32_t capacity_ = 0;
  // The fields: a plain array rather than a std::vector, so that adding one
  // on the parser's hot path is a compare and a store (growth is out of line).
  std::uint32_t count_ = 0;
  std::uint32_t entry_capacity_ = 0;
  std::unique_ptr<entry[]> entries_;
};

/// One parsed request head: request line, header fields and the framing and
/// connection decisions derived from them. The target and every header live in
/// one arena owned by the head, so it moves between threads (for instance
/// over a core pair's inbound ring) without copying a byte and without
/// leaving a view dangling. Not synchronised: one thread at a time; whichever
/// thread owns it last destroys it (or returns it to
/// `request_parser::recycle_head` on the I/O thread).
class request_head {
 public:
  /// The method as an enum. Any thread holding the head.
  [[nodiscard]] request_method method() const noexcept { return method_; }
  /// The method's name ("GET", "PROPFIND", ...), in static storage. Any thread.
  [[nodiscard]] std::string_view method_name() const noexcept { return method_name_; }
  /// The raw request target as sent. Any thread holding the head.
  [[nodiscard]] std::string_view target() const noexcept {
    return fields_.slice(target_off_, target_len_);
  }
  /// The raw path: the target up to '?' or '#'. For an absolute-form target
  /// ("http://host/p?q") the part after the authority; empty if there is
  /// none. For "*" it is "*". Any thread holding the head.
  [[nodiscard]] std::string_view path() const noexcept {
    return fields_.slice(path_off_, path_len_);
  }
  /// The raw query: after '?' (excluded) up to '#' or the end. Any thread holding the head.
  [[nodiscard]] std::string_view query() const noexcept {
    return fields_.slice(query_off_, query_len_);
  }
  /// HTTP major version (always 1). Any thread holding the head.
  [[nodiscard]] std::uint8_t version_major() const noexcept { return version_major_; }
  /// HTTP minor version (0 or 1). Any thread holding the head.
  [[nodiscard]] std::uint8_t version_minor() const noexcept { return version_minor_; }
  /// The header fields in arrival order, names lower-cased. Any thread holding the head.
  [[nodiscard]] const header_block& headers() const noexcept { return fields_; }
  /// Whether the connection may carry another request after this one:
  /// HTTP/1.1 unless "Connection: close", HTTP/1.0 only with
  /// "Connection: keep-alive". Any thread holding the head.
  [[nodiscard]] bool keep_alive() const noexcept { return keep_alive_; }
  /// How the body is delimited. Any thread holding the head.
  [[nodiscard]] body_framing framing() const noexcept { return framing_; }
  /// The Content-Length value when framing() is content_length, else 0. Any thread holding the
  /// head.
  [[nodiscard]] std::uint64_t content_length() const noexcept { return content_length_; }
  /// True for "Expect: 100-continue". Any thread holding the head.
  [[nodiscard]] bool expect_continue() const noexcept { return expect_continue_; }
  /// True when the request is an accepted WebSocket upgrade (GET, HTTP/1.1,
  /// "Upgrade: websocket", "Connection: upgrade", no body); the bytes after
  /// the head belong to the WebSocket codec. Any thread holding the head.
  [[nodiscard]] bool websocket_upgrade() const noexcept { return websocket_upgrade_; }
  /// Resets to an empty head, keeping the arena's capacity. Any thread holding the head.
  void clear() noexcept;

 private:
  friend class request_parser_state;

  // Arena: the target, then header names and values, at the offsets below
  // (path and query offsets are arena offsets too, inside the target).
  header_block fields_;
  std::string_view method_name_{};
  std::uint64_t content_length_ = 0;
  std::uint32_t target_off_ = 0;
  std::uint32_t target_len_ = 0;
  std::uint32_t path_off_ = 0;
  std::uint32_t path_len_ = 0;
  std::uint32_t query_off_ = 0;
  std::uint32_t query_len_ = 0;
  request_method method_ = request_method::other;
  body_framing framing_ = body_framing::none;
  std::uint8_t version_major_ = 0;
  std::uint8_t version_minor_ = 0;
  bool keep_alive_ = false;
  bool expect_continue_ = false;
  bool websocket_upgrade_ = false;
};

}  // namespace cadeloop::http
