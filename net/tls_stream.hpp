// Private to net/: the TLS state of one connection (an OpenSSL SSL on the
// connection's socket descriptor); empty for a plain connection.
#pragma once

#include <cadeloop/net/tls_details.hpp>

#include <cstdint>
#include <memory>

struct ssl_st;

namespace cadeloop::net {

struct ssl_deleter {
  void operator()(ssl_st* s) const noexcept;
};

struct tls_stream {
  std::unique_ptr<ssl_st, ssl_deleter>
      ssl;                        // null: plain TCP (or TLS dropped for a plain-HTTP 400)
  bool first_byte_seen = false;   // the first byte was checked for a TLS handshake record
  bool established = false;       // the handshake is done
  bool failed = false;            // the handshake failed (counted once)
  bool read_wants_write = false;  // SSL_read needs writability before it can go on
  bool more_buffered = false;     // the last read filled the buffer: OpenSSL may hold more
  tls_ref details;                // for the app (ASGI TLS extension), made when the handshake ends

  [[nodiscard]] bool active() const noexcept { return ssl != nullptr; }
  [[nodiscard]] bool handshaking() const noexcept {
    return ssl != nullptr && !established && !failed;
  }
};

}  // namespace cadeloop::net
