#!/usr/bin/env python3
"""Side-by-side WebSocket benchmark: cadeloop against its peers, in one invocation.

Every server serves the same echo app (`bench/ws/app.py`) confined to one CPU
(`taskset -c SERVER_CPU`); the load client `ws_load` (C++, raw sockets and
epoll, built from bench/ws/ws_load.cpp) runs on another (`taskset -c
LOAD_CPU`). All servers are started at once (port, port+1, ...; an idle one
costs no CPU) and measured in turn, `--rounds` times, so each server's runs sit
between the others' and the host's drift falls on all of them alike. Server
CPU is utime+stime of the server's process tree from /proc/PID/stat over each
measured run; runs with CPU steal above `--quiet-steal` on either CPU are left
out of the medians.

Memory per idle WebSocket: each server alone, USS (Private_Clean +
Private_Dirty from /proc/PID/smaps_rollup, whole process tree) before and
after `--idle-connections` WebSockets are opened and left idle, divided by
their number.

    python bench/ws/driver.py --setup      # the peers' venvs (build/bench-peers/, as bench/http/driver.py)
                                           # plus the `websockets` package for uvicorn; builds ws_load
    python bench/ws/driver.py              # every workload on every server, 5 rounds, then idle memory
    python bench/ws/driver.py --servers cadeloop,uvicorn --workloads echo64x64 --rounds 3 --duration 3

Writes a Markdown table and the raw figures to bench/results/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "bench" / "http"))
sys.path.insert(0, str(ROOT / "bench"))
import driver as http_driver  # noqa: E402  (the peers' venvs)
from common import (PEERS, RESULTS, cpu_seconds, load_average, machine, pinned, start_server,  # noqa: E402
                    steal_seconds, stop_server, tree_pids, wait_port, write_results)

BUILD = ROOT / "build" / "bench-ws"
WS_LOAD = BUILD / "bench" / "ws_load"
# uvicorn serves WebSockets with this package (its `--ws websockets` implementation).
UVICORN_WS = "websockets==17.4"


@dataclass
class Server:
    key: str
    name: str
    argv: list[str]
    python: str

    @property
    def available(self) -> bool:
        return Path(self.python).exists()


def servers(port: int) -> dict[str, Server]:
    host = "127.0.0.1"
    peer = lambda name: PEERS / name / "bin"  # noqa: E731
    cadeloop = [str(ROOT / ".venv/bin/cadeloop"), "app:app", "--host", host, "--port", str(port), "--cores", "1",
                "--max-connections", "20000", "--backlog", "4096"]
    return {
        "cadeloop": Server("cadeloop", "cadeloop (3.13, 1 core pair)", cadeloop, str(ROOT / ".venv/bin/python")),
        "cadeloop-3.11": Server("cadeloop-3.11", "cadeloop (3.11, 1 core pair)",
                                [str(ROOT / ".venv-3.11/bin/cadeloop"), *cadeloop[1:]],
                                str(ROOT / ".venv-3.11/bin/python")),
        "uvicorn": Server(
            "uvicorn", "uvicorn (websockets, httptools+uvloop)",
            [str(peer("uvicorn") / "python"), "-m", "uvicorn", "app:app", "--host", host, "--port", str(port),
             "--loop", "uvloop", "--http", "httptools", "--ws", "websockets", "--no-access-log",
             "--log-level", "warning", "--backlog", "4096"],
            str(peer("uvicorn") / "python")),
        "granian": Server(
            "granian", "granian (1 worker)",
            [str(peer("granian") / "granian"), "--interface", "asgi", "--host", host, "--port", str(port),
             "--workers", "1", "--log-level", "warning", "--backlog", "4096", "app:app"],
            str(peer("granian") / "python")),
        "cadeloop-rs": Server(
            "cadeloop-rs", "cadeloop-rs (PyPI, 3.11)",
            [str(peer("cadeloop-rs") / "python"), "-m", "cadeloop", "app:app", "--host", host, "--port", str(port),
             "--workers", "1"],
            str(peer("cadeloop-rs") / "python")),
    }


@dataclass
class Workload:
    key: str
    name: str
    connections: int
    size: int
    inflight: int = 1


WORKLOADS = {
    "echo64x1": Workload("echo64x1", "echo 64 B, 1 connection", 1, 64),
    "echo64x64": Workload("echo64x64", "echo 64 B, 64 connections", 64, 64),
    "echo16kx16": Workload("echo16kx16", "echo 16 KiB, 16 connections", 16, 16 * 1024),
    "stream1k": Workload("stream1k", "1 KiB streaming, 32 in flight, 1 connection", 1, 1024, 32),
}


@dataclass
class Result:
    server: str
    workload: str
    msgs_per_s: float = 0.0
    messages: int = 0
    p50_us: float = 0.0
    p99_us: float = 0.0
    cpu_s: float = 0.0
    steal_share: float = 0.0
    load_steal_share: float = 0.0
    round: int = 0
    window_s: float = 0.0  # the measured window, as the driver timed it
    errors: str = ""

    @property
    def cpu_us_per_message(self) -> float:
        return 1e6 * self.cpu_s / self.messages if self.messages else float("nan")

    @property
    def server_cpu_share(self) -> float:
        """Share of one CPU the server used in the window: near 1 when the server was the limit."""
        return self.cpu_s / self.window_s if self.window_s else float("nan")

    def quiet(self, max_steal: float) -> bool:
        return bool(self.messages) and max(self.steal_share, self.load_steal_share) < max_steal


def build_client() -> None:
    launcher = ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"] if subprocess.run(
        ["which", "ccache"], capture_output=True).returncode == 0 else []
    subprocess.run(["cmake", "-S", str(ROOT), "-B", str(BUILD), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                    "-DCADELOOP_BUILD_PYTHON=OFF", "-DCADELOOP_BUILD_TESTS=OFF", "-DCADELOOP_BUILD_BENCH=ON",
                    *launcher], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(BUILD), "--target", "ws_load"], check=True, stdout=subprocess.DEVNULL)


def setup() -> None:
    http_driver.setup_peers()
    r = subprocess.run([str(PEERS / "uvicorn/bin/python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        UVICORN_WS])
    print(f"setup: uvicorn websockets: {'ok' if r.returncode == 0 else 'FAILED'} ({UVICORN_WS})")
    build_client()
    print(f"setup: {WS_LOAD}")


def raise_fd_limit() -> None:
    """The servers and ws_load inherit it: 10,000 WebSockets need as many descriptors on each side."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def start(server: Server, port: int, args: argparse.Namespace):
    return start_server(pinned(args.server_cpu, server.argv, args.nice), HERE, lambda p: wait_port(port, p))


def run_load(port: int, w: Workload, duration: float, warmup: float, load_cpu: int,
             at_start=lambda: None, at_end=lambda: None, nice: int = 0) -> dict:
    """One ws_load run; `at_start` and `at_end` are called when its measured window opens and closes."""
    argv = [str(WS_LOAD), "--port", str(port), "--connections", str(w.connections), "--size", str(w.size),
            "--inflight", str(w.inflight), "--duration", str(duration), "--warmup", str(warmup)]
    proc = subprocess.Popen(pinned(load_cpu, argv, nice), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == "measure":
            at_start()
            continue
        at_end()
        lines.append(line)
        break
    out, err = proc.communicate(timeout=duration + warmup + 90)
    lines.append(out)
    try:
        return json.loads("".join(lines).strip().splitlines()[0])
    except (ValueError, IndexError):
        return {"error": f"ws_load: {''.join(lines)[-200:]} {err[-200:]}"}


def one_run(server: Server, proc, port: int, w: Workload, args: argparse.Namespace) -> Result:
    marks: dict[str, float] = {}

    def sample(name: str) -> None:
        marks[name] = cpu_seconds(proc.pid)
        marks[name + "_steal"] = steal_seconds(args.server_cpu)
        marks[name + "_lsteal"] = steal_seconds(args.load_cpu)
        marks[name + "_t"] = time.monotonic()

    figures = run_load(port, w, args.duration, args.warmup, args.load_cpu, lambda: sample("a"), lambda: sample("b"),
                       args.nice)
    r = Result(server.name, w.name, msgs_per_s=figures.get("msgs_per_s", 0.0), messages=figures.get("messages", 0),
               p50_us=figures.get("p50_us", 0.0), p99_us=figures.get("p99_us", 0.0),
               errors=str(figures.get("error", "")))
    if "a" in marks and "b" in marks:
        # The server's CPU over exactly the client's measured window.
        wall = max(marks["b_t"] - marks["a_t"], 1e-9)
        r.cpu_s = marks["b"] - marks["a"]
        r.window_s = wall
        r.steal_share = (marks["b_steal"] - marks["a_steal"]) / wall
        r.load_steal_share = (marks["b_lsteal"] - marks["a_lsteal"]) / wall
    print(f"  {server.name:40} {w.name:44} {r.msgs_per_s:10.0f} msg/s {r.cpu_us_per_message:7.2f} us CPU/msg "
          f"p50 {r.p50_us:6.0f} us  server CPU {100 * r.server_cpu_share:3.0f}%  steal {100 * r.steal_share:.1f}%/{100 * r.load_steal_share:.1f}%  {r.errors}",
          flush=True)
    return r


def measure(keys: list[str], workloads: list[Workload], args: argparse.Namespace) -> list[Result]:
    started = []
    results: list[Result] = []
    try:
        for i, key in enumerate(keys):
            port = args.port + i
            server = servers(port)[key]
            proc, error = start(server, port, args)
            if error:
                print(f"driver: {key}: {error}", file=sys.stderr)
                results += [Result(server.name, w.name, errors=error) for w in workloads]
                continue
            started.append((server, proc, port))
        for w in workloads:
            for server, proc, port in started:
                run_load(port, w, 1.0, 0.5, args.load_cpu, nice=args.nice)  # warm-up, not counted
            for rnd in range(args.rounds):
                for server, proc, port in started:
                    r = one_run(server, proc, port, w, args)
                    r.round = rnd
                    results.append(r)
    finally:
        for _, proc, _ in started:
            stop_server(proc)
    return results


def uss_bytes(root: int) -> int:
    total = 0
    for pid in tree_pids(root):
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            name, _, rest = line.partition(":")
            if name in ("Private_Clean", "Private_Dirty", "Private_Hugetlb"):
                total += int(rest.split()[0]) * 1024
    return total


def idle_memory(key: str, args: argparse.Namespace) -> dict:
    server = servers(args.port)[key]
    proc, error = start(server, args.port, args)
    if error:
        return {"server": server.name, "error": error}
    try:
        # Warm the server's paths (and its allocator) with a short echo run first.
        run_load(args.port, Workload("warm", "warm", 64, 64), 1.0, 0.2, args.load_cpu, nice=args.nice)
        time.sleep(0.5)
        base = uss_bytes(proc.pid)
        client = subprocess.Popen(pinned(args.load_cpu, [str(WS_LOAD), "--port", str(args.port), "--connections",
                                                         str(args.idle_connections), "--idle"], args.nice),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = client.stdout.readline().split()  # "open N failed M"
        time.sleep(2.0)  # let the app side settle (each connection's task is waiting in receive())
        opened = int(line[1]) if len(line) >= 4 else 0
        failed = int(line[3]) if len(line) >= 4 else args.idle_connections
        loaded = uss_bytes(proc.pid)
        client.stdin.close()
        client.wait(timeout=60)
        per = (loaded - base) / opened if opened else float("nan")
        print(f"  {server.name:40} idle: {opened} open ({failed} failed), USS {base / 2**20:.1f} MiB -> "
              f"{loaded / 2**20:.1f} MiB: {per / 1024:.2f} KiB per WebSocket", flush=True)
        return {"server": server.name, "open": opened, "failed": failed, "uss_before": base, "uss_after": loaded,
                "bytes_per_websocket": per}
    finally:
        stop_server(proc)


def medians(results: list[Result], max_steal: float, order: list[str]) -> list[str]:
    """The medians and the paired ratios; `order` names the servers as asked, the first is the one the ratios
    are about. A server with no measured run of a workload (it did not start, or every run failed) is left out
    of that workload's ratios, and named under the table."""
    lines = ["", f"Medians over the rounds with steal under {100 * max_steal:.0f} % on both CPUs "
             "(ratios: this server against each peer, paired within a round, median over the rounds where both "
             "runs were quiet):", "",
             "| workload | server | quiet runs | msgs/s | CPU µs/msg | server CPU share | p50 µs | p99 µs |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for w in dict.fromkeys(r.workload for r in results):
        for s in order:
            runs = [r for r in results if r.workload == w and r.server == s]
            if not runs:
                continue
            quiet = [r for r in runs if r.quiet(max_steal)]
            if not quiet:
                lines.append(f"| {w} | {s} | 0 / {len(runs)} | | | | | |")
                continue
            lines.append(f"| {w} | {s} | {len(quiet)} / {len(runs)} | "
                         f"{statistics.median(r.msgs_per_s for r in quiet):.0f} | "
                         f"{statistics.median(r.cpu_us_per_message for r in quiet):.2f} | "
                         f"{100 * statistics.median(r.server_cpu_share for r in quiet):.0f}% | "
                         f"{statistics.median(r.p50_us for r in quiet):.0f} | "
                         f"{statistics.median(r.p99_us for r in quiet):.0f} |")
    lines += ["", "| workload | cadeloop against | rounds | msgs/s ratio, median (min–max) | "
              "CPU/msg ratio, median (min–max) |", "|---|---|---:|---:|---:|"]
    failed: dict[str, set[str]] = {}  # server -> the workloads it has no measured run of

    def measured(server: str, w: str) -> bool:
        if any(r.messages for r in results if r.workload == w and r.server == server):
            return True
        failed.setdefault(server, set()).add(w)
        return False

    ours = order[0]
    for w in dict.fromkeys(r.workload for r in results):
        if not measured(ours, w):
            continue
        for other in order[1:]:
            if not measured(other, w):
                continue
            rps, cpu = [], []
            for rnd in sorted({r.round for r in results}):
                a = next((r for r in results if r.workload == w and r.server == ours and r.round == rnd), None)
                b = next((r for r in results if r.workload == w and r.server == other and r.round == rnd), None)
                if a and b and a.quiet(max_steal) and b.quiet(max_steal):
                    rps.append(a.msgs_per_s / b.msgs_per_s)
                    cpu.append(a.cpu_us_per_message / b.cpu_us_per_message)
            if rps:
                lines.append(f"| {w} | {other} | {len(rps)} | {statistics.median(rps):.2f} "
                             f"({min(rps):.2f}–{max(rps):.2f}) | {statistics.median(cpu):.2f} "
                             f"({min(cpu):.2f}–{max(cpu):.2f}) |")
    for server, workloads in failed.items():
        errors = sorted({r.errors for r in results if r.server == server and r.errors})
        why = f": {'; '.join(errors)}" if errors else ""
        what = "every workload" if len(workloads) == len({r.workload for r in results}) else ", ".join(
            w for w in dict.fromkeys(r.workload for r in results) if w in workloads)
        lines += ["", f"No measured run, so not in the ratios: {server} ({what}){why}"]
    return lines


def write_report(results: list[Result], idle: list[dict], args: argparse.Namespace, command: str,
                 loads: tuple[str, str]) -> Path:
    now = dt.datetime.now(dt.timezone.utc)
    stem = RESULTS / f"{now:%Y-%m-%d}-ws-{args.tag}"
    lines = [
        f"# WebSocket servers side by side, {now:%Y-%m-%d %H:%M} UTC", "",
        f"- command: `{command}`",
        f"- machine: {machine()}",
        f"- load average (1, 5, 15 min) at the start: {loads[0]}; at the end: {loads[1]}",
        f"- server on CPU {args.server_cpu}, ws_load (C++, one thread, epoll) on CPU {args.load_cpu}; each run "
        f"{args.duration} s measured after {args.warmup} s warm-up, {args.rounds} rounds, servers in turn",
        "- CPU/msg: utime+stime of the server's process tree (/proc/PID/stat), read when the client's "
        "measured window opens and closes, divided by the messages echoed in that window",
        "- steal: share of the run during which the hypervisor ran something else on the server's CPU / "
        "the client's CPU (/proc/stat)",
        "- server CPU share: the server's CPU time over the window's length; well under 100 % means the server "
        "was not the limit (the client, or other work on the machine, was), so msgs/s then says less than CPU/msg",
        f"- nice: {args.nice} (server and client; a negative value gives them precedence over other work "
        "on a shared machine)", "",
        "| workload | server | round | msgs/s | CPU µs/msg | server CPU | p50 µs | p99 µs | steal | errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        lines.append(f"| {r.workload} | {r.server} | {r.round} | {r.msgs_per_s:.0f} | {r.cpu_us_per_message:.2f} | "
                     f"{100 * r.server_cpu_share:.0f}% | {r.p50_us:.0f} | {r.p99_us:.0f} | {100 * r.steal_share:.1f}% / "
                     f"{100 * r.load_steal_share:.1f}% | {r.errors} |")
    if results:
        table = servers(args.port)
        order = [table[k].name for k in dict.fromkeys(k for k in args.servers.split(",") if k)]
        lines += medians(results, args.quiet_steal, order)
    if idle:
        lines += ["", f"Memory per idle WebSocket ({args.idle_connections} opened, USS of the server's process "
                  "tree from /proc/PID/smaps_rollup, after minus before, divided by the connections open):", "",
                  "| server | open | USS before | USS after | per WebSocket |", "|---|---:|---:|---:|---:|"]
        for m in idle:
            if "error" in m:
                lines.append(f"| {m['server']} | | | | {m['error']} |")
            else:
                lines.append(f"| {m['server']} | {m['open']} | {m['uss_before'] / 2**20:.1f} MiB | "
                             f"{m['uss_after'] / 2**20:.1f} MiB | {m['bytes_per_websocket'] / 1024:.2f} KiB |")
    return write_results(stem, lines, {
        "command": command, "machine": machine(), "date": now.isoformat(), "load_average": loads,
        "results": [dict(vars(r), cpu_us_per_message=r.cpu_us_per_message) for r in results], "idle": idle})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setup", action="store_true", help="create the peers' venvs, build ws_load, and exit")
    p.add_argument("--servers", default="cadeloop,uvicorn,granian,cadeloop-rs",
                   help="the first is the one the ratios are about")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--duration", type=float, default=4.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--port", type=int, default=18180)
    p.add_argument("--server-cpu", type=int, default=0)
    p.add_argument("--load-cpu", type=int, default=1)
    p.add_argument("--idle-connections", type=int, default=10000, help="0: skip the idle-memory measurement")
    p.add_argument("--quiet-steal", type=float, default=0.03)
    p.add_argument("--tag", default="servers", help="name part of the results file")
    p.add_argument("--nice", type=int, default=0,
                   help="run servers and client under `nice -n N` (negative, as root: precedence on a busy machine)")
    args = p.parse_args()
    if args.setup:
        setup()
        return 0
    if not WS_LOAD.exists():
        build_client()
    raise_fd_limit()
    table = servers(args.port)
    keys = list(dict.fromkeys(k for k in args.servers.split(",") if k))
    unknown = [k for k in keys if k not in table]
    if unknown:
        print(f"driver: unknown server(s) {unknown}; known: {list(table)}", file=sys.stderr)
        return 2
    missing = [k for k in keys if not table[k].available]
    if missing:
        print(f"driver: {missing} not set up; run --setup", file=sys.stderr)
        return 2
    workloads = [WORKLOADS[w] for w in args.workloads.split(",") if w]
    load_start = load_average()
    results = measure(keys, workloads, args) if workloads and args.rounds else []
    idle = [idle_memory(k, args) for k in keys] if args.idle_connections else []
    command = "python bench/ws/driver.py " + " ".join(sys.argv[1:])
    print(f"written: {write_report(results, idle, args, command.strip(), (load_start, load_average()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
