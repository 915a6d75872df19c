#pragma once

#include <array>
#include <cstdint>
#include <string>

struct sockaddr;

namespace cadeloop::net {

/// Names one connection of one I/O thread across a core pair's rings: the
/// slot in the I/O thread's connection table and the slot's generation, which
/// changes every time the slot is reused. A message naming a connection that
/// has since closed carries an old generation and is recognised and dropped.
/// Plain data; any thread.
struct connection_id {
  /// Index in the connection table.
  std::uint32_t slot = UINT32_MAX;
  /// Incarnation of the slot (starts at 1; 0 never names a connection).
  std::uint32_t generation = 0;

  /// Same slot and generation. Any thread.
  friend bool operator==(const connection_id&, const connection_id&) = default;
  /// True when this names some connection (it may be closed by now). Any thread.
  [[nodiscard]] bool valid() const noexcept { return generation != 0; }
};

/// A socket address in a fixed-size form cheap enough to ride inside a ring
/// message (no allocation): an IPv4 or IPv6 address and port, or "a Unix
/// socket" (whose path is the listener's, see `listener::description()`).
/// Plain data; any thread.
struct socket_address {
  /// Which kind of address this is.
  enum class family_kind : std::uint8_t { none, ipv4, ipv6, unix_socket };

  /// none: unknown (for instance a Unix socket peer, which has no name).
  family_kind family = family_kind::none;
  /// Port in host byte order (0 for Unix sockets).
  std::uint16_t port = 0;
  /// Address bytes in network order: 4 used for IPv4, 16 for IPv6.
  std::array<std::uint8_t, 16> bytes{};

  /// Reads a `sockaddr` of `length` bytes (AF_INET, AF_INET6, AF_UNIX;
  /// anything else gives `none`). Any thread.
  [[nodiscard]] static socket_address from_sockaddr(const sockaddr* address, std::size_t length) noexcept;
  /// The host part as text ("127.0.0.1", "::1"), or "" for none / Unix. Any thread.
  [[nodiscard]] std::string host() const;
  /// "127.0.0.1:8000", "[::1]:8000", "unix" or "-". Any thread.
  [[nodiscard]] std::string to_string() const;
};

}  // namespace cadeloop::net
