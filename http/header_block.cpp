// header_block (a head's or trailer section's fields in one arena),
// request_head::clear, and head_pool (spare heads shared by an I/O thread's
// parsers).

#include <cadeloop/http/request_parser.hpp>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace cadeloop::http {

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
      entries_{other.count_ == 0 ? nullptr
                                 : std::make_unique_for_overwrite<entry[]>(other.count_)} {
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

// ---------------------------------------------------------------- head_pool

std::unique_ptr<request_head> head_pool::take() noexcept {
  if (free_.empty()) {
    tick();
    return nullptr;
  }
  std::unique_ptr<request_head> head = std::move(free_.back());
  free_.pop_back();
  low_water_ = std::min(low_water_, free_.size());
  tick();
  return head;
}

void head_pool::give(std::unique_ptr<request_head> head) {
  if (head && free_.size() < cap_) {
    head->clear();
    free_.push_back(std::move(head));
  }  // else freed here
  tick();
}

void head_pool::tick() noexcept {
  if (++ops_ < window_) {
    return;
  }
  ops_ = 0;
  // Heads kept through the whole window were not needed by its load. Taken
  // from the front: take() and give() work at the back, so the front holds
  // the heads that have waited longest.
  if (free_.size() > floor_) {
    const std::size_t unused = std::min(low_water_, free_.size() - floor_);
    free_.erase(free_.begin(), free_.begin() + static_cast<std::ptrdiff_t>(unused));
  }
  low_water_ = free_.size();
}

}  // namespace cadeloop::http
