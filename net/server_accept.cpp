// http_server::impl, accepting: listener readiness, the connection budget
// (pausing and resuming accepts), accept back-off, and opening a connection.

#include "server_impl.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <chrono>
#include <utility>

namespace cadeloop::net {

void http_server::impl::arm_accept(listener_state& ls) {
  if (ls.armed || draining_ || accept_paused_ || accept_backoff_ || listening_paused_ ||
      !ls.l->acceptor().is_open()) {
    return;
  }
  ls.armed = true;
  ls.l->acceptor().async_wait(asio::socket_base::wait_read, [this, &ls](const error_code& ec) {
    ls.armed = false;
    if (ec) {
      return;  // operation_aborted: closed for the drain; anything else: the listener is broken
    }
    on_acceptable(ls);
  });
}

void http_server::impl::on_acceptable(listener_state& ls) {
  for (std::size_t i = 0; i < accepts_per_wake && !draining_; ++i) {
    if (budget_spent()) {
      // Resumed by maybe_resume_accept() when a connection closes or a response ends.
      accept_paused_ = true;
      ctr_.accept_pauses.add();
      return;
    }
    socket_type peer{io_};
    error_code ec;
    ls.l->acceptor().accept(peer, ec);
    if (would_block(ec)) {
      break;
    }
    if (ec) {
      if (ec == asio::error::connection_aborted) {
        continue;
      }
      // Out of descriptors or memory: retrying at once would spin. Back off.
      accept_backoff_ = true;
      accept_retry_.expires_after(std::chrono::milliseconds{50});
      accept_retry_.async_wait([this](const error_code& wait_ec) {
        accept_backoff_ = false;
        if (!wait_ec) {
          resume_accepting();
        }
      });
      return;
    }
    open_connection(std::move(peer), ls.l->is_tcp());
  }
  arm_accept(ls);
}

void http_server::impl::resume_accepting() {
  for (auto& ls : listeners_) {
    arm_accept(*ls);
  }
}

void http_server::impl::pause_listening() {
  if (listening_paused_ || draining_) {
    return;
  }
  listening_paused_ = true;
  for (auto& ls : listeners_) {
    generic_acceptor& a = ls->l->acceptor();
    if (!a.is_open()) {
      continue;
    }
    error_code ec;
    a.cancel(ec);  // the armed wait ends with operation_aborted
    if (ls->l->is_tcp()) {
      // A shut-down listening socket leaves the SO_REUSEPORT group until it
      // listens again (Linux), so the kernel stops choosing this pair. A port
      // the kernel picked (bound to port 0) is released too: remember it.
      ls->paused_length = sizeof ls->paused_address;
      if (::getsockname(a.native_handle(), reinterpret_cast<sockaddr*>(&ls->paused_address),
                        &ls->paused_length) != 0) {
        ls->paused_length = 0;
      }
      ::shutdown(a.native_handle(), SHUT_RD);
    }
  }
}

void http_server::impl::resume_listening() {
  if (!listening_paused_) {
    return;
  }
  listening_paused_ = false;
  if (draining_) {
    return;
  }
  for (auto& ls : listeners_) {
    generic_acceptor& a = ls->l->acceptor();
    if (a.is_open() && ls->l->is_tcp()) {
      if (ls->paused_length != 0) {
        // Binds the same address again when the shutdown released it (a port
        // the kernel picked); EINVAL when the socket kept it, as it does a
        // port asked for by number.
        (void)::bind(a.native_handle(), reinterpret_cast<const sockaddr*>(&ls->paused_address),
                     ls->paused_length);
      }
      ::listen(a.native_handle(), ls->l->spec().backlog);
    }
  }
  resume_accepting();
}

void http_server::impl::open_connection(socket_type peer, bool tcp) {
  error_code ec;
  peer.non_blocking(true, ec);
  if (ec) {
    return;
  }
  if (tcp) {
    const int one = 1;
    ::setsockopt(peer.native_handle(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  std::uint32_t slot = 0;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<std::uint32_t>(conns_.size());
    conns_.push_back(std::make_unique<connection>(slot, opt_.limits));
    conns_.back()->parser.use_pool(&head_pool_);
  }
  connection& c = *conns_[slot];
  c.reset(opt_.max_pipelined);
  const auto remote = peer.remote_endpoint(ec);
  c.client = ec ? socket_address{} : socket_address::from_sockaddr(remote.data(), remote.size());
  const auto local = peer.local_endpoint(ec);
  c.server = ec ? socket_address{} : socket_address::from_sockaddr(local.data(), local.size());
  c.socket.emplace(std::move(peer));
  c.phase = conn_phase::open;
  ++open_count_;
  ctr_.connections_accepted.add();
  ctr_.connections_open.add();
  if (!tls_open(c)) {
    close_now(c);
    return;
  }
  // Plain connections (WebSockets after their upgrade too) wait for
  // readability with waits of our own (conn_poller.hpp); TLS keeps Asio's.
  c.rd_ready = c.rd_hup = c.ready_posted = false;
  const connection_id id = c.id();
  c.polled = !c.tls.active() && poller_.add(c.socket->native_handle(), key_of(id));
  settle(c);
}

}  // namespace cadeloop::net
