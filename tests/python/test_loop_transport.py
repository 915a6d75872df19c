"""cadeloop's C++ socket transport: one send per transport per loop pass,
write watermarks and pause_writing/resume_writing, pause/resume_reading,
BufferedProtocol, write_eof, close/abort and connection_lost ordering,
get_extra_info, connect_accepted_socket, and the stats counters it feeds."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any, Iterator

import pytest

import cadeloop
from cadeloop import _core


@pytest.fixture
def loop() -> Iterator[cadeloop.Loop]:
    lp = cadeloop.Loop()
    asyncio.set_event_loop(lp)
    try:
        yield lp
    finally:
        asyncio.set_event_loop(None)
        lp.close()


class Recorder(asyncio.Protocol):
    """Keeps every call, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.data = bytearray()
        self.transport: Any = None
        self.lost = asyncio.get_event_loop().create_future()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.events.append(("made", None))

    def data_received(self, data: bytes) -> None:
        self.data += data
        self.events.append(("data", len(data)))

    def eof_received(self) -> bool | None:
        self.events.append(("eof", None))
        return None

    def pause_writing(self) -> None:
        self.events.append(("pause_writing", self.transport.get_write_buffer_size()))

    def resume_writing(self) -> None:
        self.events.append(("resume_writing", self.transport.get_write_buffer_size()))

    def connection_lost(self, exc: BaseException | None) -> None:
        self.events.append(("lost", exc))
        if not self.lost.done():
            self.lost.set_result(exc)


def _connected_pair(loop: cadeloop.Loop, proto: asyncio.Protocol | None = None) -> tuple[Any, Any, socket.socket]:
    """A cadeloop transport (over connect_accepted_socket) and the blocking peer socket."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    proto = proto or Recorder()
    transport, protocol = loop.run_until_complete(loop.connect_accepted_socket(lambda: proto, a))
    return transport, protocol, b


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    got = bytearray()
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        assert chunk, "peer closed early"
        got += chunk
    return bytes(got)


def test_sockets_get_the_cpp_transport(loop: cadeloop.Loop) -> None:
    transport, _, peer = _connected_pair(loop)
    try:
        assert isinstance(transport._core, _core.SocketTransportCore)
        assert isinstance(transport, asyncio.Transport)
        assert transport.get_extra_info("socket").fileno() == transport._sock_fd
        assert transport.get_extra_info("sockname") is not None
        assert transport.get_extra_info("peername") is not None
        assert transport.get_extra_info("missing", 42) == 42
        assert transport.is_reading() and not transport.is_closing()
        assert "read=polling" in repr(transport)
        assert loop.stats()["connections"] == 1
    finally:
        transport.close()
        loop.run_until_complete(asyncio.sleep(0.01))
        peer.close()
    assert transport.is_closing()
    assert loop.stats()["connections"] == 0


def test_writes_in_one_pass_leave_in_one_send(loop: cadeloop.Loop) -> None:
    transport, _, peer = _connected_pair(loop)
    try:
        before = loop.stats()

        def burst() -> None:
            for i in range(50):
                transport.write(b"chunk %02d;" % i)
            transport.writelines([b"a", bytearray(b"b"), memoryview(b"c")])
            # Nothing is sent until the pass ends.
            assert transport.get_write_buffer_size() == 50 * 9 + 3
            assert loop.stats()["sends_posted"] == before["sends_posted"]

        loop.call_soon(burst)
        loop.run_until_complete(asyncio.sleep(0))  # the pass that runs burst(), then its flush
        after = loop.stats()
        assert after["sends_posted"] - before["sends_posted"] == 1
        assert after["bytes_sent"] - before["bytes_sent"] == 50 * 9 + 3
        assert transport.get_write_buffer_size() == 0
        expected = b"".join(b"chunk %02d;" % i for i in range(50)) + b"abc"
        assert _recv_exactly(peer, len(expected)) == expected
    finally:
        transport.close()
        loop.run_until_complete(asyncio.sleep(0.01))
        peer.close()


def test_a_bytearray_is_copied_when_written(loop: cadeloop.Loop) -> None:
    transport, _, peer = _connected_pair(loop)
    try:
        buf = bytearray(b"before")
        transport.write(buf)
        buf[:] = b"AFTER!"  # changed before the flush: the sent bytes must not change
        loop.run_until_complete(asyncio.sleep(0))
        assert _recv_exactly(peer, 6) == b"before"
        with pytest.raises(TypeError, match="bytes-like"):
            transport.write("text")  # type: ignore[arg-type]
    finally:
        transport.close()
        loop.run_until_complete(asyncio.sleep(0.01))
        peer.close()


def test_watermarks_pause_and_resume_the_protocol(loop: cadeloop.Loop) -> None:
    transport, proto, peer = _connected_pair(loop)
    try:
        transport.set_write_buffer_limits(high=4096, low=1024)
        assert transport.get_write_buffer_limits() == (1024, 4096)
        transport.write(b"x" * 4096)  # at the mark, not above it
        assert not any(e[0] == "pause_writing" for e in proto.events)
        transport.write(b"y")
        assert proto.events[-1] == ("pause_writing", 4097)  # at once, inside write()
        loop.run_until_complete(asyncio.sleep(0))  # the flush: the socket takes it all
        assert proto.events[-1] == ("resume_writing", 0)
        _recv_exactly(peer, 4097)
        # The peer stops reading: fill its socket until the transport waits for EPOLLOUT.
        for _ in range(500):
            transport.write(b"z" * 65536)
            loop.run_until_complete(asyncio.sleep(0))
            if transport._core.writing:
                break
        assert transport._core.writing and transport.get_write_buffer_size() > 4096
        kinds = [e[0] for e in proto.events]
        # Each 64 KiB write paused, each flush that emptied the buffer resumed;
        # the last pause stands while the socket is full.
        assert proto.events[-1][0] == "pause_writing"
        assert kinds.count("pause_writing") == kinds.count("resume_writing") + 1
        resumes = kinds.count("resume_writing")
        # The peer drains everything: resumed once, when the buffer is under the low mark.
        got = [0]

        def reader() -> None:
            peer.settimeout(10)
            while chunk := peer.recv(1 << 20):
                got[0] += len(chunk)

        t = threading.Thread(target=reader)
        t.start()

        async def wait_resumed() -> None:
            while [e[0] for e in proto.events].count("resume_writing") <= resumes:
                await asyncio.sleep(0.001)

        loop.run_until_complete(asyncio.wait_for(wait_resumed(), 20))
        assert proto.events[-1][0] == "resume_writing" and proto.events[-1][1] <= 1024
        transport.close()
        loop.run_until_complete(asyncio.wait_for(proto.lost, 20))
        t.join(10)
        assert got[0] + 4097 == loop.stats()["bytes_sent"]
    finally:
        peer.close()


def test_pause_and_resume_reading(loop: cadeloop.Loop) -> None:
    transport, proto, peer = _connected_pair(loop)
    try:
        transport.pause_reading()
        assert not transport.is_reading()
        peer.sendall(b"held back")
        loop.run_until_complete(asyncio.sleep(0.02))
        assert bytes(proto.data) == b""
        transport.pause_reading()  # twice is fine
        transport.resume_reading()
        assert transport.is_reading()

        async def wait_data() -> None:
            while len(proto.data) < 9:
                await asyncio.sleep(0.001)

        loop.run_until_complete(asyncio.wait_for(wait_data(), 5))
        assert bytes(proto.data) == b"held back"
    finally:
        transport.close()
        loop.run_until_complete(asyncio.sleep(0.01))
        peer.close()


def test_close_flushes_first_then_connection_lost(loop: cadeloop.Loop) -> None:
    transport, proto, peer = _connected_pair(loop)
    payload = b"q" * 3_000_000  # more than the socket buffer: close() must wait for it
    transport.write(payload)
    transport.close()
    assert transport.is_closing()
    transport.write(b"tail")  # still accepted after close(), as asyncio does: sent before connection_lost
    got = bytearray()

    def reader() -> None:
        while chunk := peer.recv(1 << 20):
            got.extend(chunk)

    t = threading.Thread(target=reader)
    t.start()
    assert loop.run_until_complete(asyncio.wait_for(proto.lost, 20)) is None
    t.join(10)
    peer.close()
    assert bytes(got) == payload + b"tail"
    assert [e[0] for e in proto.events] == ["made", "pause_writing", "resume_writing", "lost"]
    assert transport.get_extra_info("socket") is not None


def test_abort_drops_the_buffer_and_loses_the_connection(loop: cadeloop.Loop) -> None:
    transport, proto, peer = _connected_pair(loop)
    # What the socket takes is sent, as asyncio's write() sends it at once;
    # the rest of the buffer is dropped.
    transport.write(b"taken")
    transport.write(b"x" * (64 << 20))
    transport.abort()
    assert loop.run_until_complete(asyncio.wait_for(proto.lost, 5)) is None
    peer.settimeout(5)
    got = bytearray()
    while chunk := peer.recv(1 << 20):
        got += chunk
    assert got.startswith(b"taken") and len(got) < 5 + (64 << 20)
    assert loop.stats()["bytes_sent"] == len(got)
    peer.close()
    transport.write(b"x")  # after connection_lost: ignored, no error


def test_peer_eof_then_close_and_write_eof(loop: cadeloop.Loop) -> None:
    transport, proto, peer = _connected_pair(loop)
    transport.write(b"to peer")
    transport.write_eof()
    assert transport.can_write_eof()
    with pytest.raises(RuntimeError, match="write_eof"):
        transport.write(b"more")
    loop.run_until_complete(asyncio.sleep(0.01))
    peer.settimeout(5)
    assert _recv_exactly(peer, 7) == b"to peer"
    assert peer.recv(100) == b""  # our side is shut for writing
    peer.sendall(b"still readable")
    peer.shutdown(socket.SHUT_WR)
    assert loop.run_until_complete(asyncio.wait_for(proto.lost, 5)) is None
    assert bytes(proto.data) == b"still readable"
    assert [e[0] for e in proto.events][-2:] == ["eof", "lost"]
    peer.close()


def test_a_protocol_error_is_a_fatal_error_for_the_transport(loop: cadeloop.Loop) -> None:
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda lp, ctx: errors.append(ctx))

    class Broken(Recorder):
        def data_received(self, data: bytes) -> None:
            raise ValueError("bad protocol")

    transport, proto, peer = _connected_pair(loop, Broken())
    peer.sendall(b"boom")
    exc = loop.run_until_complete(asyncio.wait_for(proto.lost, 5))
    assert isinstance(exc, ValueError)
    assert errors and errors[0]["message"] == "Fatal error: protocol.data_received() call failed."
    assert errors[0]["transport"] is transport
    peer.close()


def test_buffered_protocol(loop: cadeloop.Loop) -> None:
    class Buffered(asyncio.BufferedProtocol):
        def __init__(self) -> None:
            self.buf = bytearray(64)
            self.got = bytearray()
            self.sizes: list[int] = []
            self.lost = loop.create_future()

        def get_buffer(self, sizehint: int) -> memoryview:
            self.sizes.append(sizehint)
            return memoryview(self.buf)

        def buffer_updated(self, nbytes: int) -> None:
            self.got += self.buf[:nbytes]

        def eof_received(self) -> None:
            return None

        def connection_lost(self, exc: BaseException | None) -> None:
            self.lost.set_result(exc)

    transport, proto, peer = _connected_pair(loop, Buffered())
    data = bytes(range(256)) * 40  # larger than the protocol's 64-byte buffer
    peer.sendall(data)
    peer.shutdown(socket.SHUT_WR)
    assert loop.run_until_complete(asyncio.wait_for(proto.lost, 5)) is None
    assert bytes(proto.got) == data
    assert set(proto.sizes) == {-1}
    assert loop.stats()["bytes_received"] == len(data)
    peer.close()


def test_create_server_and_create_connection_use_it(loop: cadeloop.Loop) -> None:
    class Echo(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            assert isinstance(transport._core, _core.SocketTransportCore)

        def data_received(self, data: bytes) -> None:
            self.transport.write(data)

    async def main() -> None:
        server = await loop.create_server(Echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport, proto = await loop.create_connection(Recorder, "127.0.0.1", port)
        assert isinstance(transport._core, _core.SocketTransportCore)
        for i in range(100):
            transport.write(b"%d," % i)
        expected = b"".join(b"%d," % i for i in range(100))
        while len(proto.data) < len(expected):
            await asyncio.sleep(0.001)
        assert bytes(proto.data) == expected
        transport.close()
        await proto.lost
        server.close()
        await server.wait_closed()

    loop.run_until_complete(asyncio.wait_for(main(), 10))
    stats = loop.stats()
    assert stats["connections"] == 0
    assert stats["bytes_sent"] == stats["bytes_received"] == 2 * len(b"".join(b"%d," % i for i in range(100)))


def test_switching_protocols_with_writes_pending_resumes_the_old_one(loop: cadeloop.Loop) -> None:
    """start_tls swaps the protocol right after a write; with writes sent at the
    end of the pass the old protocol may be paused at that moment. It must be
    resumed (not the new one, which was never paused)."""
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda lp, ctx: errors.append(ctx))
    transport, old, peer = _connected_pair(loop)
    try:

        class Strict(Recorder):
            def resume_writing(self) -> None:
                raise AssertionError("resumed without a pause")  # as asyncio's SSLProtocol asserts

        new = Strict()
        transport.write(b"x" * 100_000)  # above the 64 KiB default mark: the old protocol pauses
        assert old.events[-1] == ("pause_writing", 100_000)
        transport.set_protocol(new)
        assert old.events[-1][0] == "resume_writing"  # the data went out: resumed before the switch
        loop.run_until_complete(asyncio.sleep(0.01))
        assert _recv_exactly(peer, 100_000) == b"x" * 100_000
        assert errors == []
        assert not any(e[0] in ("pause_writing", "resume_writing") for e in new.events)
    finally:
        transport.close()
        loop.run_until_complete(asyncio.sleep(0.01))
        peer.close()
