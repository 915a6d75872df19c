"""What a client sees of the HTTP hot path (issue 16).

- Pipelining and the end of a connection: a batch of 16 requests in one segment behind a slow first one,
  a close decided while the next read waits, bytes after the last request, a graceful stop with idle
  keep-alive connections, and 400 pipelined requests (13 MiB of answers) whose client reads late (the
  server's writes come back short): every answer in request order, nothing answered after the last request,
  a clean close.
- Response bytes freed by the I/O thread stay in the heap (runtime/core_pair.cpp): 64 KiB responses do
  not fault their pages in again each time (counted from the server's /proc/PID/stat, not timed).
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from server_harness import ServerProcess, read_response, rest_of


@pytest.fixture
def server(tmp_path: Path):
    srv = ServerProcess("hot_path_app:app", "--cores", "1", tmp=tmp_path).start()
    yield srv
    srv.stop()


def get(i: int, delay: float = 0.0, close: bool = False) -> bytes:
    q = f"i={i}" + (f"&delay={delay}" if delay else "")
    return (f"GET /n?{q} HTTP/1.1\r\nHost: x\r\n" + ("Connection: close\r\n" if close else "") + "\r\n").encode()


def test_sixteen_pipelined_in_one_segment_with_a_slow_first(server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        f = s.makefile("rb")
        for batch in range(4):
            s.sendall(b"".join(get(100 * batch + k, 0.2 if k == 0 else 0.0) for k in range(16)))
            got = [read_response(f) for _ in range(16)]
            assert [(st, body) for st, _, body in got] == [(200, b"%d" % (100 * batch + k)) for k in range(16)]


def test_a_pipelining_client_that_reads_late_gets_every_answer(server: ServerProcess) -> None:
    # 400 pipelined requests, every other one for 64 KiB (13 MiB in all, more than the client's small
    # receive buffer and the server's send buffer hold) from a client that starts reading after 1.5 s:
    # the server's writes come back short, and it resumes each where it stopped as the client reads,
    # with no answer lost, repeated or out of order. (A write that finds the socket full at once:
    # tests/net/socket_calls_test.cpp.)
    n = 400
    requests = [b"GET /64k HTTP/1.1\r\nHost: x\r\n\r\n" if i % 2 else get(i) for i in range(n)]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(30)
        s.connect(("127.0.0.1", server.port))
        send_errors: list[OSError] = []

        def send_all() -> None:
            try:
                s.sendall(b"".join(requests))
            except OSError as e:  # the server ended the connection: the reads below say how
                send_errors.append(e)

        sender = threading.Thread(target=send_all, daemon=True)
        sender.start()
        time.sleep(1.5)
        f = s.makefile("rb")
        for i in range(n):
            status, _, body = read_response(f)
            assert (status, body) == (200, b"x" * 65536 if i % 2 else b"%d" % i), i
        sender.join(timeout=10)
        assert not send_errors


def test_nothing_after_a_close_request_is_answered(server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        # The third request closes; the fourth and fifth come in the same segment, more comes later.
        s.sendall(get(1) + get(2, 0.1) + get(3, close=True) + get(4) + get(5))
        f = s.makefile("rb")
        got = [read_response(f) for _ in range(3)]
        assert [body for _, _, body in got] == [b"1", b"2", b"3"]
        assert got[2][1].get("connection") == "close"
        try:
            s.sendall(get(6))
        except OSError:
            pass
        assert rest_of(f) == b""  # closed, with no answer for 4, 5 or 6


def test_close_decided_while_the_next_read_waits(server: ServerProcess) -> None:
    # The slow request's read is already waiting for the next bytes when its close is decided; the bytes
    # that then arrive (a request after the last one) are read and dropped, and the connection closes.
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(get(7, 0.2, close=True))
        f = s.makefile("rb")
        status, headers, body = read_response(f)
        assert (status, body, headers.get("connection")) == (200, b"7", "close")
        try:
            s.sendall(get(8) * 4)
        except OSError:
            pass
        assert rest_of(f) == b""


def test_keep_alive_connections_answered_one_by_one_then_a_graceful_stop(tmp_path: Path) -> None:
    srv = ServerProcess("hot_path_app:app", "--cores", "1", tmp=tmp_path).start()
    socks = [socket.create_connection(("127.0.0.1", srv.port), timeout=10) for _ in range(8)]
    try:
        files = [s.makefile("rb") for s in socks]
        for rnd in range(25):
            for k, s in enumerate(socks):
                s.sendall(get(rnd * 10 + k))
            for k, f in enumerate(files):
                assert read_response(f)[2] == b"%d" % (rnd * 10 + k)
        srv.proc.send_signal(signal.SIGTERM)  # idle keep-alive connections: closed, the server exits 0
        for f in files:
            assert f.read() == b""
        assert srv.proc.wait(30) == 0
    finally:
        for s in socks:
            s.close()
        srv.stop()


def tree_minor_faults(pid: int) -> int:
    """Minor page faults of `pid` and its descendants so far (/proc/PID/stat field 10)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[7])
            for t in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (t / "children").read_text().split()]
        except OSError:
            pass
    return total


def fetch_64k_pipelined(port: int, connections: int, batches: int) -> int:
    socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(connections)]
    n = 0
    try:
        files = [s.makefile("rb") for s in socks]
        for _ in range(batches):
            for s in socks:
                s.sendall(b"GET /64k HTTP/1.1\r\nHost: x\r\n\r\n" * 8)
            for f in files:
                for _ in range(8):
                    status, _, body = read_response(f)
                    assert (status, len(body)) == (200, 65536)
                    n += 1
    finally:
        for s in socks:
            s.close()
    return n


def test_64k_responses_do_not_fault_their_pages_in_each_time(tmp_path: Path) -> None:
    # With glibc's defaults a freed 64 KiB response at the top of the heap went back to the kernel and the
    # next one faulted its 16 pages in again: about 16 minor faults per response, here under 2.
    srv = ServerProcess("hot_path_app:app", "--cores", "1", tmp=tmp_path).start()
    try:
        fetch_64k_pipelined(srv.port, 4, 4)  # warm-up: the heap reaches its working size
        before = tree_minor_faults(srv.pid)
        n = fetch_64k_pipelined(srv.port, 4, 8)
        per_response = (tree_minor_faults(srv.pid) - before) / n
    finally:
        srv.stop()
    assert per_response < 2, per_response
