"""Idle keep-alive memory, for bench/http/driver.py.

A started server is measured at rest, then holding N idle keep-alive connections (each made one
request, read its response, and stays open), then after they close. Memory is unique memory (USS:
Private_Clean + Private_Dirty of /proc/PID/smaps_rollup) summed over the server's process tree.
"""

from __future__ import annotations

import resource
import selectors
import socket
import time
from pathlib import Path
from typing import Callable

REQUEST = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n"
RESPONSE_END = b"Hello, World!"


def uss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1])
    return total


def raise_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, need), hard))


def open_idle(port: int, count: int, batch: int = 200, timeout: float = 10.0) -> tuple[list[socket.socket], int]:
    """`count` connections, each with one request answered; returns the open ones and how many failed.
    Connects in batches of `batch` so a server with a short accept backlog is not flooded."""
    raise_fd_limit(count + 256)
    held: list[socket.socket] = []
    failed = 0
    sel = selectors.DefaultSelector()
    while len(held) + failed < count:
        pending: dict[socket.socket, bytes] = {}
        for _ in range(min(batch, count - len(held) - failed)):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            sel.register(s, selectors.EVENT_WRITE)
            pending[s] = b""
        sent: set[socket.socket] = set()
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for key, ev in sel.select(timeout=0.5):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                try:
                    if s not in sent:
                        s.send(REQUEST)
                        sent.add(s)
                        sel.modify(s, selectors.EVENT_READ)
                        continue
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(s)
                    s.close()
                    del pending[s]
                    failed += 1
                    continue
                pending[s] += data
                if pending[s].startswith(b"HTTP/1.1 200") and pending[s].endswith(RESPONSE_END):
                    sel.unregister(s)
                    del pending[s]
                    held.append(s)
        for s in pending:
            sel.unregister(s)
            s.close()
            failed += 1
        if failed > 50:  # the server stopped accepting: report what it holds
            break
    sel.close()
    return held, failed


def idle_memory(port: int, pids: Callable[[], list[int]], counts: list[int]) -> dict:
    """Memory at rest, holding each of `counts` idle connections, and after they close (KiB)."""
    out: dict = {"rest_kib": uss_kib(pids()), "levels": []}
    for n in counts:
        before = uss_kib(pids())
        held, failed = open_idle(port, n)
        time.sleep(1.0)
        holding = uss_kib(pids())
        for s in held:
            s.close()
        time.sleep(1.5)
        after = uss_kib(pids())
        out["levels"].append({"connections": n, "held": len(held), "failed": failed, "before_kib": before,
                              "holding_kib": holding, "after_kib": after,
                              "per_connection_kib": (holding - before) / len(held) if held else None})
    return out
