// libFuzzer target for the WebSocket side of net::http_server: the real
// connection state machine (reading, the frame parser, pongs, the queue
// limit, permessage-deflate, the close handshake, closing), not only the codec.
//
// Each input opens a connection over a Unix socket to one http_server run on
// this thread with a fake app (event_sink), does a real handshake, has the
// app accept it, then sends frames built from the input and pumps the
// server; the app echoes messages and may close. Finally the client closes
// and the server must forget the connection.
//
// Input: byte 0 picks the options (deflate offered, a small max_queue, the
// app closing, raw or built frames); byte 1 seeds the cut points. In raw
// mode the rest goes on the wire as it is; otherwise it is read as frames:
// [b0: FIN|RSV|opcode] [length] [payload...] with the client's mask applied
// (and, for RSV1 frames when deflate is on, the payload compressed by zlib).
//
// Invariants (abort): at most one on_ws_close per connection, before its
// on_disconnect; nothing names a connection after its on_disconnect; no
// message after on_ws_close; the server returns to no connections, no open
// WebSocket, no unsent bytes and no requests in flight.

#include <cadeloop/http/websocket.hpp>
#include <cadeloop/net/http_server.hpp>
#include <cadeloop/net/listener.hpp>

#include <boost/asio/io_context.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using cadeloop::net::byte_buffer;
using cadeloop::net::connection_id;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_ws_connection: %s\n", what);
  std::abort();
}

class fuzz_sink final : public cadeloop::net::event_sink {
 public:
  void on_request(connection_id conn, std::uint32_t request,
                  std::unique_ptr<cadeloop::http::request_head>&&,
                  const cadeloop::net::request_info& info) override {
    check_alive(conn);
    upgrade = {conn, request, info.websocket};
  }
  void on_body(connection_id conn, std::uint32_t, byte_buffer&&, bool) override {
    check_alive(conn);
  }
  void on_disconnect(connection_id conn) override {
    check_alive(conn);
    gone = true;
  }
  void on_drained(connection_id conn, std::uint64_t) override { check_alive(conn); }
  void on_ws_message(connection_id conn, byte_buffer&& payload, bool text) override {
    check_alive(conn);
    if (closed) {
      fail("a message after on_ws_close");
    }
    pending.push_back({std::string{payload.view()}, text});
  }
  void on_ws_close(connection_id conn, std::uint16_t, std::string&&) override {
    check_alive(conn);
    if (closed) {
      fail("on_ws_close twice");
    }
    closed = true;
  }

  void check_alive(connection_id) const {
    if (gone) {
      fail("an event after on_disconnect");
    }
  }

  struct upgrade_seen {
    connection_id conn{};
    std::uint32_t seq = 0;
    bool websocket = false;
  };
  struct message {
    std::string data;
    bool text;
  };
  upgrade_seen upgrade{};
  bool have_upgrade() const { return upgrade.conn.generation != 0; }
  std::vector<message> pending;
  bool closed = false;
  bool gone = false;
};

void pump(boost::asio::io_context& io, cadeloop::net::http_server& server) {
  io.restart();
  io.poll();
  server.flush_writes();
}

// A Unix socket: no ports to run out of, no TIME_WAIT, at thousands of
// connections a second.
std::string socket_path() {
  return "/tmp/fuzz_ws_connection." + std::to_string(::getpid()) + ".sock";
}

int connect_to(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), std::min(path.size() + 1, sizeof a.sun_path));
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    fail("connect");
  }
  return fd;
}

void drain_socket(int fd) {
  char buf[65536];
  while (::recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0) {
  }
}

std::string deflate_raw(std::string_view data) {
  z_stream z{};
  deflateInit2(&z, 1, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&z, data.size()) + 16, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_SYNC_FLUSH);
  out.resize(out.size() - z.avail_out);
  deflateEnd(&z);
  if (out.size() >= 4) {
    out.resize(out.size() - 4);
  }
  return out;
}

std::string build_frames(std::string_view in, bool deflate) {
  std::string wire;
  const cadeloop::http::ws_mask_key key{0x5a, 0xa5, 0x3c, 0xc3};
  while (in.size() >= 2) {
    const auto b0 = static_cast<std::uint8_t>(in[0]);
    std::size_t len = static_cast<std::uint8_t>(in[1]);
    in.remove_prefix(2);
    len = std::min(len, in.size());
    std::string payload{in.substr(0, len)};
    in.remove_prefix(len);
    if ((b0 & 0x40U) != 0 && deflate) {
      payload = deflate_raw(payload);
    }
    std::string frame;
    cadeloop::http::encode_ws_frame(frame, static_cast<cadeloop::http::ws_opcode>(b0 & 0x0FU),
                                    payload, (b0 & 0x80U) != 0, &key);
    frame[0] = static_cast<char>(static_cast<unsigned char>(frame[0]) | (b0 & 0x70U));
    wire += frame;
  }
  return wire;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) {
    return 0;
  }
  const std::uint8_t flags = data[0];
  const std::uint8_t seed = data[1];
  const std::string_view body{reinterpret_cast<const char*>(data) + 2, size - 2};
  const bool offer_deflate = (flags & 1U) != 0;
  const bool raw = (flags & 2U) != 0;
  const bool app_closes = (flags & 4U) != 0;
  cadeloop::net::server_options opt;
  opt.ws.max_queue = (flags & 8U) != 0 ? 1 : 8;
  opt.ws.ping_interval = std::chrono::milliseconds{0};
  opt.ws.close_timeout = std::chrono::milliseconds{200};
  opt.ws.max_message = 64 * 1024;
  opt.linger_timeout = std::chrono::milliseconds{200};

  // Everything per input: a server must not outlive its io_context, nor may
  // the context run after the server is gone.
  fuzz_sink sink;
  cadeloop::net::server_counters counters;
  boost::asio::io_context io;
  {
    cadeloop::net::http_server server{io, sink, opt, counters};
    std::string error;
    const std::string path = socket_path();
    auto l = cadeloop::net::open_listener(io, cadeloop::net::listen_spec::unix_socket(path), error);
    if (!l) {
      fail("no listener");
    }
    server.add_listener(std::move(l));

    const int fd = connect_to(path);
    std::string hello =
        "GET /f HTTP/1.1\r\nHost: f\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";
    if (offer_deflate) {
      hello += "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n";
    }
    hello += "\r\n";
    ::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL);
    for (int i = 0; i < 10000 && !sink.have_upgrade(); ++i) {
      pump(io, server);
    }
    if (!sink.have_upgrade() || !sink.upgrade.websocket) {
      fail("the handshake did not reach the app");
    }
    if (!server.ws_accept(sink.upgrade.conn, sink.upgrade.seq, {}, {})) {
      fail("accept refused");
    }
    const std::string wire = raw ? std::string{body} : build_frames(body, offer_deflate);
    // The wire in up to four pieces cut where the seed says, with the app
    // (echo, consume, maybe close) running between them.
    std::size_t at = 0;
    for (int piece = 0; piece < 4 && at <= wire.size(); ++piece) {
      std::size_t n = piece == 3 ? wire.size() - at
                                 : std::min(wire.size() - at,
                                            static_cast<std::size_t>((seed >> (2 * piece)) & 3U) *
                                                (wire.size() / 4 + 1));
      if (n != 0) {
        ::send(fd, wire.data() + at, n, MSG_NOSIGNAL);
      }
      at += n;
      for (int i = 0; i < 50; ++i) {
        pump(io, server);
        // ws_consumed may hand over the next message at once: take the list first.
        std::vector<fuzz_sink::message> taken;
        taken.swap(sink.pending);
        for (const auto& m : taken) {
          server.ws_send(sink.upgrade.conn, byte_buffer::copy_of(m.data), m.text, i == 0);
          server.ws_consumed(sink.upgrade.conn);
        }
        drain_socket(fd);
      }
      if (app_closes && piece == 1) {
        server.ws_close(sink.upgrade.conn, 1000, "bye");
      }
      if (at == wire.size()) {
        break;
      }
    }
    ::close(fd);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds{5};
    while (server.connection_count() != 0) {
      pump(io, server);
      if (std::chrono::steady_clock::now() > deadline) {
        fail("the connection outlived its client");
      }
      std::this_thread::sleep_for(std::chrono::microseconds{100});
    }
    if (!sink.gone) {
      fail("no on_disconnect");
    }
    if (counters.ws_open.get() != 0 || counters.unsent_bytes.get() != 0 ||
        counters.requests_in_flight.get() != 0) {
      fail("counters not back to zero");
    }
  }
  return 0;
}
