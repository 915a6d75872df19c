"""A `cadeloop raw_app:app` server confined to one CPU (`taskset -c`), and the echo clients the one-CPU tests drive it with.

Under `taskset` a pair's I/O thread and app thread share that CPU: the path of `--io-spin-us`'s yielding spin and of
the shared-CPU yield window (`--shared-cpu-yield-us`). A client must see there exactly what it sees elsewhere.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

from server_harness import ServerProcess, read_response


def one_cpu_server(tmp_path: Path, *flags: str) -> ServerProcess:
    """`raw_app:app` on one pair, started under `taskset -c` on the lowest CPU this process may use."""
    srv = ServerProcess("raw_app:app", "--cores", "1", *flags, tmp=tmp_path)
    cpu = min(os.sched_getaffinity(0))
    srv.argv = ["taskset", "-c", str(cpu), *srv.argv]
    return srv.start()


def echo_request(body: bytes) -> bytes:
    return b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def echo_in_order(port: int, n: int, pause: float = 0) -> None:
    """n requests one after the other on one connection, each answer checked before the next is sent, `pause`
    seconds after it."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        f = s.makefile("rb")
        for i in range(n):
            time.sleep(pause)
            body = f"request {i}".encode()
            s.sendall(echo_request(body))
            status, _, got = read_response(f)
            assert (status, got) == (200, body)


def pipelined_clients(port: int, clients: int, batches: int, depth: int, timeout: float = 10) -> list[str]:
    """`clients` connections at once, each sending `batches` batches of `depth` pipelined requests and
    checking every answer in order; returns what went wrong (empty: nothing)."""
    failures: list[str] = []

    def client(n: int) -> None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
                f = s.makefile("rb")
                for batch in range(batches):
                    bodies = [f"c{n} b{batch} r{k}".encode() for k in range(depth)]
                    s.sendall(b"".join(echo_request(b) for b in bodies))
                    for b in bodies:
                        status, _, got = read_response(f)
                        if (status, got) != (200, b):
                            failures.append(f"client {n}: {status} {got!r} for {b!r}")
                            return
        except (OSError, EOFError) as e:
            failures.append(f"client {n}: {e!r}")

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    failures.extend(f"client {n}: still running after 60 s" for n, t in enumerate(threads) if t.is_alive())
    return failures
