#!/usr/bin/env python3
"""Pipes and subprocesses on cadeloop.Loop: the C++ paths against asyncio's Python ones, same build.

    .venv/bin/python bench/loop/pipes_before_after.py [--runs 5] [--cpu 1]

"after" is cadeloop.Loop as it is (C++ pipe transports, pidfd child watching
in the loop's fd table); "before" is the same loop with its three overrides
(_make_read_pipe_transport, _make_write_pipe_transport,
_make_subprocess_transport) removed, so asyncio's Python pipe transports and
its child watcher run over cadeloop's core, as before they existed. Each
sample is a fresh process (bench/loop/workloads.py), pinned to one CPU, the
two taking turns; the figure is the median of operations per CPU second of
the benchmark process (/proc/self/stat). bench/loop/run.py gives the same
workloads against asyncio and uvloop.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOADS = ["pipe_ping_pong_1k", "subprocess_spawn_wait", "subprocess_echo_256k"]

BEFORE = """import runpy, sys, cadeloop._loop as L
for name in ("_make_read_pipe_transport", "_make_write_pipe_transport", "_make_subprocess_transport"):
    delattr(L.Loop, name)
sys.argv = ["workloads.py", "cadeloop", {workload!r}]
runpy.run_path({path!r}, run_name="__main__")
"""


def sample(variant: str, workload: str, cpu: int | None) -> float:
    if variant == "after":
        cmd = [sys.executable, str(HERE / "workloads.py"), "cadeloop", workload]
    else:
        cmd = [sys.executable, "-c", BEFORE.format(workload=workload, path=str(HERE / "workloads.py"))]
    if cpu is not None:
        cmd = ["taskset", "-c", str(cpu), *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600).stdout
    got = json.loads(out.strip().splitlines()[-1])
    return float(got["per_cpu_second"] or got["value"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cpu", type=int, default=1, help="CPU to pin every sample to (-1: no pinning)")
    ap.add_argument("--only", nargs="*", help="workloads (default: the pipe and subprocess ones)")
    args = ap.parse_args()
    cpu = None if args.cpu < 0 else args.cpu
    print(f"CPython {sys.version.split()[0]}, load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'workload':<24} {'before /CPU s':>14} {'after /CPU s':>14} {'after/before':>13}")
    for workload in args.only or WORKLOADS:
        runs: dict[str, list[float]] = {"before": [], "after": []}
        for r in range(args.runs):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for variant in order:
                runs[variant].append(sample(variant, workload, cpu))
        before, after = statistics.median(runs["before"]), statistics.median(runs["after"])
        print(f"{workload:<24} {before:>14,.0f} {after:>14,.0f} {after / before:>13.2f}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
