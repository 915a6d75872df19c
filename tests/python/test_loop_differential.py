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
import gc
import os
import shutil
import socket
import ssl
import sys
import tempfile
import threading
import weakref
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


class DatagramRecorder(asyncio.DatagramProtocol):
    """Records each datagram callback with the context variable inside it.

    Each read sets the variable to '<name>:read <n>', which the next read of
    the same endpoint sees in asyncio (the reader's context lives on).
    """

    def __init__(self, name: str, out: list[Any], clean: Callable[[Any], Any]) -> None:
        self.name = name
        self.out = out
        self.clean = clean
        self.reads = 0
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: Any) -> None:
        self.out.append((self.name, "connection_made", var.get()))

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.reads += 1
        self.out.append((self.name, "datagram_received", data, self.clean(addr), var.get()))
        var.set(f"{self.name}:read {self.reads}")

    def error_received(self, exc: Exception) -> None:
        self.out.append((self.name, "error_received", type(exc).__name__, exc.errno, var.get()))

    def connection_lost(self, exc: BaseException | None) -> None:
        self.out.append((self.name, "connection_lost", type(exc).__name__, var.get()))
        self.lost.set_result(None)


async def _udp_echo_rounds(loop: Any, out: list[Any], family: int, host: str) -> None:
    """An echo server and a connected client: addresses, contexts, set_protocol, close."""
    ports: list[int] = []

    def clean(addr: Any) -> Any:
        if isinstance(addr, tuple):
            return tuple("PORT" if (i == 1 and v in ports) else v for i, v in enumerate(addr))
        return addr

    class Echo(DatagramRecorder):
        def datagram_received(self, data: bytes, addr: Any) -> None:
            super().datagram_received(data, addr)
            self.transport.sendto(data.upper(), addr)

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self.transport = transport

    var.set(f"{host} server")
    server, server_p = await loop.create_datagram_endpoint(
        lambda: Echo("server", out, clean), local_addr=(host, 0), family=family
    )
    ports.append(server.get_extra_info("sockname")[1])
    var.set(f"{host} client")
    client, client_p = await loop.create_datagram_endpoint(
        lambda: DatagramRecorder("client", out, clean), remote_addr=(host, ports[0]), family=family
    )
    ports.append(client.get_extra_info("sockname")[1])
    out.append(("client peername", clean(client.get_extra_info("peername"))))
    for i, data in enumerate((b"one", bytearray(b"two"), memoryview(b"three"))):
        var.set(f"main {i}")
        client.sendto(data)
        for _ in range(200):
            await asyncio.sleep(0.001)
            if client_p.reads > i:
                break
    # A new protocol gets the datagrams from now on, in the reader's context.
    other = DatagramRecorder("client 2", out, clean)
    client.set_protocol(other)
    var.set("main 3")
    for addr in ((host, ports[0]), client.get_extra_info("peername")):
        try:
            client.sendto(b"four", addr)
            out.append(("sendto", clean(addr), "ok"))
        except ValueError as exc:  # asyncio keeps an IPv6 remote_addr as a 4-tuple
            out.append(("sendto", clean(addr), "ValueError", str(exc).replace(str(ports[0]), "PORT")))
    for _ in range(200):
        await asyncio.sleep(0.001)
        if other.reads:
            break
    var.set("main close")
    client.close()
    server.close()
    await asyncio.wait_for(asyncio.gather(other.lost, server_p.lost), 10)
    out.append(("main after", var.get()))


def udp_echo_scenario(family: int, host: str) -> Scenario:
    async def scenario(out: list[Any]) -> None:
        await _udp_echo_rounds(asyncio.get_running_loop(), out, family, host)

    return scenario


@pytest.mark.parametrize("family", ["ipv4", "ipv6"])
def test_datagram_callbacks_addresses_and_contexts_as_asyncio(family: str) -> None:
    if family == "ipv6" and not socket.has_ipv6:
        pytest.skip("no IPv6 on this host (same for asyncio)")
    fam, host = (socket.AF_INET, "127.0.0.1") if family == "ipv4" else (socket.AF_INET6, "::1")
    expected = assert_same_as_asyncio(udp_echo_scenario(fam, host))
    server = (host, "PORT") if family == "ipv4" else (host, "PORT", 0, 0)
    # What asyncio does, spelled out once: reads run in the reader's context,
    # which keeps what the previous read set.
    assert ("client", "datagram_received", b"ONE", server, f"{host} client") in expected
    assert ("client", "datagram_received", b"TWO", server, "client:read 1") in expected
    assert ("client 2", "datagram_received", b"FOUR", server, "client:read 3") in expected


def udp_refused_scenario() -> Scenario:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        gone = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        gone.bind(("127.0.0.1", 0))
        port = gone.getsockname()[1]
        gone.close()  # nothing listens there now: the kernel answers with ICMP port unreachable

        def clean(addr: Any) -> Any:
            return addr

        var.set("refused connected")
        t, p = await loop.create_datagram_endpoint(
            lambda: DatagramRecorder("connected", out, clean), remote_addr=("127.0.0.1", port)
        )
        var.set("main send 1")
        t.sendto(b"a")
        # The refusal arrives as a socket error: reported by the read path.
        await asyncio.sleep(0.05)
        var.set("main send 2")
        t.sendto(b"b")
        # Reported by the next send when no read came first.
        t.sendto(b"c")
        t.sendto(b"d")
        await asyncio.sleep(0.05)
        var.set("unconnected")
        u, _ = await loop.create_datagram_endpoint(
            lambda: DatagramRecorder("unconnected", out, clean), local_addr=("127.0.0.1", 0)
        )
        var.set("main send 3")
        u.sendto(b"e", ("127.0.0.1", port))
        await asyncio.sleep(0.05)
        u.sendto(b"f", ("127.0.0.1", port))
        await asyncio.sleep(0.01)
        t.abort()
        u.close()
        await asyncio.wait_for(p.lost, 10)
        await asyncio.sleep(0.01)

    return scenario


def test_datagram_error_received_on_icmp_refused_as_asyncio() -> None:
    expected = assert_same_as_asyncio(udp_refused_scenario())
    assert ("connected", "error_received", "ConnectionRefusedError", 111, "refused connected") in expected


def udp_pending_close_scenario() -> Scenario:
    """Sends that would block are queued; close() waits for them to go out."""

    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        tmp = tempfile.mkdtemp()
        path = os.path.join(tmp, "peer")
        peer = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        peer.bind(path)
        peer.setblocking(False)
        var.set("unix client")
        t, p = await loop.create_datagram_endpoint(
            lambda: DatagramRecorder("client", out, lambda a: a), remote_addr=path, family=socket.AF_UNIX
        )
        var.set("main fill")
        sent = 0
        # The peer does not read: its queue fills and sends start to wait.
        while t.get_write_buffer_size() == 0 and sent < 100_000:
            t.sendto(b"%06d" % sent + b"." * 994)
            sent += 1
        queued_after = sent
        for _ in range(5):
            t.sendto(b"%06d" % sent + b"." * 994)
            sent += 1
        out.append(("buffered", t.get_write_buffer_size() > 0, t.is_closing()))
        var.set("main close")
        t.close()
        out.append(("after close", t.is_closing(), t.get_write_buffer_size() > 0, p.lost.done()))
        try:
            t.sendto(b"late")
            out.append(("sendto while closing", "ok"))
        except Exception as exc:  # noqa: BLE001
            out.append(("sendto while closing", type(exc).__name__, str(exc)))
        sent += 1
        var.set("main drain")
        got: list[bytes] = []
        for _ in range(5000):
            try:
                got.append(peer.recv(2000))
                continue
            except BlockingIOError:
                pass
            if p.lost.done() and len(got) >= sent:
                break
            await asyncio.sleep(0.001)
        out.append(("peer got all, in order", [g[:6] for g in got] == [b"%06d" % i for i in range(sent - 1)] + [b"late"],
                    len(got) == sent, queued_after > 0))
        await asyncio.wait_for(p.lost, 10)
        out.append(("lost", p.lost.done(), t.get_write_buffer_size()))
        peer.close()
        shutil.rmtree(tmp)

    return scenario


def udp_unreferenced_scenario() -> Scenario:
    """An open endpoint nobody keeps a reference to still receives: asyncio's
    reader holds the transport, as long as it is open."""

    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()

        class Receiver(asyncio.DatagramProtocol):  # keeps no reference to its transport
            def __init__(self) -> None:
                self.got: asyncio.Future[bytes] = loop.create_future()

            def datagram_received(self, data: bytes, addr: Any) -> None:
                out.append(("datagram_received", data, var.get()))
                if not self.got.done():
                    self.got.set_result(data)

            def connection_lost(self, exc: BaseException | None) -> None:
                out.append(("connection_lost", type(exc).__name__, var.get()))

        var.set("receiver")
        t, p = await loop.create_datagram_endpoint(Receiver, local_addr=("127.0.0.1", 0))
        var.set("main")
        addr = t.get_extra_info("sockname")
        alive = weakref.ref(t)
        del t
        gc.collect()
        out.append(("transport alive after collect", alive() is not None))
        peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        peer.sendto(b"still here", addr)
        out.append(("received", await asyncio.wait_for(p.got, 10)))
        peer.close()
        t = alive()
        if t is not None:
            t.close()
        await asyncio.sleep(0.01)

    return scenario


def test_datagram_endpoint_without_references_keeps_receiving_as_asyncio() -> None:
    expected = assert_same_as_asyncio(udp_unreferenced_scenario())
    assert ("transport alive after collect", True) in expected
    assert ("datagram_received", b"still here", "receiver") in expected


def test_datagram_close_with_pending_sends_as_asyncio() -> None:
    expected = assert_same_as_asyncio(udp_pending_close_scenario())
    assert ("buffered", True, False) in expected
    assert ("peer got all, in order", True, True, True) in expected
    # connection_lost waits for the queue: in the context of the send that queued first.
    assert ("client", "connection_lost", "NoneType", "main fill") in expected


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


# --- 6. call_soon_threadsafe among the loop's other callbacks -----------------------


def threadsafe_order_scenario() -> Scenario:
    """call_soon_threadsafe from the loop's own thread and from another one,
    interleaved with call_soon and due timers: the order callbacks run in,
    and the context each sees."""

    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def rec(name: str) -> None:
            out.append((name, var.get()))

        def first_pass() -> None:
            var.set("pass 1")
            loop.call_soon(rec, "soon 1")
            loop.call_soon_threadsafe(rec, "threadsafe 1")
            loop.call_later(0, rec, "timer 0")
            loop.call_soon(rec, "soon 2")
            loop.call_soon_threadsafe(rec, "threadsafe 2")
            loop.call_soon_threadsafe(nested)

        def nested() -> None:
            var.set("nested")
            loop.call_soon_threadsafe(rec, "threadsafe from a callback")
            loop.call_soon(rec, "soon from a callback")

        var.set("main")
        loop.call_soon(first_pass)
        await asyncio.sleep(0.01)

        def from_thread() -> None:
            var.set("thread")
            loop.call_soon_threadsafe(rec, "threadsafe from a thread")
            loop.call_soon_threadsafe(done.set_result, None)

        t = threading.Thread(target=from_thread)
        t.start()
        await asyncio.wait_for(done, 10)
        t.join()
        out.append(("main after", var.get()))

    return scenario


def test_call_soon_threadsafe_order_and_context_as_asyncio() -> None:
    expected = assert_same_as_asyncio(threadsafe_order_scenario())
    names = [e[0] for e in expected]
    assert names.index("soon 1") < names.index("threadsafe 1") < names.index("soon 2") < names.index("threadsafe 2")
    assert ("threadsafe from a thread", "thread") in expected


# --- 7. write() then abort() in one callback ------------------------------------------
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
