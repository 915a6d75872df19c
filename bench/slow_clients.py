#!/usr/bin/env python3
"""Slow and hostile clients against a real cadeloop server with its default settings.

For each kind of hostile client -- slow head (slowloris: a head that trickles in),
slow body (a head with Content-Length: 10 and no body), slow reader (a 100 MiB
streamed response that is never read; the app makes a fresh 64 KiB bytes object per
response, as a templated page would), shared-reader (the same, but every response sends
one module-level 64 KiB object, as a static asset would) -- opens --count connections (default 5,000)
and keeps them open (re-opening each one the server cuts) for --seconds, while a
normal client sends GET /hello on a new connection every 10 ms and records its
latency. Reports the normal client's p50/p99/max and failures, the server's peak
RSS (the server process and its children, from /proc), the load average, and the
server's /stats counters, as JSON and a Markdown table in bench/results/.

    python bench/slow_clients.py                 # 5,000 of each kind, one kind at a time
    python bench/slow_clients.py --count 500 --seconds 15 --kinds body,reader
    python bench/slow_clients.py --count 5000 --seconds 20 --kinds reader,shared-reader

The kinds run one after the other (a fresh server each): with default settings
one pair holds at most max_connections (10,000) connections.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import resource
import selectors
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = ROOT / "tests" / "python" / "server_apps"
LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")
STATS = re.compile(r"stats endpoint on http://127\.0\.0\.1:(\d+)/")


def raise_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < need:
        sys.exit(f"slow_clients: the fd hard limit {hard} is below the {need} needed; lower --count")


def rss_kib(pid: int) -> int:
    total = 0
    pids = [pid]
    try:
        pids += [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pass
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def start_server(log: Path, extra: list[str]) -> tuple[subprocess.Popen, int, int]:  # type: ignore[type-arg]
    out = open(log, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "cadeloop", "hostile_app:app", "--app-dir", str(APPS),
                             "--port", "0", "--stats-port", "0", *extra],
                            stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    port = stats = 0
    while time.monotonic() < deadline and not (port and stats):
        text = log.read_text(errors="replace")
        if m := LISTENING.search(text):
            port = int(m.group(1))
        if m := STATS.search(text):
            stats = int(m.group(1))
        if proc.poll() is not None:
            sys.exit(f"slow_clients: the server exited:\n{text}")
        time.sleep(0.05)
    if not (port and stats):
        sys.exit("slow_clients: the server did not start")
    return proc, port, stats


class Hostile:
    """--count connections of one kind, each re-opened when the server closes it."""

    def __init__(self, kind: str, port: int, count: int) -> None:
        self.kind, self.port, self.count = kind, port, count
        self.sel = selectors.DefaultSelector()
        self.stop = threading.Event()
        self.opened = 0
        self.reopened = 0
        self.connect_errors = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def open_one(self) -> None:
        s = socket.socket()
        if self.kind in ("reader", "shared-reader"):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", self.port))
            if self.kind == "head":
                s.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\n")
            elif self.kind == "body":
                s.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
            elif self.kind == "reader":
                s.sendall(b"GET /big?mb=100 HTTP/1.1\r\nHost: x\r\n\r\n")
            else:
                s.sendall(b"GET /big?mb=100&shared=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        except OSError:
            self.connect_errors += 1
            s.close()
            return
        s.setblocking(False)
        self.opened += 1
        # A reader never reads: only an error or hang-up (seen as readable with nothing to
        # peek at beyond what it got) would tell it was cut, so it is not watched.
        if self.kind not in ("reader", "shared-reader"):
            self.sel.register(s, selectors.EVENT_READ)
        else:
            self.readers.append(s)

    def run(self) -> None:
        self.readers: list[socket.socket] = []
        for _ in range(self.count):
            if self.stop.is_set():
                return
            self.open_one()
        last_trickle = time.monotonic()
        while not self.stop.is_set():
            for key, _ in self.sel.select(timeout=0.5):
                s = key.fileobj
                self.sel.unregister(s)
                s.close()  # type: ignore[union-attr]
                self.reopened += 1
                self.open_one()
            if self.kind == "head" and time.monotonic() - last_trickle > 5:
                # Slowloris: one more header line every 5 s, never the end of the head.
                last_trickle = time.monotonic()
                for key in list(self.sel.get_map().values()):
                    try:
                        key.fileobj.send(b"X-a: b\r\n")  # type: ignore[union-attr]
                    except OSError:
                        pass
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        for s in self.readers:
            s.close()


def normal_client(port: int, seconds: float, lat: list[float], failures: list[str]) -> None:
    end = time.monotonic() + seconds
    req = b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    while time.monotonic() < end:
        t0 = time.perf_counter()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(req)
                data = b""
                while b := s.recv(4096):
                    data += b
            if not data.startswith(b"HTTP/1.1 200 "):
                failures.append(data[:40].decode("latin-1"))
            else:
                lat.append((time.perf_counter() - t0) * 1000)
        except OSError as e:
            failures.append(type(e).__name__)
        time.sleep(0.01)


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def run_kind(kind: str, args: argparse.Namespace, workdir: Path) -> dict:  # type: ignore[type-arg]
    log = workdir / f"server-{kind}.log"
    proc, port, stats_port = start_server(log, args.server_arg)
    try:
        base_rss = rss_kib(proc.pid)
        hostile = Hostile(kind, port, args.count)
        t_open = time.monotonic()
        hostile.thread.start()
        peak = base_rss  # sampled while the hostile connections open too
        while hostile.thread.is_alive() and hostile.opened + hostile.connect_errors < args.count:
            time.sleep(0.1)
            peak = max(peak, rss_kib(proc.pid))
            if time.monotonic() - t_open > 120:
                break
        open_s = time.monotonic() - t_open
        lat: list[float] = []
        failures: list[str] = []
        client = threading.Thread(target=normal_client, args=(port, args.seconds, lat, failures))
        client.start()
        while client.is_alive():
            peak = max(peak, rss_kib(proc.pid))
            time.sleep(0.25)
        hostile.stop.set()
        hostile.thread.join(30)
        import urllib.request

        totals = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{stats_port}/stats", timeout=10).read())["totals"]
        return {
            "kind": kind, "count": args.count, "seconds": args.seconds, "open_seconds": round(open_s, 1),
            "hostile_opened": hostile.opened, "hostile_reopened": hostile.reopened,
            "hostile_connect_errors": hostile.connect_errors,
            "requests": len(lat), "failures": len(failures), "failure_kinds": sorted(set(failures))[:5],
            "p50_ms": round(pct(lat, 50), 2), "p99_ms": round(pct(lat, 99), 2),
            "max_ms": round(max(lat), 2) if lat else None,
            "mean_ms": round(statistics.fmean(lat), 2) if lat else None,
            "rss_base_mib": round(base_rss / 1024, 1), "rss_peak_mib": round(peak / 1024, 1),
            "loadavg": Path("/proc/loadavg").read_text().split()[:3],
            "server_counters": {k: totals.get(k) for k in (
                "timeouts", "body_timeouts", "write_timeouts", "budget_refusals", "budget_cuts",
                "accept_pauses", "protocol_errors")},
        }
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=5000, help="hostile connections of each kind (default 5000)")
    ap.add_argument("--seconds", type=float, default=30, help="how long the normal client measures (default 30)")
    ap.add_argument("--kinds", default="head,body,reader",
                    help="comma-separated: head, body, reader, shared-reader")
    ap.add_argument("--server-arg", action="append", default=[], help="extra server argument (repeatable)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"), help="where the results go")
    ap.add_argument("--tag", default="", help="suffix of the result file names")
    args = ap.parse_args()
    raise_fd_limit(args.count + 256)
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"slow_clients-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    rows = []
    for kind in args.kinds.split(","):
        row = run_kind(kind.strip(), args, workdir)
        print(json.dumps(row), flush=True)
        rows.append(row)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    meta = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{cpu}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "note": "shared machine: other builds ran at the same time (see loadavg per row)",
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{started:%Y-%m-%d}-slow-clients{('-' + args.tag) if args.tag else ''}"
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = [f"# Slow and hostile clients ({meta['date']})", "",
             f"- command: `{meta['command']}`", f"- machine: {meta['machine']}", f"- Python {meta['python']}",
             f"- {meta['note']}",
             "- server: default settings (one core pair)" + (f", plus {' '.join(args.server_arg)}" if args.server_arg
                                                           else ""),
             "- reader: a fresh 64 KiB bytes per response (held by the app across send()); shared-reader: "
             "one module-level 64 KiB object for every response", "",
             "| kind | hostile | normal requests | failures | p50 ms | p99 ms | max ms | RSS peak MiB | load avg | counters |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = ", ".join(f"{k}={v}" for k, v in r["server_counters"].items() if v)
        lines.append(f"| {r['kind']} | {r['hostile_opened']} (+{r['hostile_reopened']} re-opened) | {r['requests']} "
                     f"| {r['failures']} | {r['p50_ms']} | {r['p99_ms']} | {r['max_ms']} | {r['rss_peak_mib']} "
                     f"| {' '.join(r['loadavg'])} | {c} |")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print(f"slow_clients: wrote {out / stem}.md and .json")


if __name__ == "__main__":
    main()
