#pragma once
// Private to pyhost/loop: the accept loop of servers (loop_accept.cpp) and
// the socket addresses it shares with the datagram transport core.
#include <Python.h>
#include <sys/socket.h>

namespace cadeloop::pyhost::loop {

/// Creates the Acceptor type (loop_accept.cpp) for this interpreter and adds
/// it to `module`. Returns -1 with an exception set on failure.
int add_acceptor_type(PyObject* module);

struct loop_state;

/// Adds the accept loop's counters to a loop.stats() dict: `accepted`.
/// Returns -1 with an exception set on failure.
int add_accept_stats(const loop_state& st, PyObject* stats);

/// A socket address as the socket module gives it: (host, port) for IPv4,
/// (host, port, flowinfo, scope_id) for IPv6, and for AF_UNIX a str path
/// (decoded with the file system encoding, surrogateescape), bytes for
/// Linux's abstract namespace, '' for an unnamed peer; None for an empty
/// address (`len` 0: a datagram from an unbound Unix socket). New reference,
/// or NULL with OSError for another family.
PyObject* socket_address(const sockaddr_storage& ss, socklen_t len);

}  // namespace cadeloop::pyhost::loop
