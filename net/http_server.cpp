// http_server: the facade over http_server::impl (server_impl.hpp), and the
// impl's commands from the app thread's side of the pair (consume, close,
// abort, recycled heads) and its lifecycle (listeners, drain, abort).

#include "server_impl.hpp"

#include <string>
#include <utility>

namespace cadeloop::net {

void http_server::impl::add_listener(std::unique_ptr<listener> l) {
  listeners_.push_back(std::make_unique<listener_state>());
  listeners_.back()->l = std::move(l);
  arm_accept(*listeners_.back());
}

std::string http_server::impl::listener_description() const {
  std::string out;
  for (const auto& ls : listeners_) {
    if (!out.empty()) {
      out += ", ";
    }
    out += ls->l->description();
  }
  return out;
}

bool http_server::impl::consume(connection_id id, std::uint64_t bytes) {
  connection* c = lookup(id, false);
  if (c == nullptr) {
    ctr_.stale_messages.add();
    return false;
  }
  const std::uint64_t taken = std::min(bytes, c->body_unacked);
  c->body_unacked -= taken;
  unread_total_ -= taken;
  settle(*c);
  return true;
}

bool http_server::impl::close(connection_id id) {
  connection* c = lookup(id, false);
  if (c == nullptr) {
    ctr_.stale_messages.add();
    return false;
  }
  if (ws_active(*c)) {
    return ws_close(id, http::ws_close_code::normal, {});  // the close handshake, with 1000
  }
  abandon_in_flight(*c, false);
  c->no_more_requests = true;
  settle(*c);
  return true;
}

bool http_server::impl::abort(connection_id id) {
  connection* c = lookup(id, true);
  if (c == nullptr) {
    ctr_.stale_messages.add();
    return false;
  }
  close_now(*c);
  return true;
}

void http_server::impl::recycle_head(connection_id id, std::unique_ptr<http::request_head> head) {
  if (connection* c = lookup(id, true); c != nullptr && head) {
    c->parser.recycle_head(std::move(head));
  }
}

void http_server::impl::begin_drain() {
  if (draining_) {
    return;
  }
  draining_ = true;
  for (auto& ls : listeners_) {
    ls->l->close();
  }
  for (auto& c : conns_) {
    if (c->phase == conn_phase::open) {
      if (ws_active(*c) && !c->ws->close_sent) {
        // 1012 (service restart): the client may reconnect to another worker.
        ws_close(c->id(), 1012, "server restarting");
      }
      settle(*c);
    }
  }
}

void http_server::impl::abort_all() {
  for (auto& c : conns_) {
    if (c->phase != conn_phase::free) {
      close_now(*c);
    }
  }
}

http_server::http_server(asio::io_context& io, event_sink& sink, server_options options,
                         server_counters& counters)
    : impl_{std::make_unique<impl>(io, sink, std::move(options), counters)} {}

http_server::~http_server() = default;

void http_server::add_listener(std::unique_ptr<listener> l) {
  impl_->add_listener(std::move(l));
}

bool http_server::send(connection_id conn, std::uint32_t request, byte_buffer&& bytes,
                       send_flags flags) {
  return impl_->send(conn, request, std::move(bytes), flags);
}

void http_server::set_block_sink(block_sink give, void* ctx) noexcept {
  impl_->set_block_sink(give, ctx);
}

bool http_server::consume(connection_id conn, std::uint64_t bytes) {
  return impl_->consume(conn, bytes);
}

bool http_server::close(connection_id conn) {
  return impl_->close(conn);
}

bool http_server::abort(connection_id conn) {
  return impl_->abort(conn);
}

bool http_server::ws_accept(connection_id conn, std::uint32_t request, std::string_view subprotocol,
                            std::string_view extra_headers) {
  return impl_->ws_accept(conn, request, subprotocol, extra_headers);
}

bool http_server::ws_send(connection_id conn, byte_buffer&& payload, bool text,
                          bool notify_drained) {
  return impl_->ws_send(conn, std::move(payload), text, notify_drained);
}

bool http_server::ws_consumed(connection_id conn) {
  return impl_->ws_consumed(conn);
}

bool http_server::ws_close(connection_id conn, std::uint16_t code, std::string_view reason) {
  return impl_->ws_close(conn, code, reason);
}

void http_server::recycle_head(connection_id conn, std::unique_ptr<http::request_head> head) {
  impl_->recycle_head(conn, std::move(head));
}

void http_server::flush_writes() {
  impl_->flush_writes();
}

void http_server::begin_drain() {
  impl_->begin_drain();
}

void http_server::abort_all() {
  impl_->abort_all();
}

void http_server::pause_listening() {
  impl_->pause_listening();
}

void http_server::resume_listening() {
  impl_->resume_listening();
}

std::size_t http_server::connection_count() const noexcept {
  return impl_->connection_count();
}

bool http_server::has_dirty() const noexcept {
  return impl_->has_dirty();
}

int http_server::reactor_descriptor() const noexcept {
  return impl_->reactor_descriptor();
}

bool http_server::has_ready_handlers() const noexcept {
  return impl_->has_ready_handlers();
}

std::string http_server::listener_description() const {
  return impl_->listener_description();
}

}  // namespace cadeloop::net
