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
from pathlib import Path

from server_harness import read_response
from server_taskset import echo_in_order, echo_request, one_cpu_server, pipelined_clients


def test_one_connection_many_requests_in_order(tmp_path: Path) -> None:
    # Solo mode off: the test is about the I/O thread's spin (in solo mode the app thread serves alone).
    srv = one_cpu_server(tmp_path, "--io-spin-us", "200", "--solo-max-batch", "0")
    try:
        echo_in_order(srv.port, 300)
    finally:
        assert srv.stop() == 0


def test_pipelined_and_concurrent_connections(tmp_path: Path) -> None:
    # Solo mode off: the test is about the I/O thread's spin (in solo mode the app thread serves alone).
    srv = one_cpu_server(tmp_path, "--io-spin-us", "200", "--solo-max-batch", "0")
    try:
        assert pipelined_clients(srv.port, clients=8, batches=20, depth=16) == []
        big = os.urandom(256 * 1024)
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(echo_request(big))
            status, _, got = read_response(s.makefile("rb"))
            assert (status, got) == (200, big)
    finally:
        assert srv.stop(signal.SIGTERM) == 0
