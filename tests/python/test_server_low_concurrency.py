"""The pair's shared-CPU yield window (`--shared-cpu-yield-us`) with the whole server confined to one CPU.

There the I/O thread and the app thread each give the CPU to the other before they sleep while the other is
busy (runtime/include/cadeloop/runtime/shared_cpu.hpp), so an answer reaches the I/O thread without the app
writing its eventfd. A client must see exactly what it sees without it: every answer right and in order on
one connection, on 64 at once, pipelined; the counters show the path was taken (the app's wake-ups of the
I/O thread per request fall, the I/O thread's windows find the answers).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from server_harness import ServerProcess
from server_taskset import echo_in_order, one_cpu_server, pipelined_clients


def counted_server(tmp_path: Path, window_us: str | None, *flags: str) -> tuple[ServerProcess, Path]:
    """The server confined to one CPU, its counters written on exit; window_us None: the setting left at its
    default."""
    stats = tmp_path / f"stats-{window_us}.json"
    window = [] if window_us is None else ["--shared-cpu-yield-us", window_us]
    # Solo mode off: these tests are about the two threads' window (in solo mode one thread serves alone).
    return one_cpu_server(tmp_path, *window, *flags, "--solo-max-batch", "0", "--stats-json-on-exit",
                          str(stats)), stats


def totals(stats: Path) -> dict[str, int]:
    doc: dict[str, int] = json.loads(stats.read_text())
    return doc


def counters_after_requests_in_order(tmp_path: Path, window_us: str | None, n: int, *flags: str,
                                     pause: float = 0) -> dict[str, int]:
    """The counters of a counted server that answered n requests in order on one connection, each right."""
    srv, stats = counted_server(tmp_path, window_us, *flags)
    try:
        echo_in_order(srv.port, n, pause)
    finally:
        assert srv.stop() == 0
    t = totals(stats)
    assert t["requests"] == n, t
    return t


def test_one_connection_in_order_and_answers_are_taken_without_a_wake(tmp_path: Path) -> None:
    # A long window (20 ms): the client shares a busy machine; the window ends as soon as the peer sleeps.
    t = counters_after_requests_in_order(tmp_path, "20000", 300)
    assert t["wakeups_to_io"] < t["requests"] / 2, t
    assert t["spin_hits"] > t["requests"] / 2, t


def test_the_window_is_on_by_default_when_the_pair_shares_one_cpu(tmp_path: Path) -> None:
    t = counters_after_requests_in_order(tmp_path, None, 100)
    assert t["spins"] > 0 and t["wakeups_to_io"] < t["requests"] / 2, t


def test_an_explicit_io_spin_keeps_its_own_spin_on_the_io_side_while_the_window_is_on(tmp_path: Path) -> None:
    # The client pauses 20 ms before each request, so the app has parked long before it comes. --io-spin-us
    # keeps the I/O thread polling the sockets until its spin ends (1 s here: longer than any pause), so the
    # I/O thread does not park between requests; the window would end as soon as the app parked, and the I/O
    # thread would park once a request.
    t = counters_after_requests_in_order(tmp_path, "20000", 20, "--io-spin-us", "1000000", pause=0.02)
    assert t["io_parks"] < t["requests"] / 2 and t["spin_hits"] >= t["requests"], t


def test_without_the_window_the_pair_parks_and_wakes(tmp_path: Path) -> None:
    # The control: the same server with the window at 0 parks and is woken per request.
    t = counters_after_requests_in_order(tmp_path, "0", 100)
    assert t["wakeups_to_app"] + t["wakeups_to_io"] >= t["requests"], t
    assert t["spins"] == 0, t


def test_64_connections_pipelined_in_order(tmp_path: Path) -> None:
    srv, stats = counted_server(tmp_path, "50")
    try:
        assert pipelined_clients(srv.port, clients=64, batches=4, depth=4, timeout=20) == []
    finally:
        assert srv.stop(signal.SIGTERM) == 0
    assert totals(stats)["requests"] == 64 * 4 * 4


def test_a_negative_window_is_refused_with_one_line(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "cadeloop", "raw_app:app", "--shared-cpu-yield-us", "-5"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "shared_cpu_yield_us" in lines[0], r.stderr
