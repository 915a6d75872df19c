#include "test_encoder.hpp"

#include <cadeloop/http/date_cache.hpp>
#include <cadeloop/http/response_encoder.hpp>

#include <array>
#include <stdexcept>

namespace cadeloop::test {

struct test_encoder::impl {
  http::date_cache dates;
  http::response_encoder encoder{dates};
  std::string length_text;
};

namespace {

http::request_context context_of(const request_ctx& ctx) {
  http::request_context c;
  c.is_head = ctx.is_head;
  c.http_minor = ctx.http_minor;
  c.client_keep_alive = ctx.client_keep_alive;
  c.server_closing = ctx.server_closing;
  return c;
}

void check(const http::encode_status& s) {
  if (!s.ok()) {
    throw std::runtime_error("encoder refused: " + s.message());
  }
}

}  // namespace

test_encoder::test_encoder() : impl_{std::make_unique<impl>()} {}
test_encoder::~test_encoder() = default;

bool test_encoder::full(const request_ctx& ctx, unsigned status, std::string_view body, std::string& out) {
  impl_->encoder.start(context_of(ctx));
  http::response_head head;
  head.status = status;
  head.body_size = body.size();
  check(impl_->encoder.write_head(head, out));
  check(impl_->encoder.write_body(body, out));
  check(impl_->encoder.finish({}, out));
  return impl_->encoder.keep_alive();
}

void test_encoder::continue_line(const request_ctx& ctx, std::string& out) {
  impl_->encoder.start(context_of(ctx));
  check(impl_->encoder.write_continue(out));
}

void test_encoder::start_sized(const request_ctx& ctx, unsigned status, std::uint64_t length, std::string& out) {
  impl_->encoder.start(context_of(ctx));
  http::response_head head;
  head.status = status;
  head.body_size = length;
  check(impl_->encoder.write_head(head, out));
}

void test_encoder::part(std::string_view bytes, std::string& out) { check(impl_->encoder.write_body(bytes, out)); }

bool test_encoder::finish(std::string& out) {
  check(impl_->encoder.finish({}, out));
  return impl_->encoder.keep_alive();
}

}  // namespace cadeloop::test
