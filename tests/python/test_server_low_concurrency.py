"""The pair's shared-CPU yield window (`--shared-cpu-yield-us`) with the whole server confined to one CPU.

There the I/O thread and the app thread each give the CPU to the other before they sleep while the other is
busy (runtime/include/cadeloop/runtime/shared_cpu.hpp), so an answer reaches the I/O thread without the app
writing its eventfd. A client must see exactly what it sees without it: every answer right and in order on
one connection, on 64 at once, pipelined; the counters show the path was taken (the app's wake-ups of the
I/O thread per request fall, the I/O thread's windows find the answers).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from server_harness import ServerProcess, read_response


def one_cpu_server(tmp_path: Path, window_us: str | None) -> tuple[ServerProcess, Path]:
    """The server confined to one CPU; window_us None: the setting left at its default."""
    stats = tmp_path / f"stats-{window_us}.json"
    flags = [] if window_us is None else ["--shared-cpu-yield-us", window_us]
    srv = ServerProcess("raw_app:app", "--cores", "1", *flags, "--stats-json-on-exit", str(stats), tmp=tmp_path)
    cpu = min(os.sched_getaffinity(0))
    srv.argv = ["taskset", "-c", str(cpu), *srv.argv]
    return srv.start(), stats


def post(s: socket.socket, f, body: bytes) -> tuple[int, bytes]:  # type: ignore[no-untyped-def]
    s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    status, _, got = read_response(f)
    return status, got


def one_connection(port: int, n: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        f = s.makefile("rb")
        for i in range(n):
            body = f"request {i}".encode()
            assert post(s, f, body) == (200, body)


def totals(stats: Path) -> dict[str, int]:
    doc: dict[str, int] = json.loads(stats.read_text())
    return doc


def test_one_connection_in_order_and_answers_are_taken_without_a_wake(tmp_path: Path) -> None:
    # A long window (20 ms): the client shares a busy machine; the window ends as soon as the peer sleeps.
    srv, stats = one_cpu_server(tmp_path, "20000")
    try:
        one_connection(srv.port, 300)
    finally:
        assert srv.stop() == 0
    t = totals(stats)
    assert t["requests"] == 300
    assert t["wakeups_to_io"] < t["requests"] / 2, t
    assert t["spin_hits"] > t["requests"] / 2, t


def test_the_window_is_on_by_default_when_the_pair_shares_one_cpu(tmp_path: Path) -> None:
    srv, stats = one_cpu_server(tmp_path, None)
    try:
        one_connection(srv.port, 100)
    finally:
        assert srv.stop() == 0
    t = totals(stats)
    assert t["requests"] == 100
    assert t["spins"] > 0 and t["wakeups_to_io"] < t["requests"] / 2, t


def test_without_the_window_the_pair_parks_and_wakes(tmp_path: Path) -> None:
    # The control: the same server with the window at 0 parks and is woken per request.
    srv, stats = one_cpu_server(tmp_path, "0")
    try:
        one_connection(srv.port, 100)
    finally:
        assert srv.stop() == 0
    t = totals(stats)
    assert t["requests"] == 100
    assert t["wakeups_to_app"] + t["wakeups_to_io"] >= t["requests"], t
    assert t["spins"] == 0, t


def test_64_connections_pipelined_in_order(tmp_path: Path) -> None:
    srv, stats = one_cpu_server(tmp_path, "50")
    failures: list[str] = []

    def client(n: int) -> None:
        try:
            with socket.create_connection(("127.0.0.1", srv.port), timeout=20) as s:
                f = s.makefile("rb")
                for batch in range(4):
                    bodies = [f"c{n} b{batch} r{k}".encode() for k in range(4)]
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
        threads = [threading.Thread(target=client, args=(n,)) for n in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert failures == []
    finally:
        assert srv.stop(signal.SIGTERM) == 0
    assert totals(stats)["requests"] == 64 * 4 * 4


def test_a_negative_window_is_refused_with_one_line(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "cadeloop", "raw_app:app", "--shared-cpu-yield-us", "-5"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "shared_cpu_yield_us" in lines[0], r.stderr
