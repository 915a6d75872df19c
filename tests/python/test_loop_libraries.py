"""Real libraries on cadeloop.install(): httpx (plain HTTP and TLS with a
trustme certificate), websockets (client and server), anyio, asyncio
streams, run_in_executor, and call_soon_threadsafe from eight threads at once.

Every test runs through asyncio.run() with cadeloop's policy installed, the
way an application would use cadeloop, and checks that the loop it got is a
cadeloop.Loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import ssl
import threading
from typing import Any, Iterator

import anyio
import httpx
import pytest
import trustme
from websockets.asyncio.client import connect as ws_connect
from websockets.asyncio.server import serve as ws_serve

import cadeloop


@pytest.fixture(autouse=True)
def cadeloop_policy() -> Iterator[None]:
    old = asyncio.get_event_loop_policy()
    cadeloop.install()
    try:
        yield
    finally:
        asyncio.set_event_loop_policy(old)


def assert_on_cadeloop() -> cadeloop.Loop:
    loop = asyncio.get_running_loop()
    assert type(loop) is cadeloop.Loop
    return loop


# --- a small HTTP/1.1 server over asyncio streams, on the same loop ----------------


async def _http_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Keep-alive HTTP/1.1: GET /size/N answers N bytes, POST echoes the body's length and hash."""
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            request_line, *header_lines = head.decode("latin-1").split("\r\n")
            method, target, _ = request_line.split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in header_lines if h)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            if method == "GET" and target.startswith("/size/"):
                payload = bytes(i % 251 for i in range(int(target[len("/size/"):])))
            else:
                payload = f"{method} {target} {len(body)} {sum(body) % 65521}".encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
                + f"content-length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (ConnectionError, ssl.SSLError):
            pass


async def _httpx_round(url: str, verify: Any) -> None:
    async with httpx.AsyncClient(verify=verify, timeout=30) as client:
        r = await client.get(url + "/hello")
        assert r.status_code == 200
        assert r.text == "GET /hello 0 0"
        big = await client.get(url + "/size/1000000")  # more than one write buffer: flow control
        assert big.content == bytes(i % 251 for i in range(1_000_000))
        body = bytes(range(256)) * 4096  # 1 MiB up
        r = await client.post(url + "/upload", content=body)
        assert r.text == f"POST /upload {len(body)} {sum(body) % 65521}"
        results = await asyncio.gather(*(client.get(f"{url}/n{i}") for i in range(20)))
        assert [x.text for x in results] == [f"GET /n{i} 0 0" for i in range(20)]


def test_httpx_async_client_over_plain_http() -> None:
    async def main() -> dict[str, Any]:
        loop = assert_on_cadeloop()
        server = await asyncio.start_server(_http_handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        await _httpx_round(f"http://127.0.0.1:{port}", verify=False)
        server.close()
        await server.wait_closed()
        return loop.stats()

    stats = asyncio.run(main())
    assert stats["bytes_received"] > 2_000_000 and stats["bytes_sent"] > 2_000_000  # both ends counted


def test_httpx_async_client_over_tls_with_a_trustme_certificate() -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)

    async def main() -> None:
        assert_on_cadeloop()
        server = await asyncio.start_server(_http_handler, "localhost", 0, ssl=server_ctx)
        port = server.sockets[0].getsockname()[1]
        await _httpx_round(f"https://localhost:{port}", verify=client_ctx)
        # The certificate is really checked: a client that does not trust the CA fails.
        with pytest.raises(httpx.ConnectError):
            async with httpx.AsyncClient(verify=ssl.create_default_context()) as client:
                await client.get(f"https://localhost:{port}/x")
        server.close()
        await server.wait_closed()

    asyncio.run(main())


def test_asyncio_tls_client_and_server_with_start_tls() -> None:
    """ssl= on both ends through asyncio's SSL protocol, then start_tls on a plain connection."""
    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)

    async def upgrade_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert await reader.readline() == b"STARTTLS\n"
        writer.write(b"GO\n")
        await writer.drain()
        await writer.start_tls(server_ctx)
        while line := await reader.readline():
            writer.write(line.upper())
            await writer.drain()
        writer.close()

    async def main() -> None:
        assert_on_cadeloop()
        server = await asyncio.start_server(upgrade_handler, "localhost", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("localhost", port)
        writer.write(b"STARTTLS\n")
        assert await reader.readline() == b"GO\n"
        await writer.start_tls(client_ctx, server_hostname="localhost")
        assert writer.get_extra_info("ssl_object") is not None
        for i in range(50):
            writer.write(b"line %d\n" % i)
            assert await reader.readline() == b"LINE %d\n" % i
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()

    asyncio.run(main())


# --- websockets -----------------------------------------------------------------------


def test_websockets_client_and_server() -> None:
    async def echo(ws: Any) -> None:
        async for message in ws:
            await ws.send(message)

    async def main() -> None:
        assert_on_cadeloop()
        async with ws_serve(echo, "127.0.0.1", 0) as server:
            port = next(iter(server.sockets)).getsockname()[1]
            async with ws_connect(f"ws://127.0.0.1:{port}") as ws:
                for i in range(100):
                    await ws.send(f"message {i}")
                    assert await ws.recv() == f"message {i}"
                blob = bytes(range(256)) * 4096  # 1 MiB frame
                await ws.send(blob)
                assert await ws.recv() == blob
                await ws.ping()
            # Many clients at once.
            async def client(i: int) -> str:
                async with ws_connect(f"ws://127.0.0.1:{port}") as c:
                    await c.send(str(i))
                    return str(await c.recv())

            assert await asyncio.gather(*(client(i) for i in range(20))) == [str(i) for i in range(20)]

    asyncio.run(main())


# --- anyio ------------------------------------------------------------------------------


def test_anyio_on_cadeloop() -> None:
    async def main() -> None:
        assert_on_cadeloop()
        # Task groups, cancel scopes, timeouts.
        results: list[int] = []

        async def worker(i: int) -> None:
            await anyio.sleep(0.001 * (5 - i))
            results.append(i)

        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(worker, i)
        assert sorted(results) == [0, 1, 2, 3, 4]
        with anyio.move_on_after(0.01) as scope:
            await anyio.sleep(5)
        assert scope.cancelled_caught
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.01):
                await anyio.sleep(5)
        # Threads.
        assert await anyio.to_thread.run_sync(lambda: threading.current_thread().name) != threading.current_thread().name
        # Memory object streams.
        send, receive = anyio.create_memory_object_stream[int](10)
        async with send, receive:
            for i in range(10):
                await send.send(i)
            assert [await receive.receive() for _ in range(10)] == list(range(10))
        # TCP through anyio's own stream layer over cadeloop transports.
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        port = listener.extra(anyio.abc.SocketAttribute.local_port)

        async def serve_one(stream: anyio.abc.SocketStream) -> None:
            async with stream:
                async for chunk in stream:
                    await stream.send(chunk[::-1])

        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, serve_one)
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                for i in range(20):
                    msg = f"hello {i}".encode()
                    await stream.send(msg)
                    assert await stream.receive() == msg[::-1]
            tg.cancel_scope.cancel()
        await listener.aclose()

    anyio.run(main)


# --- asyncio streams, executors, threads ----------------------------------------------


def test_asyncio_streams_echo_many_clients() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    async def main() -> dict[str, Any]:
        loop = assert_on_cadeloop()
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]

        async def client(i: int) -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            payload = bytes([i]) * (100_000 + i)
            writer.write(payload)
            writer.write_eof()
            got = await reader.read()
            assert got == payload
            writer.close()
            await writer.wait_closed()

        await asyncio.gather(*(client(i) for i in range(30)))
        server.close()
        await server.wait_closed()
        return loop.stats()

    stats = asyncio.run(main())
    sent = sum(100_000 + i for i in range(30))
    assert stats["bytes_sent"] >= 2 * sent and stats["bytes_received"] >= 2 * sent
    assert stats["connections"] == 0  # every transport left the loop's fd table


def test_run_in_executor() -> None:
    async def main() -> None:
        loop = assert_on_cadeloop()
        main_thread = threading.get_ident()
        idents = await asyncio.gather(*(loop.run_in_executor(None, threading.get_ident) for _ in range(50)))
        assert main_thread not in idents
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            squares = await asyncio.gather(*(loop.run_in_executor(pool, pow, i, 2) for i in range(100)))
        assert squares == [i * i for i in range(100)]
        assert await asyncio.to_thread(sum, range(1000)) == 499500

    asyncio.run(main())


def test_call_soon_threadsafe_from_eight_threads_at_once_loses_nothing() -> None:
    threads_n, per_thread = 8, 20_000

    async def main() -> dict[int, list[int]]:
        loop = assert_on_cadeloop()
        received: dict[int, list[int]] = {t: [] for t in range(threads_n)}
        done = loop.create_future()
        count = 0
        start = threading.Barrier(threads_n)

        def record(t: int, i: int) -> None:
            nonlocal count
            received[t].append(i)
            count += 1
            if count == threads_n * per_thread:
                done.set_result(None)

        def producer(t: int) -> None:
            start.wait()  # all eight push at the same moment
            for i in range(per_thread):
                loop.call_soon_threadsafe(record, t, i)

        threads = [threading.Thread(target=producer, args=(t,)) for t in range(threads_n)]
        for th in threads:
            th.start()
        await asyncio.wait_for(done, 60)
        for th in threads:
            th.join()
        return received

    received = asyncio.run(main())
    for t in range(threads_n):
        assert received[t] == list(range(per_thread)), f"thread {t}: lost or reordered"


