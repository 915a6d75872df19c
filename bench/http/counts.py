#!/usr/bin/env python3
"""Per-request counts of one server on plaintext: system calls, instructions, context switches.

The baseline issue 16's item 2 asks for ("show the instruction and syscall counts per request before and
after"). For each server and each connection count (64 and 1 by default), against a fresh server on the
server CPU with bench/http/loadgen.cpp on the load CPU:

- `strace -c -f` attached to every thread of the server for a run of --requests requests: calls per request
  by system call (strace slows the server a lot, so these are counts, not times);
- per thread of the server (from /proc, no tracer attached): CPU time and voluntary and involuntary context
  switches per request over a timed run, which shows how many threads do the work;
- `perf stat` software events over a timed run: task-clock, context switches, CPU migrations, page faults
  per request (and `instructions`, which many VMs do not expose: then it says "not supported");
- with --callgrind: user-space instructions per request from valgrind's callgrind, as the difference of two
  runs of N and 2N requests divided by N, so start-up and shutdown cancel out.

    python bench/http/counts.py --servers cadeloop,c-floor --tag counts-baseline
    python bench/http/counts.py --servers cadeloop --connections 1 --callgrind
    python bench/http/counts.py --servers cadeloop-base,cadeloop --baseline ../old-checkout --tag ab
    python bench/http/counts.py --servers cadeloop --connections 64 --pipeline 16 --tag pipelined

--baseline names another checkout with its own .venv (an older build): its server is cadeloop-base.

Writes bench/results/DATE-http-TAG.md and .json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from driver import RESULTS, TOOLS, WORKLOADS, build_tools, machine, servers, start_server, stop_server, tree_pids

STRACE_LINE = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:(\d+)\s+)?(\w+)\s*$")


PIPELINE = 1  # --pipeline: requests each connection keeps in flight


def loadgen(port: int, connections: int, cpu: int, duration: float, requests: int = 0) -> dict:
    argv = ["taskset", "-c", str(cpu), str(TOOLS / "loadgen"), "--port", str(port), "--connections",
            str(connections), "--duration", str(duration), "--expect-length", "13", "--pipeline", str(PIPELINE)]
    if requests:
        argv += ["--requests", str(requests)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 120)
    return json.loads(out.stdout)


def threads(pid: int) -> list[int]:
    """Every thread of every process in the server's tree."""
    out = []
    for p in tree_pids(pid):
        try:
            out += [int(t.name) for t in Path(f"/proc/{p}/task").iterdir()]
        except OSError:
            pass
    return out


def strace_counts(pid: int, port: int, connections: int, args: argparse.Namespace) -> dict:
    tids = threads(pid)
    argv = ["strace", "-c", "-f", "-o", "/tmp/counts-strace.txt"]
    for t in tids:
        argv += ["-p", str(t)]
    st = subprocess.Popen(argv, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    figures = loadgen(port, connections, args.load_cpu, 120, args.requests)
    st.send_signal(2)
    st.wait(timeout=30)
    calls: dict[str, int] = {}
    for line in Path("/tmp/counts-strace.txt").read_text().splitlines():
        if m := STRACE_LINE.match(line):
            calls[m.group(3)] = int(m.group(1))
    n = figures["requests"]
    return {"requests": n, "errors": figures["errors"],
            "per_request": {k: v / n for k, v in sorted(calls.items(), key=lambda kv: -kv[1]) if k != "total"},
            "total_per_request": sum(v for k, v in calls.items() if k != "total") / n}


def thread_snapshot(pid: int) -> dict[str, tuple[str, int, int, int]]:
    """Per thread of the server's tree: its name, CPU ticks (utime+stime) and voluntary and involuntary
    context switches, from /proc (no tracer attached)."""
    out = {}
    for p in tree_pids(pid):
        try:
            tasks = list(Path(f"/proc/{p}/task").iterdir())
        except OSError:
            continue
        for t in tasks:
            try:
                status = (t / "status").read_text()
                fields = (t / "stat").read_text().rsplit(")", 1)[1].split()
                name = (t / "comm").read_text().strip()
            except OSError:
                continue
            vol = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
            invol = int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
            out[f"{p}/{t.name}"] = (name, int(fields[11]) + int(fields[12]), vol, invol)
    return out


def thread_counts(pid: int, port: int, connections: int, args: argparse.Namespace) -> dict:
    """Which threads do the work: per thread, CPU µs and context switches per request over a timed run."""
    before = thread_snapshot(pid)
    figures = loadgen(port, connections, args.load_cpu, args.duration)
    after = thread_snapshot(pid)
    n = max(figures["requests"], 1)
    tick_us = 1e6 / os.sysconf("SC_CLK_TCK")
    rows = []
    for tid, (name, ticks, vol, invol) in after.items():
        b = before.get(tid, (name, 0, 0, 0))
        d = (ticks - b[1], vol - b[2], invol - b[3])
        if any(d):
            rows.append({"thread": tid, "name": name, "cpu_us": d[0] * tick_us / n, "voluntary": d[1] / n,
                         "involuntary": d[2] / n})
    return {"requests": figures["requests"], "threads_total": len(after), "busy": rows}


def perf_counts(pid: int, port: int, connections: int, args: argparse.Namespace) -> dict:
    events = "instructions,task-clock,context-switches,cpu-migrations,page-faults"
    tids = ",".join(str(t) for t in threads(pid))
    perf = subprocess.Popen(["perf", "stat", "-x", ";", "-e", events, "-t", tids, "-o", "/tmp/counts-perf.txt"],
                            stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    figures = loadgen(port, connections, args.load_cpu, args.duration)
    perf.send_signal(2)
    perf.wait(timeout=30)
    out: dict = {"requests": figures["requests"], "rps": figures["rps"], "errors": figures["errors"]}
    for line in Path("/tmp/counts-perf.txt").read_text().splitlines():
        parts = line.split(";")
        if len(parts) < 3 or line.startswith("#"):
            continue
        value, event = parts[0], parts[2]
        if value.startswith("<not"):
            out[event] = "not supported"
        elif value:
            out[event] = float(value) / figures["requests"]  # task-clock in ms per request
    if isinstance(out.get("task-clock"), float):
        out["task-clock µs"] = out.pop("task-clock") * 1000
    return out


def callgrind_ir(server_key: str, connections: int, args: argparse.Namespace) -> dict:
    """User-space instructions per request: callgrind totals of a run of N and of 2N requests."""
    totals = []
    for n in (args.callgrind_requests, 2 * args.callgrind_requests):
        server = servers(args.port, args.baseline)[server_key]
        out = Path(f"/tmp/counts-callgrind-{n}.out")
        out.unlink(missing_ok=True)
        argv = [server.python, *server.argv] if server.python != server.argv[0] else server.argv
        server.argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *argv]
        proc, error = start_server(server, args.port, argparse.Namespace(server_cpu=args.server_cpu), timeout=300)
        if error:
            return {"error": error}
        loadgen(args.port, connections, args.load_cpu, 600, n)
        stop_server(proc)
        text = out.read_text(errors="replace") if out.exists() else ""
        m = re.search(r"^(?:totals|summary):\s+(\d+)", text, re.M)
        totals.append(int(m.group(1)) if m else 0)
    n = args.callgrind_requests
    return {"requests": [n, 2 * n], "ir_totals": totals, "ir_per_request": (totals[1] - totals[0]) / n}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", default="cadeloop,c-floor")
    p.add_argument("--connections", default="64,1")
    p.add_argument("--requests", type=int, default=20000, help="requests of the strace run")
    p.add_argument("--duration", type=float, default=5.0, help="seconds of the perf stat run")
    p.add_argument("--callgrind", action="store_true")
    p.add_argument("--callgrind-requests", type=int, default=2000)
    p.add_argument("--port", type=int, default=18480)
    p.add_argument("--server-cpu", type=int, default=0)
    p.add_argument("--load-cpu", type=int, default=1)
    p.add_argument("--tag", default="counts")
    p.add_argument("--baseline", type=Path, help="another checkout with its own .venv: the server cadeloop-base")
    p.add_argument("--pipeline", type=int, default=1, help="requests each connection keeps in flight")
    args = p.parse_args()
    global PIPELINE
    PIPELINE = args.pipeline
    build_tools()
    report: dict = {"command": "python bench/http/counts.py " + " ".join(sys.argv[1:]), "machine": machine(),
                    "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d"),
                    "loadavg": Path("/proc/loadavg").read_text().split()[:3], "servers": {}}
    for key in args.servers.split(","):
        server = servers(args.port, args.baseline)[key]
        entry: dict = {}
        for c in (int(x) for x in args.connections.split(",")):
            proc, error = start_server(server, args.port, args)
            if error:
                entry[str(c)] = {"error": error}
                continue
            try:
                loadgen(args.port, c, args.load_cpu, 1.0)  # warm-up
                row = {"threads": thread_counts(proc.pid, args.port, c, args),
                       "perf": perf_counts(proc.pid, args.port, c, args),
                       "strace": strace_counts(proc.pid, args.port, c, args)}
            finally:
                stop_server(proc)
            if args.callgrind:
                row["callgrind"] = callgrind_ir(key, c, args)
            entry[str(c)] = row
            print(f"{server.name} {c} conn: {json.dumps(row)[:600]}", flush=True)
        report["servers"][server.name] = entry
    write(report, args.tag)
    return 0


def write(report: dict, tag: str) -> None:
    stem = RESULTS / f"{report['date']}-http-{tag}"
    lines = [f"# Per-request counts, plaintext, {report['date']}", "",
             f"- command: `{report['command']}`", f"- machine: {report['machine']}",
             f"- load average at the start: {' '.join(report['loadavg'])}",
             "- server alone on its CPU, bench/http/loadgen.cpp on the other; `GET /` answered \"Hello, World!\""
             + (f", pipelined x{PIPELINE}" if PIPELINE > 1 else ""),
             "- strace -c -f attached to every thread: calls per request (strace slows the server: counts, not times)",
             "- perf stat (software events; this VM does not expose hardware counters such as instructions)", ""]
    for name, entry in report["servers"].items():
        for conns, row in entry.items():
            lines += [f"## {name}, {conns} connection{'s' if conns != '1' else ''}", ""]
            if "error" in row:
                lines += [row["error"], ""]
                continue
            th = row["threads"]
            lines += [f"threads over {th['requests']} requests (from /proc, no tracer): {th['threads_total']} in the "
                      "server's tree; those that ran:", "",
                      "| thread | CPU µs / request | voluntary switches / request | involuntary / request |",
                      "|---|---:|---:|---:|"]
            lines += [f"| {r['name']} ({r['thread']}) | {r['cpu_us']:.2f} | {r['voluntary']:.3f} | {r['involuntary']:.3f} |"
                      for r in th["busy"]]
            lines.append("")
            pf = row["perf"]
            lines.append(f"perf stat over {pf['requests']} requests ({pf['rps']:.0f} req/s, {pf['errors']} errors): "
                         + ", ".join(f"{k} {v:.3f}/request" if isinstance(v, float) else f"{k} {v}"
                                     for k, v in pf.items() if k not in ("requests", "rps", "errors")))
            lines.append("")
            st = row["strace"]
            lines += [f"strace -c -f over {st['requests']} requests ({st['errors']} errors): "
                      f"{st['total_per_request']:.2f} system calls per request", "",
                      "| system call | per request |", "|---|---:|"]
            lines += [f"| {k} | {v:.3f} |" for k, v in st["per_request"].items() if v >= 0.001]
            if "callgrind" in row:
                cg = row["callgrind"]
                lines += ["", f"callgrind: {cg.get('ir_per_request', cg.get('error'))} user-space instructions per "
                          f"request (totals {cg.get('ir_totals')} for {cg.get('requests')} requests)"]
            lines.append("")
    stem.with_suffix(".md").write_text("\n".join(lines))
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1))
    print(f"written: {stem.with_suffix('.md')}")


if __name__ == "__main__":
    sys.exit(main())
