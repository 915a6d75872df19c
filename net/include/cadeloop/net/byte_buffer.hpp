#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <string_view>
#include <utility>

namespace cadeloop::net {

/// Where a borrowed buffer's owner goes once the buffer is done with (see
/// byte_buffer::borrow): `give(ctx, owner)`, which must not throw and may run
/// on any thread. The sink outlives every buffer that names it.
struct owner_sink {
  void (*give)(void* ctx, void* owner) noexcept = nullptr;
  void* ctx = nullptr;
};

/// An owned run of bytes: a request body chunk on its way to the app thread,
/// or response bytes on their way to the I/O thread. Move-only; one
/// allocation, no zero-fill. Inside a core pair's rings it travels as a raw
/// pointer and a size (`release()` / `adopt()`); at every API it is this
/// owning type. Not synchronised: one thread at a time; whichever thread owns
/// it last destroys it.
class byte_buffer {
 public:
  /// An empty buffer (no allocation). Any thread.
  byte_buffer() noexcept = default;
  /// `size` uninitialised bytes. Throws std::bad_alloc. Any thread.
  explicit byte_buffer(std::size_t size)
      : data_{size == 0 ? nullptr : std::make_unique_for_overwrite<char[]>(size)}, size_{size} {}
  /// A copy of `bytes`. Throws std::bad_alloc. Any thread.
  [[nodiscard]] static byte_buffer copy_of(std::string_view bytes) {
    byte_buffer b{bytes.size()};
    if (!bytes.empty()) {
      std::memcpy(b.data(), bytes.data(), bytes.size());
    }
    return b;
  }
  /// Takes ownership of `data` (allocated with new char[], or nullptr when
  /// `size` is 0), the other half of `release()`. Any thread.
  [[nodiscard]] static byte_buffer adopt(char* data, std::size_t size) noexcept {
    byte_buffer b;
    b.data_.reset(data);
    b.size_ = data == nullptr ? 0 : size;
    return b;
  }
  /// adopt() of a block from a pool of fixed-size blocks (still a new char[]
  /// allocation, which any owner may delete): the last writer of the bytes
  /// may hand the block back to its pool instead (`pooled()`). Any thread.
  [[nodiscard]] static byte_buffer adopt_pooled(char* block, std::size_t size) noexcept {
    byte_buffer b = adopt(block, size);
    b.pooled_ = block != nullptr;
    return b;
  }
  /// Takes ownership of the allocation `base` (new char[]) whose bytes are
  /// the `size` from `base + offset`: a run inside a bigger buffer (a read
  /// buffer holding a head and its body) handed on without a copy. The other
  /// half of `offset()` and `release()`. Any thread.
  [[nodiscard]] static byte_buffer adopt(char* base, std::size_t size,
                                         std::size_t offset) noexcept {
    byte_buffer b = adopt(base, size);
    b.offset_ = base == nullptr ? 0 : offset;
    return b;
  }

  /// `size` bytes at `data` that this buffer does not own: `owner` keeps
  /// them alive and unchanged until the buffer is destroyed, when `owner`
  /// goes to `sink` (no free). A response body sent from the app's own
  /// object without a copy. Any thread.
  [[nodiscard]] static byte_buffer borrow(const char* data, std::size_t size, void* owner,
                                          const owner_sink* sink) noexcept {
    byte_buffer b;
    b.borrowed_ = const_cast<char*>(data);  // never written through: see data()
    b.size_ = size;
    b.owner_ = owner;
    b.sink_ = sink;
    return b;
  }

  byte_buffer(byte_buffer&& other) noexcept
      : data_{std::move(other.data_)},
        size_{std::exchange(other.size_, 0)},
        offset_{std::exchange(other.offset_, 0)},
        pooled_{std::exchange(other.pooled_, false)},
        borrowed_{std::exchange(other.borrowed_, nullptr)},
        owner_{std::exchange(other.owner_, nullptr)},
        sink_{std::exchange(other.sink_, nullptr)} {}
  byte_buffer& operator=(byte_buffer&& other) noexcept {
    give_back();
    data_ = std::move(other.data_);
    size_ = std::exchange(other.size_, 0);
    offset_ = std::exchange(other.offset_, 0);
    pooled_ = std::exchange(other.pooled_, false);
    borrowed_ = std::exchange(other.borrowed_, nullptr);
    owner_ = std::exchange(other.owner_, nullptr);
    sink_ = std::exchange(other.sink_, nullptr);
    return *this;
  }
  byte_buffer(const byte_buffer&) = delete;
  byte_buffer& operator=(const byte_buffer&) = delete;
  /// Frees the bytes, or gives a borrowed buffer's owner to its sink. The owning thread.
  ~byte_buffer() { give_back(); }

  /// Gives up ownership: returns the allocation (nullptr when empty or
  /// borrowed; the bytes start `offset()` into it: read that first) and
  /// leaves this buffer empty. A borrowed buffer's owner is not given to its
  /// sink: the caller took `owner()` first and passes it on. Call only after
  /// the last line that can throw before the pointer is stored elsewhere.
  /// The owning thread.
  [[nodiscard]] char* release() noexcept {
    size_ = 0;
    offset_ = 0;
    pooled_ = false;
    borrowed_ = nullptr;
    owner_ = nullptr;
    sink_ = nullptr;
    return data_.release();
  }
  /// A borrowed buffer's owner (borrow), else nullptr. The owning thread.
  [[nodiscard]] void* owner() const noexcept { return owner_; }
  /// Whether the allocation is a pool's block (adopt_pooled). The owning thread.
  [[nodiscard]] bool pooled() const noexcept { return pooled_; }
  /// Where the bytes start in the allocation: 0 but for `adopt(base, size, offset)`.
  [[nodiscard]] std::size_t offset() const noexcept { return offset_; }

  /// The bytes (nullptr when empty). A borrowed buffer's must not be
  /// written. The owning thread.
  [[nodiscard]] char* data() noexcept { return data_ ? data_.get() + offset_ : borrowed_; }
  /// The bytes (nullptr when empty). The owning thread.
  [[nodiscard]] const char* data() const noexcept {
    return data_ ? data_.get() + offset_ : borrowed_;
  }
  /// Number of bytes. The owning thread.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// True when there are no bytes. The owning thread.
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  /// The bytes as a view, valid while this buffer owns them. The owning thread.
  [[nodiscard]] std::string_view view() const noexcept { return {data(), size_}; }

 private:
  void give_back() noexcept {
    if (owner_ != nullptr) {
      sink_->give(sink_->ctx, std::exchange(owner_, nullptr));
    }
  }

  std::unique_ptr<char[]> data_;
  std::size_t size_ = 0;
  std::size_t offset_ = 0;
  bool pooled_ = false;
  char* borrowed_ = nullptr;  // borrow(): the bytes, owned by owner_
  void* owner_ = nullptr;
  const owner_sink* sink_ = nullptr;
};

}  // namespace cadeloop::net
