#!/usr/bin/env python3
"""User-space instructions per request of one server on any workload of bench/http/driver.py, from
valgrind's callgrind: a run of N requests and one of 2N, each under a fresh server, and the difference of
their totals divided by N, so start-up and shutdown cancel out. Instruction counts do not depend on what
else the machine runs, which makes them the A/B measure on a shared machine (CPU time from /proc is the
other; this one misses the kernel's side: count system calls with bench/http/counts.py).

    python bench/http/ir.py --servers cadeloop --workloads upload,pipelined,plaintext,json
    python bench/http/ir.py --baseline build/base --servers cadeloop-base,cadeloop --workloads upload
    python bench/http/ir.py --servers cadeloop --workloads upload --keep   # keep the 2N run's profile:
                                                                           # callgrind_annotate it
    python bench/http/ir.py --servers cadeloop --workloads plaintext --cache-sim --keep
        # also cache misses per request from callgrind's cache simulation (a model of this CPU's
        # L1 and last-level caches, not the hardware's counters, which this VM does not expose), and
        # with --keep the functions that miss the most

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
from pathlib import Path

from driver import RESULTS, TOOLS, WORKLOADS, build_tools, machine, servers, start_server, stop_server


def load(port: int, w, requests: int, cpu: int) -> dict:
    argv = ["taskset", "-c", str(cpu), str(TOOLS / "loadgen"), "--port", str(port), "--path", w.path,
            "--connections", str(min(w.connections, 16)), "--duration", "900", "--pipeline", str(w.pipeline),
            "--expect-status", "200", "--expect-length", str(w.expect_length), "--requests", str(requests)]
    if w.new_conn:
        argv.append("--new-conn")
    if w.body_size:
        argv += ["--method", "POST", "--body-size", str(w.body_size)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=1000)
    return json.loads(out.stdout)


# The events of a --cache-sim run reported per request: instructions, first-level instruction-cache misses,
# first-level data-cache read and write misses, and last-level data misses.
CACHE_EVENTS = ("Ir", "I1mr", "D1mr", "D1mw", "DLmr", "DLmw")


def total_ir(key: str, w, n: int, args: argparse.Namespace, baseline: Path | None,
             keep: Path | None) -> dict[str, int]:
    server = servers(args.port, baseline)[key]
    out = keep or Path(f"/tmp/ir-callgrind-{key}-{n}.out")
    out.unlink(missing_ok=True)
    argv = [server.python, *server.argv] if server.python != server.argv[0] else server.argv
    # A baseline checkout's launcher may re-execute Python (to put its own build first on the path of every
    # interpreter): valgrind follows that exec for it; the profile is the re-executed process's.
    trace = "yes" if key == "cadeloop-base" else "no"
    server.argv = ["valgrind", "--tool=callgrind", f"--trace-children={trace}", f"--callgrind-out-file={out}",
                   *(["--cache-sim=yes"] if args.cache_sim else []), *argv]
    proc, error = start_server(server, args.port, argparse.Namespace(server_cpu=args.server_cpu), timeout=600)
    if error:
        raise RuntimeError(f"{key}: {error}")
    try:
        figures = load(args.port, w, n, args.load_cpu)
        if figures.get("errors"):
            raise RuntimeError(f"{key}: {figures['errors']} errors: {figures.get('errors_by_kind')}")
    finally:
        stop_server(proc)
    text = out.read_text(errors="replace") if out.exists() else ""
    names = re.search(r"^events:\s+(.*)$", text, re.M)
    m = re.search(r"^(?:totals|summary):\s+(.*)$", text, re.M)
    if not keep:
        out.unlink(missing_ok=True)
    if not names or not m:
        return {"Ir": 0}
    return {k: int(v) for k, v in zip(names.group(1).split(), m.group(1).split())}


def per_function(path: Path, event: str = "Ir") -> dict[str, int]:
    out = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=100", "--auto=no", f"--show={event}",
                          f"--sort={event}", str(path)],
                         capture_output=True, text=True).stdout
    costs: dict[str, int] = {}
    for line in out.splitlines():
        if m := re.match(r"^\s*([\d,]+)\s+\([^)]*\)\s+(.*)$", line):
            # "file:function [object]": file and object are dropped (a function's lines inlined from headers
            # then count with it); a C++ name keeps its "::" (the first lone colon ends the file).
            name = re.sub(r"^[^:\s]*:(?!:)", "", m.group(2).replace("'2", ""), count=1)
            name = re.sub(r" \[[^\]]*\]$", "", name)  # the object too: inlined lines carry none
            costs[name] = costs.get(name, 0) + int(m.group(1).replace(",", ""))
    return costs


def print_top(a: Path, b: Path, n: int, top: int = 40, event: str = "Ir") -> None:
    """The functions whose count of `event` grew most from the N run to the 2N run, per request."""
    print(f"  {event} per request, by function:")
    ca, cb = per_function(a, event), per_function(b, event)
    diff = sorted(((cb.get(k, 0) - ca.get(k, 0)) / n, k) for k in set(ca) | set(cb))
    for cost, name in reversed(diff[-top:]):
        print(f"  {cost:9.0f}  {name[:150]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", default="cadeloop")
    p.add_argument("--workloads", default="upload,pipelined,plaintext,json")
    p.add_argument("--requests", type=int, default=4000, help="N: runs of N and 2N requests")
    p.add_argument("--baseline", type=Path, default=None, help="another tree with its own .venv: cadeloop-base")
    p.add_argument("--keep", action="store_true",
                   help="keep the profiles (/tmp/ir-KEY-WORKLOAD-n.out, -2n.out) and print the functions that "
                        "cost the most per request (their difference)")
    p.add_argument("--port", type=int, default=18580)
    p.add_argument("--server-cpu", type=int, default=0)
    p.add_argument("--load-cpu", type=int, default=1)
    p.add_argument("--cache-sim", action="store_true",
                   help="simulate the caches too and report cache misses per request")
    p.add_argument("--tag", default="")
    args = p.parse_args()
    # A fixed str hash seed for every server run: CPython's dict probes then
    # collide the same way in each run, which otherwise moves a total by a
    # few hundred instructions per request (the app's own dicts included).
    os.environ.setdefault("PYTHONHASHSEED", "0")
    build_tools()
    baseline = args.baseline.resolve() if args.baseline else None
    rows = []
    for wname in args.workloads.split(","):
        w = WORKLOADS[wname]
        for key in args.servers.split(","):
            n = args.requests
            keep_a = Path(f"/tmp/ir-{key}-{wname}-n.out") if args.keep else None
            keep_b = Path(f"/tmp/ir-{key}-{wname}-2n.out") if args.keep else None
            a = total_ir(key, w, n, args, baseline, keep_a)
            b = total_ir(key, w, 2 * n, args, baseline, keep_b)
            row = {"workload": wname, "server": servers(args.port, baseline)[key].name, "requests": [n, 2 * n],
                   "totals": [a["Ir"], b["Ir"]], "ir_per_request": (b["Ir"] - a["Ir"]) / n}
            if args.cache_sim:
                row["per_request"] = {e: (b.get(e, 0) - a.get(e, 0)) / n for e in CACHE_EVENTS}
            rows.append(row)
            if args.keep:
                print_top(keep_a, keep_b, n)
                if args.cache_sim:
                    print_top(keep_a, keep_b, n, event="I1mr")
                    print_top(keep_a, keep_b, n, event="D1mr")
                    print_top(keep_a, keep_b, n, event="D1mw")
            print(f"{wname:10} {row['server']:40} {row['ir_per_request']:10.0f} instructions/request", flush=True)
            if args.cache_sim:
                print("   " + ", ".join(f"{e} {v:.1f}" for e, v in row["per_request"].items() if e != "Ir"),
                      "per request", flush=True)
    if args.tag:
        date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
        stem = RESULTS / f"{date}-http-{args.tag}"
        lines = [f"# User-space instructions per request (callgrind), {date}", "",
                 f"- command: `python bench/http/ir.py {' '.join(sys.argv[1:])}`", f"- machine: {machine()}",
                 "- (totals of a run of 2N requests minus one of N) / N, fresh server each run, "
                 "at most 16 connections (valgrind serialises threads), "
                 f"PYTHONHASHSEED={os.environ['PYTHONHASHSEED']}", "",
                 "| workload | server | instructions/request |", "|---|---|---:|"]
        lines += [f"| {r['workload']} | {r['server']} | {r['ir_per_request']:.0f} |" for r in rows]
        if args.cache_sim:
            lines += ["", "Cache misses per request, callgrind's cache simulation (a model of this CPU's "
                      "caches, not hardware counters):", "",
                      "| workload | server | " + " | ".join(CACHE_EVENTS[1:]) + " |",
                      "|---|---|" + "---:|" * (len(CACHE_EVENTS) - 1)]
            lines += [f"| {r['workload']} | {r['server']} | "
                      + " | ".join(f"{r['per_request'][e]:.1f}" for e in CACHE_EVENTS[1:]) + " |" for r in rows]
        stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
        stem.with_suffix(".json").write_text(json.dumps({"command": lines[2], "rows": rows}, indent=1))
        print(f"written: {stem.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
