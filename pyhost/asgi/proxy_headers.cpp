// Behind a proxy: the trusted-peer list (forwarded_allow_ips) parsed once,
// and the reading of X-Forwarded-For, X-Forwarded-Proto and RFC 7239
// Forwarded for a request from a trusted peer, written into the scope's
// `client` and `scheme`. The rules follow uvicorn's ProxyHeadersMiddleware
// where it has one (right-most untrusted hop, port 0, "*" takes the
// left-most hop); docs/migrating-from-uvicorn.md lists where cadeloop differs.
#include "asgi/proxy_headers.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <charconv>
#include <cstring>

namespace cadeloop::pyhost::server {

namespace {

std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) {
    s.remove_suffix(1);
  }
  return s;
}

/// An IPv4 or IPv6 address in text: 4 or 16 bytes in `out`, v6 set for 16.
bool parse_ip(std::string_view text, std::array<std::uint8_t, 16>& out, bool& v6) noexcept {
  char buf[INET6_ADDRSTRLEN + 1];
  if (text.empty() || text.size() >= sizeof buf) {
    return false;
  }
  std::memcpy(buf, text.data(), text.size());
  buf[text.size()] = '\0';
  out.fill(0);
  if (inet_pton(AF_INET, buf, out.data()) == 1) {
    v6 = false;
    return true;
  }
  if (inet_pton(AF_INET6, buf, out.data()) == 1) {
    v6 = true;
    return true;
  }
  return false;
}

/// The address part of a hop as proxies write it: "10.0.0.1", "10.0.0.1:5000",
/// "::1", "[::1]", "[::1]:5000". Text that is no address is returned trimmed.
std::string_view hop_address(std::string_view hop) noexcept {
  hop = trim(hop);
  if (hop.size() >= 2 && hop.front() == '"' && hop.back() == '"') {
    hop = hop.substr(1, hop.size() - 2);
  }
  if (!hop.empty() && hop.front() == '[') {
    const std::size_t close = hop.find(']');
    return close == std::string_view::npos ? hop : hop.substr(1, close - 1);
  }
  const std::size_t colon = hop.find(':');
  if (colon != std::string_view::npos && hop.find(':', colon + 1) == std::string_view::npos) {
    std::array<std::uint8_t, 16> b{};
    bool v6 = false;
    if (parse_ip(hop.substr(0, colon), b, v6)) {
      return hop.substr(0, colon);  // IPv4 with a port
    }
  }
  return hop;
}

/// Splits `s` at commas outside double quotes, calling `f(piece)` for each.
template <class F>
void split_list(std::string_view s, char sep, F&& f) {
  bool quoted = false;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= s.size(); ++i) {
    if (i < s.size() && s[i] == '"') {
      quoted = !quoted;
    }
    if (i == s.size() || (s[i] == sep && !quoted)) {
      f(s.substr(start, i - start));
      start = i + 1;
    }
  }
}

bool iequals(std::string_view a, std::string_view b) noexcept {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return (x | 0x20) == (y | 0x20);
         });
}

/// A proto value as one of the four schemes, or "".
std::string_view known_scheme(std::string_view v) noexcept {
  v = trim(v);
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') {
    v = v.substr(1, v.size() - 2);
  }
  for (const std::string_view s : {"http", "https", "ws", "wss"}) {
    if (iequals(v, s)) {
      return s;
    }
  }
  return {};
}

/// One hop: the address it names and, for Forwarded, the proto it reports.
struct hop {
  std::string_view host;
  std::string_view proto;
};

/// The client among `hops` (nearest the client first): the right-most hop the
/// list does not trust; the left-most when every hop is trusted or the list is
/// "*" (as uvicorn).
const hop* choose(const proxy_trust& trust, const std::vector<hop>& hops) noexcept {
  if (hops.empty()) {
    return nullptr;
  }
  if (!trust.trusts_all()) {
    for (auto it = hops.rbegin(); it != hops.rend(); ++it) {
      if (!trust.trusts_hop(it->host)) {
        return &*it;
      }
    }
  }
  return &hops.front();
}

}  // namespace

std::optional<proxy_trust> proxy_trust::parse(std::string_view list, std::string& problem) {
  proxy_trust t;
  bool bad = false;
  split_list(list, ',', [&](std::string_view entry) {
    entry = trim(entry);
    if (bad || entry.empty()) {
      return;
    }
    if (entry == "*") {
      t.all_ = true;
      return;
    }
    if (entry == "unix") {
      t.unix_ = true;
      return;
    }
    network n;
    const std::size_t slash = entry.find('/');
    const std::string_view addr = entry.substr(0, slash);
    bool ok = parse_ip(addr, n.bytes, n.v6);
    const unsigned width = n.v6 ? 128 : 32;
    n.prefix = width;
    if (ok && slash != std::string_view::npos) {
      const std::string_view bits = entry.substr(slash + 1);
      const auto [end, ec] = std::from_chars(bits.data(), bits.data() + bits.size(), n.prefix);
      ok = ec == std::errc{} && end == bits.data() + bits.size() && !bits.empty() &&
           n.prefix <= width;
    }
    if (!ok) {
      bad = true;
      problem = std::string{"\""}.append(entry).append(
          "\" is not an IP address, a network like 10.0.0.0/8, \"unix\" or \"*\"");
      return;
    }
    t.nets_.push_back(n);
  });
  if (bad) {
    return std::nullopt;
  }
  return t;
}

bool proxy_trust::contains(const std::uint8_t* bytes, bool v6) const noexcept {
  static constexpr std::uint8_t mapped_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (v6 && std::memcmp(bytes, mapped_prefix, sizeof mapped_prefix) == 0) {
    return contains(bytes + 12, false);  // ::ffff:a.b.c.d is the IPv4 peer of a dual-stack socket
  }
  for (const network& n : nets_) {
    if (n.v6 != v6) {
      continue;
    }
    const unsigned whole = n.prefix / 8;
    const unsigned rest = n.prefix % 8;
    if (std::memcmp(n.bytes.data(), bytes, whole) != 0) {
      continue;
    }
    if (rest != 0) {
      const auto mask = static_cast<std::uint8_t>(0xff00u >> rest);
      if ((n.bytes[whole] & mask) != (bytes[whole] & mask)) {
        continue;
      }
    }
    return true;
  }
  return false;
}

bool proxy_trust::trusts(const net::socket_address& peer) const noexcept {
  using fam = net::socket_address::family_kind;
  if (all_) {
    return true;
  }
  switch (peer.family) {
    case fam::ipv4:
      return contains(peer.bytes.data(), false);
    case fam::ipv6:
      return contains(peer.bytes.data(), true);
    case fam::unix_socket:
    case fam::none:
      return unix_;
  }
  return false;
}

bool proxy_trust::trusts_hop(std::string_view text) const noexcept {
  if (all_) {
    return true;
  }
  std::array<std::uint8_t, 16> b{};
  bool v6 = false;
  return parse_ip(hop_address(text), b, v6) && contains(b.data(), v6);
}

namespace {

/// Whether a field of `block` is Forwarded, X-Forwarded-For or
/// X-Forwarded-Proto (names are stored lower-cased): one pass that most
/// requests, which carry none, end with.
bool has_proxy_header(const http::header_block& block) noexcept {
  for (const http::header_field f : block) {
    const std::size_t n = f.name.size();
    if ((n == 9 && f.name == "forwarded") || (n == 15 && f.name == "x-forwarded-for") ||
        (n == 17 && f.name == "x-forwarded-proto")) {
      return true;
    }
  }
  return false;
}

}  // namespace

bool read_forwarded(const proxy_trust& trust, const net::socket_address& peer,
                    const http::request_head& head, forwarded_client& out) {
  out = {};
  const http::header_block& block = head.headers();
  if (!trust.active() || !has_proxy_header(block) || !trust.trusts(peer)) {
    return false;
  }
  std::vector<hop> hops;
  if (block.count("forwarded") != 0) {
    // RFC 7239: elements (one per hop) separated by commas, across fields in
    // order; each a ;-list of name=value pairs, values tokens or quoted.
    for (const http::header_field f : block) {
      if (f.name != "forwarded") {
        continue;
      }
      split_list(f.value, ',', [&](std::string_view element) {
        hop h;
        split_list(element, ';', [&](std::string_view pair) {
          const std::size_t eq = pair.find('=');
          if (eq == std::string_view::npos) {
            return;
          }
          const std::string_view name = trim(pair.substr(0, eq));
          const std::string_view value = trim(pair.substr(eq + 1));
          if (iequals(name, "for")) {
            h.host = value;
          } else if (iequals(name, "proto")) {
            h.proto = value;
          }
        });
        hops.push_back(h);
      });
    }
    if (const hop* c = choose(trust, hops); c != nullptr) {
      std::array<std::uint8_t, 16> b{};
      bool v6 = false;
      const std::string_view host = hop_address(c->host);
      // "unknown" and obfuscated names ("_proxy1") are no address: the client stays the peer.
      out.host = parse_ip(host, b, v6) ? host : std::string_view{};
      out.scheme = known_scheme(c->proto);
    }
  } else {
    for (const http::header_field f : block) {
      if (f.name == "x-forwarded-for") {
        split_list(f.value, ',', [&](std::string_view h) { hops.push_back({trim(h), {}}); });
      }
    }
    if (const hop* c = choose(trust, hops); c != nullptr) {
      std::array<std::uint8_t, 16> b{};
      bool v6 = false;
      const std::string_view host = hop_address(c->host);
      out.host = parse_ip(host, b, v6) ? host : c->host;
    }
    if (const auto proto = block.find("x-forwarded-proto")) {
      out.scheme = known_scheme(*proto);  // one value, as uvicorn: a list is ignored
    }
  }
  return !out.host.empty() || !out.scheme.empty();
}

bool apply_forwarded(PyObject* scope, PyObject* client_key, PyObject* scheme_key,
                     const proxy_trust& trust, const net::socket_address& peer,
                     const http::request_head& head, bool websocket) {
  forwarded_client fc;
  if (!read_forwarded(trust, peer, head, fc)) {
    return true;
  }
  if (!fc.host.empty()) {
    // Built without Py_BuildValue's "s#" (3.11 wants PY_SSIZE_T_CLEAN before Python.h for it).
    PyObject* host =
        PyUnicode_DecodeLatin1(fc.host.data(), static_cast<Py_ssize_t>(fc.host.size()), nullptr);
    PyObject* port = PyLong_FromLong(0);
    PyObject* client = host != nullptr && port != nullptr ? PyTuple_Pack(2, host, port) : nullptr;
    Py_XDECREF(host);
    Py_XDECREF(port);
    const int rc = client == nullptr ? -1 : PyDict_SetItem(scope, client_key, client);
    Py_XDECREF(client);
    if (rc != 0) {
      return false;
    }
  }
  if (!fc.scheme.empty()) {
    const bool secure = fc.scheme == "https" || fc.scheme == "wss";
    const char* scheme = websocket ? (secure ? "wss" : "ws") : (secure ? "https" : "http");
    PyObject* s = PyUnicode_FromString(scheme);
    const int rc = s == nullptr ? -1 : PyDict_SetItem(scope, scheme_key, s);
    Py_XDECREF(s);
    if (rc != 0) {
      return false;
    }
  }
  return true;
}

}  // namespace cadeloop::pyhost::server
