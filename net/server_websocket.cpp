// http_server::impl's WebSocket side: the upgrade accepted, frames in and
// out, pings, the close handshake. Not built yet: every command is refused.

#include "server_impl.hpp"

#include <string_view>
#include <utility>

namespace cadeloop::net {

bool http_server::impl::ws_accept(connection_id /*id*/, std::uint32_t /*request*/,
                                  std::string_view /*subprotocol*/,
                                  std::string_view /*extra_headers*/) {
  return false;
}

bool http_server::impl::ws_send(connection_id /*id*/, byte_buffer&& /*payload*/, bool /*text*/,
                                bool /*notify_drained*/) {
  return false;
}

bool http_server::impl::ws_consumed(connection_id /*id*/) {
  return false;
}

bool http_server::impl::ws_close(connection_id /*id*/, std::uint16_t /*code*/,
                                 std::string_view /*reason*/) {
  return false;
}

}  // namespace cadeloop::net
