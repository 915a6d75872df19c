// The wait the net tests share: a server driven on the test's thread makes
// progress only when the test pumps it (one turn of the I/O thread), so a
// test pumps until what it expects has happened, or gives up.
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace cadeloop::test {

/// Calls `pump` until `pred` holds after it; false once `timeout` passed,
/// with `pause` between the turns.
template <class Pump>
bool pump_until(Pump&& pump, const std::function<bool()>& pred, std::chrono::milliseconds timeout,
                std::chrono::microseconds pause) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    pump();
    if (pred()) {
      return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return false;
    }
    std::this_thread::sleep_for(pause);
  }
}

}  // namespace cadeloop::test
