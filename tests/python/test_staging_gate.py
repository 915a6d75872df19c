"""The staging gate (pyhost/asgi/bridge_gate.cpp): with the pair's staged_budget (1.25 x memory_budget) of
response bytes copied for the I/O thread and not yet written, a send() of a body part over 4 KiB waits
before its bytes are copied. What a user sees: clients that do not read cost the server about the budget,
not one send_high_mark (1 MiB) of copies each.
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest

from server_harness import ServerProcess

MODES = ["subinterpreters", "processes"] if sys.version_info >= (3, 13) else ["processes"]


def serving_pids(srv: ServerProcess) -> list[int]:
    """The server and its children (the worker process in process mode)."""
    pids = [srv.pid]
    try:
        pids += [int(p) for p in Path(f"/proc/{srv.pid}/task/{srv.pid}/children").read_text().split()]
    except OSError:
        pass
    return pids


def peak_rss_mib(pids: list[int]) -> float:
    """The peak resident set (VmHWM) summed over `pids`, in MiB."""
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                total += int(line.split()[1])
    return total / 1024


@pytest.mark.parametrize("isolation", MODES)
def test_readers_that_never_read_cost_about_the_budget_not_a_high_mark_each(tmp_path: Path, isolation: str) -> None:
    # 400 clients with a 4 KiB receive buffer ask at once for 64 MiB each of the same shared 64 KiB chunk (the
    # app allocates nothing per send) and read nothing. Past 1.25 MiB staged, their app's sends wait at the
    # gate, so the serving process's peak RSS grows by a few MiB (3 here). Without the gate each app task
    # copies up to its 1 MiB high mark before it waits, faster than the I/O thread's budget cuts free them:
    # 28 MiB more here.
    srv = ServerProcess("hostile_app:app", "--cores", "1", "--isolation", isolation, "--memory-budget", "1MiB",
                        "--write-timeout", "60", tmp=tmp_path).start()
    socks: list[socket.socket] = []
    try:
        for _ in range(400):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.settimeout(10)
            s.connect(("127.0.0.1", srv.port))
            socks.append(s)
        pids = serving_pids(srv)
        time.sleep(0.3)
        for pid in pids:
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak starts from the resident set now
        base = peak_rss_mib(pids)
        request = b"GET /big?mb=64&shared=1 HTTP/1.1\r\nHost: x\r\n\r\n"
        for s in socks:
            s.sendall(request)
        time.sleep(1.5)
        grown = peak_rss_mib(pids) - base
        assert grown < 12, f"peak RSS grew by {grown:.0f} MiB with 400 readers that never read"
    finally:
        for s in socks:
            s.close()
        assert srv.stop() == 0, srv.log()
