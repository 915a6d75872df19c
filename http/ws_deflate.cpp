// permessage-deflate (RFC 7692): negotiation of a client's offers and the
// zlib compressor and decompressor of WebSocket messages.

#include "cadeloop/http/ws_deflate.hpp"

#include <zlib.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <new>

namespace cadeloop::http {

namespace {

constexpr std::string_view trailer{"\x00\x00\xff\xff", 4};

std::string_view trim(std::string_view v) noexcept {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) {
    v.remove_prefix(1);
  }
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) {
    v.remove_suffix(1);
  }
  return v;
}

bool iequals(std::string_view a, std::string_view lower) noexcept {
  if (a.size() != lower.size()) {
    return false;
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    const char c = a[i] >= 'A' && a[i] <= 'Z' ? static_cast<char>(a[i] - 'A' + 'a') : a[i];
    if (c != lower[i]) {
      return false;
    }
  }
  return true;
}

// "8".."15" without sign or leading zero (RFC 7692 7.1.2.1), possibly quoted.
int window_bits_value(std::string_view v) noexcept {
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') {
    v = v.substr(1, v.size() - 2);
  }
  if (v.empty() || v.front() == '0') {
    return -1;
  }
  int n = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc{} || end != v.data() + v.size() || n < 8 || n > 15) {
    return -1;
  }
  return n;
}

// One offer: "permessage-deflate; a; b=1". True when the server can honour it.
bool read_offer(std::string_view element, ws_deflate_params& p, bool& asked_client_bits) {
  std::size_t semi = element.find(';');
  if (!iequals(trim(element.substr(0, semi)), "permessage-deflate")) {
    return false;
  }
  p = ws_deflate_params{};
  asked_client_bits = false;
  bool seen_server_nct = false;
  bool seen_client_nct = false;
  bool seen_server_bits = false;
  while (semi != std::string_view::npos) {
    element.remove_prefix(semi + 1);
    semi = element.find(';');
    const std::string_view param = trim(element.substr(0, semi));
    const std::size_t eq = param.find('=');
    const std::string_view name = trim(param.substr(0, eq));
    const bool has_value = eq != std::string_view::npos;
    const std::string_view value = has_value ? trim(param.substr(eq + 1)) : std::string_view{};
    if (iequals(name, "server_no_context_takeover")) {
      if (seen_server_nct || has_value) {
        return false;
      }
      seen_server_nct = true;
    } else if (iequals(name, "client_no_context_takeover")) {
      if (seen_client_nct || has_value) {
        return false;
      }
      seen_client_nct = true;
      p.client_no_context_takeover = true;
    } else if (iequals(name, "server_max_window_bits")) {
      const int bits = window_bits_value(value);
      // zlib's raw deflate has no 256-byte window: a 512-byte one would
      // break the client's limit, so an offer asking for 8 is declined.
      if (seen_server_bits || bits < 9) {
        return false;
      }
      seen_server_bits = true;
      p.server_max_window_bits = static_cast<std::uint8_t>(bits);
    } else if (iequals(name, "client_max_window_bits")) {
      if (asked_client_bits) {
        return false;
      }
      int bits = 15;
      if (has_value) {
        bits = window_bits_value(value);
        if (bits < 0) {
          return false;
        }
      }
      asked_client_bits = true;
      p.client_max_window_bits =
          static_cast<std::uint8_t>(std::min<int>(bits, ws_deflate_client_window_bits));
    } else {
      return false;  // an unknown parameter: this offer is not understood
    }
  }
  return true;
}

}  // namespace

bool negotiate_ws_deflate(std::span<const std::string_view> offers, ws_deflate_params& params,
                          std::string& response) {
  response.clear();
  for (std::string_view header : offers) {
    for (;;) {
      // Extension elements are separated by commas outside quoted strings;
      // the values this extension takes are never quoted with commas inside.
      const std::size_t comma = header.find(',');
      const std::string_view element = trim(header.substr(0, comma));
      ws_deflate_params p;
      bool asked_client_bits = false;
      if (!element.empty() && read_offer(element, p, asked_client_bits)) {
        params = p;
        response.append("permessage-deflate; server_no_context_takeover");
        if (p.client_no_context_takeover) {
          response.append("; client_no_context_takeover");
        }
        if (p.server_max_window_bits != 15) {
          response.append("; server_max_window_bits=");
          response.append(std::to_string(p.server_max_window_bits));
        }
        if (asked_client_bits) {
          response.append("; client_max_window_bits=");
          response.append(std::to_string(p.client_max_window_bits));
        }
        return true;
      }
      if (comma == std::string_view::npos) {
        break;
      }
      header.remove_prefix(comma + 1);
    }
  }
  return false;
}

struct ws_deflater::stream {
  z_stream z{};
};

ws_deflater::ws_deflater(int window_bits, bool no_context_takeover)
    : s_{std::make_unique<stream>()}, reset_each_message_{no_context_takeover} {
  window_bits = std::clamp(window_bits, 9, 15);
  // memLevel 8 is zlib's default; level 6 too. Raw deflate: negative bits.
  if (deflateInit2(&s_->z, 6, Z_DEFLATED, -window_bits, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    throw std::bad_alloc{};
  }
}

ws_deflater::~ws_deflater() {
  deflateEnd(&s_->z);
}

bool ws_deflater::compress(std::string_view message, std::string& out) {
  z_stream& z = s_->z;
  const std::size_t start = out.size();
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(message.data()));
  z.avail_in = static_cast<uInt>(message.size());
  std::size_t room = deflateBound(&z, static_cast<uLong>(message.size())) + 16;
  for (;;) {
    const std::size_t at = out.size();
    out.resize(at + room);
    z.next_out = reinterpret_cast<Bytef*>(out.data() + at);
    z.avail_out = static_cast<uInt>(room);
    const int rc = deflate(&z, Z_SYNC_FLUSH);
    out.resize(out.size() - z.avail_out);
    if (rc != Z_OK && rc != Z_BUF_ERROR) {
      deflateReset(&z);
      out.resize(start);
      return false;
    }
    if (z.avail_in == 0 && z.avail_out != 0) {
      break;  // all input taken and the flush is complete
    }
    room = 4096;
  }
  // A sync flush ends with an empty stored block, 00 00 FF FF: not sent.
  if (out.size() - start >= 4 && std::string_view{out}.substr(out.size() - 4) == trailer) {
    out.resize(out.size() - 4);
  }
  if (reset_each_message_) {
    deflateReset(&z);
  }
  return true;
}

struct ws_inflater::stream {
  z_stream z{};
};

ws_inflater::ws_inflater(int window_bits, bool no_context_takeover)
    : s_{std::make_unique<stream>()}, reset_each_message_{no_context_takeover} {
  window_bits = std::clamp(window_bits, 9, 15);
  if (inflateInit2(&s_->z, -window_bits) != Z_OK) {
    throw std::bad_alloc{};
  }
}

ws_inflater::~ws_inflater() {
  inflateEnd(&s_->z);
}

ws_inflate_status ws_inflater::decompress(std::string_view message, std::size_t max_size,
                                          std::string& out) {
  z_stream& z = s_->z;
  out.clear();
  ws_inflate_status status = ws_inflate_status::ok;
  // The message, then the trailer the sender removed. The output may grow
  // to max_size + 1 bytes: one byte over the limit is how a bomb is seen.
  for (const std::string_view part : {message, trailer}) {
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(part.data()));
    z.avail_in = static_cast<uInt>(part.size());
    while (z.avail_in != 0 && status == ws_inflate_status::ok) {
      const std::size_t at = out.size();
      if (at > max_size) {
        status = ws_inflate_status::too_big;
        break;
      }
      // Room grows with the output (geometric), never past the limit + 1.
      const std::size_t room =
          std::min(max_size + 1 - at, std::max({part.size() * 4, at, std::size_t{1024}}));
      out.resize(at + room);
      z.next_out = reinterpret_cast<Bytef*>(out.data() + at);
      z.avail_out = static_cast<uInt>(room);
      const int rc = inflate(&z, Z_SYNC_FLUSH);
      out.resize(out.size() - z.avail_out);
      if (rc == Z_STREAM_END) {
        // A final block is legal; the next message then starts a new stream.
        inflateReset(&z);
        if (z.avail_in != 0 && part.data() == message.data()) {
          status = ws_inflate_status::bad_data;  // bytes after the end of the stream
        }
        break;
      }
      // Z_BUF_ERROR only means "no progress possible": fine when the output
      // was full (the loop gives more room) or the input used up.
      if ((rc != Z_OK && rc != Z_BUF_ERROR) ||
          (rc == Z_BUF_ERROR && z.avail_out != 0 && z.avail_in != 0)) {
        status = ws_inflate_status::bad_data;
      }
    }
  }
  if (status == ws_inflate_status::ok && out.size() > max_size) {
    status = ws_inflate_status::too_big;
  }
  if (status != ws_inflate_status::ok || reset_each_message_) {
    inflateReset(&z);
  }
  return status;
}

}  // namespace cadeloop::http
