// permessage-deflate (http/ws_deflate.cpp): negotiation of each parameter
// (RFC 7692 7.1), and compression and decompression checked against zlib
// used directly as a client would, including context takeover and a
// decompression bomb.

#include "zlib_reference.hpp"

#include <cadeloop/http/ws_deflate.hpp>

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

using namespace cadeloop::http;

struct negotiated {
  bool ok = false;
  ws_deflate_params params;
  std::string response;
};

negotiated negotiate(std::vector<std::string_view> offers) {
  negotiated n;
  n.ok = negotiate_ws_deflate(offers, n.params, n.response);
  return n;
}

TEST(ws_deflate_negotiation, PlainOfferIsAcceptedAndTheServerResetsItsContext) {
  const negotiated n = negotiate({"permessage-deflate"});
  ASSERT_TRUE(n.ok);
  EXPECT_EQ(n.response, "permessage-deflate; server_no_context_takeover");
  EXPECT_FALSE(n.params.client_no_context_takeover);
  EXPECT_EQ(n.params.server_max_window_bits, 15);
}

TEST(ws_deflate_negotiation, EachParameter) {
  EXPECT_EQ(negotiate({"permessage-deflate; client_no_context_takeover"}).response,
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover");
  EXPECT_TRUE(negotiate({"permessage-deflate; client_no_context_takeover"})
                  .params.client_no_context_takeover);
  EXPECT_EQ(negotiate({"permessage-deflate; server_no_context_takeover"}).response,
            "permessage-deflate; server_no_context_takeover");
  const negotiated bits = negotiate({"permessage-deflate; server_max_window_bits=10"});
  EXPECT_EQ(bits.response,
            "permessage-deflate; server_no_context_takeover; server_max_window_bits=10");
  EXPECT_EQ(bits.params.server_max_window_bits, 10);
  // client_max_window_bits without a value: the server picks (12).
  const negotiated cbits = negotiate({"permessage-deflate; client_max_window_bits"});
  EXPECT_EQ(cbits.response,
            "permessage-deflate; server_no_context_takeover; client_max_window_bits=12");
  EXPECT_EQ(cbits.params.client_max_window_bits, 12);
  // A smaller value is kept; quoted values are allowed.
  EXPECT_EQ(
      negotiate({"permessage-deflate; client_max_window_bits=\"9\""}).params.client_max_window_bits,
      9);
  EXPECT_EQ(
      negotiate({"Permessage-Deflate ; Client_Max_Window_Bits = 10"}).params.client_max_window_bits,
      10);
}

TEST(ws_deflate_negotiation, OffersTheServerCannotHonourAreDeclined) {
  for (const std::string_view offer : {
           "permessage-deflate; server_max_window_bits=8",  // zlib: no 256-byte window
           "permessage-deflate; server_max_window_bits",    // a value is required
           "permessage-deflate; server_max_window_bits=16",
           "permessage-deflate; server_max_window_bits=010",
           "permessage-deflate; client_max_window_bits=7",
           "permessage-deflate; client_no_context_takeover=1",
           "permessage-deflate; client_no_context_takeover; client_no_context_takeover",
           "permessage-deflate; mystery",
           "x-webkit-deflate-frame",
       }) {
    SCOPED_TRACE(offer);
    const negotiated n = negotiate({offer});
    EXPECT_FALSE(n.ok);
    EXPECT_EQ(n.response, "");
  }
}

TEST(ws_deflate_negotiation, FirstAcceptableOfferWinsAcrossElementsAndHeaders) {
  const negotiated n = negotiate({"foo, permessage-deflate; server_max_window_bits=8",
                                  "permessage-deflate; client_no_context_takeover"});
  ASSERT_TRUE(n.ok);
  EXPECT_TRUE(n.params.client_no_context_takeover);
  EXPECT_EQ(n.params.server_max_window_bits, 15);
}

std::string sample_text(std::size_t n) {
  std::string s;
  while (s.size() < n) {
    s += "{\"event\":\"tick\",\"value\":" + std::to_string(s.size() % 977) + "}\n";
  }
  s.resize(n);
  return s;
}

TEST(ws_deflate_codec, CompressedMessagesInflateWithPlainZlib) {
  for (const int bits : {9, 12, 15}) {
    SCOPED_TRACE(bits);
    ws_deflater d{bits, true};
    for (const std::size_t size : {std::size_t{1}, std::size_t{100}, std::size_t{70000}}) {
      const std::string msg = sample_text(size);
      std::string out;
      ASSERT_TRUE(d.compress(msg, out));
      EXPECT_FALSE(out.ends_with(std::string_view{"\x00\x00\xff\xff", 4}));
      bool ok = false;
      EXPECT_EQ(zlib_reference::decompress(out, ok), msg);
      EXPECT_TRUE(ok);
    }
  }
}

TEST(ws_deflate_codec, ZlibCompressedMessagesInflate) {
  ws_inflater inf{15, true};
  for (const std::size_t size : {std::size_t{0}, std::size_t{5}, std::size_t{200000}}) {
    const std::string msg = sample_text(size);
    std::string out;
    ASSERT_EQ(inf.decompress(zlib_reference::compress(msg), 1U << 20, out), ws_inflate_status::ok);
    EXPECT_EQ(out, msg);
  }
}

TEST(ws_deflate_codec, ContextTakeoverAcrossMessages) {
  z_stream client{};
  deflateInit2(&client, 6, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY);
  ws_inflater inf{15, false};
  const std::string msg = sample_text(3000);
  std::size_t second_size = 0;
  for (int i = 0; i < 3; ++i) {
    const std::string wire = zlib_reference::compress(msg, &client);
    if (i == 1) {
      second_size = wire.size();
    }
    std::string out;
    ASSERT_EQ(inf.decompress(wire, 1U << 20, out), ws_inflate_status::ok);
    EXPECT_EQ(out, msg);
  }
  deflateEnd(&client);
  EXPECT_LT(second_size, 40u) << "the second message should be a back-reference";
}

TEST(ws_deflate_codec, DecompressionBombStopsAtTheLimit) {
  const std::string zeros(32U * 1024U * 1024U, '\0');
  const std::string bomb = zlib_reference::compress(zeros);
  ASSERT_LT(bomb.size(), 100U * 1024U);
  ws_inflater inf{15, true};
  std::string out;
  EXPECT_EQ(inf.decompress(bomb, 1U << 20, out), ws_inflate_status::too_big);
  EXPECT_LE(out.size(), (1U << 20) + 1);
  // Exactly at the limit is fine; one byte over is not.
  const std::string exact(1000, 'q');
  EXPECT_EQ(inf.decompress(zlib_reference::compress(exact), 1000, out), ws_inflate_status::ok);
  EXPECT_EQ(out, exact);
  EXPECT_EQ(inf.decompress(zlib_reference::compress(exact), 999, out), ws_inflate_status::too_big);
}

TEST(ws_deflate_codec, GarbageIsBadData) {
  ws_inflater inf{15, true};
  std::string out;
  EXPECT_EQ(inf.decompress("\xff\xff\xff\xff\xff", 1000, out), ws_inflate_status::bad_data);
  // The stream recovers for the next message.
  EXPECT_EQ(inf.decompress(zlib_reference::compress("again"), 1000, out), ws_inflate_status::ok);
  EXPECT_EQ(out, "again");
}

}  // namespace
