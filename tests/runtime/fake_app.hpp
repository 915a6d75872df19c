#pragma once

// A C++ stand-in for the Python app thread: drains the inbound ring, answers
// with the response encoder, parks with check-before-park on the app
// parker's eventfd. Tests customise it with a handler run on its thread and
// read what it saw through a mutex-protected log (test-only state).

#include "test_encoder.hpp"

#include <cadeloop/runtime/core_pair.hpp>

#include <poll.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace cadeloop::test {

/// One message as the fake app saw it.
struct seen {
  runtime::inbound_kind kind{};
  net::connection_id conn{};
  std::uint32_t request = 0;
  std::string target;          // request
  bool has_body = false;       // request
  bool server_closing = false; // request
  bool expect_continue = false;
  std::uint64_t size = 0;      // body: bytes; drained: unsent
  bool more_body = false;      // body
  net::socket_address client{};
};

class fake_app {
 public:
  /// A hook run on the app thread for every message before the default
  /// behaviour; return true to skip the default.
  using hook = std::function<bool(fake_app&, runtime::inbound_message&)>;

  explicit fake_app(runtime::app_side& side) : side_{side} {}
  ~fake_app() { stop(); }

  /// Test thread, before start().
  void set_hook(hook h) { hook_ = std::move(h); }
  /// Report body bytes consumed as soon as they arrive (default true). Any thread.
  std::atomic<bool> auto_consume{true};

  void start() {
    thread_ = std::thread{[this] { run(); }};
  }
  void stop() {
    stop_.store(true);
    if (thread_.joinable()) {
      thread_.join();
    }
  }

  /// Runs `task` on the app thread (within ~20 ms). Any thread.
  void post(std::function<void(fake_app&)> task) {
    std::lock_guard lock{mu_};
    tasks_.push_back(std::move(task));
  }

  // ------------------------------------------------------------ app thread

  runtime::app_side& side() { return side_; }
  test_encoder& encoder() { return encoder_; }

  /// The encoder context of a request the app has not answered yet.
  request_ctx ctx(net::connection_id c, std::uint32_t seq) { return pending_[key(c, seq)].ctx; }
  bool pending(net::connection_id c, std::uint32_t seq) { return pending_.count(key(c, seq)) != 0; }

  /// A whole response with Content-Length, ending the request.
  void respond(net::connection_id c, std::uint32_t seq, unsigned status, std::string_view body) {
    std::string out;
    const bool keep = encoder_.full(ctx(c, seq), status, body, out);
    pending_.erase(key(c, seq));
    runtime::send_options o;
    o.end_of_response = true;
    o.keep_alive = keep;
    o.status = static_cast<std::uint16_t>(status);
    net::byte_buffer bytes = side_.take_buffer(out.size());  // as the bridge does
    if (!out.empty()) {
      std::memcpy(bytes.data(), out.data(), out.size());
    }
    side_.send(c, seq, std::move(bytes), o);
  }

  // ------------------------------------------------------------ observations (any thread)

  std::vector<seen> log() const {
    std::lock_guard lock{mu_};
    return log_;
  }
  std::size_t count(runtime::inbound_kind k) const {
    std::lock_guard lock{mu_};
    std::size_t n = 0;
    for (const seen& s : log_) {
      n += s.kind == k ? 1 : 0;
    }
    return n;
  }
  /// Waits until `pred(log)` holds; false on timeout.
  bool wait_until(const std::function<bool(const std::vector<seen>&)>& pred,
                  std::chrono::milliseconds timeout = std::chrono::seconds{10}) const {
    std::unique_lock lock{mu_};
    return cv_.wait_for(lock, timeout, [&] { return pred(log_); });
  }
  bool wait_count(runtime::inbound_kind k, std::size_t n, std::chrono::milliseconds timeout = std::chrono::seconds{10}) const {
    return wait_until(
        [&](const std::vector<seen>& l) {
          std::size_t c = 0;
          for (const seen& s : l) {
            c += s.kind == k ? 1 : 0;
          }
          return c >= n;
        },
        timeout);
  }

 private:
  struct request_state {
    request_ctx ctx;
    std::string target;
    std::uint64_t body = 0;
  };
  using key_type = std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>;
  static key_type key(net::connection_id c, std::uint32_t seq) { return {c.slot, c.generation, seq}; }

  void run() {
    for (;;) {
      const std::size_t n = side_.drain_inbound([this](runtime::inbound_message&& m) { handle(m); });
      std::deque<std::function<void(fake_app&)>> tasks;
      {
        std::lock_guard lock{mu_};
        tasks.swap(tasks_);
      }
      for (auto& t : tasks) {
        t(*this);
      }
      side_.flush();
      if (stop_.load()) {
        break;
      }
      if (n == 0 && tasks.empty() && side_.try_park()) {
        pollfd p{side_.parker_fd(), POLLIN, 0};
        const int r = ::poll(&p, 1, 20);
        side_.unpark(r > 0);
      }
    }
  }

  void handle(runtime::inbound_message& m) {
    seen s;
    s.kind = m.kind;
    s.conn = m.conn;
    s.request = m.request;
    if (m.kind == runtime::inbound_kind::request) {
      s.target = std::string{m.head->target()};
      s.has_body = m.info.has_body;
      s.server_closing = m.info.server_closing;
      s.expect_continue = m.head->expect_continue();
      s.client = m.info.client;
      request_state& st = pending_[key(m.conn, m.request)];
      st.ctx.is_head = m.head->method() == http::request_method::head;
      st.ctx.http_minor = m.head->version_minor();
      st.ctx.client_keep_alive = m.head->keep_alive();
      st.ctx.server_closing = m.info.server_closing;
      st.target = s.target;
    } else if (m.kind == runtime::inbound_kind::body) {
      s.size = m.body.size();
      s.more_body = m.more_body;
    } else if (m.kind == runtime::inbound_kind::drained) {
      s.size = m.unsent;
    }
    {
      std::lock_guard lock{mu_};
      log_.push_back(s);
    }
    cv_.notify_all();
    if (hook_ && hook_(*this, m)) {
      recycle(m);
      return;
    }
    switch (m.kind) {
      case runtime::inbound_kind::request:
        if (!m.info.has_body) {
          respond(m.conn, m.request, 200, "ok " + s.target + " #" + std::to_string(m.request));
        }
        break;
      case runtime::inbound_kind::body: {
        auto it = pending_.find(key(m.conn, m.request));
        if (it == pending_.end()) {
          break;
        }
        it->second.body += m.body.size();
        if (auto_consume.load() && !m.body.empty()) {
          side_.consumed(m.conn, m.body.size());
        }
        if (!m.more_body) {
          respond(m.conn, m.request, 200, "got " + std::to_string(it->second.body));
        }
        break;
      }
      case runtime::inbound_kind::disconnect:
        for (auto it = pending_.begin(); it != pending_.end();) {
          if (std::get<0>(it->first) == m.conn.slot && std::get<1>(it->first) == m.conn.generation) {
            it = pending_.erase(it);
          } else {
            ++it;
          }
        }
        break;
      case runtime::inbound_kind::drained:
      case runtime::inbound_kind::peer_eof:
      case runtime::inbound_kind::ws_message:
      case runtime::inbound_kind::ws_close:
        break;
    }
    recycle(m);
  }

  void recycle(runtime::inbound_message& m) {
    if (m.head) {
      side_.recycle(m.conn, std::move(m.head));
    }
  }

  runtime::app_side& side_;
  test_encoder encoder_;
  hook hook_;
  std::map<key_type, request_state> pending_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::vector<seen> log_;
  std::deque<std::function<void(fake_app&)>> tasks_;
};

}  // namespace cadeloop::test
