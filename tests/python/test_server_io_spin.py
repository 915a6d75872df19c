"""The I/O thread's spin (`--io-spin-us`) when the whole server is confined to one CPU.

There the spin yields the CPU to the app thread and keeps polling the sockets (runtime/io_thread.cpp),
so a request that arrives or an answer the app finishes during the spin is taken without a sleep. These
tests check what a client sees on that path: every answer right and in order, on one connection, pipelined,
on several connections at once, with bodies, and a clean stop.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from pathlib import Path

from server_harness import ServerProcess, read_response


def one_cpu_server(tmp_path: Path, spin_us: str = "200") -> ServerProcess:
    srv = ServerProcess("raw_app:app", "--cores", "1", "--io-spin-us", spin_us, tmp=tmp_path)
    cpu = min(os.sched_getaffinity(0))
    srv.argv = ["taskset", "-c", str(cpu), *srv.argv]
    return srv.start()


def test_one_connection_many_requests_in_order(tmp_path: Path) -> None:
    srv = one_cpu_server(tmp_path)
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            f = s.makefile("rb")
            for i in range(300):
                body = f"request {i}".encode()
                s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                status, _, got = read_response(f)
                assert (status, got) == (200, body)
    finally:
        assert srv.stop() == 0


def test_pipelined_and_concurrent_connections(tmp_path: Path) -> None:
    srv = one_cpu_server(tmp_path)
    failures: list[str] = []

    def client(n: int) -> None:
        try:
            with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
                f = s.makefile("rb")
                for batch in range(20):
                    bodies = [f"c{n} b{batch} r{k}".encode() for k in range(16)]
                    s.sendall(b"".join(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                                       % (len(b), b) for b in bodies))
                    for b in bodies:
                        status, _, got = read_response(f)
                        if (status, got) != (200, b):
                            failures.append(f"client {n}: {status} {got!r} for {b!r}")
                            return
        except (OSError, EOFError) as e:
            failures.append(f"client {n}: {e!r}")

    try:
        threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert failures == []
        big = os.urandom(256 * 1024)
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(big) + big)
            status, _, got = read_response(s.makefile("rb"))
            assert (status, got) == (200, big)
    finally:
        assert srv.stop(signal.SIGTERM) == 0
