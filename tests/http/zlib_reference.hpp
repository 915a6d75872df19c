// Reference permessage-deflate encoding for tests, written directly against
// zlib as a client (or Python's zlib.compressobj(wbits=-15) with a
// Z_SYNC_FLUSH) does it, independent of http/ws_deflate.cpp.
#pragma once

#include <zlib.h>

#include <string>
#include <string_view>

namespace zlib_reference {

// Raw deflate of `data` ended by a sync flush, with the 00 00 FF FF tail
// removed (RFC 7692 7.2.1). `stream` (optional) keeps context across calls.
inline std::string compress(std::string_view data, z_stream* stream = nullptr, int bits = 15) {
  z_stream local{};
  z_stream* z = stream;
  if (z == nullptr) {
    z = &local;
    deflateInit2(z, 6, Z_DEFLATED, -bits, 8, Z_DEFAULT_STRATEGY);
  }
  std::string out(deflateBound(z, data.size()) + 64, '\0');
  z->next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z->avail_in = static_cast<uInt>(data.size());
  z->next_out = reinterpret_cast<Bytef*>(out.data());
  z->avail_out = static_cast<uInt>(out.size());
  deflate(z, Z_SYNC_FLUSH);
  out.resize(out.size() - z->avail_out);
  if (z == &local) {
    deflateEnd(z);
  }
  if (out.size() >= 4 && out.ends_with(std::string_view{"\x00\x00\xff\xff", 4})) {
    out.resize(out.size() - 4);
  }
  return out;
}

// Raw inflate of one message (the tail added back); "" with ok=false on an error.
inline std::string decompress(std::string_view data, bool& ok) {
  z_stream z{};
  inflateInit2(&z, -15);
  std::string in{data};
  in.append("\x00\x00\xff\xff", 4);
  std::string out;
  char buf[16384];
  z.next_in = reinterpret_cast<Bytef*>(in.data());
  z.avail_in = static_cast<uInt>(in.size());
  ok = true;
  for (;;) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof buf;
    const int rc = inflate(&z, Z_SYNC_FLUSH);
    out.append(buf, sizeof buf - z.avail_out);
    if (rc == Z_STREAM_END || (z.avail_in == 0 && z.avail_out != 0)) {
      break;
    }
    if (rc != Z_OK && rc != Z_BUF_ERROR) {
      ok = false;
      break;
    }
  }
  inflateEnd(&z);
  return out;
}

}  // namespace zlib_reference
