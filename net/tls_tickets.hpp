// Private to net/: session-ticket keys every I/O thread and every worker
// process of one server agrees on, rotated on an interval.
#pragma once

#include <chrono>

struct ssl_ctx_st;

namespace cadeloop::net {

/// Makes `ctx` encrypt its session tickets (TLS 1.2 and 1.3) with keys
/// derived from the process's ticket secret and the current rotation period
/// (wall-clock time divided by `rotation`). A ticket made under the previous
/// period is still accepted, an older one is not: a client resumes for
/// between one and two periods. Every resumption gets a fresh ticket. Tickets also
/// expire after two periods. The secret is 32 random bytes made when the
/// library is loaded, so worker processes forked from the supervisor share
/// it (nothing is written to disk or the environment) and a ticket made by
/// one pair resumes on every other.
void use_shared_ticket_keys(ssl_ctx_st* ctx, std::chrono::milliseconds rotation);

}  // namespace cadeloop::net
