// http_server::impl, the pair's memory budget against many slow clients at
// once: unsent response bytes plus request body bytes the app has not
// taken, checked as each send arrives from the app. Over it new requests
// get 503 and the slowest clients are cut first: the write deadline list is
// ordered by last progress, so its head is the client stalled the longest.
// (Requests waiting for a body that does not come do not count against
// max_requests_in_flight: see busy_in_flight() and body_timeout.)

#include "server_impl.hpp"

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
// closed (the sender too, when it is the slowest). A connection with only a
// little output pending (a small response, a 503 on its way out) is passed
// over: cutting it would free next to nothing and lose a client that reads.
// So is the sender itself while its socket has not refused a write yet (no
// wait for writability armed): its bytes go out in this pass's writes, and
// a client that just asked is not a slow one (in solo mode a response is
// applied and written in one pass, while readers that read nothing have
// long filled their sockets' buffers; cutting the one client that reads
// would free its bytes and serve nobody).
void http_server::impl::enforce_memory_budget(const connection& sender) {
  deadline_list& l = lists_[static_cast<std::size_t>(timer_kind::write)];
  for (connection* c = l.head; c != nullptr && over_memory_budget();) {
    connection* next = c->tnext;  // close_now unlinks c only
    if (c->unsent >= budget_worth_cutting && (c != &sender || c->write_armed)) {
      ctr_.budget_cuts.add();
      close_now(*c);
    }
    c = next;
  }
}

}  // namespace cadeloop::net
