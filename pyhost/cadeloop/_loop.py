"""cadeloop.Loop: an asyncio event loop whose scheduling core is C++.

`Loop` inherits from `_core.LoopCore` (C++: ready queue, timer heap, run-once
step with the epoll poll, check-before-park wake-ups, the fd interest table,
call_soon/call_later/call_at/call_soon_threadsafe, run_forever's loop of
passes, and the hot half of the TCP/Unix socket transports) and from asyncio's
own selector event loop, whose Python code supplies what is not hot yet: the
set-up and clean-up of run_forever, run_until_complete, tasks and futures, the exception handler, executors and DNS (sock_* calls are C++, loop_sock.cpp),
the accept path of TLS servers, the cold paths of UDP transports (their reads and
ordinary sends are C++), the cold paths of pipe transports (their reads and
writes are C++, _loop_pipes.py; child processes are watched with a pidfd in
C++) and TLS (asyncio's SSL protocol over cadeloop's socket transports). Signal
handlers and sock_sendfile's sendfile(2) loop are C++ too.
"""

from __future__ import annotations

import asyncio
import collections.abc
import selectors
import socket
import sys
import threading
import warnings
import weakref
from asyncio import base_events, constants, events, format_helpers, protocols, selector_events, transports, trsock
from asyncio.log import logger
from typing import Any, Coroutine, Iterator, Mapping, TypeVar

from . import _core, _loop_pipes

__all__ = ["Loop", "EventLoopPolicy", "new_event_loop", "install", "run"]

_T = TypeVar("_T")

# spin_us is the server setting of the same name (the settings table, config/): its bounds,
# default and doc come from there. adaptive_spin is the loop's own and not a server setting.
_SPIN_US = next(row for row in _core.settings_table() if row["name"] == "spin_us")

# Loop(**settings): name -> (type, lowest, highest, default, what it does).
SETTINGS: dict[str, tuple[type, int, int, Any, str]] = {
    "spin_us": (int, _SPIN_US["min"], _SPIN_US["max"], _SPIN_US["default"], _SPIN_US["doc"]),
    "adaptive_spin": (bool, 0, 1, False, "stop spinning after a run of fruitless spins, probe now and then"),
}

_FORMAT_TAKES_DEBUG = sys.version_info >= (3, 12)


def _format_callback(callback: Any, args: Any, loop: Any) -> str:
    if _FORMAT_TAKES_DEBUG:
        return format_helpers._format_callback_source(callback, args, debug=loop.get_debug())
    return format_helpers._format_callback_source(callback, args)


# --- the Python half of _core.Handle / TimerHandle (cold paths) ------------------


def _handle_repr_info(handle: Any) -> list[str]:
    info = [type(handle).__name__]
    if handle._cancelled:
        info.append("cancelled")
    if handle._callback is not None:
        info.append(_format_callback(handle._callback, handle._args, handle._loop))
    if handle._source_traceback:
        frame = handle._source_traceback[-1]
        info.append(f"created at {frame[0]}:{frame[1]}")
    if isinstance(handle, _core.TimerHandle):
        info.insert(2 if handle._cancelled else 1, f"when={handle._when}")
    return info


def _handle_repr(handle: Any) -> str:
    return "<{}>".format(" ".join(_handle_repr_info(handle)))


def _report_callback_error(handle: Any, exc: BaseException) -> None:
    """A callback raised: hand it to the loop's exception handler, as asyncio.Handle._run does."""
    loop = handle._loop
    cb = _format_callback(handle._callback, handle._args, loop)
    context: dict[str, Any] = {"message": f"Exception in callback {cb}", "exception": exc, "handle": handle}
    if handle._source_traceback:
        context["source_traceback"] = handle._source_traceback
    loop.call_exception_handler(context)


# --- loop._selector, for the asyncio code that looks at it -------------------------


class _FdMap(collections.abc.Mapping):  # type: ignore[type-arg]
    def __init__(self, view: _SelectorView) -> None:
        self._view = view

    def __len__(self) -> int:
        return len(self._view._loop._fd_list())

    def __iter__(self) -> Iterator[int]:
        return iter(self._view._loop._fd_list())

    def __getitem__(self, fileobj: Any) -> selectors.SelectorKey:
        return self._view.get_key(fileobj)


class _SelectorView(selectors.BaseSelector):
    """A read-only selector over the C++ fd table.

    asyncio's transports read `loop._selector` for their repr() and its pipe
    transports to tell whether they are polling; registration itself goes
    through Loop._add_reader/_add_writer (C++), never through here.
    """

    def __init__(self, loop: Loop) -> None:
        self._loop = loop

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        raise NotImplementedError("cadeloop registers fds through loop.add_reader/add_writer")

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        raise NotImplementedError("cadeloop registers fds through loop.remove_reader/remove_writer")

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        raise NotImplementedError("cadeloop polls in C++ (Loop._run_once)")

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        found = self._loop._fd_key(fileobj)
        if found is None:
            raise KeyError(f"{fileobj!r} is not registered")
        events, reader, writer = found
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return selectors.SelectorKey(fileobj, fd, events, (reader, writer))

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return _FdMap(self)

    def close(self) -> None:
        pass


# --- socket transports -------------------------------------------------------------


# 3.13's Server._attach(transport) (close_clients), 3.11's Server._attach().
_ATTACH_TAKES_TRANSPORT = base_events.Server._attach.__code__.co_argcount == 2
# 3.13's transport picks its _write_ready in __init__; 3.11's is a method.
_INIT_SETS_WRITE_READY = "_write_sendmsg" in selector_events._SelectorSocketTransport.__init__.__code__.co_names
# asyncio's _call_connection_lost chain (of this Python), which _SocketTransport's does in one frame.
_CONNECTION_LOST_IS_ASYNCIOS = (
    selector_events._SelectorSocketTransport._call_connection_lost.__code__.co_names
    == ("super", "_call_connection_lost", "_empty_waiter", "set_exception", "ConnectionError")
    and selector_events._SelectorTransport._call_connection_lost.__code__.co_names
    == ("_protocol_connected", "_protocol", "connection_lost", "_sock", "close", "_loop", "_server", "_detach")
)


class _OwnMethod:
    """A method of the transport itself, kept by name of its function in the
    transport's dict: the transport is then no cycle (see _self_method)."""

    __slots__ = ("func",)

    def __init__(self, func: Any) -> None:
        self.func = func


def _self_method(name: str, default: Any, doc: str) -> property:
    """An attribute asyncio sets to one of the transport's own bound methods
    (_read_ready_cb, _write_ready). Stored bound, they would make each
    transport a reference cycle that only the cycle collector frees; stored
    as their function, the transport goes away with its last reference.
    `default(self)` answers until asyncio's code assigns one."""
    slot = "_cadeloop" + name

    def get(self: Any) -> Any:
        value = self.__dict__.get(slot, _OwnMethod)
        if value is _OwnMethod:
            return default(self)
        if type(value) is _OwnMethod:
            return value.func.__get__(self)
        return value

    def set_(self: Any, value: Any) -> None:
        if getattr(value, "__self__", None) is self and hasattr(value, "__func__"):
            value = _OwnMethod(value.__func__)
        self.__dict__[slot] = value

    return property(get, set_, doc=doc)


def _default_read_ready_cb(self: Any) -> Any:
    # What asyncio's set_protocol picks for the protocol.
    if isinstance(self._protocol, protocols.BufferedProtocol):
        return self._read_ready__get_buffer
    return self._read_ready__data_received


def _default_write_ready(self: Any) -> Any:
    # What 3.13 asyncio's __init__ picks.
    return self._write_sendmsg if selector_events._HAS_SENDMSG else self._write_send


def _made_on_first_use(transport: Any, d: dict[str, Any]) -> None:
    """The socket.socket of an accepted connection and its TransportSocket in
    the extra info, which the C++ accept loop leaves until something asks
    (_sock, _extra, get_extra_info): most connections never do."""
    family, type_, proto = d.pop("_cadeloop_sockargs")
    core = d.get("_core")
    if core is not None:
        core.fd_private = False  # the fd is the socket object's too now
    sock = d.get("_cadeloop_sock", _OwnMethod)
    if sock is _OwnMethod:
        sock = d["_cadeloop_sock"] = socket.socket(family, type_, proto, d["_sock_fd"])
        wrapped = sock
    else:
        # Closed before anyone asked (_sock is None now): what asyncio's extra
        # info holds by then, the TransportSocket of a closed socket.
        wrapped = socket.socket(family, type_, proto)
        wrapped.close()
    extra = d["_cadeloop_extra"]
    # asyncio's order: peername (from accept), socket, sockname.
    d["_cadeloop_extra"] = {"peername": extra.pop("peername"), "socket": trsock.TransportSocket(wrapped),
                            "sockname": extra.pop("sockname"), **extra}


def _get_sock(self: Any) -> Any:
    d = self.__dict__
    sock = d.get("_cadeloop_sock", _OwnMethod)
    if sock is _OwnMethod:
        _made_on_first_use(self, d)
        sock = d["_cadeloop_sock"]
    return sock


def _set_sock(self: Any, value: Any) -> None:
    self.__dict__["_cadeloop_sock"] = value


def _get_extra(self: Any) -> Any:
    d = self.__dict__
    if "_cadeloop_sockargs" in d:
        _made_on_first_use(self, d)
    return d["_cadeloop_extra"]


def _set_extra(self: Any, value: Any) -> None:
    self.__dict__["_cadeloop_extra"] = value


def _core_field(name: str, doc: str) -> property:
    def get(self: Any) -> Any:
        return getattr(self._core, name)

    def set_(self: Any, value: Any) -> None:
        setattr(self._core, name, value)

    return property(get, set_, doc=doc)


class _SocketTransport(selector_events._SelectorSocketTransport):  # type: ignore[misc,name-defined]
    """A TCP or Unix stream socket transport whose hot half is C++.

    `_core` (`_core.SocketTransportCore`) reads from epoll straight into the
    protocol (data_received, or get_buffer/buffer_updated), queues writes and
    sends them with one send per transport per loop pass, and keeps the flow
    control state. This class is asyncio's selector socket transport with that
    state moved into the core: close, abort, fatal errors, connection_lost,
    extra info, repr, sendfile and start_tls stay asyncio's code. Loop thread
    only; the loop's fd table owns the core until connection_lost.
    """

    # asyncio's __init__ assigns a buffer; the core is the buffer (len() is
    # the bytes queued, clear() drops them).
    _buffer = property(lambda self: self._core, lambda self, value: None)
    _closing = _core_field("closing", "close() was called (reading stops with it)")
    _conn_lost = _core_field("conn_lost", "connection_lost is scheduled (count of lost writes)")
    _eof = _core_field("eof", "write_eof() was called")
    _paused = _core_field("paused", "pause_reading() is in effect")
    _protocol_paused = _core_field("protocol_paused", "pause_writing() was called on the protocol")
    _high_water = _core_field("high_water", "write buffer high-water mark")
    _low_water = _core_field("low_water", "write buffer low-water mark")
    _empty_waiter = _core_field("empty_waiter", "sendfile's wait for an empty write buffer")
    _sock = property(_get_sock, _set_sock, doc="the socket.socket (an accepted connection's is made on first use)")
    _extra = property(_get_extra, _set_extra, doc="get_extra_info's dict (see _made_on_first_use)")
    _read_ready_cb = _self_method("_read_ready_cb", _default_read_ready_cb, "the read path asyncio's _read_ready takes")
    if _INIT_SETS_WRITE_READY:
        _write_ready = _self_method("_write_ready", _default_write_ready, "what asyncio's writer callback calls")

    def __init__(self, loop: Loop, sock: socket.socket, protocol: Any, waiter: Any = None,
                 extra: Any = None, server: Any = None) -> None:
        core = loop._make_transport_core(self, sock.fileno())
        self._core = core
        # The hot methods are the core's, bound on the instance: a protocol's
        # transport.write() is one C call, no Python frame.
        self.write = core.write
        self.writelines = core.writelines
        try:
            super().__init__(loop, sock, protocol, waiter, extra, server)
        except BaseException:
            core.release()  # out of the loop's fd table; the caller closes the socket
            raise
        if _CONNECTION_LOST_IS_ASYNCIOS and type(self) is _SocketTransport:
            core.detach_transport = _ATTACH_TAKES_TRANSPORT
            core.native_close = True

    def set_protocol(self, protocol: Any) -> None:
        core = self._core
        old = self.__dict__.get("_protocol")
        if core.protocol_paused and old is not None and protocol is not old:
            # Writes of this pass paused the old protocol and are not sent yet
            # (asyncio would have sent them in write()): send them now, so the
            # old protocol is resumed as it would have been. If the socket is
            # really full, the old protocol is resumed anyway: the pause/resume
            # pair belongs to one protocol, and the new one starts unpaused.
            core.flush()
            if core.protocol_paused:
                core.protocol_paused = False
                try:
                    old.resume_writing()
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    self._loop.call_exception_handler({
                        "message": "protocol.resume_writing() failed",
                        "exception": exc,
                        "transport": self,
                        "protocol": old,
                    })
        super().set_protocol(protocol)
        core.set_protocol(protocol, isinstance(protocol, protocols.BufferedProtocol))
        if core.buffer_size > core.high_water:
            self._maybe_pause_protocol()

    def _add_reader(self, fd: int, callback: Any, *args: Any) -> None:
        # asyncio starts (and resumes) reading with _add_reader(fd, self._read_ready).
        if self.is_reading():
            self._core.start_reading()

    def pause_reading(self) -> None:
        if self._core.pause_reading() and self._loop.get_debug():
            logger.debug("%r pauses reading", self)

    def resume_reading(self) -> None:
        if self._core.resume_reading() and self._loop.get_debug():
            logger.debug("%r resumes reading", self)

    def get_write_buffer_size(self) -> int:
        return self._core.buffer_size

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if not self._core.buffer_size:
            self._conn_lost += 1
            self._loop.call_soon(self._call_connection_lost, None)
        # Otherwise the flush that empties the buffer calls connection_lost.

    def abort(self) -> None:
        # asyncio's write() sends at once what the socket takes and abort() loses
        # only the rest; this transport's writes go out at the end of the pass,
        # so what asyncio would have sent already is sent before the abort.
        # (Not once closing: a flush that drains would call connection_lost itself.)
        if not self._closing and not self._conn_lost and self._core.buffer_size:
            self._core.flush()
        super().abort()

    def _fatal_error(self, exc: BaseException, message: str = "Fatal error on transport") -> None:
        # asyncio's: an OSError (a reset, a broken pipe) is only logged in debug mode.
        if isinstance(exc, OSError) and not self._loop.get_debug():
            self._force_close(exc)
        else:
            super()._fatal_error(exc, message)

    def _force_close(self, exc: BaseException | None) -> None:
        core = self._core
        if core.conn_lost:
            return
        core.discard()
        core.closing = True
        core.conn_lost += 1
        self._loop.call_soon(self._call_connection_lost, exc)

    def _call_connection_lost(self, exc: BaseException | None) -> None:
        core = self._core
        if core.native_close:
            # The chain below, in C++ (loop_transport.cpp); a fatal read error
            # (a reset) schedules it without this frame.
            core.connection_lost(exc)
            return
        # Out of the loop's fd table before asyncio closes the socket and the
        # fd number can be reused.
        core.unregister()
        try:
            if not _CONNECTION_LOST_IS_ASYNCIOS:
                super()._call_connection_lost(exc)
                return
            # asyncio's _SelectorSocketTransport._call_connection_lost and
            # _SelectorTransport._call_connection_lost, in one frame.
            try:
                if self._protocol_connected:
                    self._protocol.connection_lost(exc)
            finally:
                self._sock.close()
                self._sock = None
                self._protocol = None
                self._loop = None
                server = self._server
                if server is not None:
                    if _ATTACH_TAKES_TRANSPORT:
                        server._detach(self)
                    else:
                        server._detach()
                    self._server = None
            waiter = core.empty_waiter
            if waiter is not None:
                waiter.set_exception(ConnectionError("Connection is closed by peer"))
        finally:
            core.release()

    def write_eof(self) -> None:
        if self._closing or self._eof:
            return
        self._eof = True
        if not self._core.buffer_size:
            self._sock.shutdown(socket.SHUT_WR)

    def _make_empty_waiter(self) -> Any:
        if self._empty_waiter is not None:
            raise RuntimeError("Empty waiter is already set")
        waiter = self._loop.create_future()
        if not self._core.buffer_size:
            waiter.set_result(None)
        self._empty_waiter = waiter
        return waiter

    def __del__(self, _warn: Any = warnings.warn) -> None:
        d = self.__dict__
        if d.get("_cadeloop_sock", _OwnMethod) is None:
            return  # closed: asyncio's __del__ has nothing to do once _sock is None
        core = d.get("_core")
        if core is not None and self._sock is not None:
            core.unregister()
        super().__del__(_warn)

    # --- called from C++ -----------------------------------------------------------

    def _cadeloop_drained(self) -> None:
        """A flush emptied the buffer: what asyncio's _write_ready does then."""
        if self._empty_waiter is not None:
            self._empty_waiter.set_result(None)
        if self._closing:
            self._call_connection_lost(None)
        elif self._eof:
            self._sock.shutdown(socket.SHUT_WR)

    def _cadeloop_write_error(self, exc: BaseException) -> None:
        self._core.discard()
        self._fatal_error(exc, "Fatal write error on socket transport")
        if self._empty_waiter is not None:
            self._empty_waiter.set_exception(exc)


# --- transports of accepted connections (the C++ accept loop's fast constructor) ----

def _accepted_init_chain() -> tuple[Any, ...]:
    """asyncio's code that _SocketTransport(...) runs and the C++ accept loop's
    one-pass constructor (accepted_transport_plan) does instead; if any of it
    is replaced (a patched asyncio), servers make their transports with the
    ordinary constructor."""
    return (
        selector_events._SelectorSocketTransport.__init__,
        selector_events._SelectorTransport.__init__,
        transports._FlowControlMixin.__init__,
        transports.BaseTransport.__init__,
        transports._FlowControlMixin._set_write_buffer_limits,
        base_events._set_nodelay,
        trsock.TransportSocket,
    )


_ACCEPTED_INIT_CHAIN = _accepted_init_chain()


def accepted_transport_plan(listening: socket.socket) -> tuple[Any, ...] | None:
    """How the C++ accept loop makes the transports of connections accepted on `listening`.

    `_core.Acceptor` makes each one as _SocketTransport(loop, sock, protocol,
    None, {"peername": ...}, server) would, in one pass: the same extra info
    (peername from accept4's address, socket, sockname), attributes,
    server._attach, entry in loop._transports, TCP_NODELAY, and the same two
    callbacks scheduled (connection_made, then the start of reading, which is
    what asyncio's _add_reader callback does), without asyncio's chain of
    Python __init__ calls. None (the ordinary constructor) if asyncio's code
    was replaced.
    """
    if (_accepted_init_chain() != _ACCEPTED_INIT_CHAIN or type(listening) is not socket.socket
            or not _CONNECTION_LOST_IS_ASYNCIOS):
        return None
    # asyncio's _set_nodelay looks at the accepted socket, whose family, type and
    # proto are the listening socket's (the C++ accept loop makes it so).
    nodelay = (listening.family in {socket.AF_INET, socket.AF_INET6} and listening.type == socket.SOCK_STREAM
               and listening.proto == socket.IPPROTO_TCP)
    # An IPv4 listener bound to one address: every connection it accepts has
    # that local address and port, so getsockname() would answer the
    # listener's own (not so with a wildcard address, or IP_TRANSPARENT).
    sockname = None
    if listening.family == socket.AF_INET:
        try:
            bound = listening.getsockname()
            transparent = listening.getsockopt(socket.SOL_IP, getattr(socket, "IP_TRANSPARENT", 19))
        except OSError:
            pass
        else:
            if bound[0] != "0.0.0.0" and bound[1] != 0 and not transparent:
                sockname = bound
    write_ready = ("_write_sendmsg" if selector_events._HAS_SENDMSG else "_write_send") if _INIT_SETS_WRITE_READY else None
    return (_SocketTransport, trsock.TransportSocket, sockname, nodelay, _ATTACH_TAKES_TRANSPORT, write_ready,
            protocols.BufferedProtocol)


# asyncio's Server._attach/_detach as this Python has them (3.13: a WeakSet of the
# transports; 3.11: a count), which the C++ accept loop and close path do
# themselves for a server whose methods are these.
_SERVER_METHODS = (base_events.Server._attach.__code__.co_names, base_events.Server._detach.__code__.co_names)
_SERVER_METHODS_KNOWN = _SERVER_METHODS in {
    (("_sockets", "_clients", "add"), ("_clients", "discard", "len", "_sockets", "_wakeup")),
    (("_sockets", "_active_count"), ("_active_count", "_sockets", "_wakeup")),
}
_WEAKSET_KNOWN = (
    weakref.WeakSet.add.__code__.co_names == ("_pending_removals", "_commit_removals", "data", "add", "ref", "_remove")
    and weakref.WeakSet.discard.__code__.co_names == ("_pending_removals", "_commit_removals", "data", "discard", "ref")
    and weakref.WeakSet.__len__.__code__.co_names == ("len", "data", "_pending_removals")
)


def _server_bookkeeping_is_asyncios(server: Any) -> bool:
    """server._attach/_detach are asyncio's own, on the data they expect."""
    if server is None or not _SERVER_METHODS_KNOWN:
        return False
    cls = type(server)
    if (cls._attach is not base_events.Server._attach or cls._detach is not base_events.Server._detach
            or getattr(server, "__dict__", {}).keys() & {"_attach", "_detach"}):
        return False
    if _ATTACH_TAKES_TRANSPORT:
        clients = getattr(server, "_clients", None)
        return _WEAKSET_KNOWN and type(clients) is weakref.WeakSet and type(clients.data) is set
    return type(getattr(server, "_active_count", None)) is int


# --- datagram transports (UDP) -----------------------------------------------------


# Whether asyncio's _make_datagram_transport refuses an fd another transport uses.
_DATAGRAM_CHECKS_FD = (
    "_ensure_fd_no_transport" in selector_events.BaseSelectorEventLoop._make_datagram_transport.__code__.co_names
)


class _DatagramTransport(selector_events._SelectorDatagramTransport):  # type: ignore[misc,name-defined]
    """A UDP or Unix datagram transport whose reads and ordinary sends are C++.

    `_core` (`_core.DatagramTransportCore`) is the fd's reader (one recvfrom
    per readiness event, straight to datagram_received or error_received) and
    the transport's sendto (one send now when nothing is queued; everything
    else goes to asyncio's sendto, `_cadeloop_sendto`). The rest is asyncio's
    selector datagram transport. Loop thread only.
    """

    _conn_lost = _core_field("conn_lost", "connection_lost is scheduled (count of lost writes)")

    def __init__(self, loop: Loop, sock: socket.socket, protocol: Any, address: Any = None,
                 waiter: Any = None, extra: Any = None) -> None:
        core = _core.DatagramTransportCore(loop, self, sock.fileno(), sock.family, self.max_size)
        self._core = core
        if sock.family in (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX):
            # asyncio's __init__ registers self._read_ready as the fd's reader.
            self._read_ready = core.read_ready
        self.sendto = core.sendto
        super().__init__(loop, sock, protocol, address, waiter, extra)
        core.attach(self._buffer, self._address, self._extra.get("peername"))

    def set_protocol(self, protocol: Any) -> None:
        super().set_protocol(protocol)
        self._core.set_protocol(protocol)

    def _cadeloop_sendto(self, *args: Any, **kwargs: Any) -> None:
        selector_events._SelectorDatagramTransport.sendto(self, *args, **kwargs)

    def _call_connection_lost(self, exc: BaseException | None) -> None:
        try:
            super()._call_connection_lost(exc)
        finally:
            self._core.release()


# --- the loop ---------------------------------------------------------------------


def _check_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """Loop(**settings) with defaults filled in; one clear error naming a bad setting."""
    values: dict[str, Any] = {name: row[3] for name, row in SETTINGS.items()}
    for name, value in settings.items():
        if name not in SETTINGS:
            raise TypeError(f"Loop() got an unknown setting {name!r} (known: {', '.join(SETTINGS)})")
        kind, low, high, _, _ = SETTINGS[name]
        if kind is bool:
            if not isinstance(value, bool):
                raise TypeError(f"Loop() setting {name!r} must be a bool, not {type(value).__name__}")
        elif isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"Loop() setting {name!r} must be an int in [{low}, {high}], not {value!r}")
        values[name] = value
    return values


class Loop(_core.LoopCore, asyncio.SelectorEventLoop):  # type: ignore[misc,name-defined]
    """An asyncio event loop with its scheduling core in C++.

    Settings (keyword arguments): spin_us (int, microseconds; the bounds and
    default of the server setting spin_us, docs/configuration.md) and
    adaptive_spin (bool, default False). Create, run and close it on one
    thread; call_soon_threadsafe() may be called from any thread of the same
    interpreter.
    """

    def __new__(cls, **settings: Any) -> Loop:
        # Checked before the object exists, so a bad setting leaves no
        # half-made loop for asyncio's __del__ to complain about.
        _check_settings(settings)
        return super().__new__(cls)

    def __init__(self, **settings: Any) -> None:
        values = _check_settings(settings)
        asyncio.SelectorEventLoop.__init__(self, selector=_SelectorView(self))
        self._set_spin(values["spin_us"], values["adaptive_spin"])

    # Signals are C++ (loop_signal.cpp): add_signal_handler, remove_signal_handler,
    # the reader _read_from_self and the socketpair given to signal.set_wakeup_fd,
    # made on the first add_signal_handler so an ordinary loop registers no fd at
    # all and its idle passes need no poll system call. call_soon_threadsafe wakes
    # the loop through the C++ parker's eventfd, so asyncio's self-pipe
    # (_ssock/_csock) is never made.
    def _make_self_pipe(self) -> None:
        self._ssock = None
        self._csock = None

    def _close_self_pipe(self) -> None:
        self._close_signal_pipe()

    def _write_to_self(self) -> None:
        self._wake()
        super()._write_to_self()

    def _add_callback_signalsafe(self, handle: Any) -> None:
        self._add_callback(handle)
        self._write_to_self()

    if hasattr(base_events.BaseEventLoop, "_run_forever_setup"):  # 3.12+

        def run_forever(self) -> None:
            """Run until stop() is called: asyncio's set-up and clean-up around a C++ loop of passes."""
            try:
                self._run_forever_setup()
                self._run_until_stopped()
            finally:
                self._run_forever_cleanup()

    else:  # 3.11: its run_forever has no set-up/clean-up halves to call

        def run_forever(self) -> None:
            """Run until stop() is called: 3.11 asyncio's set-up and clean-up around a C++ loop of passes."""
            self._check_closed()
            self._check_running()
            self._set_coroutine_origin_tracking(self._debug)
            old_agen_hooks = sys.get_asyncgen_hooks()
            try:
                self._thread_id = threading.get_ident()
                sys.set_asyncgen_hooks(firstiter=self._asyncgen_firstiter_hook,
                                       finalizer=self._asyncgen_finalizer_hook)
                events._set_running_loop(self)
                self._run_until_stopped()
            finally:
                self._stopping = False
                self._thread_id = None
                events._set_running_loop(None)
                self._set_coroutine_origin_tracking(False)
                sys.set_asyncgen_hooks(*old_agen_hooks)

    def _make_socket_transport(self, sock: socket.socket, protocol: Any, waiter: Any = None, *,
                               extra: Any = None, server: Any = None) -> _SocketTransport:
        return _SocketTransport(self, sock, protocol, waiter, extra, server)

    def _make_datagram_transport(self, sock: socket.socket, protocol: Any, address: Any = None,
                                 waiter: Any = None, extra: Any = None) -> _DatagramTransport:
        if _DATAGRAM_CHECKS_FD:  # as asyncio's own: newer versions check the fd here
            self._ensure_fd_no_transport(sock)
        return _DatagramTransport(self, sock, protocol, address, waiter, extra)

    # --- pipes and subprocesses (_loop_pipes.py: C++ pipe cores, pidfd child watching) ---

    _cadeloop_children: dict[int, Any] | None = None  # pidfd -> subprocess transport

    def _make_read_pipe_transport(self, pipe: Any, protocol: Any, waiter: Any = None,
                                  extra: Any = None) -> Any:
        return _loop_pipes.ReadPipeTransport(self, pipe, protocol, waiter, extra)

    def _make_write_pipe_transport(self, pipe: Any, protocol: Any, waiter: Any = None,
                                   extra: Any = None) -> Any:
        return _loop_pipes.WritePipeTransport(self, pipe, protocol, waiter, extra)

    async def _make_subprocess_transport(self, protocol: Any, args: Any, shell: bool, stdin: Any, stdout: Any,
                                         stderr: Any, bufsize: int, extra: Any = None, **kwargs: Any) -> Any:
        if not _loop_pipes.watches_natively():
            return await super()._make_subprocess_transport(protocol, args, shell, stdin, stdout, stderr,
                                                            bufsize, extra=extra, **kwargs)
        return await _loop_pipes.make_subprocess_transport(self, protocol, args, shell, stdin, stdout, stderr,
                                                           bufsize, extra, kwargs)

    def _cadeloop_child_status_lost(self, pid: int, process_exited: Any) -> int:
        return _loop_pipes.child_status_lost(pid, process_exited)

    # --- the accept loop of servers (C++: _core.Acceptor, loop_accept.cpp) ------------

    def _start_serving(self, protocol_factory: Any, sock: socket.socket, sslcontext: Any = None,
                       server: Any = None, backlog: int = 100,
                       ssl_handshake_timeout: Any = constants.SSL_HANDSHAKE_TIMEOUT,
                       ssl_shutdown_timeout: Any = constants.SSL_SHUTDOWN_TIMEOUT) -> None:
        """Accept on `sock`: in C++ for plain TCP and Unix stream servers, asyncio's code for TLS."""
        if sslcontext or not self._cadeloop_accepts_natively(sock):
            super()._start_serving(protocol_factory, sock, sslcontext, server, backlog,
                                   ssl_handshake_timeout, ssl_shutdown_timeout)
            return
        acceptor = _core.Acceptor(self, protocol_factory, sock, server, backlog, _SocketTransport,
                                  socket.socket, sock.family, sock.type, sock.proto, accepted_transport_plan(sock),
                                  _server_bookkeeping_is_asyncios(server))
        self._add_reader(sock.fileno(), acceptor)

    # Accepted transports are not in loop._transports (a weak reference each): the
    # C++ fd table knows which transport owns an fd, from its creation to its
    # connection_lost, and answers asyncio's "fd already used by a transport" check.
    _cadeloop_sendfile_fds: set[int] | None = None

    def _ensure_fd_no_transport(self, fd: Any) -> None:
        super()._ensure_fd_no_transport(fd)  # the transports in loop._transports; validates fd
        fileno = fd if isinstance(fd, int) else int(fd.fileno())
        transport = self._fd_transport(fileno)
        if transport is not None and not transport.is_closing() and fileno not in (self._cadeloop_sendfile_fds or ()):
            raise RuntimeError(f"File descriptor {fd!r} is used by transport {transport!r}")

    async def _sendfile_native(self, transp: Any, file: Any, offset: int, count: int | None) -> int:
        # asyncio's takes the transport out of loop._transports while sock_sendfile
        # uses its socket, and puts it back after.
        fd = transp._sock_fd
        if self._transports.get(fd) is not transp:
            self._transports[fd] = transp
        if self._cadeloop_sendfile_fds is None:
            self._cadeloop_sendfile_fds = set()
        self._cadeloop_sendfile_fds.add(fd)
        try:
            return await super()._sendfile_native(transp, file, offset, count)  # type: ignore[no-any-return]
        finally:
            self._cadeloop_sendfile_fds.discard(fd)

    def _cadeloop_accepts_natively(self, sock: socket.socket) -> bool:
        """A stream socket of a family the C++ accept loop knows, and asyncio's accept code not replaced."""
        if sock.family not in (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX) or sock.type != socket.SOCK_STREAM:
            return False
        cls = type(self)
        base = selector_events.BaseSelectorEventLoop
        return (cls._accept_connection is base._accept_connection
                and cls._accept_connection2 is base._accept_connection2
                and cls._make_socket_transport is Loop._make_socket_transport
                and not self.__dict__.keys() & {"_accept_connection", "_accept_connection2", "_make_socket_transport"})

    def _cadeloop_accept_paused(self, exc: OSError, protocol_factory: Any, sock: socket.socket,
                                server: Any, backlog: int) -> None:
        """Out of descriptors or memory (called from C++): asyncio's report, then retry later."""
        self.call_exception_handler({
            "message": "socket.accept() out of system resource",
            "exception": exc,
            "socket": trsock.TransportSocket(sock),
        })
        self._remove_reader(sock.fileno())
        self.call_later(constants.ACCEPT_RETRY_DELAY, self._start_serving, protocol_factory, sock, None,
                        server, backlog)

    def _cadeloop_accept_python(self, protocol_factory: Any, sock: socket.socket, server: Any,
                                backlog: int) -> None:
        """Debug mode (called from C++): asyncio's accept code, with its logs and reports."""
        self._accept_connection(protocol_factory, sock, None, server, backlog)

    def close(self) -> None:
        if self.is_running():
            raise RuntimeError("Cannot close a running event loop")
        if self.is_closed():
            return
        _loop_pipes.forget_children(self)
        try:
            super().close()
        finally:
            self._cadeloop_objects = None
            self._release_core()

    # --- readers and writers of a file object closed before their removal ----------
    # asyncio's selector keeps the object add_reader()/add_writer() got and, once its
    # fileno() is -1, finds it by identity: remove_reader(sock) after sock.close()
    # still removes the registration (anyio's socket streams do this). The C++ table
    # is by fd, so the fd of each such object is remembered here.

    _cadeloop_objects: dict[tuple[int, bool], tuple[Any, int]] | None = None

    def add_reader(self, fd: Any, callback: Any, *args: Any) -> None:
        super().add_reader(fd, callback, *args)
        self._cadeloop_remember(fd, False)

    def add_writer(self, fd: Any, callback: Any, *args: Any) -> None:
        super().add_writer(fd, callback, *args)
        self._cadeloop_remember(fd, True)

    def remove_reader(self, fd: Any) -> bool:
        self._ensure_fd_no_transport(fd)
        return bool(self._remove_reader(self._cadeloop_registered_fd(fd, False)))

    def remove_writer(self, fd: Any) -> bool:
        self._ensure_fd_no_transport(fd)
        return bool(self._remove_writer(self._cadeloop_registered_fd(fd, True)))

    def _cadeloop_remember(self, fileobj: Any, writer: bool) -> None:
        if isinstance(fileobj, int):
            return
        if self._cadeloop_objects is None:
            self._cadeloop_objects = {}
        self._cadeloop_objects[(id(fileobj), writer)] = (fileobj, selectors._fileobj_to_fd(fileobj))

    def _cadeloop_registered_fd(self, fileobj: Any, writer: bool) -> Any:
        """The fd `fileobj` was registered with (an object's fileno() is -1 once closed)."""
        if isinstance(fileobj, int) or not self._cadeloop_objects:
            return fileobj
        entry = self._cadeloop_objects.pop((id(fileobj), writer), None)
        return entry[1] if entry is not None and entry[0] is fileobj else fileobj

    # --- low-level socket calls: C++ (loop_sock.cpp) --------------------------------
    # Each coroutine awaits what its C half returns: the result itself when the call
    # is done at once (returned as is), a future when it waits for its fd, or
    # asyncio's own coroutine for what the C half hands over (a socket that is not a
    # non-blocking socket.socket, a host name to resolve, an odd buffer).

    async def sock_recv(self, sock: socket.socket, n: int) -> bytes:
        r = self._native_sock_recv(sock, n)
        return r if r.__class__ is bytes else await r  # type: ignore[no-any-return]

    async def sock_recv_into(self, sock: socket.socket, buf: Any) -> int:
        r = self._native_sock_recv_into(sock, buf)
        return r if r.__class__ is int else await r  # type: ignore[no-any-return]

    async def sock_recvfrom(self, sock: socket.socket, bufsize: int) -> tuple[bytes, Any]:
        r = self._native_sock_recvfrom(sock, bufsize)
        return r if r.__class__ is tuple else await r  # type: ignore[no-any-return]

    async def sock_recvfrom_into(self, sock: socket.socket, buf: Any, nbytes: int = 0) -> tuple[int, Any]:
        r = self._native_sock_recvfrom_into(sock, buf, nbytes)
        return r if r.__class__ is tuple else await r  # type: ignore[no-any-return]

    async def sock_sendall(self, sock: socket.socket, data: Any) -> None:
        r = self._native_sock_sendall(sock, data)
        if r is not None:
            await r

    async def sock_sendto(self, sock: socket.socket, data: Any, address: Any) -> int:
        r = self._native_sock_sendto(sock, data, address)
        return r if r.__class__ is int else await r  # type: ignore[no-any-return]

    async def sock_connect(self, sock: socket.socket, address: Any) -> None:
        r = self._native_sock_connect(sock, address)
        if r is not None:
            try:
                await r
            finally:
                # As asyncio's sock_connect: the frame a failure's traceback keeps
                # must not keep the future, which holds the exception (a cycle).
                r = None

    async def sock_accept(self, sock: socket.socket) -> tuple[socket.socket, Any]:
        r = self._native_sock_accept(sock)
        return r if r.__class__ is tuple else await r  # type: ignore[no-any-return]

    def stats(self) -> dict[str, Any]:
        """The loop's counters. Loop thread.

        All counted in C++: ticks, polls, polls_elided, parks,
        callbacks_dispatched, timers_fired, xthread_items, wakeups_sent, spins,
        spin_hits, ready_len, timers_len, fds_registered, and for the socket
        transports: connections (live now), bytes_received, bytes_sent and
        sends_posted (send/sendmsg calls, at most one per transport per pass;
        the pipe transports' reads and writes count there too);
        accepted (connections the C++ accept loop of servers accepted).
        sock_calls counts the sock_* calls the C++ path ran (not those handed
        to asyncio's code), sock_waits those of them that waited for their fd.
        While a server's core pair feeds this loop (cadeloop.serve(), the
        `cadeloop` command), `pair` holds that pair's counters too: requests,
        responses by status class, connections, ring depths, wake-ups each
        way, latency percentiles (read from its shared stats page).
        """
        stats = self._core_stats()
        stats.update(self._sock_stats())
        server_core = getattr(self, "_cadeloop_server_core", None)
        if server_core is not None:
            stats["pair"] = server_core.stats()
        return stats

    # --- called from C++ ---------------------------------------------------------

    def _cadeloop_extract_stack(self) -> Any:
        # Frame 0 is this method; frame 1 is whoever called call_soon & co.
        # (a C method adds no frame).
        return format_helpers.extract_stack(sys._getframe(1))

    def _cadeloop_run_debug(self, handle: Any) -> None:
        """Debug mode: run one callback and log it if it was slow, as asyncio does."""
        try:
            self._current_handle = handle
            t0 = self.time()
            handle._run()
            dt = self.time() - t0
            if dt >= self.slow_callback_duration:
                base_events.logger.warning("Executing %s took %.3f seconds", base_events._format_handle(handle), dt)
        finally:
            self._current_handle = None
            # An exception raised under this frame may keep the frame alive
            # through a traceback; drop the handle so it does not keep the
            # callback (a task, say) alive with it. asyncio does the same.
            handle = None

    def _cadeloop_create_task(self, *args: Any, **kwargs: Any) -> Any:
        """create_task() with a task factory, in debug mode or with odd arguments: asyncio's code."""
        task = base_events.BaseEventLoop.create_task(self, *args, **kwargs)
        if self._task_factory is None and task._source_traceback:
            del task._source_traceback[-1]  # this frame, as asyncio drops its own
        return task

    def _cadeloop_run_foreign(self, handle: Any) -> None:
        if not handle._cancelled:
            if self._debug:
                self._cadeloop_run_debug(handle)
            else:
                handle._run()


class EventLoopPolicy(asyncio.DefaultEventLoopPolicy):  # type: ignore[misc,valid-type]
    """asyncio's default policy, making cadeloop loops."""

    _loop_factory = Loop


def new_event_loop(**settings: Any) -> Loop:
    """A new cadeloop loop (for asyncio.Runner(loop_factory=...) and friends)."""
    return Loop(**settings)


def install() -> None:
    """Make asyncio use cadeloop: asyncio.run(), get_event_loop() and new_event_loop() then create cadeloop loops."""
    asyncio.set_event_loop_policy(EventLoopPolicy())


def run(main: Coroutine[Any, Any, _T], *, debug: bool | None = None) -> _T:
    """Run one coroutine on a fresh cadeloop loop, as asyncio.run() does, and close the loop."""
    with asyncio.Runner(debug=debug, loop_factory=new_event_loop) as runner:
        return runner.run(main)
