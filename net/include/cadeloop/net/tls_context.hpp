#pragma once

// The server's TLS configuration: one OpenSSL SSL_CTX per server (per
// process), shared by every I/O thread of the process, built from the ssl_*
// settings, checked before anything binds, and replaced whole on a reload
// (connections keep the context they were made with).

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

struct ssl_ctx_st;

namespace cadeloop::net {

/// The ssl_* settings. Plain data. TLS is on when `certfile` is not empty.
struct tls_options {
  std::string certfile;             ///< PEM certificate (chain) of the server
  std::string keyfile;              ///< PEM private key ("" : in certfile)
  std::string keyfile_password;     ///< password of an encrypted key
  std::string ca_certs;             ///< PEM CA bundle client certificates are verified against
  int cert_reqs = 0;                ///< 0 no client certificate, 1 optional, 2 required
  std::string ciphers;              ///< TLS 1.2 cipher list ("" : OpenSSL's default)
  std::string ciphersuites;         ///< TLS 1.3 suites ("" : OpenSSL's default)
  std::string min_version = "1.2";  ///< "1.2" or "1.3"
  /// How often the session-ticket key changes (tls_tickets.hpp).
  std::chrono::milliseconds ticket_rotation{std::chrono::hours{1}};

  [[nodiscard]] bool enabled() const noexcept { return !certfile.empty(); }
  friend bool operator==(const tls_options&, const tls_options&) = default;
};

/// A refused TLS setting or file: `what()` is one line naming the file and
/// what is wrong with it.
class tls_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One server's TLS context. Thread-safe: `acquire` may be called from any
/// I/O thread while another thread reloads.
class tls_context {
 public:
  /// Loads and checks everything `o` names; throws tls_error. Sets SIGPIPE
  /// to be ignored if it has its default action (OpenSSL writes with write(2)).
  explicit tls_context(tls_options o);
  ~tls_context();
  tls_context(const tls_context&) = delete;
  tls_context& operator=(const tls_context&) = delete;

  /// The process-wide context for `o` (one per distinct options; made on
  /// first use). Throws tls_error.
  static std::shared_ptr<tls_context> shared(const tls_options& o);

  /// Checks what `o` names (files, password, key against certificate,
  /// ciphers) as loading would; throws tls_error. Opens nothing that stays.
  static void check(const tls_options& o);

  /// Re-reads the certificate and key of every shared context. A context
  /// whose new files are refused keeps the old ones; each refusal is one
  /// line in `problems` (newline-separated). Returns how many were reloaded.
  static std::size_t reload_all(std::string& problems);

  /// The current SSL_CTX with a reference taken (the caller frees it with
  /// SSL_CTX_free, or hands it to SSL_new and frees it after).
  [[nodiscard]] ssl_ctx_st* acquire() const;

  /// Re-reads the files: true and the new context in use, or false with the
  /// one-line reason and the old context kept.
  bool reload(std::string& problem);

  [[nodiscard]] const tls_options& options() const noexcept { return opt_; }
  /// How many times the files were reloaded successfully.
  [[nodiscard]] std::uint64_t generation() const;

 private:
  tls_options opt_;
  mutable std::mutex mu_;
  ssl_ctx_st* ctx_ = nullptr;  // guarded by mu_
  std::uint64_t generation_ = 0;
};

}  // namespace cadeloop::net
