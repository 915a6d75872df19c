#pragma once

#include <cadeloop/net/connection_id.hpp>

#include <boost/asio/basic_socket_acceptor.hpp>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace cadeloop::net {

/// Where a core pair listens. Plain data; any thread builds one, the thread
/// that opens the listener reads it.
struct listen_spec {
  /// Which of the fields below apply.
  enum class kind_type : std::uint8_t {
    tcp,           ///< `host`:`port`, SO_REUSEPORT so every pair binds its own listener
    unix_socket,   ///< `path`; a stale socket file is removed, any other file refused
    inherited_fd,  ///< `fd`, an already listening stream socket (systemd socket activation)
  };

  kind_type kind = kind_type::tcp;
  /// tcp: a numeric address or a name resolved once at open ("localhost").
  std::string host = "127.0.0.1";
  /// tcp: the port; 0 picks an ephemeral one (see `listener::local_address()`).
  std::uint16_t port = 8000;
  /// tcp and unix_socket: the listen(2) backlog.
  int backlog = 1024;
  /// tcp: set SO_REUSEPORT (one listener per core pair on the same port).
  bool reuse_port = true;
  /// unix_socket: the socket file's path.
  std::string path;
  /// unix_socket: the socket file's permission bits, set after bind whatever
  /// the umask (setting uds_mode).
  unsigned mode = 0660;
  /// inherited_fd: the descriptor. The listener owns it once opened (and
  /// closes it); on a refusal it is left open for the caller.
  int fd = -1;

  /// A TCP listen spec. Any thread.
  [[nodiscard]] static listen_spec tcp(std::string host, std::uint16_t port, int backlog = 1024);
  /// A Unix socket listen spec. Any thread.
  [[nodiscard]] static listen_spec unix_socket(std::string path, int backlog = 1024);
  /// An inherited listening descriptor. Any thread.
  [[nodiscard]] static listen_spec inherited(int fd);

  /// How a user wrote it: "127.0.0.1:8000", "[::1]:8000", "unix:/run/app.sock", "fd 3".
  /// Any thread.
  [[nodiscard]] std::string describe() const;
};

/// The acceptor type every listener kind uses: generic, so TCP, Unix and
/// inherited sockets share one code path.
using generic_acceptor = boost::asio::basic_socket_acceptor<boost::asio::generic::stream_protocol>;

/// One listening socket of one I/O thread. Opened by `open_listener` (on any
/// thread, before the I/O thread runs), then used and destroyed by the I/O
/// thread that owns `io_context`. A Unix socket listener removes its socket
/// file when destroyed.
class listener {
 public:
  /// Use `open_listener`.
  listener(generic_acceptor acceptor, listen_spec spec, socket_address local, bool is_tcp) noexcept;
  listener(const listener&) = delete;
  listener& operator=(const listener&) = delete;
  /// Closes the socket (and removes a Unix socket's file). The owning thread.
  ~listener();

  /// The acceptor, non-blocking. The owning thread.
  [[nodiscard]] generic_acceptor& acceptor() noexcept { return acceptor_; }
  /// The bound address (the real port when 0 was asked for). Any thread
  /// once opened (it never changes).
  [[nodiscard]] const socket_address& local_address() const noexcept { return local_; }
  /// True for TCP (IPv4/IPv6) listeners: accepted sockets get TCP_NODELAY. Any thread.
  [[nodiscard]] bool is_tcp() const noexcept { return is_tcp_; }
  /// The spec it was opened from. Any thread.
  [[nodiscard]] const listen_spec& spec() const noexcept { return spec_; }
  /// "127.0.0.1:43211" (the real port), "unix:/path" or "fd 3". Any thread.
  [[nodiscard]] std::string description() const;
  /// Closes the socket now (the file of a Unix socket is removed). The owning thread.
  void close() noexcept;

 private:
  generic_acceptor acceptor_;
  listen_spec spec_;
  socket_address local_;
  bool is_tcp_ = false;
};

/// Opens the listener `spec` describes, on `io`. On failure returns nullptr
/// and sets `error` to one line for the user, e.g.
/// "cannot listen on 127.0.0.1:8000: address already in use". Any thread
/// (the listener then belongs to the thread that runs `io`).
[[nodiscard]] std::unique_ptr<listener> open_listener(boost::asio::io_context& io, const listen_spec& spec,
                                                      std::string& error);

}  // namespace cadeloop::net
