// Listeners: TCP with SO_REUSEPORT, Unix-domain sockets and inherited
// (systemd) descriptors, opened non-blocking for an I/O thread's acceptor.

#include "cadeloop/net/listener.hpp"

#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

namespace cadeloop::net {

namespace asio = boost::asio;
using generic_endpoint = asio::generic::stream_protocol::endpoint;

namespace {

// "Address already in use" -> "address already in use": the message ends a
// sentence that starts with "cannot listen on ...".
std::string lower_first(std::string text) {
  if (!text.empty()) {
    text[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(text[0])));
  }
  return text;
}

std::string failure(const listen_spec& spec, const std::string& why) {
  return "cannot listen on " + spec.describe() + ": " + why;
}

std::string failure(const listen_spec& spec, const boost::system::error_code& ec) {
  return failure(spec, lower_first(ec.message()));
}

std::string failure_errno(const listen_spec& spec, int err) {
  return failure(spec, lower_first(std::generic_category().message(err)));
}

socket_address address_of(const generic_endpoint& ep) {
  return socket_address::from_sockaddr(ep.data(), ep.size());
}

// Binds and listens `acceptor` (already open) on `ep`; sets the socket
// non-blocking so accepts never wait, and close-on-exec (a process the app
// starts does not hold the port).
bool bind_and_listen(generic_acceptor& acceptor, const generic_endpoint& ep, int backlog,
                     boost::system::error_code& ec) {
  acceptor.bind(ep, ec);
  if (ec) {
    return false;
  }
  acceptor.listen(backlog, ec);
  if (ec) {
    return false;
  }
  acceptor.non_blocking(true, ec);
  if (!ec && ::fcntl(acceptor.native_handle(), F_SETFD, FD_CLOEXEC) != 0) {
    ec = boost::system::error_code{errno, boost::system::system_category()};
  }
  return !ec;
}

std::unique_ptr<listener> open_tcp(asio::io_context& io, const listen_spec& spec,
                                   std::string& error) {
  boost::system::error_code ec;
  asio::ip::address address = asio::ip::make_address(spec.host, ec);
  if (ec) {
    // Not numeric: resolve the name once, take the first address.
    asio::ip::tcp::resolver resolver{io};
    auto results = resolver.resolve(spec.host, std::to_string(spec.port), ec);
    if (ec || results.empty()) {
      error = failure(spec, "cannot resolve host '" + spec.host + "'");
      return nullptr;
    }
    address = results.begin()->endpoint().address();
  }
  const generic_endpoint ep{asio::ip::tcp::endpoint{address, spec.port}};
  generic_acceptor acceptor{io};
  acceptor.open(ep.protocol(), ec);
  if (ec) {
    error = failure(spec, ec);
    return nullptr;
  }
  const int one = 1;
  if (::setsockopt(acceptor.native_handle(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      (spec.reuse_port &&
       ::setsockopt(acceptor.native_handle(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0)) {
    error = failure_errno(spec, errno);
    return nullptr;
  }
  // Accepted sockets get it from the listener (Linux copies it), which saves
  // a setsockopt per connection; the server checks that on its first one.
  (void)::setsockopt(acceptor.native_handle(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (!bind_and_listen(acceptor, ep, spec.backlog, ec)) {
    error = failure(spec, ec);
    return nullptr;
  }
  const generic_endpoint local = acceptor.local_endpoint(ec);
  if (ec) {
    error = failure(spec, ec);
    return nullptr;
  }
  return std::make_unique<listener>(std::move(acceptor), spec, address_of(local), true);
}

std::unique_ptr<listener> open_unix(asio::io_context& io, const listen_spec& spec,
                                    std::string& error) {
  if (spec.path.empty()) {
    error = failure(spec, "empty socket path");
    return nullptr;
  }
  if (spec.path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    error = failure(spec, "socket path longer than " +
                              std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) + " bytes");
    return nullptr;
  }
  struct stat st {};
  if (::lstat(spec.path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      error = failure(spec, "the path exists and is not a socket");
      return nullptr;
    }
    // A socket file: live (someone accepts on it) or stale (left by a dead
    // process). Only a stale one may be removed.
    asio::local::stream_protocol::socket probe{io};
    boost::system::error_code probe_ec;
    probe.connect(asio::local::stream_protocol::endpoint{spec.path}, probe_ec);
    if (!probe_ec) {
      error = failure(spec, "address already in use");
      return nullptr;
    }
    if (::unlink(spec.path.c_str()) != 0 && errno != ENOENT) {
      error = failure(spec, "cannot remove the stale socket file: " +
                                lower_first(std::generic_category().message(errno)));
      return nullptr;
    }
  }
  const generic_endpoint ep{asio::local::stream_protocol::endpoint{spec.path}};
  generic_acceptor acceptor{io};
  boost::system::error_code ec;
  acceptor.open(ep.protocol(), ec);
  if (ec || !bind_and_listen(acceptor, ep, spec.backlog, ec)) {
    error = failure(spec, ec);
    return nullptr;
  }
  // The file's mode would otherwise follow the umask (0777 under umask 000).
  if (::chmod(spec.path.c_str(), static_cast<mode_t>(spec.mode & 07777U)) != 0) {
    error = failure(spec, "cannot set the socket file's mode: " +
                              lower_first(std::generic_category().message(errno)));
    ::unlink(spec.path.c_str());
    return nullptr;
  }
  socket_address local;
  local.family = socket_address::family_kind::unix_socket;
  return std::make_unique<listener>(std::move(acceptor), spec, local, false);
}

std::unique_ptr<listener> open_inherited(asio::io_context& io, const listen_spec& spec,
                                         std::string& error) {
  const int fd = spec.fd;
  int type = 0;
  socklen_t len = sizeof type;
  if (fd < 0 || ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0) {
    error = failure(spec, fd < 0 || errno == EBADF ? std::string{"not an open descriptor"}
                                                   : std::string{"not a socket"});
    return nullptr;
  }
  if (type != SOCK_STREAM) {
    error = failure(spec, "not a stream socket");
    return nullptr;
  }
  int accepting = 0;
  len = sizeof accepting;
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) != 0 || accepting == 0) {
    error = failure(spec, "the socket is not listening");
    return nullptr;
  }
  sockaddr_storage storage{};
  socklen_t storage_len = sizeof storage;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&storage), &storage_len) != 0) {
    error = failure_errno(spec, errno);
    return nullptr;
  }
  const int family = storage.ss_family;
  if (family != AF_INET && family != AF_INET6 && family != AF_UNIX) {
    error = failure(spec, "unsupported address family");
    return nullptr;
  }
  const int protocol = family == AF_UNIX ? 0 : IPPROTO_TCP;
  generic_acceptor acceptor{io};
  boost::system::error_code ec;
  acceptor.assign(asio::generic::stream_protocol{family, protocol}, fd, ec);
  if (!ec) {
    acceptor.non_blocking(true, ec);
  }
  if (ec) {
    if (acceptor.is_open()) {
      // Hand the descriptor back untouched: the caller still owns it.
      [[maybe_unused]] const int released = acceptor.release(ec);
    }
    error = failure(spec, ec);
    return nullptr;
  }
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  socket_address local =
      socket_address::from_sockaddr(reinterpret_cast<const sockaddr*>(&storage), storage_len);
  return std::make_unique<listener>(std::move(acceptor), spec, local, family != AF_UNIX);
}

}  // namespace

listen_spec listen_spec::tcp(std::string host, std::uint16_t port, int backlog) {
  listen_spec spec;
  spec.kind = kind_type::tcp;
  spec.host = std::move(host);
  spec.port = port;
  spec.backlog = backlog;
  return spec;
}

listen_spec listen_spec::unix_socket(std::string path, int backlog) {
  listen_spec spec;
  spec.kind = kind_type::unix_socket;
  spec.path = std::move(path);
  spec.backlog = backlog;
  return spec;
}

listen_spec listen_spec::inherited(int fd) {
  listen_spec spec;
  spec.kind = kind_type::inherited_fd;
  spec.fd = fd;
  return spec;
}

std::string listen_spec::describe() const {
  switch (kind) {
    case kind_type::tcp:
      if (host.find(':') != std::string::npos) {
        return "[" + host + "]:" + std::to_string(port);
      }
      return host + ":" + std::to_string(port);
    case kind_type::unix_socket:
      return "unix:" + path;
    case kind_type::inherited_fd:
      return "fd " + std::to_string(fd);
  }
  return "?";
}

listener::listener(generic_acceptor acceptor, listen_spec spec, socket_address local,
                   bool is_tcp) noexcept
    : acceptor_{std::move(acceptor)}, spec_{std::move(spec)}, local_{local}, is_tcp_{is_tcp} {}

listener::~listener() {
  close();
}

void listener::close() noexcept {
  if (!acceptor_.is_open()) {
    return;
  }
  boost::system::error_code ec;
  acceptor_.close(ec);
  if (spec_.kind == listen_spec::kind_type::unix_socket) {
    ::unlink(spec_.path.c_str());
  }
}

std::string listener::description() const {
  switch (spec_.kind) {
    case listen_spec::kind_type::tcp:
      return local_.to_string();
    case listen_spec::kind_type::unix_socket:
      return "unix:" + spec_.path;
    case listen_spec::kind_type::inherited_fd:
      return "fd " + std::to_string(spec_.fd) + " (" + local_.to_string() + ")";
  }
  return "?";
}

std::unique_ptr<listener> open_listener(asio::io_context& io, const listen_spec& spec,
                                        std::string& error) {
  try {
    switch (spec.kind) {
      case listen_spec::kind_type::tcp:
        return open_tcp(io, spec, error);
      case listen_spec::kind_type::unix_socket:
        return open_unix(io, spec, error);
      case listen_spec::kind_type::inherited_fd:
        return open_inherited(io, spec, error);
    }
  } catch (const std::exception& e) {
    // Asio throws only on allocation failure or a bad endpoint; still one line.
    error = failure(spec, lower_first(e.what()));
    return nullptr;
  }
  error = failure(spec, "unknown listener kind");
  return nullptr;
}

}  // namespace cadeloop::net
