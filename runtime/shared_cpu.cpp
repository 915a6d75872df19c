// sole_cpu(): the affinity question behind shared_cpu_yield (shared_cpu.hpp).
#include "cadeloop/runtime/shared_cpu.hpp"

#include <cstddef>

namespace cadeloop::runtime {

int sole_cpu() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) != 1) {
    return -1;
  }
  for (std::size_t cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) {
      return static_cast<int>(cpu);
    }
  }
  return -1;
}

}  // namespace cadeloop::runtime
