#!/usr/bin/env python3
"""Draws a driver.py result (bench/results/*.json) as a PNG for the docs.

    python bench/http/plot.py bench/results/2026-11-30-http-servers.json docs/img/http-servers.png
    python bench/http/plot.py bench/results/2026-11-30-http-accesslog-collector.json docs/img/accesslog.png

A side-by-side run (each server once per workload) becomes two bar charts:
requests per second and server CPU per request, per workload and server. A
run with --rounds becomes, per workload, each server's requests per second
round by round, so the spread between rounds (the host) can be seen next to
the gap between servers. Needs matplotlib (pip install matplotlib).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    if len(sys.argv) != 3:
        print("usage: plot.py RESULT.json OUT.png", file=sys.stderr)
        return 2
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(Path(sys.argv[1]).read_text())
    results = [r for r in data["results"] if r["rps"]]
    workloads = list(dict.fromkeys(r["workload"] for r in results))
    servers = list(dict.fromkeys(r["server"] for r in results))
    rounds = any("round" in r["extra"] for r in results)

    if rounds:
        fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 3.6), squeeze=False)
        for ax, w in zip(axes[0], workloads):
            for s in servers:
                runs = [r for r in results if r["workload"] == w and r["server"] == s]
                ax.plot([r["extra"]["round"] + 1 for r in runs], [r["rps"] / 1000 for r in runs],
                        marker="o", markersize=3, label=s)
            ax.set_title(w, fontsize=10)
            ax.set_xlabel("round")
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.set_ylabel("thousand requests/s")
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, loc="lower right")
    else:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4))
        width = 0.8 / len(servers)
        for k, (ax, key, label) in enumerate(zip(
                axes, ("rps", "cpu_us_per_request"), ("thousand requests/s", "server CPU µs per request"))):
            for i, s in enumerate(servers):
                xs, ys = [], []
                for j, w in enumerate(workloads):
                    r = next((r for r in results if r["workload"] == w and r["server"] == s), None)
                    if r:
                        xs.append(j + i * width)
                        ys.append(r[key] / 1000 if key == "rps" else r[key])
                ax.bar(xs, ys, width, label=s)
            ax.set_xticks([j + width * (len(servers) - 1) / 2 for j in range(len(workloads))])
            ax.set_xticklabels([w.replace(", ", "\n") for w in workloads], fontsize=8)
            ax.set_ylabel(label)
            ax.grid(axis="y", alpha=0.3)
            if k == 0:
                ax.legend(fontsize=8)
    fig.suptitle(f"{Path(sys.argv[1]).stem}\n{data['machine']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print(f"written: {sys.argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
