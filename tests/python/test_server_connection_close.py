"""How the server ends a connection, from a raw socket and the stats endpoint.

A client that says its request is its last (`Connection: close`, or HTTP/1.0 without keep-alive) gets
the whole response and the server's FIN, and the server lets go of the connection at once: it has
read all the client will send, so nothing is left to linger for. When the server decides to close
(an app error's 500 to a keep-alive client, who may already be sending its next request), it shuts
its side and lingers, reading until the client closes (or `linger_timeout`), so a request in flight
cannot turn into a reset that destroys the response.
"""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

import httpx
import pytest

from server_harness import ServerProcess, read_response, rest_of

STATS = re.compile(r"stats endpoint on http://127\.0\.0\.1:(\d+)/")


def open_connections(srv: ServerProcess) -> int:
    port = int(srv.wait_log(STATS.pattern).group(1))
    return int(httpx.get(f"http://127.0.0.1:{port}/stats", timeout=5).json()["totals"]["connections_open"])


def wait_open(srv: ServerProcess, want: int, timeout: float = 5.0) -> int:
    deadline = time.monotonic() + timeout
    while (n := open_connections(srv)) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return n


@pytest.fixture
def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    # A long linger, so a connection held by lingering would show for the whole test.
    srv = ServerProcess("raw_app:app", "--cores", "1", "--stats-port", "0", "--linger-timeout", "30",
                        tmp=tmp_path).start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("request_bytes", [
    b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /hello HTTP/1.0\r\nHost: x\r\n\r\n",
], ids=["http11-connection-close", "http10"])
def test_a_client_whose_request_is_its_last_is_let_go_at_once(server: ServerProcess, request_bytes: bytes) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(request_bytes)
        f = s.makefile("rb")
        status, headers, body = read_response(f)
        assert status == 200 and body, (status, body)
        assert f.read() == b""  # then a FIN, not a reset
        # Our side stays open, yet the server holds nothing for this connection.
        assert wait_open(server, 0) == 0


# struct tcp_info (linux/tcp.h): tcpi_segs_in, the segments the socket received, is the u32 at byte 140.
TCPI_SEGS_IN = 140


def segments_received(s: socket.socket) -> int:
    info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return int.from_bytes(info[TCPI_SEGS_IN:TCPI_SEGS_IN + 4], "little")


@pytest.mark.parametrize("request_bytes", [
    b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /hello HTTP/1.0\r\nHost: x\r\n\r\n",
], ids=["http11-connection-close", "http10"])
def test_the_last_response_and_the_servers_fin_share_one_segment(server: ServerProcess,
                                                                  request_bytes: bytes) -> None:
    # A connection that ends with its response: the FIN rides in the response's last segment, so the
    # client takes the SYN-ACK, the acknowledgement of its request and one segment with both, instead
    # of a response and then a bare FIN (two packets more per connection, each way with its ACK).
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(request_bytes)
        f = s.makefile("rb")
        status, _, body = read_response(f)
        assert (status, body) == (200, b"Hello, World!"), (status, body)
        assert f.read() == b""
        assert segments_received(s) == 3


def test_bytes_sent_after_the_last_request_do_not_cost_the_response(server: ServerProcess) -> None:
    # The client says its request is its last, then sends more while the app works (a pipelining
    # client, or junk). The server reads no further and closes with those bytes unread, which makes
    # the kernel answer with a reset: the response, held for the FIN, must have left before it.
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"GET /slow?delay=0.3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        time.sleep(0.1)
        s.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.5)  # the response, its FIN and the reset have all arrived by now
        got = rest_of(s.makefile("rb"))
        assert got.startswith(b"HTTP/1.1 200 ") and got.endswith(b"\r\n\r\nslow done"), got


def test_a_connection_the_server_closes_lingers_until_the_client_closes(server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"GET /raise HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive; the app error closes it
        f = s.makefile("rb")
        status, headers, _ = read_response(f)
        assert status == 500 and headers.get("connection") == "close", headers
        assert f.read() == b""  # the server shut its side
        # A keep-alive client may have sent its next request already: the server reads on.
        time.sleep(0.5)
        assert open_connections(server) == 1
        s.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")  # read and dropped, no reset
        time.sleep(0.2)
        assert open_connections(server) == 1
        f.close()  # the socket's file holds the descriptor too
    assert wait_open(server, 0) == 0  # gone once the client closed


def test_a_child_process_the_app_starts_does_not_hold_the_connection_open(server: ServerProcess) -> None:
    # The app starts a process that inherits what it may (close_fds=False, as os.system and many
    # libraries do) and outlives the response. The server's sockets are close-on-exec, so the child
    # holds none: when the server closes the connection the client sees the FIN at once, not when
    # the child exits.
    # A dashboard's keep-alive connection to the stats endpoint is open meanwhile: the child must not
    # hold that one either.
    stats_port = int(server.wait_log(STATS.pattern).group(1))
    dashboard = socket.create_connection(("127.0.0.1", stats_port), timeout=10)
    dashboard.sendall(b"GET /stats HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert read_response(dashboard.makefile("rb"))[0] == 200
    with dashboard, socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"GET /spawn?s=4 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        f = s.makefile("rb")
        status, _, body = read_response(f)
        assert status == 200 and body.startswith(b"spawned "), (status, body)
        t0 = time.monotonic()
        assert f.read() == b""
        assert time.monotonic() - t0 < 2.0, "the FIN waited for the app's child to exit"
        child = int(body.split()[1])
        fds = Path(f"/proc/{child}/fd")
        held = [os.readlink(p) for p in fds.iterdir()] if fds.exists() else []
        # No socket, and none of the server's eventfds or epoll sets either (only what the app's own
        # process had as inheritable: its standard streams).
        assert not [h for h in held if h.startswith(("socket:", "anon_inode:"))], held
