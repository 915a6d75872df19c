#!/usr/bin/env python3
"""Side-by-side HTTP benchmark: cadeloop against its peers, in one invocation.

Each server runs confined to one CPU (`taskset -c SERVER_CPU`), the load
generator runs on another (`taskset -c LOAD_CPU`, one thread), one server at a
time, the same app (`bench/http/app.py`) for all. The load generator is
bench/http/loadgen.cpp (built here with c++ on first use): it checks every
response's status and body length and counts errors, and runs closed loop or
open loop at a fixed rate with latency counted from when each request was due
(coordinated omission corrected). Server CPU time is read from the kernel:
utime+stime of every process in the server's tree from /proc/PID/stat, before
and after each measured run, so CPU per request covers every thread and worker.

    python bench/http/driver.py --setup            # make the peers' venvs (build/bench-peers/)
    python bench/http/driver.py --suite --rounds 2 --duration 4 --warmup 1 --tag suite
                                                   # the whole suite: every workload, every peer, idle
                                                   # memory, timers, then bench/ws/driver.py and
                                                   # bench/tls/driver.py on the peers that speak WebSocket
                                                   # and TLS (their results go into this run's JSON too);
                                                   # then bench/http/plot.py draws it
    python bench/http/driver.py --servers uvicorn,granian --workloads plaintext --duration 5
    python bench/http/driver.py --servers cadeloop,cadeloop-log --workloads plaintext --rounds 12 --duration 3
                                                   # all servers up at once, measured in turn: paired ratios
    python bench/http/driver.py --baseline ../old --servers cadeloop-base,cadeloop --workloads plaintext --rounds 12
    python bench/http/driver.py --servers cadeloop,cadeloop-rs,c-floor --workloads openloop --openloop-rate 118000 \
        --rounds 3 --duration 10                          # the open loop at one offered rate for all
                                                   # an older build (another checkout's .venv) against this one

Writes a Markdown table and the raw figures to bench/results/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
# The pieces every driver shares (re-exported: bench/http/counts.py and bench/ws/ take them from here).
from common import (PEERS, RESULTS, ROOT, TOOLS, cpu_seconds, machine, pinned, stop_server,  # noqa: E402,F401
                    steal_seconds, tree_pids, wait_port)
import common  # noqa: E402
# cadeloop writes its core pair's counters here on SIGUSR1 (and at exit).
# --client-poll: the load generator never sleeps in epoll (loadgen --poll), so waking it costs the server
# nothing (on this VM a wake-up of an idle CPU is an interrupt, a VM exit, charged to the sender's CPU).
CLIENT_POLL = False
STATS_FILE = Path("/tmp") / f"cadeloop-bench-stats-{os.getpid()}.json"
# The access log of "cadeloop-log": a real file (in the page cache), appended to.
ACCESS_LOG = Path("/tmp") / f"cadeloop-bench-access-{os.getpid()}.log"

# Each peer gets its own venv so their dependencies never mix with ours.
PEER_PACKAGES = {
    # websockets: uvicorn's `--ws websockets`, for the suite's WebSocket rows (bench/ws/driver.py)
    "uvicorn": ["uvicorn==0.54.0", "httptools==0.9.0", "uvloop==0.23.0", "websockets==17.4"],
    "granian": ["granian==2.8.9"],
    "hypercorn": ["hypercorn==0.18.0"],
    # matplotlib for bench/http/plot.py
    "plot": ["matplotlib==3.11.2"],
    # The Rust project of the same name, from PyPI (CPython 3.11 only).
    "cadeloop-rs": ["cadeloop==0.0.4"],
}



def build_tools() -> tuple[Path, Path]:
    """bench/http/loadgen.cpp and c_floor.c, compiled into build/bench-tools/ when missing or older than
    their source (bench/CMakeLists.txt builds the same two as http_loadgen and http_c_floor)."""
    TOOLS.mkdir(parents=True, exist_ok=True)
    loadgen, floor = TOOLS / "loadgen", TOOLS / "c_floor"
    for out, src, argv in ((loadgen, HERE / "loadgen.cpp", ["c++", "-std=c++20", "-O2"]),
                           (floor, HERE / "c_floor.c", ["cc", "-std=c11", "-O2"])):
        if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
            subprocess.run([*argv, "-o", str(out), str(src)], check=True)
    return loadgen, floor


@dataclass
class Server:
    name: str
    argv: list[str]
    python: str
    # what it can answer: "all", or "plaintext" for the C floor (GET, any path, "Hello, World!")
    serves: str = "all"

    @property
    def available(self) -> bool:
        return Path(self.python).exists()


def baseline_label(tree: Path) -> str:
    """`cadeloop-base`'s name in reports: the commit the other checkout's build came from."""
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return f"cadeloop at {head.stdout.strip() or tree}"


def servers(port: int, baseline: Path | None = None) -> dict[str, Server]:
    host = "127.0.0.1"
    peer = lambda name: PEERS / name / "bin"  # noqa: E731

    def cadeloop(label: str, *flags: str, venv: str = ".venv", tree: Path = ROOT) -> Server:
        """The cadeloop of `tree` (this checkout by default; from `venv`) on one core pair, with extra `flags`."""
        return Server(label, [str(tree / venv / "bin/cadeloop"), "app:app", "--host", host, "--port", str(port),
                              "--cores", "1", "--stats-json-on-exit", str(STATS_FILE), *flags],
                      str(tree / venv / "bin/python"))

    io_spin = os.environ.get("CADELOOP_BENCH_IO_SPIN_US", "50")
    cpu_yield = os.environ.get("CADELOOP_BENCH_YIELD_US", "50")
    solo_batch = os.environ.get("CADELOOP_BENCH_SOLO_BATCH", "4")
    solo_spin = os.environ.get("CADELOOP_BENCH_SOLO_SPIN_US", "20")
    table = {
        "cadeloop": cadeloop("cadeloop"),
        "cadeloop-log": cadeloop("cadeloop, access log on", "--access-log", "--access-log-file", str(ACCESS_LOG)),
        # The I/O thread spinning before it sleeps (yielding the CPU when the pair shares one), for the
        # low-concurrency experiments: CADELOOP_BENCH_IO_SPIN_US sets the time (default 50 µs).
        "cadeloop-spin": cadeloop(f"cadeloop, I/O spin {io_spin} µs", "--io-spin-us", io_spin),
        # Both threads of the pair yielding to each other before they sleep when they share one CPU
        # (shared_cpu_yield_us, on by default since 2026-12-01; CADELOOP_BENCH_YIELD_US sets the window,
        # default 50 µs). cadeloop-noyield is the same build with it off, for A/B rounds in one build.
        "cadeloop-yield": cadeloop(f"cadeloop, shared-CPU yield {cpu_yield} µs", "--shared-cpu-yield-us", cpu_yield),
        "cadeloop-noyield": cadeloop("cadeloop, shared-CPU yield off", "--shared-cpu-yield-us", "0"),
        # Solo mode off (solo_max_batch 0, on by default since 2026-12-02): the two threads of the pair hand
        # every request over, as before; and another solo_max_batch (CADELOOP_BENCH_SOLO_BATCH, default 4).
        "cadeloop-nosolo": cadeloop("cadeloop, solo mode off", "--solo-max-batch", "0"),
        "cadeloop-solo-batch": cadeloop(f"cadeloop, solo_max_batch {solo_batch}", "--solo-max-batch", solo_batch),
        # Solo mode's two give-back rules spelled out, whatever the defaults are: a pass that reads more than
        # solo_max_batch, and solo_busy_passes passes in a row that found requests while the loop was busy.
        # Another solo_spin_us (CADELOOP_BENCH_SOLO_SPIN_US, default 20, the default before 2026-12-02's
        # session 13; 50 now): how long the app thread polls the sockets before it sleeps.
        "cadeloop-solo-spin": cadeloop(f"cadeloop, solo spin {solo_spin} µs", "--solo-spin-us", solo_spin),
        "cadeloop-solo-b1-busy4": cadeloop("cadeloop, solo batch 1, busy passes 4",
                                           "--solo-max-batch", "1", "--solo-busy-passes", "4"),
        "cadeloop-solo-b1-nobusy": cadeloop("cadeloop, solo batch 1, busy passes off",
                                            "--solo-max-batch", "1", "--solo-busy-passes", "0"),
        "cadeloop-solo-b4-nobusy": cadeloop("cadeloop, solo batch 4, busy passes off",
                                            "--solo-max-batch", "4", "--solo-busy-passes", "0"),
        "cadeloop-solo-b4-busy4": cadeloop("cadeloop, solo batch 4, busy passes 4",
                                           "--solo-max-batch", "4", "--solo-busy-passes", "4"),
        # Each request's app in an asyncio.Task (asyncio_tasks, as before 2026-12-02) instead of the native
        # request task; for A/B rounds in one build.
        "cadeloop-asyncio-tasks": cadeloop("cadeloop, asyncio.Task per request", "--asyncio-tasks"),
        # The same build on CPython 3.11 (.venv-3.11, made by scripts/setup; a worker process instead of a
        # sub-interpreter), for comparisons on the Python the Rust cadeloop runs on.
        "cadeloop-py311": cadeloop("cadeloop on CPython 3.11", venv=".venv-3.11"),
        "cadeloop-py311-asyncio-tasks": cadeloop("cadeloop on CPython 3.11, asyncio.Task per request",
                                                 "--asyncio-tasks", venv=".venv-3.11"),
        "uvicorn": Server(
            "uvicorn (httptools+uvloop)",
            [str(peer("uvicorn") / "python"), "-m", "uvicorn", "app:app", "--host", host, "--port", str(port),
             "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"],
            str(peer("uvicorn") / "python"),
        ),
        "uvicorn-h11": Server(
            "uvicorn (h11+asyncio)",
            [str(peer("uvicorn") / "python"), "-m", "uvicorn", "app:app", "--host", host, "--port", str(port),
             "--loop", "asyncio", "--http", "h11", "--no-access-log", "--log-level", "warning"],
            str(peer("uvicorn") / "python"),
        ),
        "hypercorn": Server(
            "hypercorn (asyncio)",
            [str(peer("hypercorn") / "python"), "-m", "hypercorn", "--bind", f"{host}:{port}", "--workers", "1",
             "--backlog", "16384", "app:app"],
            str(peer("hypercorn") / "python"),
        ),
        "c-floor": Server("C floor (epoll, bench/http/c_floor.c)", [str(TOOLS / "c_floor"), str(port)],
                          str(TOOLS / "c_floor"), serves="plaintext"),
        "granian": Server(
            "granian (1 worker)",
            [str(peer("granian") / "granian"), "--interface", "asgi", "--host", host, "--port", str(port),
             "--workers", "1", "--no-ws", "--log-level", "warning", "app:app"],
            str(peer("granian") / "python"),
        ),
        "cadeloop-rs": Server(
            "cadeloop-rs (PyPI)",
            [str(peer("cadeloop-rs") / "python"), "-m", "cadeloop", "app:app", "--host", host, "--port", str(port),
             "--workers", "1"],
            str(peer("cadeloop-rs") / "python"),
        ),
    }
    if baseline is not None:
        # Another checkout's build (its own .venv, made by its scripts/setup), for old-against-new rounds.
        table["cadeloop-base"] = cadeloop(baseline_label(baseline), tree=baseline)
    return table


@dataclass
class Workload:
    name: str
    path: str
    connections: int
    expect_length: int
    pipeline: int = 1
    new_conn: bool = False
    body_size: int = 0
    # open loop: this share of the server's capacity (its plaintext, 64 connections req/s in this run)
    open_loop_share: float = 0.0
    plaintext: bool = False  # the C floor can answer it


WORKLOADS = {
    "plaintext": Workload("plaintext, 64 connections", "/", 64, 13, plaintext=True),
    "single": Workload("plaintext, 1 connection", "/", 1, 13, plaintext=True),
    "json": Workload("JSON, 64 connections", "/json", 64, 28),
    "body64k": Workload("64 KiB body, 64 connections", "/64k", 64, 65536),
    "stream": Workload("1 MiB stream, 16 connections", "/stream", 16, 1 << 20),
    "upload": Workload("16 KiB upload, 64 connections", "/upload", 64, 5, body_size=16384),
    "await": Workload("1 ms await, 64 connections", "/await", 64, 13),
    "newconn": Workload("new connection per request, 16", "/", 16, 13, new_conn=True, plaintext=True),
    "pipelined": Workload("pipelined x16, 64 connections", "/", 64, 13, pipeline=16, plaintext=True),
    "openloop": Workload("open loop at 80 % of capacity, 64 connections", "/", 64, 13, open_loop_share=0.8,
                         plaintext=True),
}


@dataclass
class Result:
    server: str
    workload: str
    rps: float = 0.0
    requests: int = 0
    p50_us: float = 0.0
    p99_us: float = 0.0
    cpu_s: float = 0.0
    errors: str = ""
    # responses the CPU time covers: `requests`, plus the open loop's unrecorded warm-up
    cpu_requests: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def cpu_us_per_request(self) -> float:
        n = self.cpu_requests or self.requests
        return 1e6 * self.cpu_s / n if n else float("nan")


def setup_peers() -> None:
    common.setup_peers(PEER_PACKAGES, "python3.11" if shutil.which("python3.11") else sys.executable)


def run_load(port: int, w: Workload, duration: float, load_cpu: int, rate: float = 0.0) -> tuple[dict, str]:
    """One loadgen run; its figures (requests, rps, p50/p90/p99/p999/max in µs, errors) and an error text."""
    argv = ["taskset", "-c", str(load_cpu), str(TOOLS / "loadgen"), "--port", str(port), "--path", w.path,
            "--connections", str(w.connections), "--duration", str(duration), "--pipeline", str(w.pipeline),
            "--expect-status", "200", "--expect-length", str(w.expect_length)]
    if w.new_conn:
        argv.append("--new-conn")
    if w.body_size:
        argv += ["--method", "POST", "--body-size", str(w.body_size)]
    if rate:
        # one second at the rate first, not recorded: the measured tail is the steady state's
        argv += ["--rate", f"{rate:.0f}", "--warmup", "1"]
    if CLIENT_POLL:
        argv.append("--poll")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 60)
    try:
        figures = json.loads(proc.stdout)
    except ValueError:
        return {}, f"loadgen: {proc.stderr.strip()[-300:] or proc.stdout[-300:]}"
    errors = ", ".join(f"{k} {v}" for k, v in figures.get("errors_by_kind", {}).items() if v)
    return figures, errors


def pair_stats(server: Server, pid: int) -> dict:
    """cadeloop's counters now (SIGUSR1 makes it write them), or {} for the peers."""
    if not server.name.startswith("cadeloop") or "PyPI" in server.name:
        return {}
    STATS_FILE.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR1)
    for _ in range(100):
        try:
            return json.loads(STATS_FILE.read_text())
        except (OSError, ValueError):
            time.sleep(0.02)
    return {}


def bucket_lower_us(i: int) -> int:
    """The smallest duration (µs) in bucket `i` of cadeloop's latency histogram (net::latency_buckets:
    8 buckets of 1 µs, then 8 per power of two)."""
    if i < 8:
        return i
    return (8 + (i - 8) % 8) << ((i - 8) // 8)


def server_latency(before: dict, after: dict) -> dict:
    """cadeloop's own latency percentiles over a run (the pair's histogram: from the head handed to the app to
    the response queued whole), from the bucket counts before and after it; {} without them. Each is the
    upper bound of its bucket (at most 12.5 % above the true value), so a tail the load generator sees and
    the server does not is time outside the server's handling: in the kernel's queues, on a CPU the server did
    not have, or in the load generator."""
    a, b = after.get("latency_buckets"), before.get("latency_buckets")
    if not isinstance(a, list) or not isinstance(b, list) or len(a) != len(b):
        return {}
    counts = [x - y for x, y in zip(a, b)]
    total = sum(counts)
    if total <= 0:
        return {}
    out = {}
    for name, q in (("server_p50_us", 0.50), ("server_p99_us", 0.99)):
        seen = 0
        for i, c in enumerate(counts):
            seen += c
            if seen >= q * total:
                out[name] = float(bucket_lower_us(i + 1) if i + 1 < len(counts) else bucket_lower_us(i))
                break
    return out


def start_server(server: Server, port: int, args: argparse.Namespace,
                 timeout: float = 20.0) -> tuple[subprocess.Popen, str]:
    """Starts `server` on the server CPU; returns the process and "" or why it did not start."""
    return common.start_server(pinned(args.server_cpu, server.argv), HERE, lambda p: wait_port(port, p, timeout))


def capacity_rate(server: Server, proc: subprocess.Popen, port: int, w: Workload, args: argparse.Namespace) -> float:
    """The open-loop rate for `w` on `server`: its share of the server's capacity, measured right before (a
    closed-loop plaintext run of `--warmup` seconds, at least 2), so the host's drift during a long suite
    does not offer a server more than it can take now; 0 for a closed-loop workload."""
    if not w.open_loop_share:
        return 0.0
    if args.openloop_rate:
        return args.openloop_rate  # one offered rate for every server (--openloop-rate)
    figures, _ = run_load(port, WORKLOADS["plaintext"], max(2, args.warmup), args.load_cpu)
    return w.open_loop_share * figures.get("rps", 0.0)


def serves(server: Server, w: Workload) -> bool:
    return server.serves == "all" or w.plaintext


def one_run(server: Server, proc: subprocess.Popen, port: int, w: Workload, args: argparse.Namespace) -> Result:
    """One measured load run against a started server, with its CPU time, steal and counters."""
    # The open loop's rate first: its closed-loop probe is not part of the measured run (its CPU time and
    # counters were counted against the open loop's requests before 2026-12-02).
    rate = capacity_rate(server, proc, port, w, args)
    stats_before = pair_stats(server, proc.pid)
    before = cpu_seconds(proc.pid)
    steal_before = steal_seconds(args.server_cpu)
    load_steal_before = steal_seconds(args.load_cpu)
    figures, errors = run_load(port, w, args.duration, args.load_cpu, rate)
    after = cpu_seconds(proc.pid)
    steal = steal_seconds(args.server_cpu) - steal_before
    load_steal = steal_seconds(args.load_cpu) - load_steal_before
    stats_after = pair_stats(server, proc.pid)
    extra = {"steal_share": steal / args.duration, "load_steal_share": load_steal / args.duration,
             "error_count": figures.get("errors", 0), "rate": rate}
    extra |= {k: figures[k] for k in ("p90_us", "p999_us", "max_us", "send_late_p99_us", "send_late_max_us")
              if k in figures}
    if stats_before and stats_after:
        d = {k: stats_after[k] - stats_before.get(k, 0) for k in stats_after if isinstance(stats_after[k], int)}
        reqs = max(d.get("requests", 0), 1)
        extra |= {"wakeups_per_request": (d.get("wakeups_to_app", 0) + d.get("wakeups_to_io", 0)) / reqs,
                  "wakeups_to_app_per_request": d.get("wakeups_to_app", 0) / reqs,
                  "wakeups_to_io_per_request": d.get("wakeups_to_io", 0) / reqs,
                  "eager_completed_share": d.get("eager_completed", 0) / reqs}
        extra |= server_latency(stats_before, stats_after)
    r = Result(server.name, w.name, rps=figures.get("rps", 0.0), requests=figures.get("requests", 0),
               p50_us=figures.get("p50_us", float("nan")), p99_us=figures.get("p99_us", float("nan")),
               cpu_s=after - before, errors=errors, extra=extra,
               cpu_requests=figures.get("responses_with_warmup", 0))
    wake = f"  wake-ups/req {extra['wakeups_per_request']:.3f}" if "wakeups_per_request" in extra else ""
    wake += f"  steal {100 * extra['steal_share']:.1f}% (load CPU {100 * extra['load_steal_share']:.1f}%)"
    print(f"  {server.name:28} {w.name:32} {r.rps:10.0f} req/s "
          f"{r.cpu_us_per_request:7.1f} us CPU/req  p50 {r.p50_us:8.0f} p99 {r.p99_us:8.0f} us{wake}  {errors}",
          flush=True)
    return r


def measure(server: Server, workloads: list[Workload], args: argparse.Namespace) -> list[Result]:
    proc, error = start_server(server, args.port, args)
    if error:
        return [Result(server.name, w.name, errors=error) for w in workloads]
    results = []
    try:
        for w in workloads:
            if not serves(server, w):
                continue
            run_load(args.port, w, args.warmup, args.load_cpu)  # warm-up, not counted
            results.append(one_run(server, proc, args.port, w, args))
    finally:
        stop_server(proc)
    return results


def measure_interleaved(keys: list[str], workloads: list[Workload], args: argparse.Namespace,
                        baseline: Path | None = None) -> list[Result]:
    """Every server started at once (port, port+1, ...; an idle one costs no CPU), then `--rounds`
    rounds of one run each, in turn, so each server's runs sit between the others' and the host's
    drift falls on all of them alike. Each run's `round` is kept for paired ratios."""
    started: list[tuple[Server, subprocess.Popen, int]] = []
    results: list[Result] = []
    try:
        for i, key in enumerate(keys):
            port = args.port + i
            server = servers(port, baseline)[key]
            proc, error = start_server(server, port, args)
            if error:
                print(f"driver: {key}: {error}", file=sys.stderr)
                results += [Result(server.name, w.name, errors=error) for w in workloads if serves(server, w)]
                continue
            started.append((server, proc, port))
        for w in workloads:
            for server, proc, port in started:
                if serves(server, w):
                    run_load(port, w, args.warmup, args.load_cpu)  # warm-up, not counted
            for rnd in range(args.rounds):
                for server, proc, port in started:
                    if not serves(server, w):
                        continue
                    r = one_run(server, proc, port, w, args)
                    r.extra["round"] = rnd
                    results.append(r)
    finally:
        for _, proc, _ in started:
            stop_server(proc)
    return results


def quiet_medians(results: list[Result], max_steal: float) -> list[str]:
    """With repeated runs (a server named more than once in --servers): the
    median of each server's runs whose steal stayed under `max_steal`, and
    each median against the first server's of the same workload."""
    groups: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        groups.setdefault((r.workload, r.server), []).append(r)
    if all(len(g) < 2 for g in groups.values()):
        return []
    lines = ["", f"Medians over the runs with steal under {100 * max_steal:.0f} % on both CPUs "
             "(runs kept / runs; ratios against the first server of the workload):", "",
             "| workload | server | runs | req/s | req/s ratio | CPU µs/request | CPU ratio | p50 µs | p99 µs |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for w in dict.fromkeys(r.workload for r in results):
        base: tuple[float, float] | None = None
        for (workload, server), runs in groups.items():
            if workload != w:
                continue
            quiet = [r for r in runs if r.rps and max(r.extra.get("steal_share", 0.0),
                                                      r.extra.get("load_steal_share", 0.0)) < max_steal]
            if not quiet:
                lines.append(f"| {w} | {server} | 0 / {len(runs)} | | | | | | |")
                continue
            rps = statistics.median(r.rps for r in quiet)
            cpu = statistics.median(r.cpu_us_per_request for r in quiet)
            base = base or (rps, cpu)
            p50 = statistics.median(r.p50_us for r in quiet)
            p99 = statistics.median(r.p99_us for r in quiet)
            lines.append(f"| {w} | {server} | {len(quiet)} / {len(runs)} | {rps:.0f} | {rps / base[0]:.3f} | "
                         f"{cpu:.2f} | {cpu / base[1]:.3f} | {fmt_us(p50)} | {fmt_us(p99)} |")
    lines += paired_ratios(results, max_steal)
    return lines


def paired_ratios(results: list[Result], max_steal: float) -> list[str]:
    """With --rounds: each server against the first within the same round (runs seconds apart),
    over the rounds where both runs were quiet; the median and the spread of those ratios."""
    rounds: dict[tuple[str, int], list[Result]] = {}
    for r in results:
        if "round" in r.extra:
            rounds.setdefault((r.workload, r.extra["round"]), []).append(r)
    if not rounds:
        return []
    lines = ["", "Paired by round (each run against the first server's run of the same round, both quiet):", "",
             "| workload | server | rounds | req/s ratio, median (min–max) | CPU/request ratio, median (min–max) |",
             "|---|---|---:|---:|---:|"]

    def quiet(r: Result) -> bool:
        return bool(r.rps) and max(r.extra.get("steal_share", 0.0), r.extra.get("load_steal_share", 0.0)) < max_steal

    for w in dict.fromkeys(r.workload for r in results):
        # Servers with a measured run only: one that did not start (its error results come first) is no base.
        names = list(dict.fromkeys(r.server for r in results if r.workload == w and r.rps))
        for name in names[1:]:
            rps, cpu = [], []
            for (workload, _), runs in rounds.items():
                first = next((r for r in runs if r.server == names[0]), None)
                other = next((r for r in runs if r.server == name), None)
                if workload == w and first and other and quiet(first) and quiet(other):
                    rps.append(other.rps / first.rps)
                    cpu.append(other.cpu_us_per_request / first.cpu_us_per_request)
            if rps:
                lines.append(f"| {w} | {name} vs {names[0]} | {len(rps)} | {statistics.median(rps):.3f} "
                             f"({min(rps):.3f}–{max(rps):.3f}) | {statistics.median(cpu):.3f} "
                             f"({min(cpu):.3f}–{max(cpu):.3f}) |")
    return lines


def idle_and_timers(keys: list[str], args: argparse.Namespace, baseline: Path | None) -> dict:
    """Idle keep-alive memory (each server alone, fresh) and the loops' timers and wake-ups."""
    from memory import idle_memory

    out: dict = {"idle": {}, "timers": {}}
    counts = [int(n) for n in args.idle_counts.split(",") if n]
    for key in keys:
        server = servers(args.port, baseline)[key]
        if not counts or not server.available:
            continue
        proc, error = start_server(server, args.port, args)
        if error:
            out["idle"][server.name] = {"error": error}
            continue
        try:
            out["idle"][server.name] = idle_memory(args.port, lambda: tree_pids(proc.pid), counts)
        finally:
            stop_server(proc)
        print(f"  idle: {server.name:28} {out['idle'][server.name]}", flush=True)
    # One loop per interpreter, pinned to the server CPU and the load CPU (the poking thread runs on either).
    loops = {"cadeloop": (ROOT / ".venv/bin/python", "cadeloop"),
             "cadeloop-rs (PyPI)": (PEERS / "cadeloop-rs/bin/python", "cadeloop"),
             "uvloop": (PEERS / "uvicorn/bin/python", "uvloop"),
             "asyncio": (PEERS / "uvicorn/bin/python", "asyncio")}
    for name, (python, loop) in loops.items():
        if not args.timers or not python.exists():
            continue
        proc = subprocess.run(["taskset", "-c", f"{args.server_cpu},{args.load_cpu}", str(python),
                               str(HERE / "timers.py"), loop, "1000"], capture_output=True, text=True, timeout=120)
        try:
            out["timers"][name] = json.loads(proc.stdout)
        except ValueError:
            out["timers"][name] = {"error": proc.stderr.strip()[-300:]}
        print(f"  timers: {name:20} {out['timers'][name]}", flush=True)
    return out


def conditions() -> dict:
    """The host while the suite runs: load average, and steal over the whole run on every CPU."""
    load = Path("/proc/loadavg").read_text().split()[:3]
    steal = {c: steal_seconds(c) for c in range(os.cpu_count() or 1)}
    return {"loadavg": load, "steal_s": steal, "time": dt.datetime.now(dt.timezone.utc).strftime("%H:%M:%S UTC")}


def fmt_us(v: float) -> str:
    if v != v:  # nan
        return ""
    return f"{v / 1000:.2f} ms" if v >= 10000 else f"{v:.0f}"


def write_report(results: list[Result], args: argparse.Namespace, command: str, extra: dict | None = None) -> Path:
    day = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    stem = RESULTS / f"{day}-http-{args.tag}"
    extra = extra or {}
    lines = [
        f"# HTTP servers side by side, {day}", "",
        f"- command: `{command}`",
        f"- machine: {machine()}",
        f"- server on CPU {args.server_cpu}, load generator (bench/http/loadgen.cpp, 1 thread) on CPU "
        f"{args.load_cpu}; {args.duration} s measured after {args.warmup} s warm-up per workload",
        "- every response checked (status 200 and body length); errors counted by kind",
        "- CPU/request: utime+stime of the server's whole process tree from /proc/PID/stat over the measured run,"
        " divided by the requests completed",
        "- steal: share of the measured run during which the hypervisor ran something else on the server's CPU"
        " / on the load generator's CPU (/proc/stat); a run with steal measured the host, not the server",
    ]
    if "before" in extra:
        b, a = extra["before"], extra["after"]
        lines.append(f"- host: load average {' '.join(b['loadavg'])} at {b['time']}, {' '.join(a['loadavg'])} "
                     f"at {a['time']}; CPU steal over the whole run: " + ", ".join(
                         f"CPU {c} {a['steal_s'][c] - b['steal_s'][c]:.1f} s" for c in b["steal_s"]))
    lines += ["",
              "| workload | server | req/s | CPU µs/request | p50 µs | p99 µs | p99.9 µs | wake-ups/req | steal | errors |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for w in dict.fromkeys(r.workload for r in results):
        for r in (r for r in results if r.workload == w):
            wake = f"{r.extra['wakeups_per_request']:.3f}" if "wakeups_per_request" in r.extra else ""
            steal = f"{100 * r.extra['steal_share']:.1f}%" if "steal_share" in r.extra else ""
            if "load_steal_share" in r.extra:
                steal += f" / {100 * r.extra['load_steal_share']:.1f}%"
            rate = f" (offered {r.extra['rate']:.0f}/s)" if r.extra.get("rate") else ""
            if r.extra.get("rate") and "send_late_p99_us" in r.extra:
                rate += f" (sent late p99 {r.extra['send_late_p99_us']:.0f} µs)"
            if r.extra.get("rate") and "server_p99_us" in r.extra:
                rate += f" (server-side p99 {r.extra['server_p99_us']:.0f} µs)"
            lines.append(f"| {w} | {r.server}{rate} | {r.rps:.0f} | {r.cpu_us_per_request:.1f} | {fmt_us(r.p50_us)} | "
                         f"{fmt_us(r.p99_us)} | {fmt_us(r.extra.get('p999_us', float('nan')))} | {wake} | {steal} | "
                         f"{r.errors} |")
    lines += quiet_medians(results, args.quiet_steal)
    if extra.get("idle"):
        lines += ["", "Idle keep-alive connections (unique memory of the server's processes, each connection made "
                  "one request and stays open; a fresh server per server):", "",
                  "| server | at rest MiB | connections held / asked | before MiB | holding MiB | KiB per connection "
                  "| after they close MiB |", "|---|---:|---:|---:|---:|---:|---:|"]
        for name, m in extra["idle"].items():
            if "error" in m:
                lines.append(f"| {name} | {m['error']} | | | | | |")
                continue
            for lv in m["levels"]:
                per = f"{lv['per_connection_kib']:.1f}" if lv["per_connection_kib"] is not None else ""
                lines.append(f"| {name} | {m['rest_kib'] / 1024:.1f} | {lv['held']} / {lv['connections']} | "
                             f"{lv['before_kib'] / 1024:.1f} | {lv['holding_kib'] / 1024:.1f} | {per} | "
                             f"{lv['after_kib'] / 1024:.1f} |")
    for part, what in (("ws", "WebSocket"), ("tls", "HTTPS")):
        if part in extra:
            where = extra[part].get("file") or extra[part].get("error")
            lines += ["", f"{what} rows of the suite: {where} (its .md has the tables)."]
    if extra.get("timers"):
        lines += ["", "Timers and wake-ups (each loop alone, 1,000 samples; µs):", "",
                  "| loop | sleep(1 ms) late p50 | p99 | call_soon_threadsafe wake-up p50 | p99 |",
                  "|---|---:|---:|---:|---:|"]
        for name, t in extra["timers"].items():
            if "error" in t:
                lines.append(f"| {name} | {t['error']} | | | |")
                continue
            lines.append(f"| {name} | {t['sleep_1ms_late_p50_us']:.0f} | {t['sleep_1ms_late_p99_us']:.0f} | "
                         f"{t['wakeup_p50_us']:.0f} | {t['wakeup_p99_us']:.0f} |")
    return common.write_results(stem, lines, {
        "command": command, "machine": machine(), "date": day, **extra,
        "results": [dict(vars(r), cpu_us_per_request=r.cpu_us_per_request) for r in results]})


SUITE_SERVERS = "cadeloop-rs,cadeloop,uvicorn,uvicorn-h11,granian,hypercorn,c-floor"
# The suite's servers that bench/ws/driver.py and bench/tls/driver.py also run (cadeloop first: their ratios
# are about the first server).
SUITE_WS = ("cadeloop", "uvicorn", "granian", "cadeloop-rs")
SUITE_TLS = ("cadeloop", "uvicorn", "granian")


def run_driver(argv: list[str]) -> str:
    """Runs another driver (its output passed through); the path its last `written:`/`wrote` line names."""
    print("suite: " + " ".join(argv), flush=True)
    proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    written = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", flush=True)
        m = re.match(r"(?:written|driver: wrote):? (\S+\.md)$", line.strip())
        written = m.group(1) if m else written
    return written if proc.wait() == 0 else ""


def ws_and_tls(keys: list[str], args: argparse.Namespace) -> dict:
    """The suite's WebSocket and TLS rows: bench/ws/driver.py and bench/tls/driver.py on the suite's servers
    that speak them, with the same rounds, run length and CPUs; their results files' JSON, and their names."""
    out: dict = {}
    common_args = ["--rounds", str(args.rounds), "--duration", str(args.duration), "--warmup", str(args.warmup),
                   "--server-cpu", str(args.server_cpu), "--load-cpu", str(args.load_cpu)]
    counts = [int(n) for n in args.idle_counts.split(",") if n]
    day = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    for part, driver, table, extra_args in (
            ("ws", "bench/ws/driver.py", SUITE_WS,
             ["--tag", args.tag, "--port", str(args.port + 100), "--quiet-steal", str(args.quiet_steal),
              "--idle-connections", str(max(counts, default=0))]),
            ("tls", "bench/tls/driver.py", SUITE_TLS,
             ["--port", str(args.port + 200), "--out", str(RESULTS / f"{day}-tls-{args.tag}.md")])):
        chosen = [k for k in table if k in keys]
        if not chosen:
            continue
        written = run_driver([driver, "--servers", ",".join(chosen), *common_args, *extra_args])
        if not written:
            out[part] = {"error": f"{driver} failed"}
            continue
        data = json.loads(Path(written).with_suffix(".json").read_text())
        out[part] = data | {"file": str(Path(written).with_suffix(".json").resolve().relative_to(ROOT))}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setup", action="store_true", help="create the peers' venvs and exit")
    p.add_argument("--suite", action="store_true",
                   help=f"every workload on {SUITE_SERVERS}, then idle memory and timers, then the WebSocket and TLS "
                   "drivers on those of them that speak WebSocket and TLS (implies --rounds 1 at least)")
    p.add_argument("--servers", default=None, help=f"comma-separated; default cadeloop,uvicorn,granian,cadeloop-rs "
                   f"(with --suite: {SUITE_SERVERS})")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--duration", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--port", type=int, default=18080)
    p.add_argument("--server-cpu", type=int, default=0)
    p.add_argument("--load-cpu", type=int, default=1)
    p.add_argument("--tag", default="servers", help="name part of the results file")
    p.add_argument("--rounds", type=int, default=0,
                   help="start every server at once and measure them in turn this many times (paired ratios)")
    p.add_argument("--baseline", type=Path, default=None,
                   help="another checkout of cadeloop with its own .venv: adds the server cadeloop-base")
    p.add_argument("--quiet-steal", type=float, default=0.03,
                   help="with repeated servers, medians use only runs whose CPU steal share is below this")
    p.add_argument("--idle-counts", default="",
                   help="idle keep-alive levels to measure memory at, e.g. 1000,10000 (--suite: 1000,10000)")
    p.add_argument("--timers", action="store_true", help="measure the loops' timers and wake-ups (--suite: on)")
    p.add_argument("--openloop-rate", type=float, default=0.0,
                   help="the open loop at this many requests per second for every server, instead of 80 %% of "
                   "each one's own capacity: latency compared at one offered load (a server slower than the rate "
                   "is overloaded)")
    p.add_argument("--client-poll", action="store_true",
                   help="the load generator polls instead of sleeping in epoll (loadgen --poll): no server pays "
                   "for waking it (a VM exit per wake-up of its idle CPU here), so CPU per request is the "
                   "server's own work; the default sleeps, as wrk does")
    args = p.parse_args()
    global CLIENT_POLL
    CLIENT_POLL = args.client_poll
    if args.openloop_rate < 0:
        p.error(f"--openloop-rate must be a rate in requests per second, got {args.openloop_rate:g}")
    if args.openloop_rate:
        WORKLOADS["openloop"].name = f"open loop at {args.openloop_rate:,.0f} requests/s, 64 connections"
    if args.setup:
        setup_peers()
        return 0
    if args.suite:
        args.servers = args.servers or SUITE_SERVERS
        args.rounds = max(args.rounds, 1)
        args.idle_counts = args.idle_counts or "1000,10000"
        args.timers = True
    args.servers = args.servers or "cadeloop,uvicorn,granian,cadeloop-rs"
    build_tools()
    baseline = args.baseline.resolve() if args.baseline else None
    table = servers(args.port, baseline)
    unknown = [s for s in args.servers.split(",") if s not in table]
    if unknown:
        print(f"driver: unknown server(s) {unknown}; known: {list(table)}", file=sys.stderr)
        return 2
    workloads = [WORKLOADS[w] for w in args.workloads.split(",") if w]
    command = ("python bench/http/driver.py " + " ".join(sys.argv[1:])).strip()
    extra: dict = {"before": conditions()}
    results: list[Result] = []
    if args.rounds:
        keys = list(dict.fromkeys(args.servers.split(",")))
        missing = [k for k in keys if not table[k].available]
        if missing:
            print(f"driver: {missing} not set up; run --setup", file=sys.stderr)
            keys = [k for k in keys if k not in missing]
        results = measure_interleaved(keys, workloads, args, baseline)
    else:
        keys = []
        for key in args.servers.split(","):
            server = table[key]
            if not server.available:
                print(f"driver: {key} is not set up ({server.python} missing); run --setup", file=sys.stderr)
                continue
            keys.append(key)
            print(f"{server.name}:")
            results += measure(server, workloads, args)
    extra |= idle_and_timers(keys, args, baseline)
    if args.suite:
        extra |= ws_and_tls(keys, args)
    extra["after"] = conditions()
    print(f"written: {write_report(results, args, command, extra)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
