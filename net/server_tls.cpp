// http_server::impl, TLS: each connection of a TLS server gets an OpenSSL
// SSL on its own non-blocking socket descriptor (a socket BIO, so OpenSSL
// reads and writes the descriptor itself: no second copy through memory
// BIOs, and kTLS stays possible). The read and write sides call recv_some /
// send_some instead of the socket; the handshake runs inside the first
// reads. A plain HTTP request sent to the TLS port is answered in plain
// text with one 400; a handshake is bounded in time (the head timeout) and
// bytes; renegotiation is off (tls_context.cpp).

#include "server_impl.hpp"
#include "socket_calls.hpp"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

namespace cadeloop::net {

void ssl_deleter::operator()(ssl_st* s) const noexcept {
  SSL_free(s);
}

namespace {

/// Bytes a client may send before its handshake is done: a client hello,
/// a certificate chain and its proofs fit with room to spare.
constexpr std::uint64_t handshake_max_bytes = 64 * 1024;
/// Plaintext bytes per TLS record: small pieces are coalesced up to this.
constexpr std::size_t record_bytes = 16 * 1024;

constexpr std::string_view plain_http_reason = "plain HTTP to an HTTPS port";

/// The first byte of a plain HTTP request: a method's first letter.
bool looks_like_http(unsigned char b) noexcept {
  return b >= 'A' && b <= 'Z';
}

enum failure_class : std::size_t {
  fail_protocol = 0,
  fail_client_cert = 1,
  fail_timeout = 2,
  fail_plain_http = 3,
  fail_closed = 4,
};

std::string pem_of(X509* x) {
  std::string out;
  if (x == nullptr) {
    return out;
  }
  std::unique_ptr<BIO, decltype(&BIO_free)> bio{BIO_new(BIO_s_mem()), &BIO_free};
  if (bio && PEM_write_bio_X509(bio.get(), x) == 1) {
    char* text = nullptr;
    const long n = BIO_get_mem_data(bio.get(), &text);
    out.assign(text, static_cast<std::size_t>(std::max(n, 0L)));
  }
  return out;
}

failure_class classify(int ssl_error) noexcept {
  if (ssl_error != SSL_ERROR_SSL) {
    return fail_closed;
  }
  const unsigned long e = ERR_peek_last_error();
  const int reason = ERR_GET_REASON(e);
  if (reason == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE ||
      reason == SSL_R_CERTIFICATE_VERIFY_FAILED) {
    return fail_client_cert;
  }
  return fail_protocol;
}

}  // namespace

bool http_server::impl::tls_open(connection& c) {
  if (!tls_) {
    return true;
  }
  SSL_CTX* ctx = tls_->acquire();
  SSL* s = SSL_new(ctx);
  SSL_CTX_free(ctx);  // SSL_new took its own reference
  if (s == nullptr) {
    ERR_clear_error();
    return false;
  }
  c.tls.ssl.reset(s);
  if (SSL_set_fd(s, c.socket->native_handle()) != 1) {
    ERR_clear_error();
    return false;
  }
  SSL_set_accept_state(s);
  return true;
}

void http_server::impl::tls_note_handshake(connection& c) {
  SSL* s = c.tls.ssl.get();
  if (c.tls.established || SSL_is_init_finished(s) == 0) {
    return;
  }
  c.tls.established = true;
  ctr_.tls_handshakes.add();
  if (SSL_session_reused(s) != 0) {
    ctr_.tls_resumed.add();
  }
  ctr_.tls_versions[SSL_version(s) == TLS1_3_VERSION ? 1 : 0].add();
  c.tls.details = tls_ref::adopt(make_details(s).release());
}

std::unique_ptr<tls_details> http_server::impl::make_details(SSL* s) {
  auto d = std::make_unique<tls_details>();
  d->version = static_cast<std::uint16_t>(SSL_version(s));
  if (const SSL_CIPHER* cipher = SSL_get_current_cipher(s)) {
    d->cipher_suite = SSL_CIPHER_get_protocol_id(cipher);
  }
  // The server's certificate is the same for every connection of a context.
  SSL_CTX* ctx = SSL_get_SSL_CTX(s);
  if (ctx != tls_pem_ctx_ || !tls_server_pem_) {
    tls_pem_ctx_ = ctx;
    tls_server_pem_ = std::make_shared<const std::string>(pem_of(SSL_get_certificate(s)));
  }
  d->server_cert = tls_server_pem_;
  if (X509* leaf = SSL_get0_peer_certificate(s)) {
    d->client_cert_chain.push_back(pem_of(leaf));
    if (STACK_OF(X509)* chain =
            SSL_get_peer_cert_chain(s)) {  // the server's view: without the leaf
      for (int i = 0; i < sk_X509_num(chain); ++i) {
        d->client_cert_chain.push_back(pem_of(sk_X509_value(chain, i)));
      }
    }
    std::unique_ptr<BIO, decltype(&BIO_free)> bio{BIO_new(BIO_s_mem()), &BIO_free};
    if (bio &&
        X509_NAME_print_ex(bio.get(), X509_get_subject_name(leaf), 0, XN_FLAG_RFC2253) >= 0) {
      char* text = nullptr;
      const long n = BIO_get_mem_data(bio.get(), &text);
      d->client_cert_name.assign(text, static_cast<std::size_t>(std::max(n, 0L)));
    }
    if (const long v = SSL_get_verify_result(s); v != X509_V_OK) {
      d->client_cert_error = X509_verify_cert_error_string(v);
    }
  }
  ERR_clear_error();
  return d;
}

void http_server::impl::tls_fail(connection& c, std::size_t reason_class) {
  if (c.tls.handshaking()) {
    ctr_.tls_failures[reason_class].add();
    c.tls.failed = true;
  }
}

std::size_t http_server::impl::recv_some(connection& c, char* p, std::size_t n, error_code& ec) {
  if (!c.tls.active()) {
    return recv_one(c.socket->native_handle(), p, n, ec);
  }
  ec = {};
  SSL* s = c.tls.ssl.get();
  if (!c.tls.first_byte_seen) {
    unsigned char b = 0;
    const ssize_t r = ::recv(c.socket->native_handle(), &b, 1, MSG_PEEK);
    if (r < 0) {
      // An interrupted peek is tried again when the socket is next readable.
      ec = errno == EINTR ? error_code{asio::error::would_block} : socket_error(errno);
      return 0;
    }
    if (r == 0) {
      tls_fail(c, fail_closed);
      ec = asio::error::eof;
      return 0;
    }
    c.tls.first_byte_seen = true;
    if (b != 0x16) {  // not a TLS handshake record
      if (looks_like_http(b)) {
        // Answer in plain text, once, and close: settle() writes the 400.
        tls_fail(c, fail_plain_http);
        c.tls.ssl.reset();
        c.error_status = 400;
        c.error_reason = plain_http_reason;
        ec = asio::error::would_block;
        return 0;
      }
      tls_fail(c, fail_protocol);
      ec = asio::error::connection_aborted;
      return 0;
    }
  }
  std::size_t got = 0;
  c.tls.more_buffered = false;
  while (got < n) {
    ERR_clear_error();
    const int r = SSL_read(s, p + got, static_cast<int>(std::min<std::size_t>(n - got, INT_MAX)));
    if (r > 0) {
      got += static_cast<std::size_t>(r);
      continue;
    }
    const int err = SSL_get_error(s, r);
    tls_note_handshake(c);
    if (err == SSL_ERROR_WANT_READ) {
      if (c.tls.handshaking() && BIO_number_read(SSL_get_rbio(s)) > handshake_max_bytes) {
        tls_fail(c, fail_closed);
        ec = asio::error::connection_aborted;
        return 0;
      }
      break;
    }
    if (err == SSL_ERROR_WANT_WRITE) {
      c.tls.read_wants_write = true;
      break;
    }
    if (err == SSL_ERROR_ZERO_RETURN) {
      tls_fail(c, fail_closed);  // counted only when the handshake was not done
      if (got == 0) {
        ec = asio::error::eof;  // close_notify
      }
      return got;
    }
    // A failed handshake (OpenSSL sent its alert), a bad record, or the
    // client gone without close_notify.
    const bool handshaking = c.tls.handshaking();
    tls_fail(c, classify(err));
    ERR_clear_error();
    if (got == 0) {
      ec = !handshaking && err == SSL_ERROR_SYSCALL && errno == 0
               ? error_code{asio::error::eof}
               : error_code{asio::error::connection_aborted};
    }
    return got;
  }
  tls_note_handshake(c);
  if (got == n) {
    c.tls.more_buffered = true;  // records may wait inside OpenSSL, not in the socket
  }
  if (got == 0 && !ec) {
    ec = asio::error::would_block;
  }
  return got;
}

bool http_server::impl::tls_arm_read(connection& c) {
  if (!c.tls.active() || c.phase != conn_phase::open) {
    return false;
  }
  const connection_id id = c.id();
  if (c.tls.read_wants_write) {
    c.tls.read_wants_write = false;
    c.socket->async_wait(asio::socket_base::wait_write,
                         [this, id](const error_code& ec) { on_readable(id, ec); });
    return true;
  }
  if (c.tls.more_buffered || SSL_pending(c.tls.ssl.get()) > 0) {
    asio::post(io_, [this, id] { on_readable(id, {}); });
    return true;
  }
  return false;
}

std::size_t http_server::impl::send_some(connection& c, const std::vector<asio::const_buffer>& iov,
                                         error_code& ec, int flags) {
  if (!c.tls.active()) {
    if (iov.size() == 1 && iov[0].size() > 0) {
      // One piece (a head with a small body is built as one): send(2).
      // sendmsg(2) would make the kernel import a msghdr and an iovec for
      // every response.
      return send_one(c.socket->native_handle(), iov[0].data(), iov[0].size(), ec, flags);
    }
    return send_gather(c.socket->native_handle(), iov, ec, flags);
  }
  ec = {};
  SSL* s = c.tls.ssl.get();
  std::size_t total = 0;
  std::size_t piece = 0;
  std::size_t off = 0;
  for (;;) {
    while (piece < iov.size() && off == iov[piece].size()) {
      ++piece;
      off = 0;
    }
    if (piece == iov.size()) {
      break;
    }
    // One record: from the current piece if it holds a whole one, else the
    // pieces from here coalesced. A retry after WANT_WRITE rebuilds the
    // same bytes (the queue only grows meanwhile), which OpenSSL requires.
    const char* data = static_cast<const char*>(iov[piece].data()) + off;
    std::size_t len = iov[piece].size() - off;
    if (len >= record_bytes) {
      len = record_bytes;
    } else if (piece + 1 < iov.size()) {
      tls_scratch_.assign(data, len);
      for (std::size_t i = piece + 1; i < iov.size() && tls_scratch_.size() < record_bytes; ++i) {
        const std::size_t take = std::min(iov[i].size(), record_bytes - tls_scratch_.size());
        tls_scratch_.append(static_cast<const char*>(iov[i].data()), take);
      }
      data = tls_scratch_.data();
      len = tls_scratch_.size();
    }
    ERR_clear_error();
    const int r = SSL_write(s, data, static_cast<int>(len));
    if (r <= 0) {
      const int err = SSL_get_error(s, r);
      ERR_clear_error();
      if (total == 0) {
        ec = err == SSL_ERROR_WANT_WRITE ? error_code{asio::error::would_block}
                                         : error_code{asio::error::broken_pipe};
      }
      break;
    }
    total += static_cast<std::size_t>(r);
    for (auto left = static_cast<std::size_t>(r); left > 0;) {
      const std::size_t here = std::min(left, iov[piece].size() - off);
      off += here;
      left -= here;
      if (off == iov[piece].size() && left > 0) {
        ++piece;
        off = 0;
      }
    }
  }
  return total;
}

void http_server::impl::tls_close_notify(connection& c) {
  if (c.tls.active() && c.tls.established) {
    ERR_clear_error();
    (void)SSL_shutdown(c.tls.ssl.get());  // one try: the alert goes out or not
    ERR_clear_error();
  }
}

bool http_server::impl::tls_expire(connection& c) {
  if (!c.tls.handshaking()) {
    return false;
  }
  tls_fail(c, fail_timeout);
  close_now(c);
  return true;
}

}  // namespace cadeloop::net
