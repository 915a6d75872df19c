#!/usr/bin/env python3
"""A/B of loop builds, side by side: run.py's samples with one more loop, an older cadeloop.

    python bench/loop/ab.py --base DIR [--runs 5] [--cpu 1] WORKLOAD ...

DIR holds a copy of an older installed `cadeloop` package (cp -a
.venv/lib/python3.13/site-packages/cadeloop DIR/ before installing the new
one); its samples run with PYTHONPATH=DIR and show as "cadeloop (base)".
Every sample is a fresh process (workloads.py LOOP WORKLOAD) pinned to one
CPU; the four loops take turns in a rotating order; the table is the median
operations per CPU second of the process (/proc/PID/stat) and the ratios.
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
LOOPS = ["asyncio", "uvloop", "cadeloop (base)", "cadeloop"]


def sample(loop: str, workload: str, base: str, cpu: int | None) -> float:
    env = dict(os.environ)
    name = loop
    if loop == "cadeloop (base)":
        env["PYTHONPATH"] = base + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        name = "cadeloop"
    cmd = [sys.executable, str(HERE / "workloads.py"), name, workload]
    if cpu is not None:
        cmd = ["taskset", "-c", str(cpu), *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{loop} {workload} failed:\n{out.stderr[-2000:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return float(got.get("per_cpu_second") or got["value"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="directory holding the older cadeloop package")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cpu", type=int, default=1, help="CPU to pin to (-1: none)")
    ap.add_argument("workloads", nargs="+")
    args = ap.parse_args()
    if not (Path(args.base) / "cadeloop" / "__init__.py").is_file():
        print(f"ab.py: --base {args.base}: no cadeloop package there", file=sys.stderr)
        return 2
    cpu = None if args.cpu < 0 else args.cpu
    print(f"load average before: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    print("| workload | asyncio | uvloop | cadeloop (base) | cadeloop | base / uvloop | new / uvloop | new / base |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for w in args.workloads:
        got: dict[str, list[float]] = {loop: [] for loop in LOOPS}
        for r in range(args.runs):
            for i in range(len(LOOPS)):
                loop = LOOPS[(r + i) % len(LOOPS)]
                got[loop].append(sample(loop, w, args.base, cpu))
        med = {loop: statistics.median(v) for loop, v in got.items()}
        print(f"| {w} | {med['asyncio']:,.0f} | {med['uvloop']:,.0f} | {med['cadeloop (base)']:,.0f} | "
              f"{med['cadeloop']:,.0f} | {med['cadeloop (base)'] / med['uvloop']:.2f} | "
              f"{med['cadeloop'] / med['uvloop']:.2f} | {med['cadeloop'] / med['cadeloop (base)']:.2f} |", flush=True)
    print(f"load average after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
