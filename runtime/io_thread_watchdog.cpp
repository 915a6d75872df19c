// The I/O thread's watchdog: a periodic beat that records the thread is
// alive (for a supervising process) and compares the app thread's progress
// since the last beat. An app thread that has work (it is not asleep, or
// messages wait for it) and made no progress for `stuck_timeout` marks the
// pair stuck: its listener pauses, so the other pairs of the SO_REUSEPORT
// group take new connections, and the app side is told once (it logs the
// Python stack). Progress again resumes listening.
#include "cadeloop/runtime/server_log.hpp"
#include "io_thread.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

namespace cadeloop::runtime {

namespace {

using clock_type = std::chrono::steady_clock;

std::uint64_t monotonic_ms(clock_type::time_point t) noexcept {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count());
}

std::string seconds_text(std::chrono::milliseconds d) {
  const auto ms = d.count();
  std::string out = std::to_string(ms / 1000);
  if (ms % 1000 != 0) {
    std::string frac = std::to_string(1000 + ms % 1000).substr(1);
    while (!frac.empty() && frac.back() == '0') {
      frac.pop_back();
    }
    out.append(".").append(frac);
  }
  return out.append(" s");
}

}  // namespace

void io_thread::arm_watchdog() {
  if (options_.stuck_timeout.count() <= 0) {
    return;
  }
  // Four looks per timeout (at most one a second, at least every 50 ms): a
  // stuck pair is marked within 1.25 timeouts at worst.
  const auto period = std::clamp<std::chrono::milliseconds>(
      options_.stuck_timeout / 4, std::chrono::milliseconds{50}, std::chrono::milliseconds{1000});
  if (last_progress_ == clock_type::time_point{}) {
    last_progress_ = clock_type::now();
    seen_ticks_ = ch_.page.app.loop_ticks.get();
    ch_.page.watchdog.io_beat_ms.store(monotonic_ms(last_progress_), std::memory_order_relaxed);
  }
  watchdog_timer_.expires_after(period);
  watchdog_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) {
      watchdog_beat();
      arm_watchdog();
    }
  });
}

void io_thread::watchdog_beat() {
  const auto now = clock_type::now();
  watchdog_beats& w = ch_.page.watchdog;
  w.io_beat_ms.store(monotonic_ms(now), std::memory_order_relaxed);
  if (draining_) {
    return;  // the listener is closed; the grace period bounds the rest
  }
  const std::uint64_t ticks = ch_.page.app.loop_ticks.get();
  const bool busy = w.app_busy.load(std::memory_order_relaxed) != 0;
  const bool waiting = ch_.page.io_loop.inbound_published.get() > ch_.page.app.inbound_taken.get();
  if (ticks != seen_ticks_ || (!busy && !waiting)) {
    // Progress, or nothing owed: an app asleep in its loop with no message
    // waiting is idle, not stuck.
    const auto stuck_for = now - last_progress_;
    seen_ticks_ = ticks;
    last_progress_ = now;
    if (stuck_) {
      stuck_ = false;
      w.stuck_since_ms.store(0, std::memory_order_relaxed);
      ch_.page.set_state(pair_state::serving);
      server_->resume_listening();
      server_log::write(
          server_log::log_level::warning,
          std::string{"pair "}.append(std::to_string(options_.index)).append(" progresses again"),
          std::string{"after "}
              .append(
                  seconds_text(std::chrono::duration_cast<std::chrono::milliseconds>(stuck_for)))
              .append("; accepting new connections again"));
    }
    return;
  }
  if (stuck_ || now - last_progress_ < options_.stuck_timeout) {
    return;
  }
  stuck_ = true;
  w.stuck_since_ms.store(monotonic_ms(now), std::memory_order_relaxed);
  w.stuck_episodes.add();
  ch_.page.set_state(pair_state::stuck);
  server_->pause_listening();
  server_log::write(
      server_log::log_level::warning,
      std::string{"pair "}.append(std::to_string(options_.index)).append(" is stuck"),
      std::string{"its app thread made no progress for "}
          .append(seconds_text(options_.stuck_timeout))
          .append(" while it had work (stuck_timeout); new connections go to the other pairs "
                  "until it progresses"));
  if (options_.stuck_notify_fd >= 0) {
    const char byte = 's';
    [[maybe_unused]] const auto n = ::write(options_.stuck_notify_fd, &byte, 1);
  }
}

}  // namespace cadeloop::runtime
