#pragma once
// Private to pyhost/loop: what the socket transport core (loop_transport.cpp)
// and its close path (loop_transport_close.cpp) share.

#include "loop/loop_core.hpp"

namespace cadeloop::pyhost::loop {

/// Drops the write queue (abort, fatal errors, release).
void clear_chunks(transport_object* t);
/// Takes the fd out of the loop's table (and epoll) before its socket closes.
void detach(transport_object* t);
/// The fd's epoll interest made what the transport wants.
bool apply(transport_object* t);
/// release(): drops every reference the core holds (after connection_lost).
PyObject* transport_release(PyObject* self, PyObject* unused);

/// _SocketTransport._force_close(exc) of a native_close transport: the buffer
/// dropped, reading stopped, the C++ connection_lost scheduled. -1 with an
/// exception set on failure.
int force_close(transport_object* t, PyObject* exc);
/// connection_lost(exc): _SocketTransport._call_connection_lost in C++.
PyObject* transport_connection_lost(PyObject* self, PyObject* exc);

}  // namespace cadeloop::pyhost::loop
