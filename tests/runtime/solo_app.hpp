#pragma once

// A C++ stand-in for an app thread in solo mode (runtime::app_side's
// enable_solo): a thread with its own epoll set holding the app parker's
// eventfd, a wake eventfd for the test, and, while serves_sockets(), the
// pair's solo_fd(). Each pass: drain_inbound (answering every GET with
// "ok <target>" through the test encoder), posted tasks, flush(); then
// try_park() -> watch solo_fd() or not -> epoll_wait -> sockets_ready() if
// solo_fd() was reported -> unpark(). Tests customise it with a request hook
// run on its thread; what they observe is in atomics.

#include "test_encoder.hpp"

#include <cadeloop/runtime/core_pair.hpp>

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

namespace cadeloop::test {

class solo_app {
 public:
  /// Run on the app thread for every request before it is answered; return
  /// true to leave it unanswered (answer later with respond(), from a task).
  using hook = std::function<bool(solo_app&, runtime::inbound_message&)>;

  explicit solo_app(runtime::app_side& side, hook h = {}) : side_{side}, hook_{std::move(h)} {}
  ~solo_app() {
    stop();
    ::close(wake_fd_);
  }
  solo_app(const solo_app&) = delete;
  solo_app& operator=(const solo_app&) = delete;

  /// Starts the thread and waits until it asked to serve the sockets;
  /// returns enable_solo()'s answer. Test thread.
  bool start() {
    thread_ = std::thread{[this] { run(); }};
    std::unique_lock lock{mu_};
    cv_.wait(lock, [this] { return started_; });
    return enabled_;
  }
  /// Test thread.
  void stop() {
    stop_.store(true);
    wake();
    if (thread_.joinable()) {
      thread_.join();
    }
  }
  /// Runs `task` on the app thread at its next pass. Any thread.
  void post(std::function<void(solo_app&)> task) {
    {
      std::lock_guard lock{mu_};
      tasks_.push_back(std::move(task));
    }
    wake();
  }

  /// Whether the calling thread is a solo_app's thread.
  static bool on_app_thread() noexcept { return app_thread_flag(); }

  // ------------------------------------------------------------ app thread

  runtime::app_side& side() { return side_; }

  /// A whole 200 response "ok <target>", ending request `seq` of `c`.
  void respond(net::connection_id c, std::uint32_t seq) {
    auto it = pending_.find(key(c, seq));
    if (it == pending_.end()) {
      return;
    }
    std::string out;
    const bool keep = encoder_.full(it->second.ctx, 200, "ok " + it->second.target, out);
    pending_.erase(it);
    runtime::send_options o;
    o.end_of_response = true;
    o.keep_alive = keep;
    o.status = 200;
    side_.send(c, seq, net::byte_buffer::copy_of(out), o);
  }

  // ------------------------------------------------------------ observations (any thread)

  std::atomic<std::uint64_t> requests{0};       ///< request heads taken
  std::atomic<std::uint64_t> socket_events{0};  ///< polls that reported solo_fd() readable
  std::atomic<std::uint64_t> tasks_run{0};

 private:
  struct request_state {
    request_ctx ctx;
    std::string target;
  };
  using key_type = std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>;
  static key_type key(net::connection_id c, std::uint32_t seq) {
    return {c.slot, c.generation, seq};
  }
  static bool& app_thread_flag() noexcept {
    thread_local bool flag = false;
    return flag;
  }

  enum : std::uint64_t { token_parker = 1, token_wake = 2, token_sockets = 3 };

  void wake() const noexcept {
    const std::uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof one);
  }

  static void watch(int ep, int fd, std::uint64_t token) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = token;
    (void)::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
  }

  void run() {
    app_thread_flag() = true;
    const int ep = ::epoll_create1(EPOLL_CLOEXEC);
    watch(ep, side_.parker_fd(), token_parker);
    watch(ep, wake_fd_, token_wake);
    {
      std::lock_guard lock{mu_};
      enabled_ = side_.enable_solo();
      started_ = true;
    }
    cv_.notify_all();
    bool watched = false;
    for (;;) {
      const std::size_t n =
          side_.drain_inbound([this](runtime::inbound_message&& m) { handle(m); });
      std::deque<std::function<void(solo_app&)>> tasks;
      {
        std::lock_guard lock{mu_};
        tasks.swap(tasks_);
      }
      for (auto& t : tasks) {
        t(*this);
        tasks_run.fetch_add(1);
      }
      side_.flush();
      if (stop_.load()) {
        break;
      }
      if (n != 0 || !tasks.empty() || !side_.try_park()) {
        continue;
      }
      // After try_park() announced the sleep: a hand-over from now on wakes
      // the parker, so asking serves_sockets() here misses none.
      const bool want = side_.serves_sockets();
      if (want != watched) {
        if (want) {
          watch(ep, side_.solo_fd(), token_sockets);
        } else {
          (void)::epoll_ctl(ep, EPOLL_CTL_DEL, side_.solo_fd(), nullptr);
        }
        watched = want;
      }
      epoll_event events[4];
      const int k = ::epoll_wait(ep, events, 4, 200);
      bool signalled = false;
      for (int i = 0; i < k; ++i) {
        switch (events[i].data.u64) {
          case token_parker:
            signalled = true;
            break;
          case token_wake: {
            std::uint64_t v = 0;
            (void)!::read(wake_fd_, &v, sizeof v);
            break;
          }
          case token_sockets:
            socket_events.fetch_add(1);
            side_.sockets_ready();
            break;
          default:
            break;
        }
      }
      side_.unpark(signalled);
    }
    side_.disable_solo();
    ::close(ep);
  }

  void handle(runtime::inbound_message& m) {
    if (m.kind == runtime::inbound_kind::request) {
      request_state& st = pending_[key(m.conn, m.request)];
      st.ctx.is_head = m.head->method() == http::request_method::head;
      st.ctx.http_minor = m.head->version_minor();
      st.ctx.client_keep_alive = m.head->keep_alive();
      st.ctx.server_closing = m.info.server_closing;
      st.target = std::string{m.head->target()};
      requests.fetch_add(1);
      if (!(hook_ && hook_(*this, m))) {
        respond(m.conn, m.request);
      }
    } else if (m.kind == runtime::inbound_kind::disconnect) {
      for (auto it = pending_.begin(); it != pending_.end();) {
        if (std::get<0>(it->first) == m.conn.slot && std::get<1>(it->first) == m.conn.generation) {
          it = pending_.erase(it);
        } else {
          ++it;
        }
      }
    }
    if (m.head) {
      side_.recycle(m.conn, std::move(m.head));
    }
  }

  runtime::app_side& side_;
  hook hook_;
  test_encoder encoder_;
  std::map<key_type, request_state> pending_;
  int wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false;
  bool enabled_ = false;
  std::deque<std::function<void(solo_app&)>> tasks_;
};

}  // namespace cadeloop::test
