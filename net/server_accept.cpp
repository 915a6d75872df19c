// http_server::impl, accepting: listener readiness, the connection budget
// (pausing and resuming accepts), accept back-off, and opening a connection.

#include "server_impl.hpp"
#include "socket_calls.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <utility>

namespace cadeloop::net {

namespace {
// accept(2) on Linux: errors of the connection taken, not of the listener
// ("treat them like EAGAIN by retrying"): take the next one.
bool pending_network_error(int err) noexcept {
  switch (err) {
    case ECONNABORTED:
    case EPROTO:
    case ENETDOWN:
    case ENOPROTOOPT:
    case EHOSTDOWN:
    case ENONET:
    case EHOSTUNREACH:
    case EOPNOTSUPP:
    case ENETUNREACH:
      return true;
    default:
      return false;
  }
}
}  // namespace

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
    // accept4(2) itself: the socket comes non-blocking and close-on-exec,
    // with the peer's address (Asio's accept would add an ioctl, and
    // getpeername and getsockname follow).
    sockaddr_storage peer{};
    socklen_t peer_length = 0;
    error_code ec;
    const int fd = accept_one(ls.l->acceptor().native_handle(), peer, peer_length, ec);
    if (would_block(ec)) {
      break;
    }
    if (ec) {
      // A connection that failed while it waited (reset before the accept),
      // or a network error Linux reports for it: the next one may be fine.
      if (pending_network_error(ec.value())) {
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
    open_connection(fd, peer, peer_length, ls);
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

void http_server::impl::open_connection(int fd, const sockaddr_storage& peer,
                                        socklen_t peer_length, listener_state& ls) {
  const bool tcp = ls.l->is_tcp();
  const int family = peer_length >= sizeof(sa_family_t) ? peer.ss_family : AF_UNIX;
  socket_type sock{io_};
  error_code ec;
  sock.assign(asio::generic::stream_protocol{family, tcp ? IPPROTO_TCP : 0}, fd, ec);
  if (ec) {
    ::close(fd);
    return;
  }
  if (tcp && ls.nodelay != listener_state::nodelay_kind::inherited) {
    int on = 0;
    socklen_t on_length = sizeof on;
    if (ls.nodelay == listener_state::nodelay_kind::unknown) {
      const bool inherited =
          ::getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, &on_length) == 0 && on != 0;
      ls.nodelay = inherited ? listener_state::nodelay_kind::inherited
                             : listener_state::nodelay_kind::set_each;
    }
    if (ls.nodelay == listener_state::nodelay_kind::set_each) {
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
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
  c.client = socket_address::from_sockaddr(reinterpret_cast<const sockaddr*>(&peer), peer_length);
  // The local address is the listener's when it is bound to one address (or
  // is a Unix socket); a wildcard listener's connections each ask the kernel.
  const socket_address& bound = ls.l->local_address();
  const bool wildcard =
      (bound.family == socket_address::family_kind::ipv4 ||
       bound.family == socket_address::family_kind::ipv6) &&
      std::all_of(bound.bytes.begin(),
                  bound.bytes.begin() + (bound.family == socket_address::family_kind::ipv4 ? 4 : 16),
                  [](std::uint8_t b) { return b == 0; });
  if (bound.family != socket_address::family_kind::none && !wildcard) {
    c.server = bound;
  } else {
    sockaddr_storage local{};
    socklen_t local_length = sizeof local;
    c.server = ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_length) == 0
                   ? socket_address::from_sockaddr(reinterpret_cast<const sockaddr*>(&local),
                                                   local_length)
                   : socket_address{};
  }
  c.socket.emplace(std::move(sock));
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
