// http_server::impl, the pair's budgets against many slow clients at once:
// the memory budget (unsent response bytes plus request body bytes the app
// has not taken), checked as each send arrives from the app, and the
// in-flight budget, which stalled request bodies must not hold forever.
// Over a budget new requests get 503 and the slowest clients are cut
// first: the write deadline list and the body deadline list are ordered by
// last progress, so their heads are the clients stalled the longest.

#include "server_impl.hpp"

#include <chrono>

namespace cadeloop::net {

// A new request while the pair is over its memory budget: answered 503
// (once nothing earlier is in flight) and the connection closes after it.
bool http_server::impl::refuse_over_budget(connection& c) {
  if (!over_memory_budget()) {
    return false;
  }
  ctr_.budget_refusals.add();
  c.skipping = true;
  c.stop_dispatch = true;
  c.no_more_requests = true;
  c.error_status = 503;
  c.error_reason = "server over its memory budget, retry later";
  return true;
}

// Called as a send arrives (a client that reads nothing causes no write
// event, so checking only after writes would let its bytes pile up): while
// over budget, the connection whose output made no progress the longest is
// closed. The sender goes too if it is the slowest.
void http_server::impl::enforce_memory_budget(const connection& sender) {
  (void)sender;
  deadline_list& l = lists_[static_cast<std::size_t>(timer_kind::write)];
  while (over_memory_budget() && l.head != nullptr) {
    connection& slowest = *l.head;
    ctr_.budget_cuts.add();
    close_now(slowest);  // unlinks it from the list
  }
}

// The in-flight budget is spent: rather than stop accepting behind requests
// whose bodies do not arrive, the one stalled the longest (at least a
// second without a byte) is cut with 408.
void http_server::impl::shed_stalled_bodies(const connection* keep) {
  deadline_list& l = lists_[static_cast<std::size_t>(timer_kind::body)];
  const auto stalled_before = clock_type::now() + opt_.body_timeout - std::chrono::seconds{1};
  while (in_flight_total_ >= opt_.max_requests_in_flight && l.head != nullptr && l.head != keep &&
         l.head->deadline <= stalled_before) {
    connection& c = *l.head;
    unlink_timer(c);
    ctr_.budget_cuts.add();
    expire_body(c);
  }
}

bool http_server::impl::make_room_for_accept() {
  if (open_count_ >= opt_.max_connections) {
    return false;
  }
  shed_stalled_bodies(nullptr);
  if (!budget_spent()) {
    return true;
  }
  const deadline_list& l = lists_[static_cast<std::size_t>(timer_kind::body)];
  if (l.head == nullptr || shed_armed_) {
    return false;
  }
  // The stalest body becomes sheddable one second after its last byte.
  shed_armed_ = true;
  shed_timer_.expires_at(l.head->deadline - opt_.body_timeout + std::chrono::seconds{1});
  shed_timer_.async_wait([this](const error_code& ec) {
    shed_armed_ = false;
    if (ec || draining_) {
      return;
    }
    if (make_room_for_accept()) {
      maybe_resume_accept();
    }
  });
  return false;
}

}  // namespace cadeloop::net
