"""The C++ accept loop of servers and the C++ Unix datagram reads, against asyncio.

Each scenario runs on asyncio's selector loop and on cadeloop.Loop (the
differential harness of test_loop_differential.py) and the transcripts must be
equal: the order of protocol factory calls and connection_made across
connections accepted in one readiness event, the context each runs in, the
backlog per event, server.close() with connections waiting, running out of
file descriptors (asyncio's report, then accepting again a second later),
Unix servers, and Unix datagram endpoints with bound, unbound, abstract and
non-UTF-8 peers. Two more tests show the C++ paths are the ones taken.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
from asyncio import selector_events
from pathlib import Path
from typing import Any

import pytest

import cadeloop
from test_loop_differential import Scenario, assert_same_as_asyncio, var

pytestmark = pytest.mark.timeout(60)


class ServerProto(asyncio.Protocol):
    """Records connection_made / data_received / connection_lost with the context variable."""

    def __init__(self, log: list[Any], index: int, clients: dict[Any, int]) -> None:
        self.log = log
        self.index = index
        self.clients = clients
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        who = self.clients.get(peer if not isinstance(peer, tuple) else peer[:2], "?")
        self.log.append(("connection_made", self.index, who, var.get()))
        var.set(f"made{self.index}")

    def data_received(self, data: bytes) -> None:
        self.log.append(("data_received", self.index, data, var.get()))
        self.transport.write(data.upper())

    def connection_lost(self, exc: BaseException | None) -> None:
        self.log.append(("connection_lost", self.index, type(exc).__name__))


def counting_factory(log: list[Any], clients: dict[Any, int]) -> Any:
    made = [0]

    def factory() -> ServerProto:
        made[0] += 1
        log.append(("factory", made[0], var.get()))
        var.set(f"factory{made[0]}")
        return ServerProto(log, made[0], clients)

    return factory


def tcp_listener() -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(100)
    return listener


def connect_clients(address: Any, n: int, family: int = socket.AF_INET) -> tuple[list[socket.socket], dict[Any, int]]:
    """n blocking clients, connected into the listener's queue before the loop accepts any."""
    clients = []
    names: dict[Any, int] = {}
    for i in range(n):
        c = socket.socket(family, socket.SOCK_STREAM)
        c.connect(address)
        clients.append(c)
        if family != socket.AF_UNIX:
            names[c.getsockname()[:2]] = i
    return clients, names


async def exchange(loop: Any, out: list[Any], clients: list[socket.socket]) -> None:
    """Each client sends its index and reads the echo back, one after the other."""
    for i, c in enumerate(clients):
        c.setblocking(False)
        await loop.sock_sendall(c, b"c%d" % i)
        out.append(("client got", i, await asyncio.wait_for(loop.sock_recv(c, 100), 10)))


async def settle(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


# --- TCP: order, contexts, backlog per event ---------------------------------------------


def accept_order_scenario(backlog: int, n: int, serve_forever: bool) -> Scenario:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        listener = tcp_listener()
        clients, names = connect_clients(listener.getsockname(), n)
        var.set("server")
        factory = counting_factory(out, names)
        serving = None
        if serve_forever:
            server = await loop.create_server(factory, sock=listener, backlog=backlog, start_serving=False)

            async def serve() -> None:
                var.set("serve_forever")
                await server.serve_forever()

            serving = loop.create_task(serve())
        else:
            server = await loop.create_server(factory, sock=listener, backlog=backlog)
        var.set("after create_server")
        for _ in range(12):
            out.append(("pass", sum(1 for e in out if e[0] == "factory")))
            await asyncio.sleep(0)
        await exchange(loop, out, clients)
        for c in clients:
            c.close()
        server.close()
        if serving is not None:
            serving.cancel()
            try:
                await serving
            except asyncio.CancelledError:
                out.append(("serve_forever", "cancelled"))
        await asyncio.wait_for(server.wait_closed(), 10)
        out.append(("closed", server.is_serving(), len(server.sockets)))

    return scenario


@pytest.mark.parametrize(("backlog", "n", "serve_forever"), [(100, 6, False), (3, 7, False), (2, 5, True)])
def test_accept_order_contexts_and_backlog_per_event_as_asyncio(backlog: int, n: int, serve_forever: bool) -> None:
    got = assert_same_as_asyncio(accept_order_scenario(backlog, n, serve_forever))
    assert sum(1 for e in got if e[0] == "connection_made") == n


def several_sockets_scenario() -> Scenario:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        names: dict[Any, int] = {}
        var.set("server")
        server = await loop.create_server(counting_factory(out, names), host=["127.0.0.1", "127.0.0.2"], port=0,
                                          reuse_port=True)
        out.append(("sockets", len(server.sockets)))
        clients = []
        for i, s in enumerate(sorted(server.sockets, key=lambda s: s.getsockname())):
            c = socket.create_connection(s.getsockname()[:2])
            names[c.getsockname()[:2]] = i
            clients.append(c)
            await settle()
        await exchange(loop, out, clients)
        for c in clients:
            c.close()
        server.close()
        await asyncio.wait_for(server.wait_closed(), 10)

    return scenario


def test_several_listening_sockets_as_asyncio() -> None:
    assert_same_as_asyncio(several_sockets_scenario())


def close_while_pending_scenario() -> Scenario:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        listener = tcp_listener()
        clients, names = connect_clients(listener.getsockname(), 4)
        server = await loop.create_server(counting_factory(out, names), sock=listener)
        server.close()  # connections wait in the queue; the loop has not polled the listener yet
        await settle(8)
        out.append(("serving", server.is_serving()))
        for i, c in enumerate(clients):
            c.settimeout(10)
            try:
                out.append(("client read", i, c.recv(10)))
            except OSError as exc:
                out.append(("client read", i, type(exc).__name__))
            c.close()
        await asyncio.wait_for(server.wait_closed(), 10)

    return scenario


def test_server_close_with_connections_waiting_as_asyncio() -> None:
    got = assert_same_as_asyncio(close_while_pending_scenario())
    assert not any(e[0] == "factory" for e in got)


# --- out of file descriptors (a child process: it lowers its own RLIMIT_NOFILE) ------------


def emfile_scenario() -> Scenario:
    async def scenario(out: list[Any]) -> None:
        import resource

        loop = asyncio.get_running_loop()
        listener = tcp_listener()
        names: dict[Any, int] = {}
        var.set("server")
        server = await loop.create_server(counting_factory(out, names), sock=listener, backlog=5)
        clients, more = connect_clients(listener.getsockname(), 2)
        names.update(more)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        probe = os.open(os.devnull, os.O_RDONLY)  # the lowest free fd
        os.close(probe)
        resource.setrlimit(resource.RLIMIT_NOFILE, (probe, hard))  # no new fd from here
        try:
            for _ in range(4):
                await asyncio.sleep(0)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        out.append(("limit restored", sum(1 for e in out if e[0] == "factory")))
        t0 = loop.time()
        while sum(1 for e in out if e[0] == "connection_made") < 2:
            await asyncio.sleep(0.05)
            assert loop.time() - t0 < 10
        out.append(("resumed after the retry delay", loop.time() - t0 > 0.5))
        await exchange(loop, out, clients)
        for c in clients:
            c.close()
        server.close()
        await asyncio.wait_for(server.wait_closed(), 10)

    return scenario


def test_out_of_file_descriptors_pauses_accepting_as_asyncio() -> None:
    code = textwrap.dedent("""
        import test_loop_native_accept as t
        got = t.assert_same_as_asyncio(t.emfile_scenario())
        assert ("exception handler", "socket.accept() out of system resource", "OSError") in got, got
        print("same", len(got))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), *sys.path]))
    done = subprocess.run([sys.executable, "-W", "error", "-c", code], env=env, capture_output=True, text=True,
                          timeout=50)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("same ")


# --- Unix stream servers ------------------------------------------------------------


def unix_server_scenario() -> Scenario:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "s.sock")
            names: dict[Any, int] = {"": -1}
            var.set("unix server")
            server = await loop.create_unix_server(counting_factory(out, names), path)
            out.append(("sockname is the path", server.sockets[0].getsockname() == path))
            clients, _ = connect_clients(path, 3, socket.AF_UNIX)
            await settle()
            await exchange(loop, out, clients)
            for c in clients:
                c.close()
            await settle()
            server.close()
            await asyncio.wait_for(server.wait_closed(), 10)
            out.append(("path left", os.path.exists(path)))

    return scenario


def test_unix_server_as_asyncio() -> None:
    got = assert_same_as_asyncio(unix_server_scenario())
    assert ("connection_made", 1, -1, "factory1") in got  # an unnamed peer's peername is ''


# --- Unix datagram endpoints --------------------------------------------------------


class DatagramEcho(asyncio.DatagramProtocol):
    def __init__(self, log: list[Any], name: str, norm: Any) -> None:
        self.log = log
        self.name = name
        self.norm = norm
        self.transport: Any = None
        self.got: asyncio.Queue[Any] = asyncio.Queue()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.log.append((self.name, "connection_made", var.get()))

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.log.append((self.name, "datagram_received", data, self.norm(addr), type(addr).__name__, var.get()))
        var.set(f"{self.name}:read")
        if self.name == "server" and addr:
            self.transport.sendto(data.upper(), addr)
        self.got.put_nowait(data)

    def error_received(self, exc: Exception) -> None:
        self.log.append((self.name, "error_received", type(exc).__name__))

    def connection_lost(self, exc: BaseException | None) -> None:
        self.log.append((self.name, "connection_lost", type(exc).__name__))


def unix_datagram_scenario() -> Scenario:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        with tempfile.TemporaryDirectory() as tmp:
            token = os.path.basename(tmp).encode()

            def norm(addr: Any) -> Any:
                if isinstance(addr, str):
                    return addr.replace(tmp, "<tmp>")
                if isinstance(addr, bytes):
                    return addr.replace(os.fsencode(tmp), b"<tmp>").replace(token, b"<tok>")
                return addr

            path = os.path.join(tmp, "server.sock")
            var.set("server")
            server_t, server_p = await loop.create_datagram_endpoint(
                lambda: DatagramEcho(out, "server", norm), local_addr=path, family=socket.AF_UNIX)
            var.set("client")
            # A connected endpoint bound to a path, one bound to an abstract name,
            # a plain unbound socket and one bound to a non-UTF-8 path.
            bound_t, bound_p = await loop.create_datagram_endpoint(
                lambda: DatagramEcho(out, "bound", norm), local_addr=os.path.join(tmp, "client.sock"),
                remote_addr=path, family=socket.AF_UNIX)
            abstract = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            abstract.bind(b"\0cadeloop-" + token)
            abs_t, abs_p = await loop.create_datagram_endpoint(lambda: DatagramEcho(out, "abstract", norm),
                                                               sock=abstract)
            odd_path = os.fsencode(tmp) + b"/odd-\xff.sock"
            odd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            odd.bind(odd_path)
            odd_t, odd_p = await loop.create_datagram_endpoint(lambda: DatagramEcho(out, "odd", norm), sock=odd)
            unbound = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            await settle()
            bound_t.sendto(b"from bound")
            out.append(("bound reply", await asyncio.wait_for(bound_p.got.get(), 10)))
            abs_t.sendto(b"from abstract", path)
            out.append(("abstract reply", await asyncio.wait_for(abs_p.got.get(), 10)))
            odd_t.sendto(b"from odd", os.fsencode(path))
            out.append(("odd reply", await asyncio.wait_for(odd_p.got.get(), 10)))
            unbound.sendto(b"from unbound", path)
            out.append(("server got", await asyncio.wait_for(server_p.got.get(), 10)))
            # The server answers the abstract peer by its bytes name.
            server_t.sendto(b"direct", b"\0cadeloop-" + token)
            out.append(("abstract direct", await asyncio.wait_for(abs_p.got.get(), 10)))
            unbound.close()
            for t in (bound_t, abs_t, odd_t, server_t):
                t.close()
            await settle()

    return scenario


def test_unix_datagram_echo_addresses_and_contexts_as_asyncio() -> None:
    got = assert_same_as_asyncio(unix_datagram_scenario())
    addrs = {e[4] for e in got if len(e) > 4 and e[1] == "datagram_received" and e[0] == "server"}
    assert addrs == {"str", "bytes", "NoneType"}


# --- the C++ paths are the ones taken -------------------------------------------------


class Echo(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


class DatagramSink(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.got: asyncio.Queue[bytes] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.got.put_nowait(data)


async def through_native_paths(calls: list[str], wait: float) -> tuple[list[Any], int | None]:
    """Three TCP connections to a server and one Unix datagram; what came back."""
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _l, ctx: calls.append(str(ctx.get("message"))))
    before = loop.stats()["accepted"] if isinstance(loop, cadeloop.Loop) else 0
    server = await loop.create_server(Echo, "127.0.0.1", 0)
    replies: list[Any] = []
    for i in range(3):
        with socket.create_connection(server.sockets[0].getsockname()) as c:
            c.setblocking(False)
            await loop.sock_sendall(c, b"ping%d" % i)
            try:
                replies.append(await asyncio.wait_for(loop.sock_recv(c, 100), wait))
            except asyncio.TimeoutError:
                replies.append(None)
    server.close()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "d")
        t, p = await loop.create_datagram_endpoint(DatagramSink, local_addr=path, family=socket.AF_UNIX)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(b"dgram", path)
        try:
            replies.append(await asyncio.wait_for(p.got.get(), wait))
        except asyncio.TimeoutError:
            replies.append(None)
        t.close()
    await asyncio.wait_for(server.wait_closed(), 10)
    accepted = loop.stats()["accepted"] - before if isinstance(loop, cadeloop.Loop) else None
    return replies, accepted


def test_accept_and_unix_datagram_reads_do_not_run_asyncio_python(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def refuse(*args: Any, **kwargs: Any) -> None:
        calls.append("asyncio's Python code ran")
        raise AssertionError("asyncio's Python code ran")

    monkeypatch.setattr(selector_events.BaseSelectorEventLoop, "_accept_connection", refuse)
    monkeypatch.setattr(selector_events._SelectorDatagramTransport, "_read_ready", refuse)
    replies, accepted = cadeloop.run(through_native_paths(calls, 10))
    assert (replies, accepted, calls) == ([b"ping0", b"ping1", b"ping2", b"dgram"], 3, [])
    # asyncio's own loop does run the patched code (so the patch is the right one).
    with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
        replies, _ = runner.run(through_native_paths(calls, 0.3))
    assert replies == [None] * 4
    assert "asyncio's Python code ran" in calls


# --- the accepted transport: what its protocol can see (the fast constructor) --------


class Observer(asyncio.Protocol):
    """Records what an accepted transport shows its protocol, and when."""

    def __init__(self, log: list[Any], index: int, peers: dict[Any, Any], how: str) -> None:
        self.log = log
        self.index = index
        self.peers = peers
        self.how = how
        self.transport: Any = None
        asyncio.get_running_loop().call_soon(self.look, "soon after factory")

    def look(self, when: str) -> None:
        t = self.transport
        if t is None:
            self.log.append((self.index, when, "no transport yet"))
            return
        self.log.append((self.index, when, t.is_reading(), t.is_closing(), t.get_write_buffer_size()))

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        peer = transport.get_extra_info("peername")
        client = self.peers.get(peer if not isinstance(peer, tuple) else peer[:2])
        nodelay = (sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                   if sock.family != socket.AF_UNIX else None)
        self.log.append((self.index, "connection_made", var.get(),
                         client is not None,
                         client is not None and transport.get_extra_info("sockname") == client.getpeername(),
                         type(sock).__name__, sock.fileno() == transport._sock_fd, sock.gettimeout(),
                         nodelay, transport.get_write_buffer_limits(), transport.get_protocol() is self,
                         transport.is_reading(), transport.is_closing(), transport.get_extra_info("nothing", 7),
                         sorted(k for k in ("socket", "sockname", "peername") if transport.get_extra_info(k) is not None)))
        asyncio.get_running_loop().call_soon(self.look, "soon after connection_made")
        if self.how == "pause":
            transport.pause_reading()
            asyncio.get_running_loop().call_later(0.05, transport.resume_reading)
        elif self.how == "close":
            transport.close()
        elif self.how == "write":
            transport.write(b"hello%d" % self.index)

    def data_received(self, data: bytes) -> None:
        self.log.append((self.index, "data_received", data))

    def eof_received(self) -> None:
        self.log.append((self.index, "eof_received"))

    def connection_lost(self, exc: BaseException | None) -> None:
        self.log.append((self.index, "connection_lost", type(exc).__name__, self.transport.get_extra_info("peername") is not None))


def accepted_transport_scenario(family: int, how: str, host: str = "127.0.0.1") -> Scenario:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        peers: dict[Any, Any] = {}
        made = [0]

        def factory() -> Observer:
            made[0] += 1
            return Observer(out, made[0], peers, how)

        var.set("server")
        with tempfile.TemporaryDirectory() as tmp:
            if family == socket.AF_UNIX:
                address: Any = os.path.join(tmp, "s")
                server = await loop.create_unix_server(factory, address)
            else:
                server = await loop.create_server(factory, host, 0, family=family)
                address = ("127.0.0.1", server.sockets[0].getsockname()[1])
            clients = []
            for _ in range(3):
                c = socket.socket(family, socket.SOCK_STREAM)
                c.connect(address)
                c.sendall(b"hi")
                peers[c.getsockname()[:2] if family != socket.AF_UNIX else ""] = c
                clients.append(c)
            await asyncio.sleep(0.2)
            for i, c in enumerate(clients):
                c.settimeout(5)
                if how == "reset":  # the server reads ECONNRESET: _fatal_error, connection_lost(exc)
                    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    c.close()
                    continue
                if how == "write":
                    out.append(("client got", i, c.recv(100)))
                try:
                    c.shutdown(socket.SHUT_WR)
                except OSError as exc:  # a Unix peer the server closed
                    out.append(("client shutdown", i, type(exc).__name__))
            await asyncio.sleep(0.1)
            if hasattr(server, "close_clients"):
                server.close_clients()  # 3.13: the transports server._attach recorded
            for c in clients:
                c.close()
            server.close()
            await asyncio.wait_for(server.wait_closed(), 10)
            out.append(("closed", server.is_serving()))

    return scenario


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_UNIX])
@pytest.mark.parametrize("how", ["plain", "pause", "close", "write", "reset"])
def test_accepted_transport_extra_info_and_callback_order_as_asyncio(family: int, how: str) -> None:
    got = assert_same_as_asyncio(accepted_transport_scenario(family, how))
    assert sum(1 for e in got if e[1] == "connection_made") == 3


def test_accepted_transport_of_a_wildcard_listener_as_asyncio() -> None:
    # sockname of each connection is its own local address, not the listener's 0.0.0.0
    got = assert_same_as_asyncio(accepted_transport_scenario(socket.AF_INET, "plain", "0.0.0.0"))
    assert sum(1 for e in got if e[1] == "connection_made" and e[4] is True) == 3


def test_accepted_transports_are_made_without_running_their_init(monkeypatch: pytest.MonkeyPatch) -> None:
    from cadeloop import _loop

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("_SocketTransport.__init__ ran")

    monkeypatch.setattr(_loop._SocketTransport, "__init__", refuse)
    got: list[Any] = []
    cadeloop.run(accepted_transport_scenario(socket.AF_INET, "write")(got))
    assert [e[1] for e in got if e[0] == "client got"] == [0, 1, 2]
    assert sum(1 for e in got if e[1] == "connection_made") == 3
