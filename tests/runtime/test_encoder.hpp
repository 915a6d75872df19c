#pragma once

// The fake app's response encoder, behind a small interface, in its own
// translation unit (test_encoder.cpp) so the fake app stays short.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace cadeloop::test {

/// What the encoder needs to know about a request. Plain data.
struct request_ctx {
  bool is_head = false;
  std::uint8_t http_minor = 1;
  bool client_keep_alive = true;
  bool server_closing = false;
};

/// One response at a time, like the app side's per-request encoder. App thread.
class test_encoder {
 public:
  test_encoder();
  ~test_encoder();
  test_encoder(const test_encoder&) = delete;
  test_encoder& operator=(const test_encoder&) = delete;

  /// A whole response with Content-Length; returns the keep-alive decision.
  bool full(const request_ctx& ctx, unsigned status, std::string_view body, std::string& out);
  /// `HTTP/1.1 100 Continue` (nothing for HTTP/1.0).
  void continue_line(const request_ctx& ctx, std::string& out);
  /// Starts a response with a known length (`length` body bytes follow).
  void start_sized(const request_ctx& ctx, unsigned status, std::uint64_t length, std::string& out);
  /// One body part.
  void part(std::string_view bytes, std::string& out);
  /// Ends the response; returns the keep-alive decision.
  bool finish(std::string& out);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace cadeloop::test
