#include "error_response.hpp"

#include <cadeloop/http/date_cache.hpp>
#include <cadeloop/http/response_encoder.hpp>

namespace cadeloop::net::detail {

void append_error_response(unsigned status, std::string_view reason, http::date_cache& dates,
                           std::string_view server_header, std::string& out) {
  http::encoder_options options;
  options.server = server_header;
  std::string text;
  if (!reason.empty()) {
    text.append(reason);
    text.push_back('\n');
  }
  (void)http::encode_error_response(status, text, dates, out, options);
}

}  // namespace cadeloop::net::detail
