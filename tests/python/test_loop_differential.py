"""cadeloop.Loop against asyncio's own loop, scenario by scenario.

Each scenario is one coroutine that drives a loop and writes a transcript: the
callbacks the loop made (and the value of a context variable inside each), the
results and exceptions (by type and message) of the calls it made, what the
loop's exception handler was given. The same scenario runs on asyncio's
selector loop and on cadeloop.Loop, in the same process and Python; the two
transcripts must be equal. So each test says "as asyncio on this Python",
whatever that is on 3.11 or 3.13, and never hard-codes it.

Ports and paths are kept out of the transcripts; what both loops order by the
network alone (two peers' callbacks) is kept in one list per peer.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import shutil
import socket
import ssl
import sys
import tempfile
from typing import Any, Awaitable, Callable

import pytest

import cadeloop

pytestmark = pytest.mark.timeout(60)

Scenario = Callable[[list[Any]], Awaitable[None]]

var: contextvars.ContextVar[str] = contextvars.ContextVar("cadeloop_differential", default="unset")


def transcript(loop_factory: Callable[[], asyncio.AbstractEventLoop], scenario: Scenario) -> list[Any]:
    out: list[Any] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(
            lambda _loop, ctx: out.append(
                ("exception handler", ctx.get("message"), type(ctx.get("exception")).__name__)
            )
        )
        await scenario(out)

    # asyncio.run's own context for both: a fresh copy, so the variable starts unset.
    contextvars.Context().run(_run, loop_factory, main)
    return out


def _run(loop_factory: Callable[[], asyncio.AbstractEventLoop], main: Callable[[], Any]) -> None:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(main())


def assert_same_as_asyncio(scenario: Scenario) -> list[Any]:
    expected = transcript(asyncio.SelectorEventLoop, scenario)
    got = transcript(cadeloop.Loop, scenario)
    assert got == expected, "\n".join(
        f"{'  ' if a == b else '!!'} asyncio={a!r} cadeloop={b!r}" for a, b in zip(expected, got)
    ) + f"\n(asyncio {len(expected)} entries, cadeloop {len(got)})"
    return expected


# --- 1. protocol callbacks run in the context of their connection -------------------


class Recorder:
    """Records each distinct (callback, var) of one peer once (read sizes vary).

    Its first read sets the variable to '<name>:read', which later reads of
    the same connection see in asyncio.
    """

    def __init__(self, name: str, log: list[Any]) -> None:
        self.name = name
        self.log = log
        self.buf = bytearray(64 * 1024)
        self.received = bytearray()
        self.transport: Any = None
        self.made: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.resumed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.want: int | None = None
        self.got_want: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def rec(self, what: str) -> None:
        entry = (what, var.get())
        if entry not in self.log:
            self.log.append(entry)

    def connection_made(self, transport: Any) -> None:
        self.rec("connection_made")
        self.transport = transport
        self.made.set_result(None)

    def _got(self, data: bytes) -> None:
        self.received += data
        var.set(f"{self.name}:read")
        if self.want is not None and len(self.received) >= self.want and not self.got_want.done():
            self.got_want.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.rec("data_received")
        self._got(data)

    def eof_received(self) -> None:
        self.rec("eof_received")

    def pause_writing(self) -> None:
        self.rec("pause_writing")

    def resume_writing(self) -> None:
        self.rec("resume_writing")
        if not self.resumed.done():
            self.resumed.set_result(None)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.rec("connection_lost")
        self.log.append(("connection_lost exc", type(exc).__name__))
        self.lost.set_result(None)

    async def expect(self, n: int) -> None:
        self.want = n
        if len(self.received) < n:
            await asyncio.wait_for(self.got_want, 10)
        self.want = None
        self.got_want = asyncio.get_running_loop().create_future()


class PlainRecorder(Recorder, asyncio.Protocol):
    pass


class BufferedRecorder(Recorder, asyncio.BufferedProtocol):
    def get_buffer(self, sizehint: int) -> bytearray:
        self.rec("get_buffer")
        return self.buf

    def buffer_updated(self, nbytes: int) -> None:
        self.rec("buffer_updated")
        self._got(bytes(self.buf[:nbytes]))


def make_protocol(name: str, log: list[Any], buffered: bool) -> Recorder:
    return (BufferedRecorder if buffered else PlainRecorder)(name, log)


async def conversation(server: Recorder, client: Recorder, big: int) -> None:
    """ping/pong, then a write big enough to fill the socket while the
    server does not read, then EOF both ways."""
    await asyncio.wait_for(asyncio.gather(server.made, client.made), 10)
    var.set("main:ping")
    client.transport.write(b"ping")
    await server.expect(4)
    var.set("main:pong")
    server.transport.write(b"pong")
    await client.expect(4)
    # Flow control: the server stops reading, the client writes until its
    # buffer passes the high-water mark (pause_writing, in this context),
    # then the server reads again and the client's buffer drains
    # (resume_writing, in the context of the write that filled it).
    server.transport.pause_reading()
    client.transport.set_write_buffer_limits(high=64 * 1024, low=16 * 1024)
    var.set("main:bulk")
    client.transport.write(b"x" * big)
    await asyncio.sleep(0.05)
    var.set("main:resume")
    server.transport.resume_reading()
    await asyncio.wait_for(client.resumed, 10)
    await server.expect(4 + big)
    var.set("main:eof")
    client.transport.write_eof()
    await asyncio.wait_for(server.lost, 10)  # eof_received returned None: the server closes
    await asyncio.wait_for(client.lost, 10)


def conversation_scenario(kind: str, buffered: bool) -> Scenario:
    big = 8 * 1024 * 1024

    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        server_log: list[Any] = []
        client_log: list[Any] = []
        protocols: list[Recorder] = []

        def server_factory() -> Recorder:
            p = make_protocol("server", server_log, buffered)
            protocols.append(p)
            return p

        var.set(f"{kind}:server")
        tmp = tempfile.mkdtemp()
        server: Any = None
        if kind == "tcp":
            server = await loop.create_server(server_factory, "127.0.0.1", 0)
            var.set(f"{kind}:client")
            _, client = await loop.create_connection(
                lambda: make_protocol("client", client_log, buffered), *server.sockets[0].getsockname()[:2]
            )
        elif kind == "unix":
            path = os.path.join(tmp, "s")
            server = await loop.create_unix_server(server_factory, path)
            var.set(f"{kind}:client")
            _, client = await loop.create_unix_connection(lambda: make_protocol("client", client_log, buffered), path)
        else:  # accepted: connect_accepted_socket and create_connection(sock=...) on a socketpair
            a, b = socket.socketpair()
            await loop.connect_accepted_socket(server_factory, a)
            var.set(f"{kind}:client")
            _, client = await loop.create_unix_connection(
                lambda: make_protocol("client", client_log, buffered), sock=b
            )
        var.set("main:waiting")
        while not protocols:
            await asyncio.sleep(0.001)
        await conversation(protocols[0], client, big)
        if server is not None:
            server.close()
            await server.wait_closed()
        shutil.rmtree(tmp)
        out.append(("server", server_log))
        out.append(("client", client_log))
        out.append(("main after", var.get()))

    return scenario


@pytest.mark.parametrize("buffered", [False, True], ids=["Protocol", "BufferedProtocol"])
@pytest.mark.parametrize("kind", ["tcp", "unix", "accepted"])
def test_protocol_callbacks_run_in_the_context_of_their_connection(kind: str, buffered: bool) -> None:
    expected = assert_same_as_asyncio(conversation_scenario(kind, buffered))
    # What asyncio does, spelled out once: reads see the creation context.
    server_log = dict(expected)["server"]
    first_read = "get_buffer" if buffered else "data_received"
    assert (first_read, f"{kind}:server") in server_log
    assert ("pause_writing", "main:bulk") in dict(expected)["client"]


def test_tls_protocol_callbacks_run_in_the_context_of_their_connection() -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)

    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        server_log: list[Any] = []
        client_log: list[Any] = []
        protocols: list[Recorder] = []

        def server_factory() -> Recorder:
            p = make_protocol("server", server_log, False)
            protocols.append(p)
            return p

        var.set("tls:server")
        server = await loop.create_server(server_factory, "127.0.0.1", 0, ssl=server_ctx)
        var.set("tls:client")
        _, client = await loop.create_connection(
            lambda: make_protocol("client", client_log, False),
            *server.sockets[0].getsockname()[:2],
            ssl=client_ctx,
            server_hostname="localhost",
        )
        var.set("main")
        while not protocols:
            await asyncio.sleep(0.001)
        srv = protocols[0]
        await asyncio.wait_for(srv.made, 10)
        client.transport.write(b"ping")
        await srv.expect(4)
        srv.transport.write(b"pong")
        await client.expect(4)
        client.transport.close()
        await asyncio.wait_for(asyncio.gather(srv.lost, client.lost), 10)
        server.close()
        await server.wait_closed()
        # TLS's own reads and closes differ in what they log between runs;
        # the contexts are what is compared.
        out.append(("server", [e for e in server_log if e[0] in ("connection_made", "data_received")]))
        out.append(("client", [e for e in client_log if e[0] in ("connection_made", "data_received")]))

    expected = assert_same_as_asyncio(scenario)
    assert ("data_received", "tls:server") in dict(expected)["server"]


# --- 2. sock_* calls on a socket that another callback closes ------------------------


def closed_socket_scenario(who: str) -> Scenario:
    """A sock_* call waits; then a callback closes the socket itself (`self`)
    or its peer (`peer`); the call's outcome, or a timeout, is recorded."""

    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        for op in ("sock_recv", "sock_recv_into", "sock_recvfrom", "sock_accept", "sock_sendall", "sock_connect"):
            peer: socket.socket | None = None
            keep: list[socket.socket] = []
            if op == "sock_accept":
                sock = socket.socket()
                sock.bind(("127.0.0.1", 0))
                sock.listen()
            elif op == "sock_recvfrom":
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sock.bind(("127.0.0.1", 0))
            elif op == "sock_connect":
                # A loopback listener whose accept queue is full drops new
                # SYNs: a connect() then waits (for the SYN's retry, 1 s on).
                listener = socket.socket()
                listener.bind(("127.0.0.1", 0))
                listener.listen(0)
                target_addr = listener.getsockname()
                keep.append(listener)
                while True:
                    s = socket.socket()
                    s.settimeout(0.2)
                    keep.append(s)
                    try:
                        s.connect(target_addr)
                    except OSError:  # timed out: the queue is full
                        break
                sock = socket.socket()
            else:
                sock, peer = socket.socketpair()
            sock.setblocking(False)
            call: Any = {
                "sock_recv": lambda: loop.sock_recv(sock, 10),
                "sock_recv_into": lambda: loop.sock_recv_into(sock, bytearray(10)),
                "sock_recvfrom": lambda: loop.sock_recvfrom(sock, 10),
                "sock_accept": lambda: loop.sock_accept(sock),
                "sock_sendall": lambda: loop.sock_sendall(sock, b"x" * (16 * 1024 * 1024)),
                "sock_connect": lambda: loop.sock_connect(sock, target_addr),
            }[op]
            task = asyncio.ensure_future(call())
            await asyncio.sleep(0.02)
            out.append((op, "pending", not task.done()))
            target = sock if who == "self" else peer
            if target is not None:
                loop.call_soon(target.close)
            try:
                result = await asyncio.wait_for(task, 0.3)
                out.append((op, "result", type(result).__name__))
            except BaseException as exc:  # noqa: BLE001 - the transcript records it
                out.append((op, "raised", type(exc).__name__, str(exc)))
            for s in [sock, peer, *keep]:
                if s is not None:
                    s.close()

    return scenario


@pytest.mark.parametrize("who", ["self", "peer"])
def test_pending_sock_call_when_a_callback_closes_the_socket(who: str) -> None:
    assert_same_as_asyncio(closed_socket_scenario(who))


def test_sock_call_on_a_closed_socket_and_on_its_reused_fd() -> None:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        a.setblocking(False)
        old = asyncio.ensure_future(loop.sock_recv(a, 10))
        await asyncio.sleep(0.01)
        fd = a.fileno()
        a.close()
        try:
            await loop.sock_recv(a, 10)
        except BaseException as exc:  # noqa: BLE001
            out.append(("recv on closed", type(exc).__name__, str(exc)))
        # The fd number is reused for a new socket on both loops alike: the
        # lowest free number is not always this one (another fd may have
        # been opened meanwhile), so the reuse is made explicit with dup2.
        first, d = socket.socketpair()
        if d.fileno() == fd:
            first, d = d, first
        if first.fileno() == fd:
            c = first
        else:
            try:
                os.fstat(fd)
            except OSError:  # free: reuse it
                os.dup2(first.fileno(), fd)
                c = socket.socket(fileno=fd)
                first.close()
            else:  # another fd took it: never clobber that one (the transcript says so)
                c = first
        c.setblocking(False)
        out.append(("fd reused", c.fileno() == fd))
        new = asyncio.ensure_future(loop.sock_recv(c, 10))
        await asyncio.sleep(0.01)
        d.send(b"new")
        for name, task in (("new", new), ("old", old)):
            try:
                out.append((name, await asyncio.wait_for(task, 0.3)))
            except BaseException as exc:  # noqa: BLE001
                out.append((name, type(exc).__name__))
        for s in (b, c, d):
            s.close()

    assert_same_as_asyncio(scenario)


# --- 3. TCP_NODELAY on TCP transports -------------------------------------------------


def test_tcp_nodelay_as_asyncio_sets_it() -> None:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        accepted: list[Any] = []

        class Server(asyncio.Protocol):
            def connection_made(self, transport: Any) -> None:
                accepted.append(transport)

        def nodelay(transport: Any) -> bool:
            return transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0

        async def accepted_one() -> Any:
            while len(accepted) < want:
                await asyncio.sleep(0.001)
            return accepted[-1]

        server = await loop.create_server(Server, "127.0.0.1", 0)
        addr = server.sockets[0].getsockname()
        want = 1
        t, _ = await loop.create_connection(asyncio.Protocol, *addr)
        out.append(("host/port: client", nodelay(t), "accepted", nodelay(await accepted_one())))
        t.close()
        for proto in (0, socket.IPPROTO_TCP):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, proto)
            s.connect(addr)
            want += 1
            t, _ = await loop.create_connection(asyncio.Protocol, sock=s)
            out.append((f"sock= proto {proto}: client", nodelay(t), "accepted", nodelay(await accepted_one())))
            t.close()
        for proto in (0, socket.IPPROTO_TCP):
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, proto)
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            server2 = await loop.create_server(Server, sock=listener)
            want += 1
            t, _ = await loop.create_connection(asyncio.Protocol, *listener.getsockname())
            out.append((f"server sock= proto {proto}: accepted", nodelay(await accepted_one())))
            t.close()
            server2.close()
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        b = socket.create_connection(listener.getsockname())
        a, _ = listener.accept()
        listener.close()
        t, _ = await loop.connect_accepted_socket(asyncio.Protocol, a)
        out.append(("connect_accepted_socket", nodelay(t)))
        t.close()
        b.close()
        for tr in accepted:
            tr.close()
        server.close()
        await server.wait_closed()
        await asyncio.sleep(0.01)

    expected = assert_same_as_asyncio(scenario)
    assert expected[0] == ("host/port: client", True, "accepted", True)


# --- 4. UDP: create_datagram_endpoint's arguments, sendto -----------------------------


def udp_scenario(out_port: list[int]) -> Scenario:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        peer.bind(("127.0.0.1", 0))
        peer.setblocking(False)
        port = peer.getsockname()[1]

        def clean(value: Any) -> Any:
            return str(value).replace(str(port), "PORT")

        class P(asyncio.DatagramProtocol):
            def connection_made(self, transport: Any) -> None:
                out.append(("connection_made", var.get()))

            def datagram_received(self, data: bytes, addr: Any) -> None:
                out.append(("datagram_received", data, var.get()))

            def error_received(self, exc: Exception) -> None:
                out.append(("error_received", type(exc).__name__, clean(exc)))

            def connection_lost(self, exc: BaseException | None) -> None:
                out.append(("connection_lost", type(exc).__name__, clean(exc), var.get()))

        async def drain_peer() -> None:
            await asyncio.sleep(0.02)
            while True:
                try:
                    data, _ = peer.recvfrom(100)
                except BlockingIOError:
                    return
                out.append(("peer got", data))

        for kwargs in ({"reuse_address": True}, {"reuse_address": False}, {"reuse_port": True}):
            try:
                t, _ = await loop.create_datagram_endpoint(P, local_addr=("127.0.0.1", 0), **kwargs)
                out.append(("created with", kwargs))
                t.close()
            except Exception as exc:  # noqa: BLE001
                out.append(("create", kwargs, type(exc).__name__, clean(exc).replace("BaseEventLoop.", "")))
        await asyncio.sleep(0.01)

        var.set("udp")
        t, _ = await loop.create_datagram_endpoint(P, local_addr=("127.0.0.1", 0))
        var.set("main")
        for addr in (("localhost", port), ("127.0.0.1", port), None):
            try:
                t.sendto(b"unconnected", addr)
                out.append(("sendto", clean(addr), "ok"))
            except Exception as exc:  # noqa: BLE001
                out.append(("sendto", clean(addr), type(exc).__name__, clean(exc)))
            await drain_peer()
        t.close()
        await asyncio.sleep(0.01)
        for _ in range(6):
            try:
                t.sendto(b"after close", ("127.0.0.1", port))
                out.append(("sendto after close", "ok"))
            except Exception as exc:  # noqa: BLE001
                out.append(("sendto after close", type(exc).__name__, clean(exc)))
        await drain_peer()

        var.set("udp connected")
        t, _ = await loop.create_datagram_endpoint(P, remote_addr=("127.0.0.1", port))
        var.set("main")
        for addr in (None, ("127.0.0.1", port), ("localhost", port), ("127.0.0.1", 1)):
            try:
                t.sendto(b"connected", addr)
                out.append(("connected sendto", clean(addr), "ok"))
            except Exception as exc:  # noqa: BLE001
                out.append(("connected sendto", clean(addr), type(exc).__name__, clean(exc)))
            await drain_peer()
        peer.sendto(b"reply", t.get_extra_info("sockname"))
        await asyncio.sleep(0.02)
        t.close()
        await asyncio.sleep(0.01)
        for _ in range(6):
            try:
                t.sendto(b"after close")
                out.append(("connected sendto after close", "ok"))
            except Exception as exc:  # noqa: BLE001
                out.append(("connected sendto after close", type(exc).__name__, clean(exc)))
        peer.close()
        await asyncio.sleep(0.01)

    return scenario


def test_udp_endpoint_arguments_and_sendto_as_asyncio() -> None:
    expected = assert_same_as_asyncio(udp_scenario([]))
    assert ("datagram_received", b"reply", "udp connected") in expected


# --- 5. readers and writers of a socket object closed before their removal -----------
# (anyio's socket streams close the socket, then remove its reader or writer:
# its own test suite, tests/conformance/run_peer_suites.py, found this)


@pytest.mark.parametrize("family", ["unix-stream", "unix-dgram", "tcp"])
def test_remove_reader_and_writer_of_a_closed_socket_object(family: str) -> None:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        for side in ("reader", "writer"):
            if family == "tcp":
                listener = socket.create_server(("127.0.0.1", 0))
                a = socket.create_connection(listener.getsockname())
                b, _ = listener.accept()
                listener.close()
            else:
                kind = socket.SOCK_STREAM if family == "unix-stream" else socket.SOCK_DGRAM
                a, b = socket.socketpair(socket.AF_UNIX, kind)
            a.setblocking(False)
            add, remove = (
                (loop.add_reader, loop.remove_reader) if side == "reader" else (loop.add_writer, loop.remove_writer)
            )
            called: list[str] = []
            add(a, called.append, "ready")
            await asyncio.sleep(0.01)
            a.close()  # another callback's close: the registration stays
            try:
                out.append((side, "removed", remove(a)))
            except BaseException as exc:  # noqa: BLE001 - the transcript records it
                out.append((side, "raised", type(exc).__name__, str(exc)))
            out.append((side, "removed again", remove(a) if a.fileno() >= 0 else "closed"))
            await asyncio.sleep(0.01)
            out.append((side, "called", sorted(set(called))))
            b.close()

    assert_same_as_asyncio(scenario)


# --- 6. write() then abort() in one callback ------------------------------------------
# (aiohttp's WebSocket tests write the handshake's reply and abort the
# transport in one callback: its own test suite, run_peer_suites.py, found this)


def test_write_then_abort_sends_what_asyncio_sends() -> None:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()

        class WriteThenAbort(asyncio.Protocol):
            def connection_made(self, transport: Any) -> None:
                transport.write(b"before abort")
                transport.abort()
                transport.write(b"after abort")

            def connection_lost(self, exc: BaseException | None) -> None:
                out.append(("server connection_lost", type(exc).__name__))

        server = await loop.create_server(WriteThenAbort, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        got = b""
        try:
            while chunk := await asyncio.wait_for(reader.read(1 << 16), 2):
                got += chunk
            out.append(("client read", got))
        except BaseException as exc:  # noqa: BLE001 - the transcript records it
            out.append(("client read", got, "raised", type(exc).__name__))
        writer.close()
        server.close()
        await server.wait_closed()

    assert_same_as_asyncio(scenario)
