// Readiness of plain connection sockets, tracked by the server itself (see
// conn_poller.hpp): the read wait on the socket's own reactor registration,
// and the nested edge-triggered set for FINs. Both are reactor operations of
// ours through Boost 1.74's detail interface: a read operation that may be
// tried speculatively is queued without EPOLL_CTL_MOD.

#include "conn_poller.hpp"

#include <boost/asio/detail/epoll_reactor.hpp>
#include <boost/asio/detail/op_queue.hpp>
#include <boost/asio/detail/reactor_op.hpp>
#include <boost/asio/detail/scheduler.hpp>
#include <boost/version.hpp>

#include <unistd.h>

#include <array>

// The operations below follow Asio's detail interface as Boost 1.74 (Debian
// 12's libboost-dev, the one this project builds with) has it: another Boost
// must be read against it before it is allowed here.
#if BOOST_VERSION / 100 != 1074
#error \
    "net/conn_poller.cpp uses asio::detail::epoll_reactor as Boost 1.74 has it; check it against this Boost first"
#endif

#if !defined(BOOST_ASIO_HAS_EPOLL)
#error "conn_poller needs Asio's epoll reactor"
#endif

namespace cadeloop::net {

namespace detail = boost::asio::detail;

namespace {
constexpr int max_events = 64;
}  // namespace

struct conn_poller::wait_op final : detail::reactor_op {
  explicit wait_op(conn_poller* o)
      : reactor_op{{}, &wait_op::perform_wait, &wait_op::finish}, owner{o} {}

  // Runs inside the reactor's handling of the set's readiness, or
  // speculatively when the wait is armed: collects what is ready, or
  // stays queued when nothing is.
  static status perform_wait(reactor_op* base) {
    auto* self = static_cast<wait_op*>(base);
    if (self->owner == nullptr) {
      return done;
    }
    const int n = ::epoll_wait(self->owner->epfd_, self->events.data(), max_events, 0);
    if (n <= 0) {
      self->count = 0;
      return not_done;
    }
    self->count = static_cast<std::size_t>(n);
    return n < max_events ? done_and_exhausted : done;
  }

  // The scheduler runs the completion (scheduler != nullptr) or destroys it
  // with the io_context; an operation whose poller is gone frees itself.
  static void finish(void* scheduler, detail::scheduler_operation* base,
                     const boost::system::error_code& /*ec*/, std::size_t /*bytes*/) {
    auto* self = static_cast<wait_op*>(base);
    conn_poller* p = self->owner;
    if (p == nullptr) {
      delete self;
      return;
    }
    if (scheduler == nullptr) {
      // The io_context is destroyed before the poller: the poller frees it.
      p->pending_ = false;
      return;
    }
    p->complete(*self);
  }

  conn_poller* owner;
  std::size_t count = 0;
  std::array<epoll_event, max_events> events{};
};

namespace {

// The socket's implementation inside Asio (its descriptor and its reactor
// data), reached through a pointer to the protected member.
struct socket_access : boost::asio::generic::stream_protocol::socket {
  static auto& implementation(boost::asio::generic::stream_protocol::socket& s) {
    constexpr auto member = &socket_access::impl_;
    return (s.*member).get_implementation();
  }
};

// The reactor's epoll descriptor is private: an explicit instantiation may
// name a private member, and this one hands the member pointer out.
int detail::epoll_reactor::*reactor_epoll_fd_member = nullptr;
template <int detail::epoll_reactor::*Member>
struct reactor_fd_access {
  static inline const bool taken = (reactor_epoll_fd_member = Member, true);
};
template struct reactor_fd_access<&detail::epoll_reactor::epoll_fd_>;

// The scheduler's queue and its reactor's place in it, the same way: the
// queue holds only the reactor's task between polls when nothing is ready.
bool (*scheduler_has_ready)(detail::scheduler&) = nullptr;
template <auto Queue, auto Task>
struct scheduler_access {
  static bool has_ready(detail::scheduler& s) {
    detail::scheduler_operation* front = (s.*Queue).front();
    if (front == nullptr) {
      return false;
    }
    detail::scheduler_operation* task = &(s.*Task);
    return front != task || detail::op_queue_access::next(front) != nullptr;
  }
  static inline const bool taken = (scheduler_has_ready = &has_ready, true);
};
template struct scheduler_access<&detail::scheduler::op_queue_,
                                 &detail::scheduler::task_operation_>;

}  // namespace

bool has_ready_handlers(boost::asio::io_context& io) noexcept {
  auto& s = boost::asio::use_service<detail::scheduler>(io);
  // Without the accessor (it cannot fail to be set, but) a poll is the safe answer.
  return scheduler_has_ready == nullptr || scheduler_has_ready(s);
}

int reactor_fd_of(boost::asio::io_context& io) noexcept {
  auto& reactor = boost::asio::use_service<detail::epoll_reactor>(io);
  return reactor_epoll_fd_member != nullptr ? reactor.*reactor_epoll_fd_member : -1;
}

struct socket_read_wait::op final : detail::reactor_op {
  op() : reactor_op{{}, &op::perform_wait, &op::finish} {}

  // Only ever performed when the socket had an edge (from the reactor's
  // events, or speculatively after one came while nothing was queued): the
  // read that follows finds out what it brought. "Exhausted" makes the next
  // start queue without trying.
  static status perform_wait(reactor_op* /*base*/) { return done_and_exhausted; }

  static void finish(void* scheduler, detail::scheduler_operation* base,
                     const boost::system::error_code& /*ec*/, std::size_t /*bytes*/) {
    auto* self = static_cast<op*>(base);
    self->in_queue = false;
    if (self->orphan) {
      delete self;
      return;
    }
    if (scheduler == nullptr || self->ec_) {
      return;  // the io_context is going away, or the socket was closed
    }
    self->on_ready(self->ctx, self->key);
  }

  bool in_queue = false;
  bool orphan = false;
  // The reactor of `io`, looked up once: use_service finds a service by
  // comparing type names, which cost as much as the rest of a start.
  boost::asio::io_context* io = nullptr;
  detail::epoll_reactor* reactor = nullptr;
  handler on_ready = nullptr;
  void* ctx = nullptr;
  std::uint64_t key = 0;
};

void socket_read_wait::start(boost::asio::io_context& io,
                             boost::asio::generic::stream_protocol::socket& s, handler on_ready,
                             void* ctx, std::uint64_t key) {
  if (op_ == nullptr) {
    op_ = new op{};
  }
  if (op_->in_queue) {
    return;
  }
  auto& impl = socket_access::implementation(s);
  op_->on_ready = on_ready;
  op_->ctx = ctx;
  op_->key = key;
  op_->ec_ = {};
  op_->in_queue = true;
  if (op_->io != &io) {
    op_->reactor = &boost::asio::use_service<detail::epoll_reactor>(io);
    op_->io = &io;
  }
  // A continuation: from inside a handler a completion joins the thread's
  // own queue (no lock, no wake-up).
  op_->reactor->start_op(detail::epoll_reactor::read_op, impl.socket_, impl.reactor_data_, op_, true,
                   true);
}

void socket_read_wait::release() noexcept {
  if (op_ == nullptr) {
    return;
  }
  if (op_->in_queue) {
    op_->orphan = true;
  } else {
    delete op_;
  }
  op_ = nullptr;
}

conn_poller::conn_poller(boost::asio::io_context& io, handler on_events, void* ctx)
    : on_events_{on_events}, ctx_{ctx} {
  epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epfd_ < 0) {
    return;
  }
  auto& reactor = boost::asio::use_service<detail::epoll_reactor>(io);
  reactor.init_task();
  detail::epoll_reactor::per_descriptor_data state = nullptr;
  if (reactor.register_descriptor(epfd_, state) != 0) {
    if (state != nullptr) {
      reactor.cleanup_descriptor_data(state);
    }
    ::close(epfd_);
    epfd_ = -1;
    return;
  }
  reactor_ = &reactor;
  state_ = state;
  op_ = new wait_op{this};
  arm();
}

conn_poller::~conn_poller() {
  if (epfd_ < 0) {
    return;
  }
  auto& reactor = *static_cast<detail::epoll_reactor*>(reactor_);
  auto state = static_cast<detail::epoll_reactor::per_descriptor_data>(state_);
  if (pending_) {
    op_->owner = nullptr;  // deregistering hands it to the scheduler, which frees it
  } else {
    delete op_;
  }
  op_ = nullptr;
  reactor.deregister_descriptor(epfd_, state, true);
  reactor.cleanup_descriptor_data(state);
  ::close(epfd_);
}

bool conn_poller::add(int fd, std::uint64_t key) noexcept {
  if (epfd_ < 0) {
    return false;
  }
  epoll_event ev{};
  ev.events = EPOLLRDHUP | EPOLLET;
  ev.data.u64 = key;
  return ::epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) == 0;
}

void conn_poller::arm() {
  if (pending_ || op_ == nullptr) {
    return;
  }
  pending_ = true;
  auto& reactor = *static_cast<detail::epoll_reactor*>(reactor_);
  auto state = static_cast<detail::epoll_reactor::per_descriptor_data>(state_);
  op_->count = 0;
  // A continuation: armed from inside a handler it joins the thread's own
  // queue (no lock, no wake-up) when the speculative wait finds events.
  reactor.start_op(detail::epoll_reactor::read_op, epfd_, state, op_, true, true);
}

void conn_poller::complete(wait_op& op) {
  pending_ = false;
  struct rearm {
    conn_poller* p;
    ~rearm() { p->arm(); }
  } guard{this};
  on_events_(ctx_, std::span<const epoll_event>{op.events.data(), op.count});
}

}  // namespace cadeloop::net
