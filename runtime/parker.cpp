// The parker's eventfd: creating it, the wake write and the drain read that
// ends a sleep. The check-before-park protocol itself is in parker.hpp.
#include "cadeloop/runtime/parker.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace cadeloop::runtime {

parker::parker() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (fd_ < 0) {
    throw std::system_error(errno, std::generic_category(), "eventfd");
  }
}

parker::~parker() {
  if (fd_ >= 0) {
    ::close(fd_);
  }
}

void parker::unpark(bool signalled) noexcept {
  parked_.store(false, std::memory_order_relaxed);
  if (signalled) {
    // The eventfd is non-blocking; a read that finds the counter already
    // drained (EAGAIN) is harmless.
    std::uint64_t value = 0;
    [[maybe_unused]] auto n = ::read(fd_, &value, sizeof value);
  }
}

bool parker::wake() noexcept {
  // The seq_cst load pairs with prepare_park(): see the class comment.
  if (!parked_.load(std::memory_order_seq_cst)) {
    return false;
  }
  // Of several producers that see the consumer parked, one writes: the
  // exchange hands the wake to exactly one of them.
  if (!parked_.exchange(false, std::memory_order_seq_cst)) {
    return false;
  }
  const std::uint64_t one = 1;
  ssize_t n = 0;
  do {
    n = ::write(fd_, &one, sizeof one);
  } while (n < 0 && errno == EINTR);
  // EAGAIN means the counter is at its maximum: the consumer is woken anyway.
  wakeups_sent_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace cadeloop::runtime
