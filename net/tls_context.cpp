// tls_context: the ssl_* settings made into one OpenSSL SSL_CTX (checked
// file by file, each refusal one line naming the file), the process-wide
// registry of contexts the I/O threads share, and reloading.

#include <cadeloop/net/tls_context.hpp>

#include "tls_tickets.hpp"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <sys/stat.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>
#include <utility>
#include <vector>

namespace cadeloop::net {

namespace {

struct ctx_deleter {
  void operator()(SSL_CTX* c) const noexcept { SSL_CTX_free(c); }
};
using ctx_ptr = std::unique_ptr<SSL_CTX, ctx_deleter>;

/// The most recent OpenSSL error as text ("" when there is none); clears the queue.
std::string openssl_reason() {
  unsigned long last = 0;
  while (const unsigned long e = ERR_get_error()) {
    last = e;
  }
  if (last == 0) {
    return {};
  }
  const char* r = ERR_reason_error_string(last);
  return r != nullptr ? r : "unknown OpenSSL error";
}

[[noreturn]] void refuse(std::string_view setting, std::string_view file, std::string_view what) {
  ERR_clear_error();
  throw tls_error(std::string{setting}.append(": ").append(file).append(": ").append(what));
}

/// The whole file, or a refusal naming it (missing, unreadable, empty).
std::string read_file(std::string_view setting, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    refuse(setting, path,
           std::string{"cannot be read ("}.append(std::strerror(EISDIR)).append(")"));
  }
  errno = 0;
  std::ifstream in{path, std::ios::binary};
  if (!in) {
    const int err = errno;
    if (err == ENOENT) {
      refuse(setting, path, "no such file");
    }
    refuse(setting, path,
           std::string{"cannot be read ("}
               .append(err != 0 ? std::strerror(err) : "unknown")
               .append(")"));
  }
  std::ostringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  if (text.empty()) {
    refuse(setting, path, "is empty");
  }
  return text;
}

struct password_source {
  const std::string* password;
  bool asked = false;
};

int password_cb(char* buf, int size, int /*rwflag*/, void* user) {
  auto* src = static_cast<password_source*>(user);
  src->asked = true;
  const std::string& p = *src->password;
  if (p.empty() || static_cast<int>(p.size()) > size) {
    return -1;
  }
  std::memcpy(buf, p.data(), p.size());
  return static_cast<int>(p.size());
}

/// ALPN: HTTP/1.1 is the one protocol served. A client that offers it gets
/// it (whatever else it offers, h2 included); one that does not gets no
/// ALPN answer and may go on with HTTP/1.1 or hang up.
int select_alpn(SSL* /*ssl*/, const unsigned char** out, unsigned char* outlen,
                const unsigned char* in, unsigned int inlen, void* /*arg*/) {
  static constexpr unsigned char http11[] = {'h', 't', 't', 'p', '/', '1', '.', '1'};
  for (unsigned int i = 0; i < inlen;) {
    const unsigned int len = in[i];
    if (i + 1 + len > inlen) {
      break;
    }
    if (len == sizeof http11 && std::memcmp(in + i + 1, http11, sizeof http11) == 0) {
      *out = in + i + 1;
      *outlen = static_cast<unsigned char>(len);
      return SSL_TLSEXT_ERR_OK;
    }
    i += 1 + len;
  }
  return SSL_TLSEXT_ERR_NOACK;
}

ctx_ptr build(const tls_options& o) {
  ERR_clear_error();
  ctx_ptr ctx{SSL_CTX_new(TLS_server_method())};
  if (!ctx) {
    throw tls_error("TLS: cannot create an OpenSSL context: " + openssl_reason());
  }
  SSL_CTX* c = ctx.get();
  int min_version = TLS1_2_VERSION;
  if (o.min_version == "1.3") {
    min_version = TLS1_3_VERSION;
  } else if (o.min_version != "1.2") {
    throw tls_error("ssl_min_version: expected 1.2 or 1.3, got \"" + o.min_version + "\"");
  }
  SSL_CTX_set_min_proto_version(c, min_version);
  SSL_CTX_set_options(
      c, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_NO_COMPRESSION);
  // A client's FIN without close_notify (a TCP half-close after its request)
  // is an end of input, as over plain TCP: OpenSSL 3 otherwise makes it a
  // fatal error, sends a decode_error alert and refuses to write the
  // response. HTTP's own framing tells a cut request from a whole one, as
  // nginx relies on with the same option.
  SSL_CTX_set_options(c, SSL_OP_IGNORE_UNEXPECTED_EOF);
  // Idle connections give their record buffers back; writes report each
  // record written and may be retried from a moved buffer (the connection's
  // output queue is coalesced anew on each try).
  SSL_CTX_set_mode(c, SSL_MODE_RELEASE_BUFFERS | SSL_MODE_ENABLE_PARTIAL_WRITE |
                          SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_read_ahead(c, 1);
  static constexpr unsigned char sid_context[] = {'c', 'a', 'd', 'e', 'l', 'o', 'o', 'p'};
  SSL_CTX_set_session_id_context(c, sid_context, sizeof sid_context);
  SSL_CTX_set_num_tickets(c, 1);
  // Tickets open on every pair of the server, with keys that rotate.
  use_shared_ticket_keys(c, o.ticket_rotation);
  SSL_CTX_set_alpn_select_cb(c, select_alpn, nullptr);

  // The certificate chain.
  const std::string cert_pem = read_file("ssl_certfile", o.certfile);
  if (SSL_CTX_use_certificate_chain_file(c, o.certfile.c_str()) != 1) {
    refuse("ssl_certfile", o.certfile, "is not a PEM certificate (" + openssl_reason() + ")");
  }
  // The key: in its own file or after the certificate.
  const std::string& key_path = o.keyfile.empty() ? o.certfile : o.keyfile;
  const std::string_view key_setting = o.keyfile.empty() ? "ssl_certfile" : "ssl_keyfile";
  const std::string key_pem = o.keyfile.empty() ? cert_pem : read_file(key_setting, key_path);
  std::unique_ptr<BIO, decltype(&BIO_free)> bio{
      BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())), &BIO_free};
  password_source pw{&o.keyfile_password};
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key{
      PEM_read_bio_PrivateKey(bio.get(), nullptr, password_cb, &pw), &EVP_PKEY_free};
  if (!key) {
    const bool encrypted = key_pem.find("ENCRYPTED") != std::string::npos;
    if (encrypted && o.keyfile_password.empty()) {
      refuse(key_setting, key_path, "the key is encrypted and ssl_keyfile_password is not set");
    }
    if (encrypted) {
      refuse(key_setting, key_path, "wrong ssl_keyfile_password (the key cannot be decrypted)");
    }
    refuse(key_setting, key_path, "is not a PEM private key");
  }
  if (SSL_CTX_use_PrivateKey(c, key.get()) != 1 || SSL_CTX_check_private_key(c) != 1) {
    refuse(key_setting, key_path, "the key does not match the certificate in " + o.certfile);
  }
  // Client certificates.
  if (o.cert_reqs < 0 || o.cert_reqs > 2) {
    throw tls_error("ssl_cert_reqs: expected 0 (none), 1 (optional) or 2 (required), got " +
                    std::to_string(o.cert_reqs));
  }
  if (!o.ca_certs.empty()) {
    (void)read_file("ssl_ca_certs", o.ca_certs);
    if (SSL_CTX_load_verify_locations(c, o.ca_certs.c_str(), nullptr) != 1) {
      refuse("ssl_ca_certs", o.ca_certs,
             "is not a PEM certificate bundle (" + openssl_reason() + ")");
    }
    if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(o.ca_certs.c_str())) {
      SSL_CTX_set_client_CA_list(c, names);
    }
  } else if (o.cert_reqs != 0) {
    throw tls_error("ssl_cert_reqs: " + std::to_string(o.cert_reqs) +
                    " verifies client certificates, which needs ssl_ca_certs");
  }
  if (o.cert_reqs == 1) {
    SSL_CTX_set_verify(c, SSL_VERIFY_PEER, nullptr);
  } else if (o.cert_reqs == 2) {
    SSL_CTX_set_verify(c, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  if (!o.ciphers.empty() && SSL_CTX_set_cipher_list(c, o.ciphers.c_str()) != 1) {
    throw tls_error("ssl_ciphers: no TLS 1.2 cipher matches \"" + o.ciphers + "\"");
  }
  if (!o.ciphersuites.empty() && SSL_CTX_set_ciphersuites(c, o.ciphersuites.c_str()) != 1) {
    throw tls_error("ssl_ciphersuites: no TLS 1.3 suite matches \"" + o.ciphersuites + "\"");
  }
  ERR_clear_error();
  return ctx;
}

std::mutex registry_mu;
std::vector<std::weak_ptr<tls_context>>& registry() {
  static std::vector<std::weak_ptr<tls_context>> r;
  return r;
}

}  // namespace

tls_context::tls_context(tls_options o) : opt_{std::move(o)}, ctx_{build(opt_).release()} {
  // OpenSSL writes to the socket with write(2), not send(MSG_NOSIGNAL) as
  // Asio does: a client gone mid-write must be an EPIPE, not a SIGPIPE that
  // kills the process. (CPython ignores SIGPIPE already; this is for a C++
  // host.) A handler someone installed is left alone.
  struct sigaction old {};
  if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
    std::signal(SIGPIPE, SIG_IGN);
  }
}

tls_context::~tls_context() {
  SSL_CTX_free(ctx_);
}

std::shared_ptr<tls_context> tls_context::shared(const tls_options& o) {
  const std::lock_guard lock{registry_mu};
  auto& r = registry();
  std::erase_if(r, [](const std::weak_ptr<tls_context>& w) { return w.expired(); });
  for (const auto& w : r) {
    if (auto p = w.lock(); p && p->options() == o) {
      return p;
    }
  }
  auto p = std::make_shared<tls_context>(o);
  r.push_back(p);
  return p;
}

void tls_context::check(const tls_options& o) {
  (void)build(o);
}

std::size_t tls_context::reload_all(std::string& problems) {
  std::vector<std::shared_ptr<tls_context>> live;
  {
    const std::lock_guard lock{registry_mu};
    for (const auto& w : registry()) {
      if (auto p = w.lock()) {
        live.push_back(std::move(p));
      }
    }
  }
  std::size_t n = 0;
  for (const auto& p : live) {
    std::string problem;
    if (p->reload(problem)) {
      ++n;
    } else {
      if (!problems.empty()) {
        problems.push_back('\n');
      }
      problems.append(problem);
    }
  }
  return n;
}

SSL_CTX* tls_context::acquire() const {
  const std::lock_guard lock{mu_};
  SSL_CTX_up_ref(ctx_);
  return ctx_;
}

bool tls_context::reload(std::string& problem) {
  ctx_ptr fresh;
  try {
    fresh = build(opt_);
  } catch (const tls_error& e) {
    problem = std::string{"TLS reload refused, the old certificate stays: "}.append(e.what());
    return false;
  }
  // Session tickets issued before the reload stay valid after it: the
  // ticket keys do not depend on the certificate (tls_tickets.cpp).
  const std::lock_guard lock{mu_};
  SSL_CTX_free(ctx_);
  ctx_ = fresh.release();
  ++generation_;
  return true;
}

std::uint64_t tls_context::generation() const {
  const std::lock_guard lock{mu_};
  return generation_;
}

}  // namespace cadeloop::net
