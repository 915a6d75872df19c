#pragma once

// What the app may learn of a TLS connection (the ASGI TLS extension):
// made once per connection by its I/O thread when the handshake ends,
// immutable after, shared by reference count with the requests of the
// connection on their way to the app thread.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace cadeloop::net {

struct tls_details {
  std::uint16_t version = 0;                       ///< 0x0303 TLS 1.2, 0x0304 TLS 1.3
  std::uint16_t cipher_suite = 0;                  ///< the IANA number of the cipher suite
  std::shared_ptr<const std::string> server_cert;  ///< PEM of the server's certificate
  std::vector<std::string> client_cert_chain;      ///< PEM, the client's own first
  std::string client_cert_name;   ///< RFC 4514 subject of the client's certificate ("" none)
  std::string client_cert_error;  ///< why it was not verified ("" verified or none)
  mutable std::atomic<std::uint32_t> refs{1};
};

/// A counted reference to a tls_details; any thread may drop one.
class tls_ref {
 public:
  tls_ref() noexcept = default;
  /// Takes over the reference `p` holds (from `release()`).
  static tls_ref adopt(const tls_details* p) noexcept {
    tls_ref r;
    r.p_ = p;
    return r;
  }
  /// A new reference to `p`.
  static tls_ref share(const tls_details* p) noexcept {
    if (p != nullptr) {
      p->refs.fetch_add(1, std::memory_order_relaxed);
    }
    return adopt(p);
  }
  tls_ref(const tls_ref& o) noexcept : tls_ref{share(o.p_)} {}
  tls_ref(tls_ref&& o) noexcept : p_{std::exchange(o.p_, nullptr)} {}
  tls_ref& operator=(tls_ref o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~tls_ref() {
    if (p_ != nullptr && p_->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      delete p_;
    }
  }
  [[nodiscard]] const tls_details* get() const noexcept { return p_; }
  /// Gives the reference up (to be adopted again, on another thread perhaps).
  [[nodiscard]] const tls_details* release() noexcept { return std::exchange(p_, nullptr); }
  explicit operator bool() const noexcept { return p_ != nullptr; }
  const tls_details* operator->() const noexcept { return p_; }
  const tls_details& operator*() const noexcept { return *p_; }

 private:
  const tls_details* p_ = nullptr;
};

}  // namespace cadeloop::net
