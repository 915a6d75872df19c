#pragma once

// One spin-wait hint for every spin-before-park loop (the I/O thread's and the
// event loop's).

namespace cadeloop::runtime {

/// Tells the CPU this thread is busy-waiting (x86 `pause`: yields the core's
/// resources to an SMT sibling and saves power); a no-op elsewhere. Any thread.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace cadeloop::runtime
