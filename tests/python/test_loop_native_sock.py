"""cadeloop's C++ sock_* calls (pyhost/loop/loop_sock.cpp) against asyncio's own.

Each scenario runs on asyncio's selector loop and on cadeloop.Loop (the
differential harness of test_loop_differential.py) and the transcripts must be
equal: results, exceptions by type, errno and message, what is left in the
loop's fd table. Each call is driven both ways: done at once (the data, the
connection, the room in the socket buffer is already there) and waiting for its
fd. The last tests check that the C++ path is the one that ran.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import struct
import tempfile
from typing import Any, Callable

import pytest

import cadeloop
from test_loop_differential import assert_same_as_asyncio

pytestmark = pytest.mark.timeout(60)


def _ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


HAS_IPV6 = _ipv6_loopback()
# The reason holds for asyncio's loop as much as for cadeloop's: neither can use ::1 here.
needs_ipv6 = pytest.mark.skipif(not HAS_IPV6, reason="no IPv6 loopback (::1) on this machine, for asyncio too")


def pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    return a, b


def registered(loop: Any, sock: socket.socket) -> bool:
    """Whether the loop's selector still has the socket's fd."""
    return sock.fileno() in loop._selector.get_map()


async def outcome(aw: Any, timeout: float = 0.3) -> Any:
    """The result of an awaitable, or the exception it raised (type, errno, message)."""
    try:
        return ("ok", await asyncio.wait_for(aw, timeout))
    except OSError as exc:
        return ("raised", type(exc).__name__, exc.errno, str(exc))
    except BaseException as exc:  # noqa: BLE001 - the transcript records it
        return ("raised", type(exc).__name__, str(exc))


def fill(sock: socket.socket) -> int:
    """Fills the socket's send buffer; returns how much it took."""
    n = 0
    chunk = b"f" * 65536
    while True:
        try:
            n += sock.send(chunk)
        except BlockingIOError:
            return n


def drain(sock: socket.socket) -> int:
    n = 0
    while True:
        try:
            got = sock.recv(1 << 20)
        except BlockingIOError:
            return n
        if not got:
            return n
        n += len(got)


# --- sock_recv / sock_recv_into ----------------------------------------------------


def test_sock_recv_at_once_waiting_and_at_eof() -> None:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        a, b = pair()
        b.send(b"ready data")
        out.append(("at once", await loop.sock_recv(a, 5), await loop.sock_recv(a, 100)))
        out.append(("left registered", registered(loop, a)))
        task = asyncio.ensure_future(loop.sock_recv(a, 100))
        await asyncio.sleep(0.01)
        out.append(("pending", task.done(), registered(loop, a)))
        b.send(b"late")
        out.append(("waited", await task))
        await asyncio.sleep(0)
        out.append(("unregistered after", registered(loop, a)))
        out.append(("n=0", await loop.sock_recv(a, 0)))
        out.append(("n<0", await outcome(loop.sock_recv(a, -1))))
        out.append(("n not int", await outcome(loop.sock_recv(a, "10"))))  # type: ignore[arg-type]
        b.send(b"big")
        out.append(("n huge", await loop.sock_recv(a, 1 << 20)))
        task = asyncio.ensure_future(loop.sock_recv(a, 100))
        await asyncio.sleep(0.01)
        b.shutdown(socket.SHUT_WR)
        out.append(("eof while waiting", await task))
        out.append(("eof at once", await loop.sock_recv(a, 100)))
        a.close()
        b.close()

    assert_same_as_asyncio(scenario)


def test_sock_recv_into_at_once_and_waiting() -> None:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        a, b = pair()
        buf = bytearray(8)
        b.send(b"0123456789")
        out.append(("at once", await loop.sock_recv_into(a, buf), bytes(buf)))
        view = memoryview(buf)[2:5]
        out.append(("into a slice", await loop.sock_recv_into(a, view), bytes(buf)))
        task = asyncio.ensure_future(loop.sock_recv_into(a, buf))
        await asyncio.sleep(0.01)
        out.append(("pending", task.done(), registered(loop, a)))
        b.send(b"abc")
        out.append(("waited", await task, bytes(buf)))
        await asyncio.sleep(0)
        out.append(("unregistered after", registered(loop, a)))
        out.append(("read-only buffer", await outcome(loop.sock_recv_into(a, b"immutable"))))
        out.append(("empty buffer", await outcome(loop.sock_recv_into(a, bytearray()))))
        b.close()
        out.append(("eof", await loop.sock_recv_into(a, buf)))
        a.close()

    assert_same_as_asyncio(scenario)


def test_sock_recv_errors() -> None:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        # A reset: the peer closes with unread data (RST), at once and while waiting.
        for waiting in (False, True):
            listener = socket.socket()
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            c = socket.socket()
            c.connect(listener.getsockname())
            s, _ = listener.accept()
            c.setblocking(False)
            task = asyncio.ensure_future(loop.sock_recv(c, 10)) if waiting else None
            await asyncio.sleep(0.01)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
            await asyncio.sleep(0.01)
            out.append(("reset", waiting, await outcome(task if task is not None else loop.sock_recv(c, 10))))
            c.close()
            listener.close()
        # A closed socket (fileno -1).
        a, b = pair()
        a.close()
        out.append(("closed", await outcome(loop.sock_recv(a, 10))))
        out.append(("closed into", await outcome(loop.sock_recv_into(a, bytearray(4)))))
        b.close()

    assert_same_as_asyncio(scenario)


# --- cancellation, two calls, close while pending ----------------------------------


def test_cancel_a_pending_call_leaves_no_registration_and_loses_no_data() -> None:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        a, b = pair()
        for op in ("sock_recv", "sock_recv_into", "sock_sendall"):
            if op == "sock_sendall":
                filled = fill(a)
                task = asyncio.ensure_future(loop.sock_sendall(a, b"s" * 100_000))
            else:
                task = asyncio.ensure_future(
                    loop.sock_recv(a, 10) if op == "sock_recv" else loop.sock_recv_into(a, bytearray(10)))
            await asyncio.sleep(0.01)
            out.append((op, "pending", task.done(), registered(loop, a)))
            task.cancel()
            out.append((op, await outcome(task)))
            await asyncio.sleep(0)
            out.append((op, "registered after cancel", registered(loop, a)))
            if op == "sock_sendall":
                out.append((op, "peer got", drain(b) >= filled))
            else:
                b.send(b"kept")
                await asyncio.sleep(0.01)
                out.append((op, "next call", await loop.sock_recv(a, 10)))
        a.close()
        b.close()

    assert_same_as_asyncio(scenario)


def test_two_pending_recvs_on_one_socket() -> None:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        a, b = pair()
        first = asyncio.ensure_future(loop.sock_recv(a, 10))
        await asyncio.sleep(0.01)
        second = asyncio.ensure_future(loop.sock_recv(a, 10))
        await asyncio.sleep(0.01)
        b.send(b"one")
        await asyncio.sleep(0.05)
        out.append(("first", first.done(), "second", second.done()))
        out.append(("second", await outcome(second)))
        out.append(("first", await outcome(first, 0.1)))
        await asyncio.sleep(0)
        out.append(("registered", registered(loop, a)))
        # And a recv pending beside a sendall pending on the same socket.
        filled = fill(a)
        send = asyncio.ensure_future(loop.sock_sendall(a, b"z" * 200_000))
        recv = asyncio.ensure_future(loop.sock_recv(a, 10))
        await asyncio.sleep(0.01)
        b.send(b"two")
        out.append(("recv beside sendall", await outcome(recv)))
        got = 0
        while not send.done():
            got += drain(b)
            await asyncio.sleep(0.005)
        got += drain(b)
        out.append(("sendall beside recv", await outcome(send), got == filled + 200_000))
        await asyncio.sleep(0)
        out.append(("registered", registered(loop, a)))
        a.close()
        b.close()

    assert_same_as_asyncio(scenario)


def test_pending_recvfrom_into_when_a_callback_closes_the_socket() -> None:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.bind(("127.0.0.1", 0))
        u.setblocking(False)
        task = asyncio.ensure_future(loop.sock_recvfrom_into(u, bytearray(10)))
        await asyncio.sleep(0.01)
        loop.call_soon(u.close)
        out.append(await outcome(task))
        out.append(("on the closed socket", await outcome(loop.sock_recvfrom_into(u, bytearray(10)))))

    assert_same_as_asyncio(scenario)


# --- sock_sendall --------------------------------------------------------------------


def test_sock_sendall_at_once_partial_and_waiting() -> None:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        a, b = pair()
        for data in (b"bytes", bytearray(b"bytearray"), memoryview(b"--memoryview--")[2:-2], b""):
            out.append(("at once", type(data).__name__, await loop.sock_sendall(a, data), drain(b)))
        # Bigger than the socket buffer: a partial send, then the rest as the peer reads.
        big = bytes(range(256)) * 16384  # 4 MiB
        task = asyncio.ensure_future(loop.sock_sendall(a, bytearray(big)))
        await asyncio.sleep(0.01)
        out.append(("pending", task.done(), registered(loop, a)))
        got = bytearray()
        while not task.done() or len(got) < len(big):
            try:
                got += b.recv(1 << 20)
            except BlockingIOError:
                await asyncio.sleep(0.002)
        out.append(("sent all in order", await task, bytes(got) == big))
        await asyncio.sleep(0)
        out.append(("registered after", registered(loop, a)))
        # Not a C-contiguous byte buffer: a 2-byte-item memoryview, a str.
        arr = memoryview(b"\x01\x00\x02\x00").cast("H")
        out.append(("items", await outcome(loop.sock_sendall(a, arr)), b.recv(100)))
        out.append(("str", await outcome(loop.sock_sendall(a, "text"))))  # type: ignore[arg-type]
        a.close()
        b.close()

    assert_same_as_asyncio(scenario)


def test_sock_sendall_errors() -> None:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        a, b = pair()
        b.close()
        out.append(("peer closed", await outcome(loop.sock_sendall(a, b"x"))))
        a.close()
        out.append(("closed", await outcome(loop.sock_sendall(a, b"x"))))
        # The peer goes away while the sendall waits.
        a, b = pair()
        fill(a)
        task = asyncio.ensure_future(loop.sock_sendall(a, b"w" * 100_000))
        await asyncio.sleep(0.01)
        b.close()
        out.append(("peer closed while waiting", await outcome(task)))
        a.close()

    assert_same_as_asyncio(scenario)


# --- datagrams: sock_recvfrom, sock_recvfrom_into, sock_sendto ---------------------


def datagram_scenario(family: int) -> Callable[[list[Any]], Any]:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        tmp = tempfile.mkdtemp() if family == socket.AF_UNIX else None
        server = socket.socket(family, socket.SOCK_DGRAM)
        client = socket.socket(family, socket.SOCK_DGRAM)
        if family == socket.AF_UNIX:
            assert tmp is not None
            server.bind(os.path.join(tmp, "server"))
            client.bind(os.path.join(tmp, "client"))
        else:
            host = "::1" if family == socket.AF_INET6 else "127.0.0.1"
            server.bind((host, 0))
            client.bind((host, 0))
        server.setblocking(False)
        client.setblocking(False)
        to_server = server.getsockname()
        me = client.getsockname()

        def same_address(addr: Any) -> bool:
            return addr == me

        out.append(("sendto", await loop.sock_sendto(client, b"first", to_server)))
        await asyncio.sleep(0.01)
        data, addr = await loop.sock_recvfrom(server, 100)
        out.append(("recvfrom at once", data, same_address(addr), type(addr).__name__,
                    len(addr) if isinstance(addr, tuple) else None))
        task = asyncio.ensure_future(loop.sock_recvfrom(server, 3))
        await asyncio.sleep(0.01)
        out.append(("pending", task.done(), registered(loop, server)))
        await loop.sock_sendto(client, b"truncated", to_server)
        data, addr = await task
        out.append(("recvfrom waited", data, same_address(addr)))
        buf = bytearray(16)
        await loop.sock_sendto(client, b"into", to_server)
        await asyncio.sleep(0.01)
        n, addr = await loop.sock_recvfrom_into(server, buf)
        out.append(("recvfrom_into at once", n, bytes(buf[:n]), same_address(addr)))
        task2 = asyncio.ensure_future(loop.sock_recvfrom_into(server, buf, 2))
        await asyncio.sleep(0.01)
        await loop.sock_sendto(client, b"nbytes", to_server)
        n, addr = await task2
        out.append(("recvfrom_into waited", n, bytes(buf[:n]), same_address(addr)))
        await asyncio.sleep(0)
        out.append(("registered after", registered(loop, server)))
        out.append(("nbytes too big", await outcome(loop.sock_recvfrom_into(server, bytearray(2), 10))))
        out.append(("too long", await outcome(loop.sock_sendto(client, b"x" * 300_000, to_server))))
        out.append(("bad address", await outcome(loop.sock_sendto(client, b"x", ("no", "such")))))
        server.close()
        client.close()
        if tmp is not None:
            for name in os.listdir(tmp):
                os.unlink(os.path.join(tmp, name))
            os.rmdir(tmp)

    return scenario


def test_datagrams_ipv4() -> None:
    assert_same_as_asyncio(datagram_scenario(socket.AF_INET))


@needs_ipv6
def test_datagrams_ipv6() -> None:
    assert_same_as_asyncio(datagram_scenario(socket.AF_INET6))


def test_datagrams_unix() -> None:
    assert_same_as_asyncio(datagram_scenario(socket.AF_UNIX))


# --- sock_connect and sock_accept -----------------------------------------------------


def stream_scenario(family: int) -> Callable[[list[Any]], Any]:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        tmp = tempfile.mkdtemp() if family == socket.AF_UNIX else None
        listener = socket.socket(family, socket.SOCK_STREAM)
        if family == socket.AF_UNIX:
            assert tmp is not None
            listener.bind(os.path.join(tmp, "listener"))
        else:
            listener.bind(("::1" if family == socket.AF_INET6 else "127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        where = listener.getsockname()
        # accept waiting, then connect
        accepting = asyncio.ensure_future(loop.sock_accept(listener))
        await asyncio.sleep(0.01)
        out.append(("accept pending", accepting.done(), registered(loop, listener)))
        c1 = socket.socket(family, socket.SOCK_STREAM)
        c1.setblocking(False)
        out.append(("connect", await outcome(loop.sock_connect(c1, where))))
        conn, addr = await accepting
        out.append(("accepted", type(conn).__name__, conn.family == family, conn.type == socket.SOCK_STREAM,
                    conn.gettimeout(), conn.getblocking(), addr == c1.getsockname()))
        await asyncio.sleep(0)
        out.append(("registered after accept", registered(loop, listener)))
        await loop.sock_sendall(c1, b"over the connection")
        out.append(("data", await loop.sock_recv(conn, 100)))
        # connect first, accept at once
        c2 = socket.socket(family, socket.SOCK_STREAM)
        c2.setblocking(False)
        await loop.sock_connect(c2, where)
        conn2, addr2 = await loop.sock_accept(listener)
        out.append(("accepted at once", conn2.getblocking(), addr2 == c2.getsockname()))
        for s in (c1, c2, conn, conn2):
            s.close()
        listener.close()
        # connection refused: nothing listens there any more
        c3 = socket.socket(family, socket.SOCK_STREAM)
        c3.setblocking(False)
        refused = await outcome(loop.sock_connect(c3, where))
        out.append(("refused", refused[:3]))  # the message has the port or path
        c3.close()
        if tmp is not None:
            os.unlink(os.path.join(tmp, "listener"))
            os.rmdir(tmp)

    return scenario


def test_connect_and_accept_ipv4() -> None:
    assert_same_as_asyncio(stream_scenario(socket.AF_INET))


@needs_ipv6
def test_connect_and_accept_ipv6() -> None:
    assert_same_as_asyncio(stream_scenario(socket.AF_INET6))


def test_connect_and_accept_unix() -> None:
    assert_same_as_asyncio(stream_scenario(socket.AF_UNIX))


def test_sock_connect_addresses_and_errors() -> None:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        # a host name (asyncio resolves it through getaddrinfo), a numeric host
        for address in (("localhost", port), ("127.0.0.1", port)):
            s = socket.socket()
            s.setblocking(False)
            out.append((address[0], await outcome(loop.sock_connect(s, address)), s.getpeername()[1] == port))
            s.close()
        listener.close()
        # refused, with asyncio's message naming the address
        s = socket.socket()
        s.setblocking(False)
        out.append(("refused", str(await outcome(loop.sock_connect(s, ("127.0.0.1", port)))).replace(str(port), "PORT")))
        s.close()
        # bad addresses
        for address in (("127.0.0.1",), "not a tuple", ("127.0.0.1", "port?"), ("300.1.1.1", 80)):
            s = socket.socket()
            s.setblocking(False)
            r = await outcome(loop.sock_connect(s, address))
            out.append(("bad", repr(address), r[0], r[1]))
            s.close()
        # a closed socket
        s = socket.socket()
        s.close()
        out.append(("closed", await outcome(loop.sock_connect(s, ("127.0.0.1", port)))))
        # an AF_INET6 socket to a numeric IPv6 address: the resolved 4-tuple in the message
        if HAS_IPV6:
            s = socket.socket(socket.AF_INET6)
            s.setblocking(False)
            r = await outcome(loop.sock_connect(s, ("::1", port)))
            out.append(("refused v6", str(r).replace(str(port), "PORT")))
            s.close()

    assert_same_as_asyncio(scenario)


# --- checks asyncio makes: non-blocking sockets, transports, SSL sockets ---------------


def test_blocking_sockets_in_debug_mode_and_out_of_it() -> None:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.bind(("127.0.0.1", 0))
        fresh = socket.socket()
        calls: list[tuple[str, Callable[[], Any]]] = [
            ("sock_recv", lambda: loop.sock_recv(a, 10)),
            ("sock_recv_into", lambda: loop.sock_recv_into(a, bytearray(4))),
            ("sock_recvfrom", lambda: loop.sock_recvfrom(u, 10)),
            ("sock_recvfrom_into", lambda: loop.sock_recvfrom_into(u, bytearray(4))),
            ("sock_sendall", lambda: loop.sock_sendall(a, b"x")),
            ("sock_sendto", lambda: loop.sock_sendto(u, b"x", u.getsockname())),
            ("sock_connect", lambda: loop.sock_connect(fresh, listener.getsockname())),
            ("sock_accept", lambda: loop.sock_accept(listener)),
        ]
        loop.set_debug(True)
        for name, call in calls:
            out.append(("debug", name, await outcome(call())))
        loop.set_debug(False)
        # Outside debug mode a blocking socket blocks, as asyncio's call does (data is there).
        b.send(b"blocking ok")
        out.append(("blocking recv", await loop.sock_recv(a, 100)))
        a.settimeout(0.05)
        out.append(("timeout recv", await outcome(loop.sock_recv(a, 100), 2)))
        for s in (a, b, listener, u, fresh):
            s.close()

    assert_same_as_asyncio(scenario)


def test_socket_used_by_a_transport() -> None:
    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, a)
        # The transport's own fd, in a socket.socket object of its own (detached, not closed, at the end).
        raw = socket.socket(fileno=transport.get_extra_info("socket").fileno())
        raw.setblocking(False)
        for name, call in (("sock_recv", lambda: loop.sock_recv(raw, 10)),
                           ("sock_accept", lambda: loop.sock_accept(raw))):
            r = await outcome(call())
            out.append((name, r[0], r[1], str(r[-1]).split(" is used by transport")[0].split(" ")[:2]))
        raw.detach()
        transport.close()
        await asyncio.sleep(0.01)
        b.close()

    assert_same_as_asyncio(scenario)


def test_socket_subclasses_and_ssl_sockets() -> None:
    import ssl

    class Sub(socket.socket):
        def recv(self, n: int, *args: Any) -> bytes:  # type: ignore[override]
            return b"sub:" + super().recv(n, *args)

    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        sub = Sub(a.family, a.type, a.proto, fileno=os.dup(a.fileno()))
        sub.setblocking(False)
        b.send(b"data")
        out.append(("subclass", await loop.sock_recv(sub, 10)))
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        wrapped = ctx.wrap_socket(socket.socket(), server_hostname="localhost", do_handshake_on_connect=False)
        out.append(("ssl", await outcome(loop.sock_recv(wrapped, 10))))
        for s in (a, b, sub, wrapped):
            s.close()

    assert_same_as_asyncio(scenario)


# --- the C++ path is the one that runs ---------------------------------------------------


def test_native_path_counts_its_calls_and_waits() -> None:
    async def main() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        loop = asyncio.get_running_loop()
        a, b = pair()
        before = loop.stats()  # type: ignore[attr-defined]
        b.send(b"x")
        await asyncio.sleep(0.01)
        await loop.sock_recv(a, 10)  # at once
        task = asyncio.ensure_future(loop.sock_recv(a, 10))
        await asyncio.sleep(0.01)
        await loop.sock_sendall(b, b"y")
        await task  # waited
        middle = loop.stats()  # type: ignore[attr-defined]
        blocking, other = socket.socketpair()  # handed to asyncio's code: not counted
        other.send(b"z")
        await loop.sock_recv(blocking, 10)
        after = loop.stats()  # type: ignore[attr-defined]
        for s in (a, b, blocking, other):
            s.close()
        return before, middle, after

    before, middle, after = cadeloop.run(main())
    assert middle["sock_calls"] - before["sock_calls"] == 3
    assert middle["sock_waits"] - before["sock_waits"] == 1
    assert after["sock_calls"] == middle["sock_calls"]


def test_asyncio_selector_code_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("asyncio's selector sock code ran")

    for name in ("sock_recv", "_sock_recv", "sock_recv_into", "_sock_recv_into", "sock_sendall", "_sock_sendall",
                 "sock_recvfrom", "_sock_recvfrom", "sock_recvfrom_into", "_sock_recvfrom_into",
                 "sock_sendto", "_sock_sendto", "sock_connect", "_sock_connect", "_sock_connect_cb",
                 "sock_accept", "_sock_accept", "_sock_read_done", "_sock_write_done"):
        monkeypatch.setattr(asyncio.selector_events.BaseSelectorEventLoop, name, refuse)

    opened: list[socket.socket] = []

    def track(s: socket.socket) -> socket.socket:
        opened.append(s)
        return s

    async def main() -> list[Any]:
        try:
            return await calls()
        finally:  # asyncio's loop stops at the first patched method: close what is open
            for s in opened:
                s.close()
            opened.clear()

    async def calls() -> list[Any]:
        loop = asyncio.get_running_loop()
        got: list[Any] = []
        listener = track(socket.socket())
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        accepting = asyncio.ensure_future(loop.sock_accept(listener))
        await asyncio.sleep(0.01)
        c = track(socket.socket())
        c.setblocking(False)
        await loop.sock_connect(c, listener.getsockname())
        conn, _ = await accepting
        track(conn)
        reading = asyncio.ensure_future(loop.sock_recv(conn, 100))
        await asyncio.sleep(0.01)
        await loop.sock_sendall(c, b"native")
        got.append(await reading)
        buf = bytearray(10)
        await loop.sock_sendall(conn, b"into")
        got.append(await loop.sock_recv_into(c, buf))
        u = track(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        u.bind(("127.0.0.1", 0))
        u.setblocking(False)
        rf = asyncio.ensure_future(loop.sock_recvfrom(u, 10))
        await asyncio.sleep(0.01)
        got.append(await loop.sock_sendto(u, b"dgram", u.getsockname()))
        got.append((await rf)[0])
        await loop.sock_sendto(u, b"dgram2", u.getsockname())
        await asyncio.sleep(0.01)
        got.append((await loop.sock_recvfrom_into(u, buf))[0])
        return got

    assert cadeloop.run(main()) == [b"native", 4, 5, b"dgram", 6]
    # asyncio's own loop runs that code, and so would hit the patch.
    with pytest.raises(AssertionError, match="asyncio's selector sock code ran"):
        asyncio.run(main())


def test_errno_of_a_refused_connect_is_kept() -> None:
    async def main() -> int | None:
        loop = asyncio.get_running_loop()
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        c = socket.socket()
        c.setblocking(False)
        try:
            await loop.sock_connect(c, ("127.0.0.1", port))
        except ConnectionRefusedError as exc:
            return exc.errno
        finally:
            c.close()
        return None

    assert cadeloop.run(main()) == errno.ECONNREFUSED


def test_a_failed_connect_leaves_its_exception_in_no_cycle() -> None:
    """asyncio's sock_connect drops its future in a `finally:` so the frame a
    failure's traceback keeps does not hold the exception through the future
    (anyio's happy-eyeballs test checks this)."""
    import gc

    async def scenario(out: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        free = socket.socket()
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
        free.close()
        for how in ("sock_connect", "create_connection"):
            s = socket.socket()
            s.setblocking(False)
            exc: BaseException | None = None
            try:
                if how == "sock_connect":
                    await loop.sock_connect(s, ("127.0.0.1", port))
                else:  # asyncio's create_connection calls sock_connect
                    await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
            except OSError as e:
                exc = e
            s.close()
            await asyncio.sleep(0)  # the task's wake-up no longer holds the future
            chain = []  # the exception and those it was raised from or during
            while exc is not None and len(chain) < 5:
                chain.append(sorted(type(r).__name__ for r in gc.get_referrers(exc) if r is not chain))
                exc = exc.__cause__ or exc.__context__
            out.append((how, "referrers", chain))

    assert_same_as_asyncio(scenario)
