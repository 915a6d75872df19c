#pragma once
// Behind a proxy: which peers may speak for the client (forwarded_allow_ips,
// read once at start-up) and what a trusted peer's X-Forwarded-For,
// X-Forwarded-Proto and RFC 7239 Forwarded headers say. The bridge calls
// `apply_forwarded` once per scope (http and websocket) where it sets
// `client` and `scheme`; nothing here keeps per-request state.

#include <Python.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <cadeloop/http/request.hpp>
#include <cadeloop/net/connection_id.hpp>

namespace cadeloop::pyhost::server {

/// The peers trusted with proxy headers. Plain data, made on the main or
/// loop thread at start-up and then only read (by the loop thread).
class proxy_trust {
 public:
  /// Trusts nobody: proxy headers are never read.
  proxy_trust() = default;

  /// Reads forwarded_allow_ips: a comma list of IPv4/IPv6 addresses and
  /// networks ("10.0.0.0/8", "fd00::/8"), "unix" (a peer on a Unix socket),
  /// or "*" alone (any peer). Empty entries are skipped. On a bad entry,
  /// nullopt and `problem` says which and why. Any thread.
  static std::optional<proxy_trust> parse(std::string_view list, std::string& problem);

  /// Whether any peer can be trusted (proxy_headers on, a non-empty list).
  [[nodiscard]] bool active() const noexcept { return all_ || unix_ || !nets_.empty(); }
  /// Whether the connection's peer is trusted. Any thread.
  [[nodiscard]] bool trusts(const net::socket_address& peer) const noexcept;
  /// Whether a hop named in a header ("10.0.0.1", "[::1]:80") is trusted. Any thread.
  [[nodiscard]] bool trusts_hop(std::string_view hop) const noexcept;
  /// Whether the list was "*".
  [[nodiscard]] bool trusts_all() const noexcept { return all_; }

 private:
  struct network {
    std::array<std::uint8_t, 16> bytes{};
    bool v6 = false;
    unsigned prefix = 0;  // bits compared
  };
  [[nodiscard]] bool contains(const std::uint8_t* bytes, bool v6) const noexcept;

  bool all_ = false;
  bool unix_ = false;
  std::vector<network> nets_;
};

/// What a trusted peer's headers say about the client. Views into the head.
struct forwarded_client {
  std::string_view host;    ///< the client address ("" when the headers name none)
  std::string_view scheme;  ///< http, https, ws or wss ("" when they name none)
};

/// Reads the proxy headers of `head` when `trust` trusts `peer`; false when
/// the peer is untrusted or the headers say nothing usable. `Forwarded`
/// wins over the X-Forwarded-* pair when a request has both. Any thread.
bool read_forwarded(const proxy_trust& trust, const net::socket_address& peer,
                    const http::request_head& head, forwarded_client& out);

/// The hook where a scope is built: when the peer is trusted, sets
/// scope[client_key] to (host, 0) and scope[scheme_key] to the forwarded
/// scheme (http/https for an http scope, ws/wss for a websocket scope).
/// False with a Python error set when the dict cannot be written. Loop
/// thread, holding the GIL.
bool apply_forwarded(PyObject* scope, PyObject* client_key, PyObject* scheme_key,
                     const proxy_trust& trust, const net::socket_address& peer,
                     const http::request_head& head, bool websocket);

}  // namespace cadeloop::pyhost::server
