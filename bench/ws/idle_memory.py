#!/usr/bin/env python3
"""Memory per idle WebSocket of cadeloop, and which objects hold it.

Starts cadeloop (`--cores 1`) with bench/ws/census_app.py (the echo app of bench/ws/app.py, whose
WebSockets wait in `await receive()`, plus `GET /census`), warms it with a short echo run, then
opens `--connections` WebSockets with `ws_load --idle` (C++, raw sockets, another process) and
leaves them idle. Reports, per connection:

- USS (Private_Clean + Private_Dirty + Private_Hugetlb of /proc/PID/smaps_rollup, the server's
  process tree) after minus before;
- the Python objects the app's interpreter gained (GC-tracked objects by type and their
  `sys.getsizeof` bytes; bytes and str are not GC-tracked and fall in the rest) and the
  allocator's block count.

    python bench/ws/idle_memory.py                         # 3.13 (.venv), 10,000 connections
    python bench/ws/idle_memory.py --python 3.11 --connections 10000 --rounds 3
    python bench/ws/idle_memory.py --http-keepalive     # idle HTTP keep-alive instead (bench/http/memory.py)

The figure the issue's goal reads (<= 4 KiB) is the USS one; bench/ws/driver.py measures it the
same way beside the peers.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# bench/ws/driver.py (ws_load, USS, server start and stop), loaded under its own name: it imports
# bench/http/driver.py as `driver`.
_spec = importlib.util.spec_from_file_location("ws_driver", HERE / "driver.py")
assert _spec is not None and _spec.loader is not None
ws_driver = importlib.util.module_from_spec(_spec)
sys.modules["ws_driver"] = ws_driver
_spec.loader.exec_module(ws_driver)

http_driver = ws_driver.http_driver


def census(port: int) -> dict:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"GET /census HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return json.loads(data.split(b"\r\n\r\n", 1)[1])


def one_round(args: argparse.Namespace) -> dict:
    venv = ".venv" if args.python == "3.13" else ".venv-3.11"
    argv = [str(ROOT / venv / "bin/cadeloop"), "census_app:app", "--host", "127.0.0.1", "--port", str(args.port),
            "--cores", "1", "--max-connections", str(args.connections + 1000), "--backlog", "4096", *args.extra]
    server = ws_driver.Server("cadeloop", f"cadeloop ({args.python})", argv, str(ROOT / venv / "bin/python"))
    proc, error = ws_driver.start(server, args.port, args)
    if error:
        raise SystemExit(f"idle_memory: {error}")
    try:
        ws_driver.run_load(args.port, ws_driver.Workload("warm", "warm", 64, 64), 1.0, 0.2, args.load_cpu)
        time.sleep(0.5)
        c0 = census(args.port)
        base = ws_driver.uss_bytes(proc.pid)
        client = subprocess.Popen(["taskset", "-c", str(args.load_cpu), str(ws_driver.WS_LOAD), "--port",
                                   str(args.port), "--connections", str(args.connections), "--idle"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert client.stdout is not None and client.stdin is not None
        line = client.stdout.readline().split()  # "open N failed M"
        time.sleep(2.0)  # each connection's task is waiting in receive()
        loaded = ws_driver.uss_bytes(proc.pid)
        c1 = census(args.port)
        client.stdin.close()
        client.wait(timeout=60)
    finally:
        http_driver.stop_server(proc)
    opened = int(line[1]) if len(line) >= 4 else 0
    if not opened:
        raise SystemExit(f"idle_memory: no WebSocket opened ({line})")
    types = {}
    for name, (count, size) in c1["types"].items():
        c, s = c0["types"].get(name, [0, 0])
        if count - c >= opened // 2:
            types[name] = {"per_connection": (count - c) / opened, "bytes": (size - s) / opened}
    return {"open": opened, "uss_before": base, "uss_after": loaded, "bytes_per_websocket": (loaded - base) / opened,
            "blocks_per_websocket": (c1["blocks"] - c0["blocks"]) / opened, "python_types": types}


def http_keepalive(args: argparse.Namespace) -> None:
    """Idle keep-alive connections (bench/http/memory.py) on bench/http/app.py, at 1,000 and `--connections`."""
    sys.path.insert(0, str(ROOT / "bench" / "http"))
    import memory  # noqa: E402

    venv = ".venv" if args.python == "3.13" else ".venv-3.11"
    argv = [str(ROOT / venv / "bin/cadeloop"), "app:app", "--host", "127.0.0.1", "--port", str(args.port),
            "--cores", "1", "--max-connections", str(args.connections + 1000), "--backlog", "4096", *args.extra]
    proc = subprocess.Popen(["taskset", "-c", str(args.server_cpu), *argv], cwd=ROOT / "bench" / "http",
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    if not http_driver.wait_port(args.port, proc):
        http_driver.stop_server(proc)
        raise SystemExit("idle_memory: the server did not start")
    try:
        out = memory.idle_memory(args.port, lambda: http_driver.tree_pids(proc.pid), [1000, args.connections])
    finally:
        http_driver.stop_server(proc)
    for level in out["levels"]:
        print(f"{level['held']} idle keep-alive connections: {level['per_connection_kib']:.2f} KiB each "
              f"(Python {args.python})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", choices=("3.13", "3.11"), default="3.13")
    p.add_argument("--connections", type=int, default=10000)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--port", type=int, default=18280)
    p.add_argument("--server-cpu", type=int, default=0)
    p.add_argument("--load-cpu", type=int, default=1)
    p.add_argument("--nice", type=int, default=0)
    p.add_argument("--json", help="also write the raw figures here")
    p.add_argument("--http-keepalive", action="store_true", help="measure idle HTTP keep-alive connections instead")
    p.add_argument("extra", nargs="*", help="more cadeloop flags (after --)")
    args = p.parse_args()
    if not ws_driver.WS_LOAD.exists():
        ws_driver.build_client()
    ws_driver.raise_fd_limit()
    if args.http_keepalive:
        http_keepalive(args)
        return 0
    rounds = []
    for i in range(args.rounds):
        r = one_round(args)
        rounds.append(r)
        print(f"round {i + 1}: {r['open']} open, USS {r['uss_before'] / 2**20:.1f} -> {r['uss_after'] / 2**20:.1f} MiB: "
              f"{r['bytes_per_websocket'] / 1024:.2f} KiB per idle WebSocket; "
              f"{r['blocks_per_websocket']:.1f} Python allocator blocks each", flush=True)
        for name, t in sorted(r["python_types"].items(), key=lambda kv: -kv[1]["bytes"]):
            print(f"    {name:24} {t['per_connection']:5.2f} per connection, {t['bytes']:7.1f} bytes")
    per = statistics.median(r["bytes_per_websocket"] for r in rounds)
    print(f"median of {len(rounds)}: {per / 1024:.2f} KiB per idle WebSocket (Python {args.python})")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rounds": rounds}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
