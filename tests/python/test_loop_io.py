"""cadeloop.Loop's I/O: add_reader/add_writer over the C++ poller, the sock_*
methods, and TCP through asyncio streams, with a real peer on the wire."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Iterator

import pytest

import cadeloop
from cadeloop import _core


@pytest.fixture
def loop() -> Iterator[cadeloop.Loop]:
    lp = cadeloop.Loop()
    try:
        yield lp
    finally:
        lp.close()


def test_add_reader_on_a_socketpair(loop: cadeloop.Loop) -> None:
    a, b = socket.socketpair()
    a.setblocking(False)
    received: list[bytes] = []

    def on_readable() -> None:
        data = a.recv(100)
        received.append(data)
        if data == b"stop":
            loop.stop()

    try:
        loop.add_reader(a, on_readable)  # a socket object, as selectors accept
        assert loop.stats()["fds_registered"] == 1
        loop.call_later(0.001, b.send, b"one")
        loop.call_later(0.02, b.send, b"stop")
        loop.call_later(5, loop.stop)  # guard
        loop.run_forever()
        assert received == [b"one", b"stop"]
        assert loop.remove_reader(a.fileno()) is True
        assert loop.remove_reader(a.fileno()) is False
        assert loop.stats()["fds_registered"] == 0
    finally:
        a.close()
        b.close()


def test_add_writer_and_replacing_a_reader_cancels_the_old_handle(loop: cadeloop.Loop) -> None:
    a, b = socket.socketpair()
    a.setblocking(False)
    try:
        first = loop._add_reader(a.fileno(), lambda: None)
        second = loop._add_reader(a.fileno(), lambda: None)
        assert isinstance(first, _core.Handle)
        assert first.cancelled() and not second.cancelled()
        key = loop._selector.get_key(a.fileno())
        assert key.data == (second, None)
        writable: list[bool] = []

        def on_writable() -> None:
            writable.append(True)
            loop.remove_writer(a)
            loop.stop()

        loop.add_writer(a.fileno(), on_writable)
        assert loop._selector.get_key(a.fileno()).events == 3  # EVENT_READ | EVENT_WRITE
        loop.run_forever()
        assert writable == [True]
        assert loop.remove_reader(a) is True
        with pytest.raises(KeyError):
            loop._selector.get_key(a.fileno())
    finally:
        a.close()
        b.close()


def test_add_reader_refuses_a_regular_file(loop: cadeloop.Loop, tmp_path: object) -> None:
    import os

    fd = os.open(os.path.join(str(tmp_path), "f"), os.O_CREAT | os.O_RDWR)
    try:
        with pytest.raises(PermissionError):
            loop.add_reader(fd, lambda: None)
        assert loop.stats()["fds_registered"] == 0
    finally:
        os.close(fd)


def test_sock_methods_talk_to_a_blocking_peer_thread(loop: cadeloop.Loop) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def peer() -> None:
        conn, _ = listener.accept()
        with conn:
            data = b""
            while len(data) < 1_000_000:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            conn.sendall(data[::-1][:100_000])

    t = threading.Thread(target=peer)
    t.start()

    async def main() -> bytes:
        s = socket.socket()
        s.setblocking(False)
        with s:
            await loop.sock_connect(s, ("127.0.0.1", port))
            payload = bytes(range(256)) * 3907 + b"1234"  # 1,000,196 bytes: sendall must wait for the peer
            await loop.sock_sendall(s, payload[:1_000_000])
            got = bytearray()
            buf = bytearray(8192)
            while len(got) < 100_000:
                n = await loop.sock_recv_into(s, buf)
                assert n > 0
                got += buf[:n]
            return bytes(got), payload[:1_000_000]

    try:
        got, sent = loop.run_until_complete(main())
        assert got == sent[::-1][:100_000]
    finally:
        t.join(timeout=10)
        listener.close()


def test_sock_accept_and_sock_recv(loop: cadeloop.Loop) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]

    def client() -> None:
        with socket.create_connection(("127.0.0.1", port)) as c:
            c.sendall(b"ping")
            assert c.recv(4) == b"pong"

    async def main() -> bytes:
        t = threading.Thread(target=client)
        t.start()
        conn, _ = await loop.sock_accept(listener)
        conn.setblocking(False)
        with conn:
            data = await loop.sock_recv(conn, 4)
            await loop.sock_sendall(conn, b"pong")
        await loop.run_in_executor(None, t.join)
        return data

    try:
        assert loop.run_until_complete(main()) == b"ping"
    finally:
        listener.close()


async def _echo_server_and_clients(clients: int, messages: int) -> tuple[int, dict[str, object]]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            writer.write(line)
            await writer.drain()
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    async def client(i: int) -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        ok = 0
        for j in range(messages):
            msg = f"client {i} message {j}\n".encode()
            writer.write(msg)
            await writer.drain()
            assert await reader.readline() == msg
            ok += 1
        writer.close()
        await writer.wait_closed()
        return ok

    total = sum(await asyncio.gather(*(client(i) for i in range(clients))))
    stats = asyncio.get_running_loop().stats()  # type: ignore[attr-defined]
    server.close()
    await server.wait_closed()
    return total, stats


def test_streams_echo_over_tcp(loop: cadeloop.Loop) -> None:
    total, stats = loop.run_until_complete(_echo_server_and_clients(clients=10, messages=50))
    assert total == 500
    assert stats["connections"] >= 10  # ten client transports (and their server sides) were live
    assert stats["polls"] > 0 and stats["parks"] > 0


def test_a_large_write_is_buffered_and_drained(loop: cadeloop.Loop) -> None:
    size = 8 * 1024 * 1024

    async def main() -> int:
        got = 0
        done = asyncio.get_running_loop().create_future()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal got
            while chunk := await reader.read(1 << 16):
                got += len(chunk)
            writer.close()
            done.set_result(None)

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.transport.set_write_buffer_limits(high=1 << 16)
        writer.write(b"x" * size)  # more than the socket takes: buffered, then paused
        assert writer.transport.get_write_buffer_size() > 0
        await writer.drain()
        writer.write_eof()
        await done
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()
        return got

    assert loop.run_until_complete(main()) == size


def test_create_connection_with_a_protocol_and_extra_info(loop: cadeloop.Loop) -> None:
    class Collect(asyncio.Protocol):
        def __init__(self) -> None:
            self.data = b""
            self.lost = loop.create_future()

        def data_received(self, data: bytes) -> None:
            self.data += data

        def connection_lost(self, exc: BaseException | None) -> None:
            self.lost.set_result(exc)

    async def main() -> tuple[bytes, object]:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"hello from server")
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport, proto = await loop.create_connection(Collect, "127.0.0.1", port)
        peer = transport.get_extra_info("peername")
        assert await proto.lost is None
        server.close()
        await server.wait_closed()
        return proto.data, peer

    data, peer = loop.run_until_complete(main())
    assert data == b"hello from server"
    assert peer[0] == "127.0.0.1"
