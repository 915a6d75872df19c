// tls_tickets: session-ticket keys shared by every pair of a server and
// rotated on an interval (see tls_tickets.hpp). Keys are never stored: each
// is HMAC-SHA256(secret, label || period), so every thread and process
// computes the same ones without talking to the others.

#include "tls_tickets.hpp"

#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace cadeloop::net {

namespace {

constexpr std::size_t name_bytes = 16;
constexpr std::size_t key_bytes = 32;

using secret_bytes = std::array<unsigned char, 32>;

/// The process's ticket secret: made once, when the library is loaded (in
/// the supervisor, before it forks its workers).
const secret_bytes& secret() {
  static const secret_bytes s = [] {
    secret_bytes b{};
    if (RAND_bytes(b.data(), static_cast<int>(b.size())) != 1) {
      std::abort();  // no randomness: no safe ticket key can be made
    }
    return b;
  }();
  return s;
}
[[maybe_unused]] const secret_bytes& made_at_load = secret();

struct period_keys {
  std::int64_t period = -1;
  std::array<unsigned char, name_bytes> name{};
  std::array<unsigned char, key_bytes> aes{};
  std::array<unsigned char, key_bytes> mac{};
};

void derive(char label, std::int64_t period, unsigned char* out, std::size_t n) {
  unsigned char msg[1 + 8];
  msg[0] = static_cast<unsigned char>(label);
  for (int i = 0; i < 8; ++i) {
    msg[1 + i] = static_cast<unsigned char>(static_cast<std::uint64_t>(period) >> (56 - 8 * i));
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  const secret_bytes& s = secret();
  HMAC(EVP_sha256(), s.data(), static_cast<int>(s.size()), msg, sizeof msg, md, &len);
  std::memcpy(out, md, n);
}

/// The keys of `period`; a few recent periods are kept per thread.
const period_keys& keys_of(std::int64_t period) {
  thread_local std::array<period_keys, 4> cache;
  period_keys& k = cache[static_cast<std::size_t>(period) % cache.size()];
  if (k.period != period) {
    derive('n', period, k.name.data(), k.name.size());
    derive('e', period, k.aes.data(), k.aes.size());
    derive('m', period, k.mac.data(), k.mac.size());
    k.period = period;
  }
  return k;
}

std::int64_t rotation_ms(SSL* s) {
  return static_cast<std::int64_t>(
      reinterpret_cast<std::uintptr_t>(SSL_CTX_get_app_data(SSL_get_SSL_CTX(s))));
}

std::int64_t current_period(std::int64_t rotation) {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  const std::int64_t ms = static_cast<std::int64_t>(now.tv_sec) * 1000 + now.tv_nsec / 1000000;
  return ms / rotation;
}

bool set_mac_key(EVP_MAC_CTX* hctx, const period_keys& k) {
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {
      OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_KEY,
                                        const_cast<unsigned char*>(k.mac.data()), k.mac.size()),
      OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_end(),
  };
  return EVP_MAC_CTX_set_params(hctx, params) == 1;
}

/// OpenSSL's ticket key callback: enc 1 makes a ticket, 0 opens one.
/// Returns 1 (made), 2 (opened: issue a new ticket), 0 (unknown key: full
/// handshake), -1 (error). An opened ticket is always renewed: a TLS 1.3
/// client uses each ticket once (OpenSSL's and Python's do), and without a
/// new one its next connection would be a full handshake.
int ticket_key_cb(SSL* s, unsigned char key_name[16], unsigned char iv[EVP_MAX_IV_LENGTH],
                  EVP_CIPHER_CTX* cctx, EVP_MAC_CTX* hctx, int enc) {
  const std::int64_t rotation = rotation_ms(s);
  const std::int64_t now = current_period(rotation);
  if (enc == 1) {
    const period_keys& k = keys_of(now);
    if (RAND_bytes(iv, EVP_CIPHER_get_iv_length(EVP_aes_256_cbc())) != 1) {
      return -1;
    }
    std::memcpy(key_name, k.name.data(), name_bytes);
    if (EVP_EncryptInit_ex(cctx, EVP_aes_256_cbc(), nullptr, k.aes.data(), iv) != 1 ||
        !set_mac_key(hctx, k)) {
      return -1;
    }
    return 1;
  }
  // The current period, the one before, and the next (a pair whose clock
  // read crossed the boundary a moment earlier).
  for (const std::int64_t period : {now, now - 1, now + 1}) {
    const period_keys& k = keys_of(period);
    if (std::memcmp(key_name, k.name.data(), name_bytes) != 0) {
      continue;
    }
    if (EVP_DecryptInit_ex(cctx, EVP_aes_256_cbc(), nullptr, k.aes.data(), iv) != 1 ||
        !set_mac_key(hctx, k)) {
      return -1;
    }
    return 2;
  }
  return 0;
}

}  // namespace

void use_shared_ticket_keys(SSL_CTX* ctx, std::chrono::milliseconds rotation) {
  const std::int64_t ms = std::max<std::int64_t>(rotation.count(), 1);
  SSL_CTX_set_app_data(ctx, reinterpret_cast<void*>(static_cast<std::uintptr_t>(ms)));
  SSL_CTX_set_tlsext_ticket_key_evp_cb(ctx, ticket_key_cb);
  // A ticket opens for at most two periods (made at the start of one,
  // presented at the end of the next); say so to the client.
  const std::int64_t lifetime_s = std::max<std::int64_t>((2 * ms) / 1000, 1);
  SSL_CTX_set_timeout(ctx, static_cast<long>(lifetime_s));
}

}  // namespace cadeloop::net
