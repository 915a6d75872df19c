"""HTTPS servers side by side: cadeloop (TLS in its I/O thread), uvicorn (httptools + uvloop, Python's ssl)
and granian (rustls), each one process on one CPU, serving bench/http/app.py.

Workloads (bench/tls/tls_load.cpp, an epoll + OpenSSL client on another CPU):

- keep-alive: "Hello, World!" over 64 TLS keep-alive connections;
- new connection: 16 concurrent clients, a new TLS connection (full handshake, TLS 1.3, no resumption)
  per request, so requests/s is handshakes/s;
- resumed: the same, each new connection offering the ticket of the one before (the "resumed" column
  says how many the server accepted).

Server CPU per request is utime+stime of the server's process tree (/proc/PID/stat) over the run divided by
the requests answered; on a loaded machine the CPU ratios are the figures to read, req/s ratios hold on a
quiet one. Peers come from the venvs of bench/http/driver.py (build/bench-peers/{uvicorn,granian};
`--setup` makes them). Writes bench/results/DATE-tls-servers.md and its runs as .json beside it.

    .venv/bin/python bench/tls/driver.py --setup        # once: the peers' venvs
    .venv/bin/python bench/tls/driver.py --duration 10 --rounds 3
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import ssl
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
APP_DIR = ROOT / "bench" / "http"
sys.path.insert(0, str(ROOT / "bench"))
from common import (PEERS, RESULTS, TOOLS, cpu_seconds, pinned, start_server, steal_seconds, stop_server,  # noqa: E402
                    wait_port)
import common  # noqa: E402

# bench/http/driver.py: the peers' pinned versions.
_spec = importlib.util.spec_from_file_location("http_driver", APP_DIR / "driver.py")
assert _spec is not None and _spec.loader is not None
http_driver = importlib.util.module_from_spec(_spec)
sys.modules["http_driver"] = http_driver
_spec.loader.exec_module(http_driver)

PEER_PACKAGES = {k: http_driver.PEER_PACKAGES[k] for k in ("uvicorn", "granian")}


@dataclass
class Workload:
    key: str
    name: str
    connections: int
    new_conn: bool = False
    resume: bool = False


WORKLOADS = [
    Workload("keepalive", "keep-alive, 64 connections", 64),
    Workload("newconn", "new TLS connection per request, 16", 16, new_conn=True),
    Workload("resumed", "new connection resuming a ticket, 16", 16, new_conn=True, resume=True),
]


@dataclass
class Run:
    server: str
    workload: str
    rps: float = 0.0
    requests: int = 0
    cpu_s: float = 0.0
    p50_us: float = 0.0
    p99_us: float = 0.0
    errors: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def cpu_us_per_request(self) -> float:
        return 1e6 * self.cpu_s / self.requests if self.requests else float("nan")


def server_argv(key: str, port: int, cert: Path, key_file: Path) -> list[str]:
    host = "127.0.0.1"
    peer = lambda name: PEERS / name / "bin"  # noqa: E731
    if key == "cadeloop":
        return [str(ROOT / ".venv/bin/cadeloop"), "app:app", "--host", host, "--port", str(port), "--cores", "1",
                "--ssl-certfile", str(cert), "--ssl-keyfile", str(key_file)]
    if key == "uvicorn":
        return [str(peer("uvicorn") / "python"), "-m", "uvicorn", "app:app", "--host", host, "--port", str(port),
                "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning",
                "--ssl-certfile", str(cert), "--ssl-keyfile", str(key_file)]
    if key == "granian":
        return [str(peer("granian") / "granian"), "--interface", "asgi", "--host", host, "--port", str(port),
                "--workers", "1", "--no-ws", "--log-level", "warning",
                "--ssl-certificate", str(cert), "--ssl-keyfile", str(key_file), "app:app"]
    raise SystemExit(f"driver: unknown server {key!r} (cadeloop, uvicorn, granian)")


def setup_peers() -> None:
    common.setup_peers(PEER_PACKAGES, sys.executable)


def build_load() -> Path:
    """bench/tls/tls_load.cpp into build/bench-tools/ when missing or older than its source."""
    TOOLS.mkdir(parents=True, exist_ok=True)
    out, src = TOOLS / "tls_load", HERE / "tls_load.cpp"
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        subprocess.run(["c++", "-std=c++20", "-O2", "-o", str(out), str(src), "-lssl", "-lcrypto"], check=True)
    return out


def make_certificate(d: Path) -> tuple[Path, Path]:
    """A self-signed ECDSA P-256 certificate for 127.0.0.1 (what every server presents)."""
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


def wait_tls(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return wait_port(port, proc, timeout, tls=ctx, connect_timeout=1)


def start(key: str, port: int, cert: Path, key_file: Path, cpu: int) -> subprocess.Popen:
    proc, error = start_server(pinned(cpu, server_argv(key, port, cert, key_file)), APP_DIR,
                               lambda p: wait_tls(port, p))
    if error:
        raise RuntimeError(f"{key} {error}")
    return proc


def load(tool: Path, port: int, w: Workload, duration: float, cpu: int) -> dict:
    argv = ["taskset", "-c", str(cpu), str(tool), "--port", str(port), "--connections", str(w.connections),
            "--duration", str(duration)]
    if w.new_conn:
        argv.append("--new-conn")
    if w.resume:
        argv.append("--resume")
    p = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 60)
    try:
        return json.loads(p.stdout)
    except ValueError:
        raise RuntimeError(f"tls_load: {p.stderr.strip()[-300:] or p.stdout[-300:]}") from None


def one_run(tool: Path, key: str, proc: subprocess.Popen, port: int, w: Workload, args: argparse.Namespace) -> Run:
    before = cpu_seconds(proc.pid)
    steal_before = steal_seconds(args.server_cpu)
    figures = load(tool, port, w, args.duration, args.load_cpu)
    cpu = cpu_seconds(proc.pid) - before
    steal = steal_seconds(args.server_cpu) - steal_before
    r = Run(key, w.key, rps=figures["rps"], requests=figures["requests"], cpu_s=cpu, p50_us=figures["p50_us"],
            p99_us=figures["p99_us"], errors=figures["errors"],
            extra={"handshakes_per_s": figures["handshakes_per_s"], "steal_share": steal / args.duration,
                   "resumed_share": figures["resumed"] / max(figures["handshakes"], 1)})
    print(f"  {key:9} {w.name:38} {r.rps:9.0f} req/s {r.cpu_us_per_request:8.1f} us CPU/req  "
          f"p50 {r.p50_us:7.0f} p99 {r.p99_us:7.0f} us  errors {r.errors}"
          + (f"  resumed {100 * r.extra['resumed_share']:.0f}%" if w.resume else ""), flush=True)
    return r


def median_run(runs: list[Run]) -> Run:
    """The run with the median CPU per request (its req/s comes along)."""
    ordered = sorted(runs, key=lambda r: r.cpu_us_per_request)
    return ordered[len(ordered) // 2]


def report(results: dict[tuple[str, str], list[Run]], keys: list[str], args: argparse.Namespace, load1: str) -> str:
    date = dt.datetime.now(dt.timezone.utc)
    lines = [f"# HTTPS servers: keep-alive and new connections over TLS\n",
             f"Command: `.venv/bin/python bench/tls/driver.py {' '.join(sys.argv[1:])}`  ",
             f"Machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}, "
             f"{ssl.OPENSSL_VERSION} (client and cadeloop)  ",
             f"Date: {date:%Y-%m-%d %H:%M} UTC; load average before the run: {load1}  ",
             f"Server on CPU {args.server_cpu}, load client (bench/tls/tls_load.cpp) on CPU {args.load_cpu}; "
             f"{args.duration:g} s per run after a {args.warmup:g} s warm-up; {args.rounds} rounds, servers in turn "
             f"in each round; the median run by CPU per request is shown. ECDSA P-256 certificate, TLS 1.3.\n",
             "| server | workload | req/s | server CPU µs/request | p50 µs | p99 µs | errors | resumed |",
             "|---|---|---|---|---|---|---|---|"]
    for w in WORKLOADS:
        for key in keys:
            runs = results.get((key, w.key))
            if not runs:
                continue
            m = median_run(runs)
            resumed = f"{100 * m.extra['resumed_share']:.0f} %" if w.resume else ""
            lines.append(f"| {key} | {w.name} | {m.rps:.0f} | {m.cpu_us_per_request:.1f} | {m.p50_us:.0f} | "
                         f"{m.p99_us:.0f} | {sum(r.errors for r in runs)} | {resumed} |")
    lines += ["", "Ratios, cadeloop against each peer (per round, then the median of the rounds): req/s "
              "(higher is better for cadeloop) and CPU per request (peer's / cadeloop's: how many times less CPU "
              "cadeloop spends).\n", "| workload | peer | req/s ratio | CPU/request ratio |", "|---|---|---|---|"]
    for w in WORKLOADS:
        mine = results.get(("cadeloop", w.key), [])
        for key in keys:
            theirs = results.get((key, w.key), [])
            if key == "cadeloop" or not mine or not theirs:
                continue
            rps = [a.rps / b.rps for a, b in zip(mine, theirs) if b.rps]
            cpu = [b.cpu_us_per_request / a.cpu_us_per_request for a, b in zip(mine, theirs) if a.requests]
            lines.append(f"| {w.name} | {key} | {statistics.median(rps):.2f}× | {statistics.median(cpu):.2f}× |")
    return "\n".join(lines) + "\n"


def write_raw(path: Path, results: dict[tuple[str, str], list[Run]], load1: str) -> None:
    """Every run (not only the median one of the table) as JSON beside the Markdown, for bench/http/plot.py."""
    names = {w.key: w.name for w in WORKLOADS}
    runs = [dict(vars(r), workload=names[r.workload], workload_key=r.workload, round=i,
                 cpu_us_per_request=r.cpu_us_per_request)
            for runs in results.values() for i, r in enumerate(runs)]
    path.write_text(json.dumps({
        "kind": "tls", "command": f".venv/bin/python bench/tls/driver.py {' '.join(sys.argv[1:])}".strip(),
        "machine": common.machine(), "openssl": ssl.OPENSSL_VERSION,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(), "load_average_before": load1, "results": runs},
        indent=1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setup", action="store_true", help="make the peers' venvs and exit")
    ap.add_argument("--servers", default="cadeloop,uvicorn,granian")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--port", type=int, default=18443)
    ap.add_argument("--server-cpu", type=int, default=0)
    ap.add_argument("--load-cpu", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None,
                    help="default bench/results/DATE-tls-servers.md (the runs go to the same name .json)")
    args = ap.parse_args()
    if args.setup:
        setup_peers()
        return 0
    keys = args.servers.split(",")
    tool = build_load()
    load1 = Path("/proc/loadavg").read_text().split()[0]
    results: dict[tuple[str, str], list[Run]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cert, key_file = make_certificate(Path(tmp))
        procs: dict[str, tuple[subprocess.Popen, int]] = {}
        try:
            for i, key in enumerate(keys):
                procs[key] = (start(key, args.port + i, cert, key_file, args.server_cpu), args.port + i)
            for rnd in range(args.rounds):
                print(f"round {rnd + 1} of {args.rounds}", flush=True)
                for w in WORKLOADS:
                    for key in keys:
                        proc, port = procs[key]
                        load(tool, port, w, args.warmup, args.load_cpu)  # warm-up, not counted
                        results.setdefault((key, w.key), []).append(one_run(tool, key, proc, port, w, args))
        finally:
            for proc, _ in procs.values():
                stop_server(proc)
    text = report(results, keys, args, load1)
    print(text)
    out = args.out or RESULTS / f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d}-tls-servers.md"
    out.write_text(text)
    write_raw(out.with_suffix(".json"), results, load1)
    print(f"driver: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
