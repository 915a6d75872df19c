// TLS through net::http_server, driven directly on the test's thread: a
// self-signed certificate made here, an OpenSSL client on a non-blocking
// loopback socket, the test playing the app. Covers the TLS read and write
// paths (handshake inside the first reads, records held inside OpenSSL,
// coalesced and partial writes, close_notify), the plain-HTTP answer, and
// one context shared by servers on several threads while it is reloaded
// (the part run under TSan).

#include "pump_until.hpp"

#include <cadeloop/net/http_server.hpp>
#include <cadeloop/net/listener.hpp>
#include <cadeloop/net/tls_context.hpp>

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using cadeloop::net::byte_buffer;
using cadeloop::net::connection_id;
using cadeloop::net::http_server;
using cadeloop::net::listen_spec;
using cadeloop::net::request_info;
using cadeloop::net::send_flags;
using cadeloop::net::server_counters;
using cadeloop::net::server_options;

// A self-signed EC certificate and its key in a temporary directory.
struct test_cert {
  std::filesystem::path dir;
  std::string cert;
  std::string key;

  test_cert() {
    char tmpl[] = "/tmp/tls_server_test.XXXXXX";
    dir = ::mkdtemp(tmpl);
    cert = (dir / "cert.pem").string();
    key = (dir / "key.pem").string();
    EVP_PKEY* pkey = EVP_EC_gen("P-256");
    X509* x = X509_new();
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), 0);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600);
    X509_set_pubkey(x, pkey);
    X509_NAME* name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>("localhost"), -1, -1, 0);
    X509_set_issuer_name(x, name);
    X509_sign(x, pkey, EVP_sha256());
    FILE* f = std::fopen(cert.c_str(), "w");
    PEM_write_X509(f, x);
    std::fclose(f);
    f = std::fopen(key.c_str(), "w");
    PEM_write_PrivateKey(f, pkey, nullptr, nullptr, 0, nullptr, nullptr);
    std::fclose(f);
    X509_free(x);
    EVP_PKEY_free(pkey);
  }
  ~test_cert() { std::filesystem::remove_all(dir); }
};

struct seen_request {
  connection_id conn{};
  std::uint32_t seq = 0;
  std::string target;
  bool tls = false;
  std::uint16_t version = 0;
};

class recording_sink final : public cadeloop::net::event_sink {
 public:
  void on_request(connection_id conn, std::uint32_t request,
                  std::unique_ptr<cadeloop::http::request_head>&& head,
                  const request_info& info) override {
    requests.push_back({conn, request, std::string{head->target()}, info.tls,
                        info.tls_info ? info.tls_info->version : std::uint16_t{0}});
  }
  void on_body(connection_id conn, std::uint32_t, byte_buffer&& bytes, bool more) override {
    body_bytes += bytes.size();
    body_done = !more;
    body_conn = conn;
    unconsumed += bytes.size();
  }
  void on_disconnect(connection_id) override { ++disconnects; }
  void on_drained(connection_id, std::uint64_t) override {}

  std::vector<seen_request> requests;
  std::size_t body_bytes = 0;
  std::size_t unconsumed = 0;
  bool body_done = false;
  connection_id body_conn{};
  int disconnects = 0;
};

// An OpenSSL client on a non-blocking socket; every call returns at once.
class tls_client {
 public:
  explicit tls_client(std::uint16_t port) {
    ctx_ = SSL_CTX_new(TLS_client_method());
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0;
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
    ssl_ = SSL_new(ctx_);
    SSL_set_fd(ssl_, fd_);
    SSL_set_connect_state(ssl_);
  }
  tls_client(const tls_client&) = delete;
  tls_client& operator=(const tls_client&) = delete;
  ~tls_client() {
    SSL_free(ssl_);
    SSL_CTX_free(ctx_);
    ::close(fd_);
  }

  [[nodiscard]] bool connected() const noexcept { return connected_; }
  [[nodiscard]] int fd() const noexcept { return fd_; }
  // Moves the handshake on; true once it is done.
  bool handshake() {
    ERR_clear_error();
    return SSL_do_handshake(ssl_) == 1;
  }
  // Writes what it can of `out` (kept for the next call).
  void flush() {
    while (!out.empty()) {
      ERR_clear_error();
      const int n =
          SSL_write(ssl_, out.data(), static_cast<int>(std::min<std::size_t>(out.size(), 1 << 20)));
      if (n <= 0) {
        return;
      }
      out.erase(0, static_cast<std::size_t>(n));
    }
  }
  // Takes whatever has arrived.
  void poll() {
    char buf[16384];
    for (;;) {
      ERR_clear_error();
      const int n = SSL_read(ssl_, buf, sizeof buf);
      if (n > 0) {
        in.append(buf, static_cast<std::size_t>(n));
        continue;
      }
      const int err = SSL_get_error(ssl_, n);
      if (err == SSL_ERROR_ZERO_RETURN) {
        close_notify = true;
      } else if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) {
        broken = true;
      }
      return;
    }
  }

  std::string out;
  std::string in;
  bool close_notify = false;
  bool broken = false;

 private:
  SSL_CTX* ctx_ = nullptr;
  SSL* ssl_ = nullptr;
  int fd_ = -1;
  bool connected_ = false;
};

class tls_server_test : public ::testing::Test {
 protected:
  void start() {
    opt.tls.certfile = cert.cert;
    opt.tls.keyfile = cert.key;
    std::string error;
    auto l = cadeloop::net::open_listener(io, listen_spec::tcp("127.0.0.1", 0), error);
    ASSERT_NE(l, nullptr) << error;
    port = l->local_address().port;
    server = std::make_unique<http_server>(io, sink, opt, counters);
    server->add_listener(std::move(l));
  }
  void TearDown() override { server.reset(); }

  void pump() {
    io.restart();
    io.poll();
    server->flush_writes();
  }
  bool pump_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 5s) {
    return cadeloop::test::pump_until([this] { pump(); }, pred, timeout, 100us);
  }

  test_cert cert;
  boost::asio::io_context io;
  recording_sink sink;
  server_counters counters;
  server_options opt;
  std::unique_ptr<http_server> server;
  std::uint16_t port = 0;
};

std::string response(std::size_t body) {
  return "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body) + "\r\n\r\n" +
         std::string(body, 'b');
}

TEST_F(tls_server_test, PipelinedRequestsAndLargeResponsesInOrder) {
  start();
  tls_client c{port};
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(pump_until([&] { return c.handshake(); }));
  c.out =
      "GET /a HTTP/1.1\r\nHost: t\r\n\r\nGET /b HTTP/1.1\r\nHost: t\r\n\r\n"
      "GET /c HTTP/1.1\r\nHost: t\r\n\r\n";
  c.flush();
  ASSERT_TRUE(pump_until([&] { return sink.requests.size() == 3; }));
  for (const seen_request& r : sink.requests) {
    EXPECT_TRUE(r.tls);
    EXPECT_EQ(r.version, TLS1_3_VERSION);
  }
  EXPECT_EQ(counters.tls_handshakes.get(), 1U);
  EXPECT_EQ(counters.tls_versions[1].get(), 1U);
  // Answered out of order, in several pieces each: small ones coalesce into
  // a record, the large ones fill the socket and are written in parts.
  const std::size_t sizes[] = {3 * 1024 * 1024, 17, 700 * 1024};
  for (int i = 2; i >= 0; --i) {
    const std::string whole = response(sizes[i]);
    const std::size_t half = whole.size() / 2;
    send_flags more;
    ASSERT_TRUE(server->send(sink.requests[static_cast<std::size_t>(i)].conn,
                             static_cast<std::uint32_t>(i),
                             byte_buffer::copy_of(whole.substr(0, half)), more));
    send_flags end;
    end.end_of_response = true;
    ASSERT_TRUE(server->send(sink.requests[static_cast<std::size_t>(i)].conn,
                             static_cast<std::uint32_t>(i),
                             byte_buffer::copy_of(whole.substr(half)), end));
  }
  const std::string expected = response(sizes[0]) + response(sizes[1]) + response(sizes[2]);
  ASSERT_TRUE(pump_until(
      [&] {
        c.poll();
        return c.in.size() >= expected.size();
      },
      20s));
  EXPECT_TRUE(c.in == expected);
  EXPECT_FALSE(c.broken);
}

TEST_F(tls_server_test, LargeUploadReadThroughOpenSslBuffers) {
  opt.body_window = 64 * 1024;
  start();
  tls_client c{port};
  ASSERT_TRUE(pump_until([&] { return c.handshake(); }));
  const std::size_t n = 4 * 1024 * 1024;
  c.out = "POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: " + std::to_string(n) + "\r\n\r\n" +
          std::string(n, 'u');
  ASSERT_TRUE(pump_until(
      [&] {
        c.flush();
        if (sink.unconsumed > 0) {  // the app reads the body as it comes
          server->consume(sink.body_conn, sink.unconsumed);
          sink.unconsumed = 0;
        }
        return sink.body_done;
      },
      20s));
  EXPECT_EQ(sink.body_bytes, n);
  ASSERT_EQ(sink.requests.size(), 1U);
  send_flags end;
  end.end_of_response = true;
  end.keep_alive = false;
  ASSERT_TRUE(server->send(sink.requests[0].conn, 0, byte_buffer::copy_of(response(2)), end));
  ASSERT_TRUE(pump_until([&] {
    c.poll();
    return c.close_notify;
  }));
  EXPECT_EQ(c.in, response(2));
}

TEST_F(tls_server_test, PlainHttpGetsAPlainTextAnswer) {
  start();
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a), 0);
  const std::string req = "GET / HTTP/1.1\r\nHost: t\r\n\r\n";
  ASSERT_EQ(::send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  std::string in;
  bool eof = false;
  ASSERT_TRUE(pump_until([&] {
    char buf[4096];
    const ssize_t r = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r > 0) {
      in.append(buf, static_cast<std::size_t>(r));
    } else if (r == 0) {
      eof = true;
    }
    return eof;
  }));
  ::close(fd);
  EXPECT_EQ(in.rfind("HTTP/1.1 400 ", 0), 0U) << in;
  EXPECT_NE(in.find("plain HTTP to an HTTPS port"), std::string::npos) << in;
  EXPECT_TRUE(sink.requests.empty());
  EXPECT_EQ(counters.tls_failures[3].get(), 1U);
}

// Servers on two threads share one context while a third thread reloads it:
// every handshake completes (with the old context or the new one).
TEST_F(tls_server_test, SharedContextReloadedWhileServing) {
  opt.tls.certfile = cert.cert;
  opt.tls.keyfile = cert.key;
  std::atomic<bool> stop{false};
  std::atomic<int> done{0};
  auto serve = [&] {
    boost::asio::io_context tio;
    recording_sink tsink;
    server_counters tctr;
    std::string error;
    auto l = cadeloop::net::open_listener(tio, listen_spec::tcp("127.0.0.1", 0), error);
    ASSERT_NE(l, nullptr) << error;
    const std::uint16_t p = l->local_address().port;
    auto s = std::make_unique<http_server>(tio, tsink, opt, tctr);
    s->add_listener(std::move(l));
    for (int i = 0; i < 10; ++i) {
      tls_client c{p};
      const auto deadline = std::chrono::steady_clock::now() + 5s;
      bool ok = false;
      while (!ok && std::chrono::steady_clock::now() < deadline) {
        tio.restart();
        tio.poll();
        s->flush_writes();
        ok = c.handshake();
      }
      EXPECT_TRUE(ok);
      done.fetch_add(ok ? 1 : 0);
    }
    s.reset();
  };
  std::thread reloader{[&] {
    while (!stop.load()) {
      std::string problems;
      cadeloop::net::tls_context::reload_all(problems);
      EXPECT_EQ(problems, "");
      std::this_thread::sleep_for(1ms);
    }
  }};
  std::thread a{serve};
  std::thread b{serve};
  a.join();
  b.join();
  stop = true;
  reloader.join();
  EXPECT_EQ(done.load(), 20);
}

// Session tickets through two separately built contexts (as two worker
// processes forked from one supervisor have): a ticket one makes, the other
// opens. Plain OpenSSL on a socket pair; the test drives both ends.
struct ticket_pair {
  SSL* server = nullptr;
  SSL* client = nullptr;
  int fds[2]{-1, -1};

  ticket_pair(SSL_CTX* server_ctx, SSL_CTX* client_ctx, SSL_SESSION* resume) {
    ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds);
    server = SSL_new(server_ctx);
    SSL_set_fd(server, fds[0]);
    SSL_set_accept_state(server);
    client = SSL_new(client_ctx);
    SSL_set_fd(client, fds[1]);
    SSL_set_connect_state(client);
    if (resume != nullptr) {
      SSL_set_session(client, resume);
    }
  }
  ~ticket_pair() {
    (void)SSL_shutdown(client);  // a client freed without it marks its session not resumable
    ERR_clear_error();
    SSL_free(server);
    SSL_free(client);
    ::close(fds[0]);
    ::close(fds[1]);
  }
  ticket_pair(const ticket_pair&) = delete;
  ticket_pair& operator=(const ticket_pair&) = delete;

  /// Handshake, one byte each way (the client reads the TLS 1.3 ticket
  /// on the way); true when both ends are done.
  bool exchange() {
    bool s_done = false;
    bool c_done = false;
    for (int i = 0; i < 50 && !(s_done && c_done); ++i) {
      s_done = s_done || SSL_do_handshake(server) == 1;
      c_done = c_done || SSL_do_handshake(client) == 1;
    }
    char b = 'x';
    if (!s_done || !c_done || SSL_write(server, &b, 1) != 1) {
      return false;
    }
    for (int i = 0; i < 50; ++i) {
      if (SSL_read(client, &b, 1) == 1) {
        ERR_clear_error();
        return true;
      }
    }
    return false;
  }
};

TEST(tls_tickets, ATicketOneContextMadeOpensOnAnother) {
  test_cert cert;
  cadeloop::net::tls_options o;
  o.certfile = cert.cert;
  o.keyfile = cert.key;
  cadeloop::net::tls_context first{o};
  cadeloop::net::tls_context second{o};
  SSL_CTX* a = first.acquire();
  SSL_CTX* b = second.acquire();
  SSL_CTX* client_ctx = SSL_CTX_new(TLS_client_method());
  SSL_SESSION* session = nullptr;
  {
    ticket_pair p{a, client_ctx, nullptr};
    ASSERT_TRUE(p.exchange());
    EXPECT_EQ(SSL_session_reused(p.server), 0);
    session = SSL_get1_session(p.client);
  }
  ASSERT_NE(session, nullptr);
  ASSERT_EQ(SSL_SESSION_has_ticket(session), 1);
  for (SSL_CTX* server_ctx : {b, a, b, a, b}) {
    ticket_pair p{server_ctx, client_ctx, session};
    ASSERT_TRUE(p.exchange());
    EXPECT_EQ(SSL_session_reused(p.server), 1);
  }
  // After a reload the same ticket still opens.
  std::string problem;
  ASSERT_TRUE(second.reload(problem)) << problem;
  SSL_CTX* reloaded = second.acquire();
  {
    ticket_pair p{reloaded, client_ctx, session};
    ASSERT_TRUE(p.exchange());
    EXPECT_EQ(SSL_session_reused(p.server), 1);
  }
  SSL_SESSION_free(session);
  SSL_CTX_free(reloaded);
  SSL_CTX_free(client_ctx);
  SSL_CTX_free(a);
  SSL_CTX_free(b);
}

}  // namespace
