// socket_address: a peer or local address copied out of a sockaddr, and its
// text form for logs (host:port, [v6]:port, unix path).

#include "cadeloop/net/connection_id.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>

namespace cadeloop::net {

socket_address socket_address::from_sockaddr(const sockaddr* address, std::size_t length) noexcept {
  socket_address out;
  if (address == nullptr || length < sizeof(sa_family_t)) {
    return out;
  }
  switch (address->sa_family) {
    case AF_INET:
      if (length >= sizeof(sockaddr_in)) {
        sockaddr_in in{};
        std::memcpy(&in, address, sizeof in);
        out.family = family_kind::ipv4;
        out.port = ntohs(in.sin_port);
        std::memcpy(out.bytes.data(), &in.sin_addr, 4);
      }
      break;
    case AF_INET6:
      if (length >= sizeof(sockaddr_in6)) {
        sockaddr_in6 in6{};
        std::memcpy(&in6, address, sizeof in6);
        out.family = family_kind::ipv6;
        out.port = ntohs(in6.sin6_port);
        std::memcpy(out.bytes.data(), &in6.sin6_addr, 16);
      }
      break;
    case AF_UNIX:
      out.family = family_kind::unix_socket;
      break;
    default:
      break;
  }
  return out;
}

std::string socket_address::host() const {
  char text[INET6_ADDRSTRLEN] = {};
  switch (family) {
    case family_kind::ipv4:
      ::inet_ntop(AF_INET, bytes.data(), text, sizeof text);
      return text;
    case family_kind::ipv6:
      ::inet_ntop(AF_INET6, bytes.data(), text, sizeof text);
      return text;
    case family_kind::unix_socket:
    case family_kind::none:
      break;
  }
  return {};
}

std::string socket_address::to_string() const {
  // Built with append: GCC 12 warns falsely (-Wrestrict) on chained operator+.
  std::string out;
  switch (family) {
    case family_kind::ipv4:
      out.append(host()).append(":").append(std::to_string(port));
      return out;
    case family_kind::ipv6:
      out.append("[").append(host()).append("]:").append(std::to_string(port));
      return out;
    case family_kind::unix_socket:
      return "unix";
    case family_kind::none:
      break;
  }
  return "-";
}

}  // namespace cadeloop::net
