"""loop.sock_sendfile and loop.sendfile on cadeloop.Loop (sendfile(2) in C++, loop_sendfile.cpp), against asyncio.

Each scenario runs on asyncio's selector loop and on cadeloop.Loop (the
differential harness of test_loop_differential.py) and records what a program
sees: the bytes the peer received (by length and digest), the result, the
exception (type and message), the file position afterwards, whether the
socket is still registered with the loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import socket
import tempfile
from typing import Any

import pytest

import cadeloop
from test_loop_differential import assert_same_as_asyncio

pytestmark = pytest.mark.timeout(60)

SIZE = 3 * 1024 * 1024 + 12345  # a few MiB, not a multiple of any buffer size


def _make_file() -> tuple[str, bytes]:
    data = hashlib.sha256(b"cadeloop").digest() * (SIZE // 32 + 1)
    data = bytes(b ^ (i & 0xFF) for i, b in enumerate(data[:SIZE]))
    fd, path = tempfile.mkstemp(prefix="cadeloop-sendfile-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path, data


PATH, DATA = _make_file()


def digest(b: bytes) -> tuple[int, str]:
    return (len(b), hashlib.sha256(b).hexdigest()[:16])


async def slow_reader(sock: socket.socket, want: int | None, delay: float = 0.0005) -> bytes:
    """Reads until EOF or `want` bytes, pausing between reads so the sender hits EAGAIN."""
    loop = asyncio.get_running_loop()
    got = bytearray()
    while want is None or len(got) < want:
        chunk = await loop.sock_recv(sock, 65536)
        if not chunk:
            break
        got += chunk
        await asyncio.sleep(delay)
    return bytes(got)


def _pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    return a, b


def _registered(loop: Any, sock: socket.socket) -> bool:
    try:
        loop._selector.get_key(sock)
    except KeyError:
        return False
    return True


CASES = [(0, None), (12345, 2 * 1024 * 1024 + 7), (SIZE - 10, None), (SIZE + 5, None), (1, SIZE * 2)]


async def sock_sendfile_scenario(out: list[Any]) -> None:
    loop = asyncio.get_running_loop()
    for offset, count in CASES:
        a, b = _pair()
        with open(PATH, "rb") as f:
            expect = DATA[offset: None if count is None else offset + count]
            reader = asyncio.ensure_future(slow_reader(b, len(expect)))
            sent = await loop.sock_sendfile(a, f, offset, count)
            out.append(("sock_sendfile", offset, count, sent, f.tell(), _registered(loop, a)))
            a.close()
            got = await reader
            out.append(("received", digest(got) == digest(expect), len(got)))
        b.close()


async def transport_sendfile_scenario(out: list[Any]) -> None:
    loop = asyncio.get_running_loop()
    events: list[str] = []

    class Proto(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            events.append("connection_made")

        def data_received(self, data: bytes) -> None:
            events.append("data_received " + data.decode())

        def connection_lost(self, exc: BaseException | None) -> None:
            events.append(f"connection_lost {type(exc).__name__}")

    for offset, count in CASES[:3]:
        a, b = _pair()
        transport, _ = await loop.create_connection(Proto, sock=a)
        with open(PATH, "rb") as f:
            expect = DATA[offset: None if count is None else offset + count]
            transport.write(b"head:")  # queued data goes before the file
            reader = asyncio.ensure_future(slow_reader(b, len(expect) + 10))
            sent = await loop.sendfile(transport, f, offset, count)
            out.append(("sendfile", offset, count, sent, f.tell(), transport.is_reading()))
            transport.write(b":tail")
            got = await reader
            out.append(("received", digest(got) == digest(b"head:" + expect + b":tail"), len(got)))
            await loop.sock_sendall(b, b"back")  # reading was resumed
            await asyncio.sleep(0.01)
        transport.close()
        await asyncio.sleep(0.01)
        b.close()
    out.append(("events", events))


async def cancel_scenario(out: list[Any]) -> None:
    loop = asyncio.get_running_loop()
    a, b = _pair()
    with open(PATH, "rb") as f:
        task = asyncio.ensure_future(loop.sock_sendfile(a, f, 100, None))
        for _ in range(5):
            await asyncio.sleep(0)  # the socket is full: the sender waits
        out.append(("waiting", task.done(), _registered(loop, a)))
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            out.append(("cancelled", True))
        await asyncio.sleep(0)
        out.append(("after cancel", f.tell(), _registered(loop, a)))
        # The socket is usable again by the program.
        got = await slow_reader(b, 1, 0)
        out.append(("peer got the start", got[:16] == DATA[100:116]))
    a.close()
    b.close()


async def fallback_scenario(out: list[Any]) -> None:
    loop = asyncio.get_running_loop()
    # Not a file sendfile(2) can read: asyncio's fallback (read + send).
    payload = DATA[:300000]
    for make in ("bytesio", "pipe"):
        a, b = _pair()
        if make == "bytesio":
            f: Any = io.BytesIO(payload)
            count = None
        else:
            r, w = os.pipe()
            os.set_blocking(w, False)
            os.write(w, payload[:40000])
            os.close(w)
            f = os.fdopen(r, "rb")
            count = 40000
        reader = asyncio.ensure_future(slow_reader(b, len(payload) if count is None else count))
        try:
            sent = await loop.sock_sendfile(a, f, 0, count)
        except Exception as e:  # noqa: BLE001  (the fallback's final seek on a pipe)
            sent = (type(e).__name__, str(e))
        got = await reader
        out.append((make, sent, digest(got)))
        f.close()
        a.close()
        b.close()
    a, b = _pair()
    try:
        await loop.sock_sendfile(a, io.BytesIO(b"abc"), fallback=False)
    except Exception as e:  # noqa: BLE001
        out.append(("no fallback", type(e).__name__, str(e)))
    try:
        with open(PATH) as text:
            await loop.sock_sendfile(a, text)
    except Exception as e:  # noqa: BLE001
        out.append(("text file", type(e).__name__, str(e)))
    a.close()
    b.close()


async def peer_gone_scenario(out: list[Any]) -> None:
    loop = asyncio.get_running_loop()
    a, b = _pair()
    with open(PATH, "rb") as f:
        task = asyncio.ensure_future(loop.sock_sendfile(a, f))
        got = await slow_reader(b, 500000)
        b.close()
        try:
            await task
        except Exception as e:  # noqa: BLE001
            out.append(("sender", type(e).__name__))
        out.append(("position moved past what the peer read", f.tell() >= len(got) > 0))
        out.append(("registered", _registered(loop, a)))
    a.close()


@pytest.mark.parametrize(
    "scenario",
    [sock_sendfile_scenario, transport_sendfile_scenario, cancel_scenario, fallback_scenario, peer_gone_scenario],
    ids=lambda s: s.__name__,
)
def test_sendfile_as_asyncio(scenario: Any) -> None:
    expected = assert_same_as_asyncio(scenario)
    assert expected


def test_sendfile_is_cadeloops_own_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """asyncio's Python sendfile loop replaced by a raise: cadeloop does not need it, asyncio's loop does."""
    import asyncio.unix_events as ue

    def refuse(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("asyncio's Python sendfile loop ran")

    monkeypatch.setattr(ue._UnixSelectorEventLoop, "_sock_sendfile_native_impl", refuse)
    monkeypatch.setattr(os, "sendfile", refuse)

    async def main() -> tuple[int, bytes]:
        loop = asyncio.get_running_loop()
        a, b = _pair()
        reader = asyncio.ensure_future(slow_reader(b, SIZE, 0))
        try:
            with open(PATH, "rb") as f:
                sent = await loop.sock_sendfile(a, f, 0, None, fallback=False)
            return sent, await reader
        finally:
            reader.cancel()
            a.close()
            b.close()

    sent, got = cadeloop.run(main())
    assert sent == SIZE and got == DATA
    with pytest.raises(AssertionError, match="Python sendfile loop ran"):
        with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
            runner.run(main())
