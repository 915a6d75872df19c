#pragma once

#include <cadeloop/http/request.hpp>

#include <llhttp.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace cadeloop::http {

/// What a `parse_event` reports.
enum class parse_event_kind : std::uint8_t {
  head,              ///< a request head is complete and valid (`parse_event::head`)
  body,              ///< a piece of the body (`parse_event::body`)
  message_complete,  ///< the request is complete (`parse_event::trailers` if any)
};

/// One event produced by `request_parser::feed`. Events are queued while
/// llhttp runs and handed to the caller after it returns, in stream order.
/// Valid until the next `feed()` or `reset()` on the same parser (I/O thread).
struct parse_event {
  /// Which of the fields below is meaningful.
  parse_event_kind kind = parse_event_kind::head;
  /// Pool slot of `head` / `trailers`, for `request_parser::take_head` / `take_trailers`.
  std::uint32_t slot = 0;
  /// kind == head: the parsed head, owned by the parser until the next feed()
  /// unless taken with `request_parser::take_head`.
  request_head* head = nullptr;
  /// kind == body: body bytes, a view into the input given to feed() (no
  /// copy; chunked framing already removed). Valid while that input is.
  std::string_view body{};
  /// kind == message_complete: the chunked trailer fields, or nullptr when
  /// there were none. Owned like `head` (see `request_parser::take_trailers`).
  header_block* trailers = nullptr;
};

/// Outcome of one `request_parser::feed`.
enum class feed_status : std::uint8_t {
  ok,        ///< every byte was consumed; feed more when it arrives
  paused,    ///< the message credit reached 0 after a message: the bytes after
             ///< `consumed` were not parsed; add credit, then feed them again
  closing,   ///< the last complete request was not keep-alive: answer it and
             ///< close; the bytes after `consumed` must be ignored
  upgraded,  ///< a WebSocket upgrade was accepted: the bytes from `consumed` on
             ///< belong to the WebSocket codec; the parser takes no more input
  error,     ///< the request was rejected: answer `request_parser::error()` and close
};

/// Result of one `request_parser::feed`. Plain data.
struct feed_result {
  /// See `feed_status`.
  feed_status status = feed_status::ok;
  /// Bytes of the input that were parsed (always <= the input's size).
  std::size_t consumed = 0;
};

/// Why a request was rejected. Plain data; `reason` is in static storage.
struct parse_error {
  /// HTTP status to answer with (400, 413, 414, 431, 500, 501, 505).
  std::uint16_t status = 0;
  /// Short human reason, for the log and the error body.
  std::string_view reason{};
  /// Always true: after a rejection the connection's framing can't be trusted.
  bool must_close = true;
};

/// Spare request heads shared by every parser of one I/O thread: a head
/// given back after its request is kept here rather than in its
/// connection's parser, so an idle keep-alive connection holds none (each
/// keeps room for a typical request, about 1.6 KiB).
///
/// How many it keeps follows the load: up to `cap`, but every `window`
/// operations (takes and gives) the heads that stayed in it through the
/// whole window, beyond `floor`, are freed, since the load of that window
/// did not need them. So 64 connections pipelining 16 requests each (about
/// 1,000 heads lent at the peak) reuse their heads instead of freeing and
/// allocating most of them per batch, and a burst's heads are given back
/// once the load drops. Not thread-safe: used by one I/O thread.
class head_pool {
 public:
  explicit head_pool(std::size_t floor = 256, std::size_t cap = 4096, std::size_t window = 8192)
      : floor_{floor}, cap_{cap}, window_{window} {}
  head_pool(const head_pool&) = delete;
  head_pool& operator=(const head_pool&) = delete;

  /// A spare head (cleared), or nullptr when none is kept. I/O thread.
  [[nodiscard]] std::unique_ptr<request_head> take() noexcept;
  /// Keeps `head` for reuse (clearing it) or frees it when the pool is full. I/O thread.
  void give(std::unique_ptr<request_head> head);
  /// Heads kept now. I/O thread.
  [[nodiscard]] std::size_t size() const noexcept { return free_.size(); }

 private:
  // Counts one operation; at the end of a window frees what it did not use.
  void tick() noexcept;

  std::vector<std::unique_ptr<request_head>> free_;
  std::size_t floor_;
  std::size_t cap_;
  std::size_t window_;
  std::size_t ops_ = 0;
  // The fewest heads kept at any point of the current window.
  std::size_t low_water_ = 0;
};

/// The state of `request_parser` (see it for the contract), held on the heap
/// by it so that a connection gone WebSocket can free it. Incremental HTTP/1.1
/// request parser over llhttp (strict mode, no lenient
/// flags). Push bytes with `feed()`; read the queued events with `events()`.
///
/// It validates framing and syntax strictly (request smuggling defences),
/// enforces `request_limits` while it parses (at the stream position where a
/// limit is crossed, never after the fact), caps the number of
/// requests parsed ahead with a message credit, stops after the head of an
/// accepted WebSocket upgrade, and reports the same events whatever way the
/// stream is split into feeds (body pieces may be cut differently; their
/// concatenation is the same).
///
/// Steady state allocates nothing: heads, trailer blocks and the event queue
/// are pooled and reused. Owned and used by one I/O thread; not movable
/// (llhttp keeps a pointer to it). Destroyed by that thread.
class request_parser_state {
 public:
  /// `set_credit` value meaning "no cap on messages".
  static constexpr std::uint32_t unlimited_credit = UINT32_MAX;

  /// A parser at the start of a connection. I/O thread.
  explicit request_parser_state(const request_limits& limits = {});
  request_parser_state(const request_parser_state&) = delete;
  request_parser_state& operator=(const request_parser_state&) = delete;
  request_parser_state(request_parser_state&&) = delete;
  request_parser_state& operator=(request_parser_state&&) = delete;
  /// I/O thread.
  ~request_parser_state() = default;

  /// Parses `input`, which continues the bytes consumed so far. Clears the
  /// events of the previous feed first (their views and heads become invalid
  /// unless taken). Returns how far it got; bytes after `consumed` must be
  /// fed again (paused) or belong to someone else (upgraded, closing).
  /// After `error`, `closing` or `upgraded` it consumes nothing more. I/O thread.
  feed_result feed(std::string_view input) noexcept;

  /// Events queued by the last feed(), in stream order. I/O thread.
  [[nodiscard]] std::span<const parse_event> events() const noexcept { return events_; }

  /// Sets how many more requests may complete before the parser pauses
  /// (`unlimited_credit` for no cap, the default). With 0 it parses nothing.
  /// I/O thread.
  void set_credit(std::uint32_t messages) noexcept { credit_ = messages; }
  /// Adds to the credit (saturating), for instance when a response was sent. I/O thread.
  void add_credit(std::uint32_t messages) noexcept;
  /// Remaining credit. I/O thread.
  [[nodiscard]] std::uint32_t credit() const noexcept { return credit_; }

  /// Takes ownership of the head of a `head` event from the last feed, so it
  /// can outlive the next feed (for instance to cross the inbound ring). The
  /// event's pointer stays valid, now owned by the caller. I/O thread.
  [[nodiscard]] std::unique_ptr<request_head> take_head(const parse_event& event) noexcept;
  /// Gives a head back for reuse, keeping parsing allocation-free when heads
  /// are taken. Its contents are dropped. I/O thread (a head coming back from
  /// the app thread arrives over the ring first).
  void recycle_head(std::unique_ptr<request_head> head);
  /// Takes spare heads from `pool` and gives recycled ones back to it instead
  /// of keeping them in this parser (nullptr: keep them here). The pool must
  /// outlive the parser. I/O thread.
  void use_pool(head_pool* pool) noexcept { pool_ = pool; }
  /// Takes ownership of the trailers of a `message_complete` event. I/O thread.
  [[nodiscard]] std::unique_ptr<header_block> take_trailers(const parse_event& event) noexcept;
  /// Gives a trailer block back for reuse. I/O thread.
  void recycle_trailers(std::unique_ptr<header_block> trailers);

  /// Why the request was rejected, valid after feed() returned `error`. I/O thread.
  [[nodiscard]] const parse_error& error() const noexcept { return error_; }
  /// After feed() returned `error` for a head rejected once complete (413 for
  /// its Content-Length, a missing Host, ...): that head (method, target,
  /// fields), never handed out as an event, e.g. for the access log line of
  /// the error response; null otherwise. Valid until the next feed() or
  /// reset(). I/O thread.
  [[nodiscard]] const request_head* rejected_head() const noexcept { return rejected_head_; }
  /// True while a request has started but not completed (an EOF now means a
  /// truncated request). I/O thread.
  [[nodiscard]] bool mid_message() const noexcept { return phase_ != phase::idle; }
  /// Bytes consumed since construction or reset(). I/O thread.
  [[nodiscard]] std::uint64_t stream_offset() const noexcept { return stream_base_; }
  /// The limits in force. I/O thread.
  [[nodiscard]] const request_limits& limits() const noexcept { return limits_; }
  /// Back to the start of a new connection (credit and limits unchanged,
  /// pools kept). I/O thread.
  void reset() noexcept;

 private:
  enum class phase : std::uint8_t { idle, head, body, trailers };
  enum class state : std::uint8_t { parsing, paused, closing, upgraded, failed };
  enum class pause_reason : std::uint8_t { none, credit, closing };

  // llhttp callbacks, reached through the static trampolines in the .cpp.
  // A head's fields have none: llhttp validates them and scan_head_fields()
  // reads them from the head's bytes. Trailer fields have their own three.
  int on_message_begin();
  int on_method(const char* at, std::size_t len);
  int on_url(const char* at, std::size_t len);
  int on_url_complete();
  int on_version_complete();
  int check_host();
  int on_headers_complete();
  int on_body(const char* at, std::size_t len);
  int on_chunk_header();
  int on_chunk_extension(const char* at, std::size_t len);
  int on_message_complete();
  int on_trailer_field(const char* at, std::size_t len);
  int on_trailer_value(const char* at, std::size_t len);
  int on_trailer_value_complete();

  template <int (request_parser_state::*Member)()>
  static int trampoline(llhttp_t* parser) noexcept;
  template <int (request_parser_state::*Member)(const char*, std::size_t)>
  static int data_trampoline(llhttp_t* parser, const char* at, std::size_t len) noexcept;
  static const llhttp_settings_t& settings() noexcept;
  static const llhttp_settings_t& trailer_settings() noexcept;

  int fail(std::uint16_t status, const char* reason) noexcept;
  int fail_internal() noexcept;
  // Whether a head span ending at at + len (in the input) is within the
  // limits: the same verdict as comparing its stream position with
  // limit_end_, both sides shifted by the address of the feed's first byte.
  [[nodiscard]] bool within_limits(const char* at, std::size_t len) const noexcept {
    return reinterpret_cast<std::uintptr_t>(at) + len <= limit_addr_;
  }
  int check_head_span(const char* at, std::size_t len) noexcept {
    return within_limits(at, len) ? 0 : check_head_limits_slow(stream_pos(at) + len);
  }
  [[gnu::noinline]] int check_head_limits_slow(std::uint64_t end) noexcept;
  [[nodiscard]] std::uint16_t head_limit_violation(std::uint64_t end, const char** reason,
                                                   std::uint64_t target_end) const noexcept;
  [[nodiscard]] std::uint64_t target_end_before(std::uint64_t pos,
                                                std::size_t consumed) const noexcept;
  void classify_llhttp_error(llhttp_errno_t err, std::uint64_t pos, std::size_t consumed) noexcept;
  [[nodiscard]] bool unknown_http_version_before(std::uint64_t pos) const noexcept;
  [[gnu::noinline]] int interpret_head_field(const char* name, std::size_t name_len,
                                             std::string_view value);
  // The one reader of a head's fields (head_fields.cpp): see the .cpp.
  int scan_head_fields(const char* until);
  [[gnu::noinline]] int check_line_in_progress();
  [[gnu::noinline]] void keep_head_bytes(const char* from, const char* to);
  void keep_head_input();
  [[gnu::noinline]] int end_feed_in_head();
  [[nodiscard]] const char* before_fold(const char* until) const noexcept;
  [[gnu::noinline]] int scan_before_error(const char* error_at);
  [[nodiscard]] std::uintptr_t limit_address() const noexcept;
  [[nodiscard]] std::uint64_t stream_pos(const char* at) const noexcept {
    return stream_base_ + static_cast<std::uint64_t>(at - feed_begin_);
  }
  // Stream position of a byte of the head's bytes (head_bytes_, input or arena).
  [[nodiscard]] std::uint64_t head_pos(const char* at) const noexcept {
    return head_start_ + static_cast<std::uint64_t>(at - head_bytes_);
  }
  void set_limit_end(std::uint64_t end) noexcept {
    limit_end_ = end;
    limit_addr_ = limit_address();
  }
  [[nodiscard]] header_block& trailer_fields();
  void begin_feed() noexcept;
  request_head& acquire_head();
  header_block& acquire_trailers();
  void start_message() noexcept;

  llhttp_t parser_{};
  request_limits limits_;
  std::uint64_t max_header_bytes_ = 0;  // limits clamped so positions can't overflow
  std::uint64_t max_url_ = 0;
  std::uint32_t credit_ = unlimited_credit;
  state state_ = state::parsing;
  phase phase_ = phase::idle;
  pause_reason pause_reason_ = pause_reason::none;
  parse_error error_{};

  std::vector<parse_event> events_;
  std::vector<std::unique_ptr<request_head>> heads_;  // slots [0, heads_used_) belong to this feed
  std::vector<std::unique_ptr<request_head>> free_heads_;
  head_pool* pool_ = nullptr;  // when set, spare heads live there instead of free_heads_
  std::vector<std::unique_ptr<header_block>> trailers_;
  std::vector<std::unique_ptr<header_block>> free_trailers_;
  std::size_t heads_used_ = 0;
  std::size_t trailers_used_ = 0;
  request_head* head_ = nullptr;                 // head being parsed (slot heads_used_ - 1)
  const request_head* rejected_head_ = nullptr;  // see rejected_head()
  header_block* trailer_block_ = nullptr;        // trailers being parsed (slot trailers_used_ - 1)

  // Absolute stream positions: stream_base_ is the offset of feed_begin_.
  const char* feed_begin_ = nullptr;
  std::uint64_t stream_base_ = 0;
  std::uint64_t head_start_ = 0;  // first byte of the method
  std::uint64_t method_end_ = 0;  // one past the method
  bool head_start_known_ = false;
  bool url_open_ = false;  // between the method and the end of the target
  // Stream position after the last target byte llhttp reported. An
  // HTTP/0.9-style line keeps url_open_ until its LF, and llhttp may stop
  // on a byte after the target's CR or LF before reporting the target: the
  // error path then finds the target's end from here (target_end_before).
  std::uint64_t url_seen_end_ = 0;
  std::uint64_t limit_end_ = UINT64_MAX;  // a head byte at or past this violates a limit
  // limit_end_ as an address in the current input (saturated), so a span's
  // check is one compare: `at + len <= limit_addr_`.
  std::uintptr_t limit_addr_ = UINTPTR_MAX;
  // A head's bytes. While all of a head so far is in the current input,
  // head_base_ is its first byte there and nothing is copied: its target
  // and fields are offsets from it, which become arena offsets unchanged
  // when scan_head_fields() copies the head to its arena at its end. A head
  // still open when a feed ends has its bytes kept in its arena as they are
  // (keep_head_bytes); later feeds append theirs, so the same scan reads
  // the head from the arena. head_bytes_ is the head's first byte wherever
  // it is now, head_end_ one past its last available byte, head_readable_
  // the first byte a 16-byte load may start at.
  const char* head_base_ = nullptr;
  const char* head_bytes_ = nullptr;
  const char* head_end_ = nullptr;
  const char* head_readable_ = nullptr;
  const char* feed_end_ = nullptr;  // one past the current input
  std::uint32_t fields_off_ =
      0;  // head offset of the first field line not scanned yet; 0 before the version
  std::uint32_t scanned_to_ =
      0;  // head offset of head_end_ when the fields were last scanned at a feed's end
  bool head_cut_ = false;  // the kept bytes stopped at the head limit (the head is refused)

  // Per-message state.
  bool in_field_ = false;  // trailer fields
  bool in_value_ = false;
  bool te_seen_ = false;
  bool websocket_token_ = false;
  bool expect_continue_ = false;
  bool keep_alive_ = false;
  bool websocket_ = false;
  bool trailers_over_ = false;
  std::uint8_t host_count_ = 0;
  std::uint8_t chunked_count_ = 0;
  std::uint64_t body_declared_ = 0;  // sum of chunk sizes so far
  std::uint64_t chunk_ext_bytes_ = 0;
  std::uint64_t trailer_bytes_ = 0;
};

/// Incremental HTTP/1.1 request parser over llhttp (strict mode, no lenient
/// flags): the contract of `request_parser_state`, whose storage (about half a
/// KiB with its queues) it makes at its first feed and keeps across `reset()`
/// (once per connection, not per request), until `release()` frees it: a
/// connection upgraded to WebSocket parses no more HTTP, and an idle
/// WebSocket should not hold a parser. Owned and used by one I/O thread.
class request_parser {
 public:
  /// `set_credit` value meaning "no cap on messages".
  static constexpr std::uint32_t unlimited_credit = request_parser_state::unlimited_credit;

  /// A parser at the start of a connection; allocates nothing yet. I/O thread.
  explicit request_parser(const request_limits& limits = {}) : limits_{limits} {}
  request_parser(const request_parser&) = delete;
  request_parser& operator=(const request_parser&) = delete;
  request_parser(request_parser&&) = delete;
  request_parser& operator=(request_parser&&) = delete;
  /// I/O thread.
  ~request_parser() = default;

  /// See `request_parser_state::feed`. After `release()` it consumes nothing
  /// and reports `upgraded`. I/O thread.
  feed_result feed(std::string_view input) noexcept {
    if (state_ == nullptr) [[unlikely]] {
      if (!make_state()) {
        return {released_ ? feed_status::upgraded : feed_status::error, 0};
      }
    }
    return state_->feed(input);
  }
  /// Events queued by the last feed(), in stream order. I/O thread.
  [[nodiscard]] std::span<const parse_event> events() const noexcept {
    return state_ != nullptr ? state_->events() : std::span<const parse_event>{};
  }
  /// See `request_parser_state::set_credit`. I/O thread.
  void set_credit(std::uint32_t messages) noexcept {
    credit_ = messages;
    if (state_ != nullptr) {
      state_->set_credit(messages);
    }
  }
  /// See `request_parser_state::add_credit`. I/O thread.
  void add_credit(std::uint32_t messages) noexcept;
  /// Remaining credit. I/O thread.
  [[nodiscard]] std::uint32_t credit() const noexcept {
    return state_ != nullptr ? state_->credit() : credit_;
  }
  /// See `request_parser_state::take_head`. I/O thread.
  [[nodiscard]] std::unique_ptr<request_head> take_head(const parse_event& event) noexcept {
    return state_ != nullptr ? state_->take_head(event) : nullptr;
  }
  /// See `request_parser_state::recycle_head`; once released, a head goes
  /// to the pool (or is freed). I/O thread.
  void recycle_head(std::unique_ptr<request_head> head);
  /// See `request_parser_state::use_pool`. I/O thread.
  void use_pool(head_pool* pool) noexcept {
    pool_ = pool;
    if (state_ != nullptr) {
      state_->use_pool(pool);
    }
  }
  /// See `request_parser_state::take_trailers`. I/O thread.
  [[nodiscard]] std::unique_ptr<header_block> take_trailers(const parse_event& event) noexcept {
    return state_ != nullptr ? state_->take_trailers(event) : nullptr;
  }
  /// See `request_parser_state::recycle_trailers`. I/O thread.
  void recycle_trailers(std::unique_ptr<header_block> trailers);
  /// Why the request was rejected, valid after feed() returned `error`. I/O thread.
  [[nodiscard]] const parse_error& error() const noexcept;
  /// See `request_parser_state::rejected_head`. I/O thread.
  [[nodiscard]] const request_head* rejected_head() const noexcept {
    return state_ != nullptr ? state_->rejected_head() : nullptr;
  }
  /// True while a request has started but not completed. I/O thread.
  [[nodiscard]] bool mid_message() const noexcept {
    return state_ != nullptr && state_->mid_message();
  }
  /// Bytes consumed since construction or reset() (0 before the first feed
  /// and after release()). I/O thread.
  [[nodiscard]] std::uint64_t stream_offset() const noexcept {
    return state_ != nullptr ? state_->stream_offset() : 0;
  }
  /// The limits in force. I/O thread.
  [[nodiscard]] const request_limits& limits() const noexcept { return limits_; }
  /// Back to the start of a new connection (credit and limits unchanged,
  /// storage kept; after release() it is made again at the next feed). I/O thread.
  void reset() noexcept {
    released_ = false;
    out_of_memory_ = false;
    if (state_ != nullptr) {
      state_->reset();
    }
  }
  /// Frees the parser's storage: the connection parses no more HTTP (it
  /// became a WebSocket). feed() then reports `upgraded` until reset();
  /// credit, limits and pool stay. I/O thread.
  void release() noexcept {
    if (state_ != nullptr) {
      credit_ = state_->credit();
    }
    state_.reset();
    released_ = true;
  }
  /// Whether the storage exists now (made at the first feed, freed by release()). I/O thread.
  [[nodiscard]] bool holds_state() const noexcept { return state_ != nullptr; }

 private:
  // Makes state_ unless released; false when it can't (released, or out of memory).
  [[gnu::noinline]] bool make_state() noexcept;

  std::unique_ptr<request_parser_state> state_;
  request_limits limits_;
  head_pool* pool_ = nullptr;
  std::uint32_t credit_ = unlimited_credit;
  bool released_ = false;
  bool out_of_memory_ = false;
};

}  // namespace cadeloop::http
