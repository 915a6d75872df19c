#include "cadeloop/runtime/core_pair.hpp"

#include "cadeloop/runtime/io_thread.hpp"

#include <utility>

namespace cadeloop::runtime {

// ---------------------------------------------------------------- app side

inbound_message app_side::adopt(const inbound_event& ev) noexcept {
  inbound_message m;
  m.kind = ev.kind;
  m.conn = ev.conn;
  m.request = ev.request;
  switch (ev.kind) {
    case inbound_kind::request:
      m.head.reset(static_cast<http::request_head*>(ev.data));
      m.info = net::request_info{ev.client, ev.server, ev.has_body, ev.server_closing, ev.tls};
      break;
    case inbound_kind::body:
      m.body = net::byte_buffer::adopt(static_cast<char*>(ev.data), ev.size);
      m.more_body = ev.more_body;
      break;
    case inbound_kind::drained:
      m.unsent = ev.size;
      break;
    case inbound_kind::disconnect:
    case inbound_kind::peer_eof:
      break;
  }
  return m;
}

void app_side::stage(const outbound_command& cmd) {
  ch_.outbound.stage(cmd);
  ch_.outbound_messages.add();
}

void app_side::send(net::connection_id conn, std::uint32_t request, net::byte_buffer&& bytes, send_options options) {
  outbound_command cmd;
  cmd.kind = outbound_kind::send;
  cmd.conn = conn;
  cmd.request = request;
  cmd.end_of_response = options.end_of_response;
  cmd.keep_alive = options.keep_alive;
  cmd.notify_drained = options.notify_drained;
  cmd.data = bytes.data();
  cmd.size = bytes.size();
  stage(cmd);
  (void)bytes.release();  // the ring owns them now
}

void app_side::consumed(net::connection_id conn, std::uint64_t bytes) {
  outbound_command cmd;
  cmd.kind = outbound_kind::consumed;
  cmd.conn = conn;
  cmd.size = bytes;
  stage(cmd);
}

void app_side::close(net::connection_id conn) {
  outbound_command cmd;
  cmd.kind = outbound_kind::close;
  cmd.conn = conn;
  stage(cmd);
}

void app_side::abort(net::connection_id conn) {
  outbound_command cmd;
  cmd.kind = outbound_kind::abort;
  cmd.conn = conn;
  stage(cmd);
}

void app_side::recycle(net::connection_id conn, std::unique_ptr<http::request_head>&& head) {
  if (!head) {
    return;
  }
  outbound_command cmd;
  cmd.kind = outbound_kind::recycle;
  cmd.conn = conn;
  cmd.head = head.get();
  stage(cmd);
  (void)head.release();
}

std::size_t app_side::flush() noexcept {
  const std::size_t n = ch_.outbound.publish();
  if (n != 0) {
    ch_.io_parker.wake();  // a system call only if the I/O thread announced a sleep
  }
  return n;
}

bool app_side::try_park() noexcept {
  const bool sleep = ch_.app_parker.try_park([this] {
    return ch_.inbound.has_pending() || ch_.io_stopped.load(std::memory_order_seq_cst);
  });
  if (sleep) {
    ch_.app_parks.add();
  }
  return sleep;
}

void app_side::unpark(bool signalled) noexcept { ch_.app_parker.unpark(signalled); }

// ---------------------------------------------------------------- core pair

namespace {

void dispose(const inbound_event& ev) noexcept {
  if (ev.kind == inbound_kind::request) {
    delete static_cast<http::request_head*>(ev.data);
  } else if (ev.kind == inbound_kind::body) {
    delete[] static_cast<char*>(ev.data);
  }
}

void dispose(const outbound_command& cmd) noexcept {
  delete[] cmd.data;
  delete cmd.head;
}

}  // namespace

core_pair::core_pair(core_pair_options options)
    : options_{std::move(options)},
      ch_{std::make_unique<pair_channels>(options_.ring_capacity)},
      app_{*ch_},
      io_{std::make_unique<io_thread>(*ch_, options_)} {}

core_pair::~core_pair() {
  io_.reset();  // stops and joins the thread if it still runs
  ch_->inbound.dispose_all([](const inbound_event& ev) { dispose(ev); });
  ch_->outbound.dispose_all([](const outbound_command& cmd) { dispose(cmd); });
}

std::string core_pair::start() {
  std::string error = io_->open_listener(local_, description_);
  if (!error.empty()) {
    return error;
  }
  io_->start();
  return {};
}

void core_pair::request_stop() noexcept { io_->request_stop(); }

void core_pair::join() { io_->join(); }

void core_pair::stop() {
  request_stop();
  join();
}

core_pair_stats core_pair::stats() const noexcept {
  const pair_channels& ch = *ch_;
  const net::server_counters& c = ch.io_counters;
  core_pair_stats s;
  s.requests = c.requests.get();
  s.responses = c.responses.get();
  s.requests_in_flight = c.requests_in_flight.get();
  s.bytes_in = c.bytes_in.get();
  s.bytes_out = c.bytes_out.get();
  s.unsent_bytes = c.unsent_bytes.get();
  s.connections_accepted = c.connections_accepted.get();
  s.connections_open = c.connections_open.get();
  s.protocol_errors = c.protocol_errors.get();
  s.timeouts = c.timeouts.get();
  s.stale_messages = c.stale_messages.get();
  s.accept_pauses = c.accept_pauses.get();
  s.write_calls = c.write_calls.get();
  s.io_passes = ch.io_passes.get();
  s.io_parks = ch.io_parks.get();
  s.inbound_messages = ch.inbound.published_count();
  s.inbound_depth = ch.inbound.depth();
  s.wakeups_to_app = ch.app_parker.wakeups_sent();
  s.outbound_messages = ch.outbound_messages.get();
  s.outbound_depth = ch.outbound.depth();
  s.app_parks = ch.app_parks.get();
  s.wakeups_to_io = ch.io_parker.wakeups_sent();
  return s;
}

}  // namespace cadeloop::runtime
