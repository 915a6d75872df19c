// Private to net/: a file region a response sends (ASGI http.response.pathsend),
// read by the I/O thread as the socket takes it (server_pathsend.cpp).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <utility>

namespace cadeloop::net {

/// An open file and the bytes of it still to send; owns the descriptor.
struct file_part {
  file_part(int descriptor, std::uint64_t from, std::uint64_t length, bool ends,
            bool reuse) noexcept
      : fd{descriptor}, offset{from}, remaining{length}, end_of_response{ends}, keep_alive{reuse} {}
  file_part(const file_part&) = delete;
  file_part& operator=(const file_part&) = delete;
  ~file_part() {
    if (fd >= 0) {
      ::close(fd);
    }
  }

  int fd;
  std::uint64_t offset;     // next byte to send
  std::uint64_t remaining;  // bytes still to send
  bool end_of_response;     // the response ends with the file's last byte
  bool keep_alive;          // with end_of_response: the connection carries another request
};

}  // namespace cadeloop::net
