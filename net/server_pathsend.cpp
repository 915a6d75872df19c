// http_server::impl, files as response bodies (ASGI http.response.pathsend):
// the app thread opens the file and sends the head; the I/O thread sends the
// file's bytes as the socket takes them, never holding more than one chunk:
// sendfile(2) straight from the page cache on plain TCP, pread(2) chunks
// handed to TLS otherwise. A file that ends early or cannot be read closes
// the connection (the head promised its length), with one log line.

#include "server_impl.hpp"

#include <sys/sendfile.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <string>
#include <utility>

namespace cadeloop::net {

namespace {

/// Bytes one sendfile(2) call may send, and calls per pass of the loop (a big
/// file does not keep the other connections waiting).
constexpr std::uint64_t sendfile_chunk = std::uint64_t{1} << 20;
constexpr int sendfile_calls_per_pass = 4;
/// Bytes read per chunk for a TLS connection (one chunk in memory at a time).
constexpr std::uint64_t tls_file_chunk = 64 * 1024;

}  // namespace

bool http_server::send_file(connection_id conn, std::uint32_t request, int fd, std::uint64_t offset,
                            std::uint64_t length, send_flags flags) {
  std::unique_ptr<file_part> file{new (std::nothrow)
                                      file_part(fd, offset, length, true, flags.keep_alive)};
  if (!file) {
    ::close(fd);
    return false;
  }
  if (length == 0) {
    file.reset();
    return impl_->send(conn, request, byte_buffer{}, flags);
  }
  return impl_->send_file(conn, request, std::move(file), length);
}

bool http_server::impl::send_file(connection_id id, std::uint32_t seq,
                                  std::unique_ptr<file_part> file, std::uint64_t length) {
  connection* c = lookup(id, false);
  const std::uint32_t index = c == nullptr ? 0 : seq - c->hol_seq;
  if (c == nullptr || index >= c->in_flight()) {
    ctr_.stale_messages.add();
    return false;  // the file closes with `file`
  }
  if (index < c->records.size()) {
    c->records[index].bytes += length;
  }
  if (index == 0) {
    if (c->file) {
      ctr_.stale_messages.add();
      return false;
    }
    c->file = std::move(file);
    c->hol_started = true;
    c->wrote_any = true;
    mark_dirty(*c);
  } else {
    later_response* r = later_slot(*c, index);
    if (r == nullptr) {
      return false;
    }
    r->ended = true;
    r->keep_alive = file->keep_alive;
    r->file = std::move(file);
  }
  if (c->phase == conn_phase::open) {
    settle(*c);
  }
  return true;
}

bool http_server::impl::pump_file(connection& c) {
  file_part& f = *c.file;
  const auto fail = [&](const char* what, int err) {
    // One line on standard error, as the server log writes its lines (net/
    // sits below the server log; this failure is rare: a file changed or
    // broke while it was being sent).
    std::string line{"cadeloop: pathsend: "};
    line.append(what).append(" the file of a response");
    if (err != 0) {
      line.append(": ").append(std::strerror(err));
    }
    line.append("; the connection is closed\n");
    (void)!::write(2, line.data(), line.size());
    close_now(c);
    return false;
  };
  if (!c.tls.active()) {
    const int sock = c.socket->native_handle();
    for (int calls = 0; f.remaining != 0; ++calls) {
      if (calls == sendfile_calls_per_pass) {
        mark_dirty(c);  // more on the next pass
        break;
      }
      auto at = static_cast<off_t>(f.offset);
      const ssize_t n = ::sendfile(sock, f.fd, &at, std::min(f.remaining, sendfile_chunk));
      ctr_.write_calls.add();
      if (n < 0) {
        if (errno == EINTR) {
          continue;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          arm_write(c);
          break;
        }
        if (errno == EPIPE || errno == ECONNRESET) {
          close_now(c);  // the client is gone
          return false;
        }
        return fail("could not send", errno);
      }
      if (n == 0) {
        return fail("the file ended before the length announced by", 0);
      }
      const auto sent = static_cast<std::uint64_t>(n);
      f.offset += sent;
      f.remaining -= sent;
      ctr_.bytes_out.add(sent);
      note_write_progress(c, static_cast<std::size_t>(sent));
    }
  } else {
    const auto want = static_cast<std::size_t>(std::min(f.remaining, tls_file_chunk));
    byte_buffer chunk{want};
    ssize_t n = 0;
    do {
      n = ::pread(f.fd, chunk.data(), want, static_cast<off_t>(f.offset));
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
      return fail("could not read", errno);
    }
    if (n == 0) {
      return fail("the file ended before the length announced by", 0);
    }
    const auto got = static_cast<std::size_t>(n);
    if (got < want) {
      chunk = byte_buffer::copy_of({chunk.data(), got});
    }
    f.offset += got;
    f.remaining -= got;
    append_out(c, std::move(chunk));
  }
  if (f.remaining == 0) {
    const bool ends = f.end_of_response;
    const bool keep_alive = f.keep_alive;
    c.file.reset();  // before finish_hol, which may make a later response's file current
    if (ends) {
      finish_hol(c, keep_alive);
    }
  }
  return true;
}

}  // namespace cadeloop::net
