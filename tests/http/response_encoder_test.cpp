#include "cadeloop/http/response_encoder.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <new>
#include <string>
#include <vector>

// Counting allocator for the steady-state test: every operator new in this
// binary goes through here.
namespace {
std::size_t allocation_count = 0;
}  // namespace

// GCC pairs its built-in knowledge of operator new with the free() below and
// warns of a mismatch, but both replacements here use malloc/free.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(std::size_t size) {
  ++allocation_count;
  if (void* p = std::malloc(size == 0 ? 1 : size)) {
    return p;
  }
  throw std::bad_alloc{};
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

namespace cadeloop::http {
namespace {

constexpr std::string_view tail = "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\nServer: cadeloop\r\n\r\n";

std::string with_tail(std::string_view head) {
  return std::string{head} + std::string{tail};
}

class ResponseEncoder : public ::testing::Test {
 protected:
  date_cache dates{[] { return std::int64_t{784111777}; }};
  response_encoder enc{dates};
  std::string out;

  encode_status head(unsigned status, std::vector<header_field> headers = {},
                     std::optional<std::uint64_t> body_size = std::nullopt, bool trailers = false) {
    headers_ = std::move(headers);
    return enc.write_head({status, headers_, body_size, trailers}, out);
  }

 private:
  std::vector<header_field> headers_;
};

TEST_F(ResponseEncoder, SmallResponseWithKnownBody) {
  enc.start({});
  ASSERT_TRUE(head(200, {{"content-type", "text/plain"}, {"x-a", "1"}, {"x-b", "2"}}, 13).ok());
  ASSERT_TRUE(enc.write_body("Hello, world!", out).ok());
  ASSERT_TRUE(enc.finish({}, out).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nx-a: 1\r\nx-b: 2\r\n"
                           "Content-Length: 13\r\n") +
                     "Hello, world!");
  EXPECT_EQ(enc.framing(), response_framing::content_length);
  EXPECT_TRUE(enc.keep_alive());
}

TEST_F(ResponseEncoder, StatusLineUsesRegisteredReasonPhrases) {
  const std::vector<std::pair<unsigned, std::string_view>> cases = {
      {100, "Continue"},
      {102, "Processing"},
      {103, "Early Hints"},
      {200, "OK"},
      {201, "Created"},
      {202, "Accepted"},
      {203, "Non-Authoritative Information"},
      {204, "No Content"},
      {205, "Reset Content"},
      {206, "Partial Content"},
      {207, "Multi-Status"},
      {208, "Already Reported"},
      {226, "IM Used"},
      {300, "Multiple Choices"},
      {301, "Moved Permanently"},
      {302, "Found"},
      {303, "See Other"},
      {304, "Not Modified"},
      {305, "Use Proxy"},
      {307, "Temporary Redirect"},
      {308, "Permanent Redirect"},
      {400, "Bad Request"},
      {401, "Unauthorized"},
      {402, "Payment Required"},
      {403, "Forbidden"},
      {404, "Not Found"},
      {405, "Method Not Allowed"},
      {406, "Not Acceptable"},
      {407, "Proxy Authentication Required"},
      {408, "Request Timeout"},
      {409, "Conflict"},
      {410, "Gone"},
      {411, "Length Required"},
      {412, "Precondition Failed"},
      {413, "Content Too Large"},
      {414, "URI Too Long"},
      {415, "Unsupported Media Type"},
      {416, "Range Not Satisfiable"},
      {417, "Expectation Failed"},
      {421, "Misdirected Request"},
      {422, "Unprocessable Content"},
      {423, "Locked"},
      {424, "Failed Dependency"},
      {425, "Too Early"},
      {426, "Upgrade Required"},
      {428, "Precondition Required"},
      {429, "Too Many Requests"},
      {431, "Request Header Fields Too Large"},
      {451, "Unavailable For Legal Reasons"},
      {500, "Internal Server Error"},
      {501, "Not Implemented"},
      {502, "Bad Gateway"},
      {503, "Service Unavailable"},
      {504, "Gateway Timeout"},
      {505, "HTTP Version Not Supported"},
      {506, "Variant Also Negotiates"},
      {507, "Insufficient Storage"},
      {508, "Loop Detected"},
      {510, "Not Extended"},
      {511, "Network Authentication Required"}};
  for (const auto& [status, phrase] : cases) {
    EXPECT_EQ(reason_phrase(status), phrase) << status;
    if (status < 200) {
      continue;
    }
    out.clear();
    enc.start({});
    ASSERT_TRUE(head(status, {}, 0).ok()) << status;
    const std::string line =
        "HTTP/1.1 " + std::to_string(status) + " " + std::string{phrase} + "\r\n";
    EXPECT_EQ(out.substr(0, line.size()), line);
  }
}

TEST_F(ResponseEncoder, UnregisteredStatusHasEmptyReasonPhrase) {
  enc.start({});
  ASSERT_TRUE(head(299, {}, 0).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 299 \r\nContent-Length: 0\r\n"));
  EXPECT_EQ(reason_phrase(418), "");
}

TEST_F(ResponseEncoder, StatusOutsideRangeIsRefused) {
  for (const unsigned status : {0U, 99U, 101U, 600U, 1000U}) {
    enc.start({});
    const encode_status st = head(status, {{"x", "y"}}, 0);
    EXPECT_EQ(st.code, encode_errc::bad_status) << status;
    EXPECT_EQ(out, "");
  }
  enc.start({});
  EXPECT_TRUE(head(100, {}).ok());
  EXPECT_TRUE(head(599, {}, 0).ok());
}

TEST_F(ResponseEncoder, InvalidHeaderNameIsRefusedAndNamed) {
  for (const std::string_view name :
       {std::string_view{"bad name"}, std::string_view{""}, std::string_view{"x:y"},
        std::string_view{"x\r\nevil"}, std::string_view{"caf\xc3\xa9"}, std::string_view{"a\"b"},
        std::string_view{"(x)"}, std::string_view{"x\0y", 3}}) {
    out = "previous";
    enc.start({});
    const encode_status st = head(200, {{"x-ok", "1"}, {name, "v"}}, 0);
    EXPECT_EQ(st.code, encode_errc::bad_header_name);
    EXPECT_EQ(st.header, name);
    EXPECT_EQ(out, "previous") << "nothing of a refused head may be written";
  }
  // The encoder stays ready for a replacement response.
  out.clear();
  ASSERT_TRUE(head(500, {}, 0).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n"));
}

TEST_F(ResponseEncoder, TokenCharactersAreAllowedInNames) {
  enc.start({});
  ASSERT_TRUE(head(200, {{"!#$%&'*+-.^_`|~09azAZ", "v"}}, 0).ok());
  EXPECT_NE(out.find("!#$%&'*+-.^_`|~09azAZ: v\r\n"), std::string::npos);
}

TEST_F(ResponseEncoder, InvalidHeaderValueIsRefusedAndNamed) {
  for (const std::string_view value :
       {std::string_view{"a\rb"}, std::string_view{"a\nb"}, std::string_view{"a\r\nx-evil: 1"},
        std::string_view{"a\0b", 3}, std::string_view{"a\x01"}, std::string_view{"a\x1f"},
        std::string_view{"a\x7f"}}) {
    enc.start({});
    const encode_status st = head(200, {{"x-id", value}}, 0);
    EXPECT_EQ(st.code, encode_errc::bad_header_value);
    EXPECT_EQ(st.header, "x-id");
    EXPECT_EQ(out, "");
  }
  EXPECT_EQ((encode_status{encode_errc::bad_header_value, "x-id"}.message()),
            "invalid value (CR, LF, NUL or other control character) for header 'x-id'");
  EXPECT_EQ((encode_status{encode_errc::bad_header_name, "a\nb"}.message()),
            "invalid name for header 'a\\x0ab'");
}

TEST_F(ResponseEncoder, HtabObsTextAreAllowedAndWhitespaceTrimmed) {
  enc.start({});
  ASSERT_TRUE(head(200, {{"x-a", "a\tb \xff"}, {"x-b", " \t padded \t"}}, 0).ok());
  EXPECT_EQ(out,
            with_tail("HTTP/1.1 200 OK\r\nx-a: a\tb \xff\r\nx-b: padded\r\nContent-Length: 0\r\n"));
}

TEST_F(ResponseEncoder, AppContentLengthChoosesFraming) {
  enc.start({});
  ASSERT_TRUE(head(200, {{"Content-Length", "5"}}).ok());
  ASSERT_TRUE(enc.write_body("hel", out).ok());
  ASSERT_TRUE(enc.write_body("lo", out).ok());
  ASSERT_TRUE(enc.finish({}, out).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n") + "hello");
  EXPECT_EQ(enc.framing(), response_framing::content_length);
  EXPECT_TRUE(enc.keep_alive());
}

TEST_F(ResponseEncoder, AppContentLengthWinsOverKnownBodySize) {
  enc.start({});
  ASSERT_TRUE(head(200, {{"content-length", "2"}}, 99).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"));
}

TEST_F(ResponseEncoder, InvalidContentLengthIsRefused) {
  for (const std::string_view value :
       {std::string_view{"-1"}, std::string_view{"+1"}, std::string_view{"1 2"},
        std::string_view{"abc"}, std::string_view{""}, std::string_view{"5,5"},
        std::string_view{"0x10"}, std::string_view{"18446744073709551616"}}) {
    enc.start({});
    const encode_status st = head(200, {{"content-length", value}});
    EXPECT_EQ(st.code, encode_errc::bad_content_length) << value;
    EXPECT_EQ(st.header, "content-length");
    EXPECT_EQ(out, "");
  }
  enc.start({});
  ASSERT_TRUE(head(200, {{"content-length", "18446744073709551615"}}).ok());
}

TEST_F(ResponseEncoder, DuplicateContentLengthMustAgree) {
  enc.start({});
  ASSERT_TRUE(head(200, {{"content-length", "3"}, {"Content-Length", " 3"}}).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n"));
  out.clear();
  enc.start({});
  const encode_status st = head(200, {{"content-length", "3"}, {"Content-Length", "4"}});
  EXPECT_EQ(st.code, encode_errc::conflicting_content_length);
  EXPECT_EQ(st.header, "Content-Length");
  EXPECT_EQ(out, "");
}

TEST_F(ResponseEncoder, UnknownLengthIsChunkedOnHttp11) {
  enc.start({});
  ASSERT_TRUE(head(200, {{"transfer-encoding", "gzip"}}).ok());
  ASSERT_TRUE(enc.write_body("Hello, world!", out).ok());
  ASSERT_TRUE(enc.write_body("", out).ok());  // empty part: nothing, and not a terminator
  ASSERT_TRUE(enc.write_body(std::string(4096, 'x'), out).ok());
  ASSERT_TRUE(enc.finish({}, out).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n") +
                     "d\r\nHello, world!\r\n1000\r\n" + std::string(4096, 'x') + "\r\n0\r\n\r\n");
  EXPECT_EQ(enc.framing(), response_framing::chunked);
  EXPECT_TRUE(enc.keep_alive());
}

TEST_F(ResponseEncoder, ChunkFramingIsSeparateFromBodyBytes) {
  enc.start({});
  ASSERT_TRUE(head(200).ok());
  out.clear();
  const body_part_framing f = enc.frame_body_part(300, out);
  ASSERT_TRUE(f.status.ok());
  EXPECT_TRUE(f.send_body);
  EXPECT_EQ(out, "12c\r\n");
  EXPECT_EQ(f.after_body, "\r\n");
  const body_part_framing empty = enc.frame_body_part(0, out);
  EXPECT_FALSE(empty.send_body);
  EXPECT_EQ(empty.after_body, "");
  EXPECT_EQ(out, "12c\r\n");
}

TEST_F(ResponseEncoder, UnknownLengthIsCloseDelimitedOnHttp10) {
  enc.start({.http_minor = 0, .client_keep_alive = true});
  ASSERT_TRUE(head(200).ok());
  ASSERT_TRUE(enc.write_body("abc", out).ok());
  ASSERT_TRUE(enc.finish({}, out).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 200 OK\r\nConnection: close\r\n") + "abc");
  EXPECT_EQ(enc.framing(), response_framing::close_delimited);
  EXPECT_FALSE(enc.keep_alive());
}

TEST_F(ResponseEncoder, HeadKeepsHeadersAndSuppressesBody) {
  enc.start({.is_head = true});
  ASSERT_TRUE(head(200, {{"content-type", "text/html"}}, 13).ok());
  const body_part_framing f = enc.frame_body_part(13, out);
  EXPECT_TRUE(f.status.ok());
  EXPECT_FALSE(f.send_body);
  ASSERT_TRUE(enc.write_body("Hello, world!", out).ok());
  ASSERT_TRUE(enc.finish({}, out).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 200 OK\r\ncontent-type: text/html\r\nContent-Length: 13\r\n"));
  EXPECT_TRUE(enc.keep_alive());

  out.clear();
  enc.start({.is_head = true});
  ASSERT_TRUE(head(200, {{"content-length", "7"}}).ok());
  ASSERT_TRUE(enc.write_body("1234567", out).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 200 OK\r\nContent-Length: 7\r\n"));

  out.clear();
  enc.start({.is_head = true});
  ASSERT_TRUE(head(200).ok());
  ASSERT_TRUE(enc.write_body("streamed", out).ok());
  ASSERT_TRUE(enc.finish({}, out).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 200 OK\r\n"));
  EXPECT_EQ(enc.framing(), response_framing::none);
  EXPECT_TRUE(enc.keep_alive());
}

TEST_F(ResponseEncoder, NoContentHasNoBodyAndNoContentLength) {
  enc.start({});
  ASSERT_TRUE(head(204, {{"content-length", "5"}, {"x-a", "1"}}, 5).ok());
  ASSERT_TRUE(enc.write_body("hello", out).ok());
  ASSERT_TRUE(enc.finish({}, out).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 204 No Content\r\nx-a: 1\r\n"));
  EXPECT_TRUE(enc.keep_alive());
}

// RFC 9110 15.3.6: no content in a 205; it is not one of HTTP/1.1's
// bodiless statuses (RFC 9112 6.3), so the head says Content-Length: 0,
// whatever the app declared, and the connection stays usable.
TEST_F(ResponseEncoder, ResetContentHasNoBodyAndContentLengthZero) {
  enc.start({});
  ASSERT_TRUE(head(205, {{"content-length", "5"}, {"x-a", "1"}}, 5).ok());
  const body_part_framing f = enc.frame_body_part(5, out);
  EXPECT_TRUE(f.status.ok());
  EXPECT_FALSE(f.send_body);
  ASSERT_TRUE(enc.finish({}, out).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 205 Reset Content\r\nx-a: 1\r\nContent-Length: 0\r\n"));
  EXPECT_TRUE(enc.keep_alive());

  out.clear();
  enc.start({});
  ASSERT_TRUE(head(205).ok());  // streamed: still no body, no chunking
  ASSERT_TRUE(enc.write_body("hello", out).ok());
  ASSERT_TRUE(enc.finish({}, out).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 205 Reset Content\r\nContent-Length: 0\r\n"));
  EXPECT_EQ(enc.framing(), response_framing::none);
}

TEST_F(ResponseEncoder, NotModifiedHasNoBodyButKeepsContentLength) {
  enc.start({});
  ASSERT_TRUE(head(304, {{"etag", "\"x\""}, {"content-length", "5"}}).ok());
  ASSERT_TRUE(enc.write_body("hello", out).ok());
  ASSERT_TRUE(enc.finish({}, out).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 304 Not Modified\r\netag: \"x\"\r\nContent-Length: 5\r\n"));

  out.clear();
  enc.start({});
  ASSERT_TRUE(head(304, {}, 0).ok());
  ASSERT_TRUE(enc.finish({}, out).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 304 Not Modified\r\n"));
  EXPECT_TRUE(enc.keep_alive());
}

TEST_F(ResponseEncoder, InterimResponsesPrecedeTheFinalHead) {
  enc.start({});
  ASSERT_TRUE(head(103, {{"link", "</a.css>; rel=preload"}, {"content-length", "3"}}).ok());
  ASSERT_TRUE(head(200, {}, 2).ok());
  ASSERT_TRUE(enc.write_body("ok", out).ok());
  EXPECT_EQ(out, "HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n" +
                     with_tail("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n") + "ok");
}

TEST_F(ResponseEncoder, InterimResponsesAreNotSentToHttp10) {
  enc.start({.http_minor = 0, .client_keep_alive = false});
  ASSERT_TRUE(head(103, {{"link", "</a.css>"}}).ok());
  ASSERT_TRUE(enc.write_continue(out).ok());
  EXPECT_EQ(out, "");
  ASSERT_TRUE(head(200, {}, 0).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n"));
}

TEST_F(ResponseEncoder, ContinueIsSentBeforeTheFinalHeadOnly) {
  enc.start({});
  ASSERT_TRUE(enc.write_continue(out).ok());
  EXPECT_EQ(out, "HTTP/1.1 100 Continue\r\n\r\n");
  ASSERT_TRUE(head(200, {}, 0).ok());
  out.clear();
  EXPECT_EQ(enc.write_continue(out).code, encode_errc::bad_state);
  EXPECT_EQ(out, "");
}

TEST_F(ResponseEncoder, DateAndServerAreNotDuplicated) {
  enc.start({});
  ASSERT_TRUE(head(200, {{"DATE", "Mon, 01 Jan 2024 00:00:00 GMT"}, {"server", "app/1"}}, 0).ok());
  EXPECT_EQ(out,
            "HTTP/1.1 200 OK\r\nDATE: Mon, 01 Jan 2024 00:00:00 GMT\r\nserver: app/1\r\n"
            "Content-Length: 0\r\n\r\n");
}

TEST_F(ResponseEncoder, ServerHeaderIsConfigurable) {
  response_encoder custom{dates, {.server = "edge", .send_date = true}};
  custom.start({});
  ASSERT_TRUE(custom.write_head({200, {}, 0}, out).ok());
  EXPECT_EQ(out,
            "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
            "Server: edge\r\n\r\n");
  out.clear();
  response_encoder bare{dates, {.server = "", .send_date = false}};
  bare.start({});
  ASSERT_TRUE(bare.write_head({200, {}, 0}, out).ok());
  EXPECT_EQ(out, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
}

TEST_F(ResponseEncoder, ClosesWhenTheClientAsked) {
  enc.start({.client_keep_alive = false});
  ASSERT_TRUE(head(200, {}, 0).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n"));
  EXPECT_FALSE(enc.keep_alive());
}

TEST_F(ResponseEncoder, Http10WithoutKeepAliveCloses) {
  enc.start({.http_minor = 0, .client_keep_alive = false});
  ASSERT_TRUE(head(200, {}, 0).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n"));
  EXPECT_FALSE(enc.keep_alive());
}

TEST_F(ResponseEncoder, Http10KeepAliveIsConfirmed) {
  enc.start({.http_minor = 0, .client_keep_alive = true});
  ASSERT_TRUE(head(200, {}, 2).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n"));
  EXPECT_TRUE(enc.keep_alive());
}

TEST_F(ResponseEncoder, AppConnectionCloseIsHonouredOnce) {
  enc.start({});
  ASSERT_TRUE(head(200, {{"Connection", "foo, Close"}}, 0).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n"));
  EXPECT_FALSE(enc.keep_alive());

  out.clear();
  enc.start({});
  ASSERT_TRUE(head(200, {{"connection", "keep-alive"}}, 0).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n"));
  EXPECT_TRUE(enc.keep_alive());
}

TEST_F(ResponseEncoder, ServerClosingCloses) {
  enc.start({.server_closing = true});
  ASSERT_TRUE(head(200, {}, 0).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n"));
  EXPECT_FALSE(enc.keep_alive());
}

TEST_F(ResponseEncoder, TrailersFollowTheLastChunk) {
  enc.start({});
  ASSERT_TRUE(head(200, {}, 5, /*trailers=*/true).ok());
  EXPECT_EQ(enc.framing(), response_framing::chunked);
  ASSERT_TRUE(enc.write_body("hello", out).ok());
  const header_field trailers[] = {{"x-checksum", " abc "}, {"server-timing", "db;dur=5"}};
  ASSERT_TRUE(enc.finish(trailers, out).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n") +
                     "5\r\nhello\r\n0\r\nx-checksum: abc\r\nserver-timing: db;dur=5\r\n\r\n");
}

TEST_F(ResponseEncoder, InvalidTrailersAreRefused) {
  const std::vector<std::pair<header_field, encode_errc>> cases = {
      {{"bad name", "1"}, encode_errc::bad_header_name},
      {{"x-sum", "a\r\nb"}, encode_errc::bad_header_value},
      {{"Content-Length", "5"}, encode_errc::forbidden_header},
      {{"transfer-encoding", "chunked"}, encode_errc::forbidden_header},
      {{"connection", "close"}, encode_errc::forbidden_header}};
  for (const auto& [field, code] : cases) {
    out.clear();
    enc.start({});
    ASSERT_TRUE(head(200).ok());
    out.clear();
    const encode_status st = enc.finish({&field, 1}, out);
    EXPECT_EQ(st.code, code) << field.name;
    EXPECT_EQ(st.header, field.name);
    EXPECT_EQ(out, "") << "not even the last chunk is written";
  }
}

TEST_F(ResponseEncoder, TrailersAreDroppedWithoutChunkedFraming) {
  enc.start({});
  ASSERT_TRUE(head(200, {}, 2).ok());
  ASSERT_TRUE(enc.write_body("ok", out).ok());
  const header_field t{"x-sum", "1"};
  ASSERT_TRUE(enc.finish({&t, 1}, out).ok());
  EXPECT_EQ(out, with_tail("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n") + "ok");
}

TEST_F(ResponseEncoder, BodyLongerThanContentLengthIsRefused) {
  enc.start({});
  ASSERT_TRUE(head(200, {{"content-length", "3"}}).ok());
  ASSERT_TRUE(enc.write_body("ab", out).ok());
  const std::string before = out;
  EXPECT_EQ(enc.write_body("cd", out).code, encode_errc::body_too_long);
  EXPECT_EQ(out, before);
  EXPECT_FALSE(enc.keep_alive());
}

TEST_F(ResponseEncoder, BodyShorterThanContentLengthForcesClose) {
  enc.start({});
  ASSERT_TRUE(head(200, {}, 10).ok());
  ASSERT_TRUE(enc.write_body("short", out).ok());
  EXPECT_EQ(enc.finish({}, out).code, encode_errc::body_too_short);
  EXPECT_FALSE(enc.keep_alive());
}

TEST_F(ResponseEncoder, CallsOutOfOrderAreRefused) {
  enc.start({});
  EXPECT_EQ(enc.write_body("x", out).code, encode_errc::bad_state);
  EXPECT_EQ(enc.finish({}, out).code, encode_errc::bad_state);
  ASSERT_TRUE(head(200, {}, 0).ok());
  EXPECT_EQ(head(200, {}, 0).code, encode_errc::bad_state);
  ASSERT_TRUE(enc.finish({}, out).ok());
  EXPECT_EQ(enc.write_body("x", out).code, encode_errc::bad_state);
}

TEST_F(ResponseEncoder, SteadyStateMakesNoAllocation) {
  out.reserve(4096);
  const header_field headers[] = {{"content-type", "text/plain"}, {"x-a", "1"}, {"x-b", "2"}};
  const header_field trailers[] = {{"x-sum", "1"}};
  const auto one_round = [&] {
    out.clear();
    enc.start({});
    (void)enc.write_head({200, headers, 13}, out);
    (void)enc.write_body("Hello, world!", out);
    (void)enc.finish({}, out);
    enc.start({});
    (void)enc.write_head({200, headers, std::nullopt, true}, out);
    (void)enc.write_body("Hello, world!", out);
    (void)enc.finish(trailers, out);
  };
  one_round();
  const std::size_t before = allocation_count;
  for (int i = 0; i < 100; ++i) {
    one_round();
  }
  EXPECT_EQ(allocation_count, before);
  // The counter itself works: a real allocation is seen.
  const std::string probe(100, 'x');
  EXPECT_GT(allocation_count, before);
}

TEST(ErrorResponse, CompleteCloseResponseWithTextBody) {
  date_cache dates{[] { return std::int64_t{784111777}; }};
  std::string out;
  ASSERT_TRUE(encode_error_response(400, "", dates, out).ok());
  EXPECT_EQ(out,
            "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
            "Content-Length: 12\r\nConnection: close\r\n" +
                std::string{tail} + "Bad Request\n");

  for (const unsigned status : {413U, 414U, 431U, 500U, 501U, 505U}) {
    out.clear();
    ASSERT_TRUE(encode_error_response(status, "", dates, out).ok());
    const std::string phrase{reason_phrase(status)};
    EXPECT_EQ(out, "HTTP/1.1 " + std::to_string(status) + " " + phrase +
                       "\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: " +
                       std::to_string(phrase.size() + 1) + "\r\nConnection: close\r\n" +
                       std::string{tail} + phrase + "\n");
  }
}

TEST(ErrorResponse, CustomTextExtraHeadersAndHead) {
  date_cache dates{[] { return std::int64_t{784111777}; }};
  std::string out;
  const header_field allow{"Allow", "GET, HEAD"};
  ASSERT_TRUE(encode_error_response(405, "no\n", dates, out, {.server = "", .send_date = false},
                                    {&allow, 1}, /*is_head=*/true)
                  .ok());
  EXPECT_EQ(out,
            "HTTP/1.1 405 Method Not Allowed\r\nContent-Type: text/plain; charset=utf-8\r\n"
            "Content-Length: 3\r\nConnection: close\r\nAllow: GET, HEAD\r\n\r\n");
}

TEST(ErrorResponse, NonErrorStatusBecomes500AndBadExtraIsRefused) {
  date_cache dates{[] { return std::int64_t{784111777}; }};
  std::string out;
  ASSERT_TRUE(encode_error_response(200, "x", dates, out, {.server = "", .send_date = false}).ok());
  EXPECT_EQ(out,
            "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain; charset=utf-8\r\n"
            "Content-Length: 1\r\nConnection: close\r\n\r\nx");
  out.clear();
  const header_field bad{"x-a", "1\r\nx-b: 2"};
  const encode_status st = encode_error_response(400, "", dates, out, {}, {&bad, 1});
  EXPECT_EQ(st.code, encode_errc::bad_header_value);
  EXPECT_EQ(st.header, "x-a");
  EXPECT_EQ(out, "");
}

// An encoder sharing a header_line_cache writes what one without it writes,
// byte for byte, refusal for refusal, however often a field comes back:
// the same heads again and again (the later ones from the cache), with
// fields that are valid, invalid, owned by the encoder, too long to keep,
// and far more distinct ones than the table has slots (so they collide).
TEST(HeaderLineCache, CachedEncoderWritesWhatAPlainOneWrites) {
  struct head_case {
    unsigned status;
    std::vector<header_field> headers;
    std::optional<std::uint64_t> body_size;
    request_context ctx;
  };
  const std::string long_value(300, 'v');
  std::vector<std::string> many;  // distinct fields: x-0: 0 ... x-299: 299
  for (int i = 0; i < 300; ++i) {
    many.push_back(std::to_string(i));
  }
  std::vector<std::string> many_names;
  for (int i = 0; i < 300; ++i) {
    many_names.push_back("x-" + std::to_string(i));
  }
  request_context v10;
  v10.http_minor = 0;
  v10.client_keep_alive = false;
  request_context head_req;
  head_req.is_head = true;
  std::vector<head_case> cases = {
      {200, {{"content-type", "text/plain"}, {"content-length", "13"}}, 13, {}},
      {200, {{"Content-Type", "text/plain"}, {"CONTENT-LENGTH", " 13 "}}, 13, {}},
      {200, {{"content-type", "application/json"}, {"content-length", "28"}}, 28, {}},
      {200, {{"x-a", "a\tb \xff"}, {"x-b", " \t padded \t"}, {"x-e", ""}}, 0, {}},
      {200, {{"content-length", "3"}, {"Content-Length", " 3"}}, std::nullopt, {}},
      {200, {{"content-length", "3"}, {"Content-Length", "4"}}, std::nullopt, {}},
      {200, {{"content-length", "3"}, {"content-length", "4"}}, std::nullopt, {}},
      {200, {{"content-length", "-1"}}, std::nullopt, {}},
      {200, {{"content-length", "18446744073709551616"}}, std::nullopt, {}},
      {200, {{"connection", "close"}, {"x-a", "1"}}, 0, {}},
      {200, {{"Connection", "keep-alive, Close"}}, 0, {}},
      {200, {{"connection", "keep-alive"}}, 0, {}},
      {200, {{"transfer-encoding", "chunked"}}, std::nullopt, {}},
      {200, {{"date", "Mon, 01 Jan 2001 00:00:00 GMT"}}, 0, {}},
      {200, {{"Server", "mine"}}, 0, {}},
      {200, {{"date", "x"}, {"server", "y"}}, 0, {}},
      {103, {{"link", "</a.css>; rel=preload"}}, std::nullopt, {}},
      {200, {{"content-type", "text/plain"}}, std::nullopt, v10},
      {200, {{"content-type", "text/plain"}, {"content-length", "13"}}, 13, head_req},
      {204, {{"content-length", "0"}, {"x-a", "1"}}, std::nullopt, {}},
      {304, {{"content-length", "13"}, {"etag", "\"abc\""}}, std::nullopt, {}},
      {200, {{"x-long", long_value}, {"content-length", "1"}}, 1, {}},
      {200, {{"bad name", "v"}}, 0, {}},
      {200, {{"x-ok", "1"}, {"x:y", "v"}}, 0, {}},
      {200, {{"x-id", "a\r\nx-evil: 1"}}, 0, {}},
      {200, {{"x-id", std::string_view{"a\0b", 3}}}, 0, {}},
      {200, {{"x-id", "a\x7f"}}, 0, {}},
  };
  head_case all_many{200, {}, 0, {}};
  for (std::size_t i = 0; i < 300; ++i) {
    all_many.headers.push_back({many_names[i], many[i]});
    cases.push_back({200, {{many_names[i], many[i]}, {"content-type", "text/plain"}}, 0, {}});
  }
  cases.push_back(all_many);

  date_cache dates{[] { return std::int64_t{784111777}; }};
  header_line_cache cache;
  encoder_options cached_options;
  cached_options.lines = &cache;
  // Each case twice in a row (the second from the cache), and the whole
  // list three times (whatever the collisions left of the first round).
  for (int round = 0; round < 6; ++round) {
    for (std::size_t i = 0; i < cases.size() * 2; ++i) {
      const head_case& c = cases[i / 2];
      response_encoder plain{dates};
      response_encoder cached{dates, cached_options};
      plain.start(c.ctx);
      cached.start(c.ctx);
      std::string plain_out = "before|";
      std::string cached_out = "before|";
      const encode_status a =
          plain.write_head({c.status, c.headers, c.body_size, false}, plain_out);
      const encode_status b =
          cached.write_head({c.status, c.headers, c.body_size, false}, cached_out);
      ASSERT_EQ(a.code, b.code) << "round " << round << ", case " << i;
      ASSERT_EQ(a.header, b.header) << "round " << round << ", case " << i;
      ASSERT_EQ(plain_out, cached_out) << "round " << round << ", case " << i;
      ASSERT_EQ(plain.framing(), cached.framing()) << "round " << round << ", case " << i;
      ASSERT_EQ(plain.keep_alive(), cached.keep_alive()) << "round " << round << ", case " << i;
    }
  }
}

TEST(HeaderLineCache, KeepsOnlyFieldsThatPassedAndShortEnough) {
  date_cache dates{[] { return std::int64_t{784111777}; }};
  header_line_cache cache;
  encoder_options options;
  options.lines = &cache;
  const header_field good{"content-type", "text/plain"};
  const header_field bad{"x-id", "a\nb"};
  const std::string long_value(header_line_cache::max_field, 'v');
  const header_field too_long{"x-long", long_value};
  EXPECT_EQ(cache.find(good), nullptr);
  for (const header_field& f : {good, bad, too_long}) {
    response_encoder enc{dates, options};
    enc.start({});
    std::string out;
    (void)enc.write_head({200, {&f, 1}, 0, false}, out);
  }
  const header_line_cache::entry* e = cache.find(good);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(std::string_view(e->line.data(), e->line_len), "content-type: text/plain\r\n");
  EXPECT_EQ(cache.find(bad), nullptr);
  EXPECT_EQ(cache.find(too_long), nullptr);
  // Another field of the same bytes but another case is another entry.
  EXPECT_EQ(cache.find({"Content-Type", "text/plain"}), nullptr);
}

TEST(HeaderHelpers, TokenListMatching) {
  EXPECT_TRUE(header_has_token("keep-alive, Upgrade", "upgrade"));
  EXPECT_TRUE(header_has_token(" close ", "close"));
  EXPECT_FALSE(header_has_token("closed", "close"));
  EXPECT_FALSE(header_has_token("", "close"));
  EXPECT_TRUE(header_name_equals("Content-LENGTH", "content-length"));
  EXPECT_FALSE(header_name_equals("content-lengthx", "content-length"));
}

}  // namespace
}  // namespace cadeloop::http
