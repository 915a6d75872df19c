#pragma once

// Private to net/. Kept in its own translation unit because request.hpp and
// response_encoder.hpp both declare cadeloop::http::body_framing (until the
// http/ rename lands), so no file may include both.

#include <string>
#include <string_view>

namespace cadeloop::http {
class date_cache;
}

namespace cadeloop::net::detail {

/// Appends a complete connection-closing error response (status, reason as
/// the body) to `out`. I/O thread (owner of `dates`).
void append_error_response(unsigned status, std::string_view reason, http::date_cache& dates,
                           std::string_view server_header, std::string& out);

}  // namespace cadeloop::net::detail
