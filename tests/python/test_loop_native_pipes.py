"""cadeloop.Loop's pipes and subprocesses (C++ pipe cores, pidfd child watching) against asyncio.

Each scenario runs on asyncio's selector loop and on cadeloop.Loop in the same
process and Python (the differential harness of test_loop_differential.py),
and the transcripts must be equal: callbacks of the pipe protocols, data,
exceptions by type, return codes of children. A fresh event loop policy is
put in place before each run, so a child watcher asyncio's own run made (3.11
makes a thread watcher in the policy) is not what cadeloop's run finds.

The last tests prove the native paths run: asyncio's Python pipe I/O and child
watchers are made to raise, and cadeloop's pipes and children still work, with
no watcher thread started.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
import sys
import tempfile
import threading
import warnings
from asyncio import unix_events
from typing import Any, Callable

import pytest
from test_loop_differential import Scenario, transcript

import cadeloop
from cadeloop import _loop_pipes

pytestmark = pytest.mark.timeout(60)

PY = sys.executable


def assert_same(scenario: Scenario) -> list[Any]:
    asyncio.set_event_loop_policy(None)
    expected = transcript(asyncio.SelectorEventLoop, scenario)
    asyncio.set_event_loop_policy(None)
    got = transcript(cadeloop.Loop, scenario)
    asyncio.set_event_loop_policy(None)
    assert got == expected, "\n".join(
        f"{'  ' if a == b else '!!'} asyncio={a!r} cadeloop={b!r}" for a, b in zip(expected, got)
    ) + f"\n(asyncio {len(expected)} entries, cadeloop {len(got)})"
    return expected


class PipeRecorder(asyncio.Protocol):
    """Records callbacks; data is joined (read sizes may differ), flow control events counted."""

    def __init__(self, out: list[Any], name: str) -> None:
        self.out = out
        self.name = name
        self.data = bytearray()
        self.lost: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.resumed = asyncio.Event()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.out.append((self.name, "connection_made"))

    def data_received(self, data: bytes) -> None:
        if not self.data:
            self.out.append((self.name, "data_received"))
        self.data += data

    def eof_received(self) -> None:
        self.out.append((self.name, "eof_received", bytes(self.data)))

    def pause_writing(self) -> None:
        self.out.append((self.name, "pause_writing", self.transport.get_write_buffer_size() > 0))

    def resume_writing(self) -> None:
        self.out.append((self.name, "resume_writing"))
        self.resumed.set()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.out.append((self.name, "connection_lost", type(exc).__name__, bytes(self.data)))
        self.lost.set_result(None)


def is_closed(f: Any) -> bool:
    return f.fileno() == -1 if isinstance(f, socket.socket) else bool(f.closed)


async def passes(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


# --- read pipes -------------------------------------------------------------------


def read_pipe_scenario(kind: str) -> Scenario:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        if kind == "socket":
            a, b = socket.socketpair()
            rfile, wfd = a, b.detach()
        elif kind == "fifo":
            d = tempfile.mkdtemp()
            path = os.path.join(d, "fifo")
            os.mkfifo(path)
            rfd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            wfd = os.open(path, os.O_WRONLY)
            rfile = open(rfd, "rb", buffering=0)
        else:
            rfd, wfd = os.pipe()
            rfile = open(rfd, "rb", buffering=0)
        transport, proto = await loop.connect_read_pipe(lambda: PipeRecorder(out, "reader"), rfile)
        out.append(("reading", transport.is_reading(), transport.is_closing()))
        os.write(wfd, b"hello ")
        await passes()
        transport.pause_reading()
        out.append(("paused", transport.is_reading()))
        os.write(wfd, b"while paused")
        await passes()
        out.append(("received while paused", bytes(proto.data)))
        transport.resume_reading()
        await passes()
        out.append(("after resume", bytes(proto.data)))
        for _ in range(5):
            os.write(wfd, b"x" * 50_000)  # less than a pipe holds: never blocks
            await passes()
        os.close(wfd)
        await proto.lost
        out.append(("closing", transport.is_closing(), len(proto.data), is_closed(rfile)))
        if kind == "fifo":
            os.unlink(path)
            os.rmdir(d)

    return scenario


@pytest.mark.parametrize("kind", ["pipe", "fifo", "socket"])
def test_read_pipe_data_pause_eof_as_asyncio(kind: str) -> None:
    assert_same(read_pipe_scenario(kind))


def read_pipe_close_scenario() -> Scenario:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        rfd, wfd = os.pipe()
        rfile = open(rfd, "rb", buffering=0)
        transport, proto = await loop.connect_read_pipe(lambda: PipeRecorder(out, "reader"), rfile)
        os.write(wfd, b"abc")
        await passes()
        transport.close()
        out.append(("closing", transport.is_closing()))
        os.write(wfd, b"after close")
        await proto.lost
        out.append(("closed", rfile.closed, transport.get_protocol()))
        os.close(wfd)
        # Not a pipe: asyncio's ValueError.
        with tempfile.TemporaryFile() as f:
            try:
                await loop.connect_read_pipe(lambda: PipeRecorder(out, "file"), f)
            except ValueError as exc:
                out.append(("regular file", type(exc).__name__, str(exc)))

    return scenario


def test_read_pipe_close_and_a_regular_file_as_asyncio() -> None:
    assert_same(read_pipe_close_scenario())


# --- write pipes ------------------------------------------------------------------


def write_pipe_big_scenario(kind: str) -> Scenario:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        if kind == "socket":
            a, b = socket.socketpair()
            rfd, wfile = a.detach(), b
        else:
            rfd, wfd = os.pipe()
            wfile = open(wfd, "wb", buffering=0)
        os.set_blocking(rfd, False)
        transport, proto = await loop.connect_write_pipe(lambda: PipeRecorder(out, "writer"), wfile)
        transport.write(b"small")
        out.append(("after small write", transport.get_write_buffer_size()))
        big = bytes(range(256)) * 4096  # 1 MiB
        transport.write(big)
        transport.write(bytearray(b"tail"))
        transport.write(memoryview(b"--end"))
        out.append(("queued", transport.get_write_buffer_size() > 0))
        got = bytearray()
        done = loop.create_future()
        want = 5 + len(big) + 9

        def readable() -> None:
            try:
                chunk = os.read(rfd, 65536)
            except BlockingIOError:
                return
            got.extend(chunk)
            if len(got) >= want and not done.done():
                done.set_result(None)

        loop.add_reader(rfd, readable)
        await done
        out.append(("all read", bytes(got) == b"small" + big + b"tail--end"))
        out.append(("buffer", transport.get_write_buffer_size()))
        transport.close()
        await proto.lost
        loop.remove_reader(rfd)
        os.close(rfd)
        out.append(("writes after close", transport.write(b"lost"), transport.is_closing()))

    return scenario


@pytest.mark.parametrize("kind", ["pipe", "socket"])
def test_write_pipe_big_write_pauses_and_resumes_as_asyncio(kind: str) -> None:
    transcript_ = assert_same(write_pipe_big_scenario(kind))
    assert ("writer", "pause_writing", True) in transcript_ and ("writer", "resume_writing") in transcript_


def write_pipe_reader_closed_scenario(how: str) -> Scenario:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        rfd, wfd = os.pipe()
        wfile = open(wfd, "wb", buffering=0)
        transport, proto = await loop.connect_write_pipe(lambda: PipeRecorder(out, "writer"), wfile)
        if how == "write after close":
            os.close(rfd)
            transport.write(b"to nobody")  # EPIPE at once
        elif how == "buffered":
            transport.write(b"y" * 200_000)  # the pipe takes 64 KiB, the rest waits
            out.append(("buffered", transport.get_write_buffer_size() > 0))
            os.close(rfd)
        else:  # the reader trick: the write pipe watches for its reader closing
            os.close(rfd)
        await proto.lost
        out.append(("after", transport.is_closing(), transport.get_write_buffer_size(), wfile.closed))
        transport.write(b"more")
        out.append(("wrote after lost", transport.is_closing()))

    return scenario


@pytest.mark.parametrize("how", ["write after close", "buffered", "idle"])
def test_write_pipe_whose_reader_closed_as_asyncio(how: str) -> None:
    assert_same(write_pipe_reader_closed_scenario(how))


def write_pipe_abort_and_eof_scenario() -> Scenario:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        rfd, wfd = os.pipe()
        wfile = open(wfd, "wb", buffering=0)
        transport, proto = await loop.connect_write_pipe(lambda: PipeRecorder(out, "writer"), wfile)
        out.append(("can_write_eof", transport.can_write_eof()))
        transport.write(b"z" * 100_000)
        transport.abort()
        await proto.lost
        out.append(("aborted", transport.get_write_buffer_size(), len(os.read(rfd, 200_000))))
        os.close(rfd)
        rfd, wfd = os.pipe()
        wfile = open(wfd, "wb", buffering=0)
        transport, proto = await loop.connect_write_pipe(lambda: PipeRecorder(out, "eof"), wfile)
        transport.write(b"w" * 100_000)
        transport.write_eof()
        out.append(("eof pending", transport.is_closing(), transport.get_write_buffer_size() > 0))
        got = bytearray()
        while True:
            await asyncio.sleep(0.001)
            try:
                chunk = os.read(rfd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                break
            got += chunk
        await proto.lost
        out.append(("eof read", len(got)))
        os.close(rfd)

    return scenario


def test_write_pipe_abort_and_write_eof_as_asyncio() -> None:
    assert_same(write_pipe_abort_and_eof_scenario())


# --- subprocesses -----------------------------------------------------------------


def subprocess_scenario() -> Scenario:
    async def scenario(out: list[Any]) -> None:
        # echo through stdin and stdout, with communicate()
        p = await asyncio.create_subprocess_exec(
            PY, "-c", "import sys; d = sys.stdin.buffer.read(); sys.stdout.buffer.write(d.upper())",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        stdout, stderr = await p.communicate(b"echo me " * 10000)
        out.append(("communicate", len(stdout), stdout[:16], stderr, p.returncode))
        # line by line through the stream API
        p = await asyncio.create_subprocess_exec(
            PY, "-u", "-c", "import sys\nfor line in sys.stdin: print(line.strip()[::-1], flush=True)",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        assert p.stdin is not None and p.stdout is not None
        for word in (b"abc", b"hello"):
            p.stdin.write(word + b"\n")
            await p.stdin.drain()
            out.append(("line", await p.stdout.readline()))
        p.stdin.close()
        out.append(("wait", await p.wait(), await p.stdout.read()))
        # exit codes, a shell, stderr
        p = await asyncio.create_subprocess_shell("echo oops >&2; exit 7", stderr=asyncio.subprocess.PIPE)
        out.append(("shell", await p.stderr.read() if p.stderr else None, await p.wait()))
        # a child that exits at once, with no pipes
        p = await asyncio.create_subprocess_exec("/bin/true")
        out.append(("true", await p.wait(), await p.wait()))
        # killed by signals: its own, kill(), terminate(), send_signal()
        p = await asyncio.create_subprocess_exec(PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
        out.append(("own SIGTERM", await p.wait()))
        for how in ("kill", "terminate", "send_signal"):
            p = await asyncio.create_subprocess_exec("/bin/sleep", "30")
            if how == "send_signal":
                p.send_signal(signal.SIGUSR1)
            else:
                getattr(p, how)()
            out.append((how, await p.wait()))
            # kill() after the exit was seen: asyncio's Process does nothing
            try:
                p.kill()
                out.append(("kill after exit", "no error"))
            except Exception as exc:  # noqa: BLE001 - recorded and compared
                out.append(("kill after exit", type(exc).__name__))
        # many at once
        procs = [await asyncio.create_subprocess_exec("/bin/sh", "-c", f"exit {i}") for i in range(12)]
        out.append(("many", await asyncio.gather(*(p.wait() for p in procs))))
        # a program that does not exist: asyncio's exception
        try:
            await asyncio.create_subprocess_exec("/nonexistent/program")
        except OSError as exc:
            out.append(("missing", type(exc).__name__))

    return scenario


def test_subprocesses_as_asyncio() -> None:
    assert_same(subprocess_scenario())


class ExitRecorder(asyncio.SubprocessProtocol):
    def __init__(self, out: list[Any]) -> None:
        self.out = out
        self.exited = asyncio.get_running_loop().create_future()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self.out.append(("pipe_data_received", fd, data))

    def process_exited(self) -> None:
        self.exited.set_result(None)


def subprocess_protocol_scenario() -> Scenario:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        transport, proto = await loop.subprocess_exec(lambda: ExitRecorder(out), "/bin/sh", "-c", "exit 3",
                                                      stdin=None, stdout=None, stderr=None)
        await proto.exited
        out.append(("exec", transport.get_returncode(), transport.get_pipe_transport(1)))
        transport.close()
        transport, proto = await loop.subprocess_shell(lambda: ExitRecorder(out), "kill -9 $$",
                                                       stdin=None, stdout=None, stderr=None)
        await proto.exited
        out.append(("shell", transport.get_returncode()))
        try:
            transport.kill()
            out.append(("kill after exit", "no error"))
        except ProcessLookupError:
            out.append(("kill after exit", "ProcessLookupError"))
        transport.close()

    return scenario


def test_subprocess_protocol_return_codes_as_asyncio() -> None:
    assert_same(subprocess_protocol_scenario())


# --- the native paths run ---------------------------------------------------------


def _raising(name: str) -> Callable[..., Any]:
    def method(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"asyncio's {name} ran")

    return method


@pytest.fixture
def asyncio_pipe_io_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """asyncio's Python pipe reads, writes and child watchers raise if they run."""
    monkeypatch.setattr(unix_events._UnixReadPipeTransport, "_read_ready", _raising("read pipe _read_ready"))
    monkeypatch.setattr(unix_events._UnixWritePipeTransport, "_write_ready", _raising("write pipe _write_ready"))
    monkeypatch.setattr(unix_events._UnixWritePipeTransport, "write", _raising("write pipe write"))
    for watcher in ("ThreadedChildWatcher", "PidfdChildWatcher"):
        monkeypatch.setattr(getattr(unix_events, watcher), "add_child_handler", _raising(watcher))


def test_native_pipe_and_child_paths_run(asyncio_pipe_io_raises: None) -> None:
    asyncio.set_event_loop_policy(None)
    threads_before = threading.active_count()
    seen: dict[str, Any] = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        before = loop.stats()
        p = await asyncio.create_subprocess_exec(
            PY, "-c", "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read()[::-1])",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        seen["threads while running"] = threading.active_count()
        stdout, _ = await p.communicate(b"x" * 200_000 + b"abc")
        seen["out"] = stdout[:3]
        seen["rc"] = p.returncode
        p = await asyncio.create_subprocess_exec("/bin/sh", "-c", "kill -TERM $$")
        seen["signalled"] = await p.wait()
        after = loop.stats()
        seen["bytes_received"] = after["bytes_received"] - before["bytes_received"]
        seen["bytes_sent"] = after["bytes_sent"] - before["bytes_sent"]
        seen["fds left"] = after["fds_registered"]

    cadeloop.run(main())
    asyncio.set_event_loop_policy(None)
    assert seen == {
        "threads while running": threads_before,  # no watcher thread, on 3.11 too
        "out": b"cba",
        "rc": 0,
        "signalled": -signal.SIGTERM,
        "bytes_received": 200_003,
        "bytes_sent": 200_003,
        "fds left": 0,
    }


def test_asyncio_loop_hits_the_raising_methods(asyncio_pipe_io_raises: None) -> None:
    """The fixture above is not a no-op: asyncio's own loop runs those methods."""
    asyncio.set_event_loop_policy(None)

    async def main() -> None:
        rfd, wfd = os.pipe()
        loop = asyncio.get_running_loop()
        transport, _ = await loop.connect_write_pipe(asyncio.Protocol, open(wfd, "wb", buffering=0))
        try:
            transport.write(b"x")
        finally:
            transport.close()
            os.close(rfd)

    with pytest.raises(AssertionError, match="write pipe write"):
        asyncio.run(main())
    asyncio.set_event_loop_policy(None)


def test_a_child_watcher_set_in_the_policy_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """asyncio's documented behaviour: a watcher the program put in the policy watches its children."""
    calls: list[int] = []
    original = unix_events.ThreadedChildWatcher.add_child_handler

    def counting(self: Any, pid: int, callback: Any, *args: Any) -> None:
        calls.append(pid)
        original(self, pid, callback, *args)

    monkeypatch.setattr(unix_events.ThreadedChildWatcher, "add_child_handler", counting)
    policy = cadeloop.EventLoopPolicy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the watcher API is deprecated on 3.12+
        watcher = unix_events.ThreadedChildWatcher()
        policy.set_child_watcher(watcher)
    asyncio.set_event_loop_policy(policy)
    try:

        async def main() -> int:
            p = await asyncio.create_subprocess_exec("/bin/sh", "-c", "exit 5")
            return await p.wait()

        assert cadeloop.run(main()) == 5
    finally:
        asyncio.set_event_loop_policy(None)
    assert len(calls) == 1


def test_loop_closed_with_a_running_child_leaves_no_pidfd() -> None:
    asyncio.set_event_loop_policy(None)
    holder: dict[str, Any] = {}

    async def main() -> None:
        p = await asyncio.create_subprocess_exec("/bin/sleep", "30")
        holder["proc"] = p
        holder["children"] = dict(asyncio.get_running_loop()._cadeloop_children or {})

    loop = cadeloop.Loop()
    loop.run_until_complete(main())
    (pidfd,) = holder["children"]
    os.fstat(pidfd)  # open while the loop watches
    transport = holder["children"][pidfd]
    transport.close()  # kills the child, as asyncio's does
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        loop.close()
    with pytest.raises(OSError):
        os.fstat(pidfd)
    holder["proc"]._transport._proc.wait(timeout=10)
    asyncio.set_event_loop_policy(None)


def test_without_pidfd_asyncio_child_watcher_watches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where pidfd_open(2) is missing (ENOSYS), cadeloop takes asyncio's own path (its thread watcher here)."""
    def no_pidfd(pid: int, flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, "Function not implemented")

    calls: list[int] = []
    original = unix_events.ThreadedChildWatcher.add_child_handler

    def counting(self: Any, pid: int, callback: Any, *args: Any) -> None:
        calls.append(pid)
        original(self, pid, callback, *args)

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    monkeypatch.setattr(_loop_pipes, "_pidfd_works", None)
    monkeypatch.setattr(unix_events.ThreadedChildWatcher, "add_child_handler", counting)
    asyncio.set_event_loop_policy(None)
    try:

        async def main() -> int:
            p = await asyncio.create_subprocess_exec("/bin/sh", "-c", "exit 6")
            return await p.wait()

        assert cadeloop.run(main()) == 6
    finally:
        asyncio.set_event_loop_policy(None)
    assert len(calls) == 1
