"""cadeloop.Loop's pipe transports and child processes: the Python halves.

The pipe transports are asyncio's own unix pipe transports with their hot paths
in `_core.PipeTransportCore` (C++): the read pipe's reads (one read(2) per
readiness event straight to data_received), the write pipe's write() (one
write(2) at once when nothing is queued; the rest appended to asyncio's
buffer) and its writer (one write(2) of the buffer per readiness event). EOF,
errors, pause/resume, close, abort, the write pipe's "reader closed" watch,
flow control callbacks and connection_lost are asyncio's code, called by the
core where asyncio's code would run them.

Child processes are watched with their pidfd in the loop's own fd table
(`LoopCore._watch_child`, C++: waitpid on readiness, then
`transport._process_exited(returncode)`), with no thread and no SIGCHLD
handler, on 3.11 as on 3.13; asyncio's child watcher path is kept when
pidfd_open(2) is missing or refused, or when the event loop policy holds a
child watcher of another kind (one the program set: asyncio's documented
behaviour is to use it).
"""

from __future__ import annotations

import os
from asyncio import unix_events
from asyncio.log import logger
from typing import Any

from . import _core


def _core_field(name: str, doc: str) -> property:
    def get(self: Any) -> Any:
        return getattr(self._core, name)

    def set_(self: Any, value: Any) -> None:
        setattr(self._core, name, value)

    return property(get, set_, doc=doc)


class ReadPipeTransport(unix_events._UnixReadPipeTransport):  # type: ignore[misc,name-defined]
    """asyncio's read pipe transport whose reads are C++ (`_core.read_ready` is the fd's reader)."""

    _protocol = _core_field("protocol", "the protocol data goes to")
    _closing = _core_field("closing", "close() was called or EOF was read")

    def __init__(self, loop: Any, pipe: Any, protocol: Any, waiter: Any = None, extra: Any = None) -> None:
        core = _core.PipeTransportCore(loop, self, pipe.fileno(), self.max_size)
        self._core = core
        # asyncio's __init__ and resume_reading register self._read_ready as the reader.
        self._read_ready = core.read_ready
        try:
            super().__init__(loop, pipe, protocol, waiter, extra)
        except BaseException:
            core.release()
            raise

    def _cadeloop_read_eof(self) -> None:
        """The core read EOF: what asyncio's _read_ready does then."""
        if self._loop.get_debug():
            logger.info("%r was closed by peer", self)
        self._closing = True
        self._loop._remove_reader(self._fileno)
        self._loop.call_soon(self._protocol.eof_received)
        self._loop.call_soon(self._call_connection_lost, None)

    def _call_connection_lost(self, exc: BaseException | None) -> None:
        try:
            super()._call_connection_lost(exc)
        finally:
            self._core.release()


class WritePipeTransport(unix_events._UnixWritePipeTransport):  # type: ignore[misc,name-defined]
    """asyncio's write pipe transport whose write() and writer are C++."""

    _protocol = _core_field("protocol", "the transport's protocol")
    _closing = _core_field("closing", "close(), write_eof() or an error closed it")
    _conn_lost = _core_field("conn_lost", "writes after the pipe was lost (counted)")

    def __init__(self, loop: Any, pipe: Any, protocol: Any, waiter: Any = None, extra: Any = None) -> None:
        core = _core.PipeTransportCore(loop, self, pipe.fileno(), 1)
        self._core = core
        # The hot methods are the core's, bound on the instance: write() is one C call.
        self.write = core.write
        self._write_ready = core.write_ready
        try:
            super().__init__(loop, pipe, protocol, waiter, extra)
        except BaseException:
            core.release()
            raise
        core.attach(self._buffer)

    # --- called from C++ -----------------------------------------------------------

    def _cadeloop_write(self, data: Any) -> None:
        """asyncio's write, for what the core does not write itself."""
        unix_events._UnixWritePipeTransport.write(self, data)

    def _cadeloop_write_queued(self) -> None:
        """The core queued what the pipe did not take: wait for it to drain."""
        self._loop._add_writer(self._fileno, self._write_ready)
        self._maybe_pause_protocol()

    def _cadeloop_drained(self) -> None:
        """The writer emptied the buffer: what asyncio's _write_ready does then."""
        self._loop._remove_writer(self._fileno)
        self._maybe_resume_protocol()  # may write again
        if self._closing:
            self._loop._remove_reader(self._fileno)
            self._call_connection_lost(None)

    def _cadeloop_write_error(self, exc: BaseException) -> None:
        self._buffer.clear()
        self._conn_lost += 1
        self._loop._remove_writer(self._fileno)
        self._fatal_error(exc, "Fatal write error on pipe transport")

    def _call_connection_lost(self, exc: BaseException | None) -> None:
        try:
            super()._call_connection_lost(exc)
        finally:
            self._core.release()


# --- child processes ----------------------------------------------------------------

_pidfd_works: bool | None = None


def _pidfd_available() -> bool:
    """Whether pidfd_open(2) works here (Linux 5.3+, not refused by a seccomp filter)."""
    global _pidfd_works
    if _pidfd_works is None:
        try:
            fd = os.pidfd_open(os.getpid())
        except (AttributeError, OSError):
            _pidfd_works = False
        else:
            os.close(fd)
            _pidfd_works = True
    return _pidfd_works


def watches_natively() -> bool:
    """Whether a new child is watched by the loop (pidfd) rather than asyncio's child watcher."""
    if not _pidfd_available():
        return False
    policy = unix_events.events.get_event_loop_policy()
    watcher = getattr(policy, "_watcher", None)
    # A watcher in the policy was set by the program (or made by asyncio's
    # get_child_watcher()): asyncio uses it, and so does cadeloop. A pidfd
    # watcher does what the loop does, so the loop does it.
    return watcher is None or isinstance(watcher, unix_events.PidfdChildWatcher)


async def make_subprocess_transport(loop: Any, protocol: Any, args: Any, shell: bool, stdin: Any, stdout: Any,
                                    stderr: Any, bufsize: int, extra: Any, kwargs: dict[str, Any]) -> Any:
    """asyncio's _make_subprocess_transport with the child watched by the loop (pidfd)."""
    waiter = loop.create_future()
    transport = unix_events._UnixSubprocessTransport(loop, protocol, args, shell, stdin, stdout, stderr, bufsize,
                                                     waiter=waiter, extra=extra, **kwargs)
    watch_child(loop, transport)
    try:
        await waiter
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException:
        transport.close()
        await transport._wait()
        raise
    return transport


def watch_child(loop: Any, transport: Any) -> None:
    pid = transport.get_pid()
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:  # already reaped by someone else
        loop.call_soon(transport._process_exited, child_status_lost(pid, transport._process_exited))
        return
    children = loop._cadeloop_children
    if children is None:
        children = loop._cadeloop_children = {}
    children[pidfd] = transport
    try:
        loop._watch_child(pidfd, pid, transport._process_exited, children)
    except BaseException:
        del children[pidfd]
        os.close(pidfd)
        raise


def child_status_lost(pid: int, process_exited: Any) -> int:
    """The returncode of a child someone else reaped: Popen's if it did, else 255 as asyncio reports."""
    proc = getattr(getattr(process_exited, "__self__", None), "_proc", None)
    if proc is not None and proc.returncode is not None:
        return int(proc.returncode)
    logger.warning("child process pid %d exit status already read:  will report returncode 255", pid)
    return 255


def forget_children(loop: Any) -> None:
    """At loop close: stop watching the children still running, close their pidfds, reap the exited."""
    children = loop._cadeloop_children
    if not children:
        return
    for pidfd, transport in list(children.items()):
        loop._remove_reader(pidfd)
        os.close(pidfd)
        proc = getattr(transport, "_proc", None)
        if proc is not None:
            proc.poll()  # reaps one that exited; Popen's own cleanup reaps the rest later
    children.clear()
