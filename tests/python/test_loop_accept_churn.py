"""Accepted connections made cheaply, against asyncio.

cadeloop's C++ accept loop makes an accepted connection's socket.socket and
its asyncio.TransportSocket only when something asks for them, keeps no entry
for it in loop._transports (the C++ fd table says which transport owns an fd)
and runs connection_lost's chain in C++. What a program sees must stay
asyncio's: get_extra_info('socket') and the rest of the extra info, before and
after the connection is closed; the "file descriptor is used by a transport"
check of add_reader/remove_reader/sock_* for the fd of a live transport (and
not once it is closing); loop.sendfile over an accepted transport. One more
test shows the transport of a closed connection goes away with its last
reference (no reference cycle left for the cycle collector).
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import struct
import tempfile
import weakref
from typing import Any

import pytest

import cadeloop
from test_loop_differential import Scenario, assert_same_as_asyncio

pytestmark = pytest.mark.timeout(60)


class Keep(asyncio.Protocol):
    """Keeps its transport and tells when it is made and lost."""

    def __init__(self, out: list[Any], made: asyncio.Future[Any], lost: asyncio.Future[Any]) -> None:
        self.out = out
        self.made = made
        self.lost = lost
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.made.set_result(None)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.out.append(("connection_lost", type(exc).__name__))
        self.lost.set_result(None)


async def one_connection(out: list[Any], host: str = "127.0.0.1") -> tuple[Any, Any, socket.socket, Keep]:
    loop = asyncio.get_running_loop()
    made: asyncio.Future[Any] = loop.create_future()
    lost: asyncio.Future[Any] = loop.create_future()
    proto: list[Keep] = []

    def factory() -> Keep:
        proto.append(Keep(out, made, lost))
        return proto[0]

    server = await loop.create_server(factory, host, 0)
    client = socket.create_connection(("127.0.0.1", server.sockets[0].getsockname()[1]))
    await asyncio.wait_for(made, 10)
    return server, proto[0].transport, client, proto[0]


def describe_socket(tsock: Any, transport: Any, client: socket.socket) -> list[Any]:
    return [
        type(tsock).__module__ + "." + type(tsock).__name__,
        tsock.family, tsock.type, tsock.proto,
        tsock.fileno() >= 0,
        tsock.gettimeout(),
        tsock.getsockname() == transport.get_extra_info("sockname") == client.getpeername(),
        tsock.getpeername() == transport.get_extra_info("peername") == client.getsockname(),
        tsock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0,
        repr(tsock).startswith("<asyncio.TransportSocket fd="),
    ]


def extra_info_scenario(ask_before_close: bool, how: str) -> Scenario:
    async def scenario(out: list[Any]) -> None:
        server, transport, client, proto = await one_connection(out)
        if ask_before_close:
            tsock = transport.get_extra_info("socket")
            out.append(("socket", describe_socket(tsock, transport, client)))
            out.append(("same object", transport.get_extra_info("socket") is tsock))
            tsock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            out.append(("keepalive", tsock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) != 0))
            out.append(("keys", [k for k in ("peername", "socket", "sockname")
                                 if transport.get_extra_info(k) is not None]))
        if how == "reset":  # a fatal read error: connection_lost from C++
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
        elif how == "close":
            transport.close()
        else:
            transport.abort()
        await asyncio.wait_for(proto.lost, 10)
        tsock = transport.get_extra_info("socket")
        out.append(("after close", type(tsock).__name__, tsock.fileno(), tsock.family, tsock.type,
                    "[closed]" in repr(tsock) or "fd=-1" in repr(tsock)))
        out.append(("sockname after close", transport.get_extra_info("sockname") is not None,
                    transport.get_extra_info("peername") is not None))
        out.append(("keys after close", [k for k in ("peername", "socket", "sockname")
                                         if transport.get_extra_info(k) is not None]))
        out.append(("closing", transport.is_closing(), transport._sock is None))
        client.close()
        server.close()
        await server.wait_closed()

    return scenario


@pytest.mark.parametrize("ask_before_close", [True, False])
@pytest.mark.parametrize("how", ["reset", "close", "abort"])
def test_extra_info_socket_of_an_accepted_transport_as_asyncio(ask_before_close: bool, how: str) -> None:
    got = assert_same_as_asyncio(extra_info_scenario(ask_before_close, how))
    assert ("keys after close", ["peername", "socket", "sockname"]) in got
    if ask_before_close:
        assert got[0][1][0] == "asyncio.trsock.TransportSocket" and got[0][1][4] is True


def fd_in_use_scenario() -> Scenario:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        server, transport, client, proto = await one_connection(out)
        fd = transport.get_extra_info("socket").fileno()
        for what, call in [("add_reader", lambda: loop.add_reader(fd, print)),
                           ("add_writer", lambda: loop.add_writer(fd, print)),
                           ("remove_reader", lambda: loop.remove_reader(fd))]:
            try:
                call()
                out.append((what, "ok"))
            except RuntimeError as exc:
                out.append((what, "RuntimeError", f"File descriptor {fd!r} is used by transport" in str(exc)))
        shared = socket.socket(transport.get_extra_info("socket").family, socket.SOCK_STREAM, 0, fd)
        try:
            await loop.sock_recv(shared, 10)
            out.append(("sock_recv", "ok"))
        except RuntimeError as exc:
            out.append(("sock_recv", "RuntimeError", "is used by transport" in str(exc)))
        finally:
            shared.detach()
        transport.close()  # closing: the fd is free for add_reader again (asyncio: is_closing())
        loop.add_reader(fd, print)
        out.append(("closing: remove_reader", loop.remove_reader(fd)))
        await asyncio.wait_for(proto.lost, 10)
        client.close()
        server.close()
        await server.wait_closed()

    return scenario


def test_fd_of_an_accepted_transport_is_in_use_as_asyncio() -> None:
    got = assert_same_as_asyncio(fd_in_use_scenario())
    assert ("add_reader", "RuntimeError", True) in got and ("sock_recv", "RuntimeError", True) in got


def sendfile_scenario() -> Scenario:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        server, transport, client, proto = await one_connection(out)
        data = os.urandom(300_000)
        with tempfile.TemporaryFile() as f:
            f.write(data)
            f.flush()
            f.seek(0)
            client.setblocking(False)
            got = bytearray()

            async def read() -> None:
                while len(got) < len(data):
                    got.extend(await loop.sock_recv(client, 65536))

            reader = asyncio.ensure_future(read())
            sent = await loop.sendfile(transport, f)
            await asyncio.wait_for(reader, 10)
        out.append(("sendfile", sent, bytes(got) == data))
        transport.write(b"after")  # the transport is whole again
        more = await asyncio.wait_for(loop.sock_recv(client, 10), 5)
        out.append(("write after sendfile", more))
        transport.close()
        await asyncio.wait_for(proto.lost, 10)
        client.close()
        server.close()
        await server.wait_closed()

    return scenario


def test_sendfile_over_an_accepted_transport_as_asyncio() -> None:
    got = assert_same_as_asyncio(sendfile_scenario())
    assert ("sendfile", 300_000, True) in got


def test_closed_accepted_transport_goes_away_without_the_cycle_collector() -> None:
    async def main() -> tuple[bool, bool, bool]:
        loop = asyncio.get_running_loop()
        out: list[Any] = []
        server, transport, client, proto = await one_connection(out)
        fd = transport.get_extra_info("socket").fileno()
        in_weak_table = fd in loop._transports
        owner_known = loop._fd_transport(fd) is transport
        gone = weakref.ref(transport)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        await asyncio.wait_for(proto.lost, 10)
        del transport
        proto.transport = None
        await asyncio.sleep(0)
        alive = gone() is not None
        server.close()
        await server.wait_closed()
        return in_weak_table, alive, owner_known

    gc.disable()
    try:
        in_weak_table, alive, owner_known = cadeloop.run(main())
    finally:
        gc.enable()
    assert not in_weak_table and owner_known  # the C++ fd table answers for it, not loop._transports
    assert not alive  # freed by reference counting: no cycle through its own bound methods


def server_bookkeeping_scenario() -> Scenario:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        lost: list[asyncio.Future[Any]] = []

        def factory() -> Keep:
            lost.append(loop.create_future())
            return Keep(out, loop.create_future(), lost[-1])

        server = await loop.create_server(factory, "127.0.0.1", 0)
        address = server.sockets[0].getsockname()
        clients = [socket.create_connection(address) for _ in range(3)]
        await asyncio.sleep(0.1)
        if hasattr(server, "close_clients"):  # 3.13: the WeakSet server._attach fills
            out.append(("clients", len(server._clients)))
        server.close()
        closed = asyncio.ensure_future(server.wait_closed())
        for i, c in enumerate(clients):
            await asyncio.sleep(0.05)
            out.append(("wait_closed done", i, closed.done()))
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            c.close()
            await asyncio.wait_for(lost[i], 10)
            if hasattr(server, "close_clients"):
                out.append(("clients", len(server._clients)))
        await asyncio.wait_for(closed, 10)
        out.append(("wait_closed done", "end", closed.done()))

    return scenario


def test_server_attach_detach_and_wait_closed_as_asyncio() -> None:
    got = assert_same_as_asyncio(server_bookkeeping_scenario())
    assert ("wait_closed done", "end", True) in got
    if hasattr(asyncio.Server, "close_clients"):  # 3.13 (3.11's wait_closed returns once the server is closed)
        assert ("wait_closed done", 2, False) in got and ("clients", 0) in got


def test_connections_accepted_by_a_loop_closed_before_their_callback_leave_no_fd() -> None:
    loop = cadeloop.Loop()
    made: list[Any] = []
    try:
        server = loop.run_until_complete(loop.create_server(lambda: Keep(made, loop.create_future(),
                                                                         loop.create_future()), "127.0.0.1", 0))
        address = server.sockets[0].getsockname()
        before = socket_inodes()
        clients = [socket.create_connection(address) for _ in range(3)]
        # One pass: the accept loop accepts all three and schedules their callbacks
        # for the next pass, which never comes.
        loop.stop()
        loop.run_forever()
        accepted = loop.stats()["accepted"]
        server.close()
    finally:
        loop.close()
    del server, loop
    gc.collect()
    new = socket_inodes() - before
    mine = {os.fstat(c.fileno()).st_ino for c in clients}
    for c in clients:
        c.close()
    assert accepted == 3 and made == []
    assert new == mine  # the clients' own sockets; none of the three accepted ones is left open


def socket_inodes() -> set[int]:
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                found.add(os.stat(f"/proc/self/fd/{name}").st_ino)
        except OSError:
            pass  # the listing's own fd
    return found
