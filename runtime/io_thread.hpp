#pragma once

#include <cadeloop/net/http_server.hpp>
#include <cadeloop/net/listener.hpp>
#include <cadeloop/runtime/pair_channels.hpp>
#include <cadeloop/runtime/shared_cpu.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <thread>

namespace cadeloop::runtime {

/// The native half of a core pair: one thread running an Asio io_context
/// with the pair's listener and HTTP server, feeding the inbound ring and
/// applying the outbound ring.
///
/// Its loop, per pass:
///   poll()            run every ready handler without blocking (accepts,
///                     reads + parsing, writability, timers, the wake fd)
///   drain_outbound()  apply the app's commands (response bytes, credit, ...)
///   flush_writes()    one write system call per connection with new output
///   flush_inbound()   publish this pass's inbound batch; wake the app only
///                     if it is parked
///   nothing done?     park: announce, re-check the outbound ring, then
///                     block in run_one() with the parker's eventfd
///                     registered in the same io_context; or, in solo
///                     mode, give the sockets to the app thread and sleep
///                     until they come back (give_sockets_to_app)
///
/// Created by `core_pair` on the control thread, which also opens the
/// listener through it before `start()`; from `start()` to the end of the
/// thread everything inside is touched by the I/O thread only, except while
/// it has given the sockets to the app thread (pair_channels::owner): then
/// the app thread runs `solo_pass()` and the I/O thread sleeps. Destroyed by
/// the control thread after `join()`.
class io_thread final : public net::event_sink, public io_pass_host {
 public:
  /// Control thread.
  io_thread(pair_channels& channels, const core_pair_options& options);
  io_thread(const io_thread&) = delete;
  io_thread& operator=(const io_thread&) = delete;
  /// Control thread, after join() (or if start() was never called).
  ~io_thread() override;

  /// Opens the listener. Returns "" or a one-line error. Control thread, before start().
  [[nodiscard]] std::string open_listener(net::socket_address& local, std::string& description);
  /// Starts the thread. Control thread.
  void start();
  /// Asks the loop to drain and stop (see core_pair::request_stop). Any thread.
  void request_stop() noexcept;
  /// Waits for the thread. Control thread.
  void join();

  // event_sink: called by the HTTP server on the I/O thread; each stages one
  // message on the inbound ring (published at the end of the pass).
  void on_request(net::connection_id conn, std::uint32_t request,
                  std::unique_ptr<http::request_head>&& head,
                  const net::request_info& info) override;
  void on_body(net::connection_id conn, std::uint32_t request, net::byte_buffer&& bytes,
               bool more_body) override;
  void on_disconnect(net::connection_id conn) override;
  void on_drained(net::connection_id conn, std::uint64_t unsent) override;
  void on_peer_eof(net::connection_id conn) override;
  void on_ws_message(net::connection_id conn, net::byte_buffer&& payload, bool text) override;
  void on_ws_close(net::connection_id conn, std::uint16_t code, std::string&& reason) override;

  // io_pass_host: the app thread runs the loop's pass while it owns the sockets.
  [[nodiscard]] int ready_fd() const noexcept override { return reactor_fd_; }
  std::size_t solo_pass(bool poll, bool& dirty, std::size_t& handlers) override;

 private:
  void run() noexcept;
  bool solo_allowed() const noexcept;
  void give_sockets_to_app();
  bool take_sockets_back() noexcept;
  std::uint64_t app_progress() const noexcept;  // the app thread's parks + solo passes
  void loop();
  std::size_t drain_outbound();
  void apply(const outbound_command& cmd);
  void flush_inbound() noexcept;
  void arm_wake_wait();
  void after_wake_handlers() noexcept;
  void park();
  void arm_watchdog();
  void watchdog_beat();

  pair_channels& ch_;
  core_pair_options options_;
  // Declared before the server and the descriptor: destroyed after them, so
  // no handler outlives what it points to (the context destroys pending
  // handlers without running them).
  boost::asio::io_context io_;
  std::unique_ptr<net::http_server> server_;
  std::unique_ptr<net::listener> listener_;
  boost::asio::posix::stream_descriptor wake_fd_;  // a dup of the parker's eventfd
  boost::asio::steady_timer grace_timer_;
  // The watchdog (runtime/io_thread_watchdog.cpp): the app's progress as last seen.
  boost::asio::steady_timer watchdog_timer_;
  std::uint64_t seen_ticks_ = 0;
  std::chrono::steady_clock::time_point last_progress_{};
  bool stuck_ = false;
  bool draining_ = false;
  bool wake_armed_ = false;
  bool wake_fired_ = false;
  shared_cpu_yield yield_;  // the window before a park when the app shares our CPU
  int reactor_fd_ = -1;     // the io_context's epoll set (solo mode's readiness)
  // Solo mode: the sockets were stolen from the app thread, and its progress
  // then (no hand-over again until it parked or served a pass).
  bool stolen_ = false;
  std::uint64_t progress_at_steal_ = 0;
  // Requests and WebSocket messages staged since the solo pass began (body
  // pieces and notices are part of a request's work, not more of it).
  std::size_t work_units_ = 0;
  std::thread thread_;
};

}  // namespace cadeloop::runtime
