#!/usr/bin/env python3
"""Scheduling microbenchmarks: cadeloop.Loop vs asyncio's default loop vs uvloop.

Each workload runs on a fresh loop per implementation, best of --repeat runs.
Reports operations per second (higher is better) or a round-trip time
(lower is better), and cadeloop's wake-up counters for the cross-thread case.

    .venv/bin/python -m pip install -r bench/loop/requirements.txt   # uvloop, optional
    .venv/bin/python bench/loop/sched_bench.py [--repeat 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import sys
import threading
import time
from typing import Any, Callable

import cadeloop


def loop_factories() -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    out: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
        "asyncio": asyncio.SelectorEventLoop,
        "cadeloop": cadeloop.Loop,
    }
    try:
        import uvloop  # type: ignore[import-not-found]

        out["uvloop"] = uvloop.new_event_loop
    except ImportError:
        pass
    return out


def call_soon_chain(loop: asyncio.AbstractEventLoop, n: int = 300_000) -> float:
    """One callback at a time, each scheduling the next: per-pass overhead."""
    left = n

    def step() -> None:
        nonlocal left
        left -= 1
        if left:
            loop.call_soon(step)
        else:
            loop.stop()

    loop.call_soon(step)
    t0 = time.perf_counter()
    loop.run_forever()
    return n / (time.perf_counter() - t0)


def call_soon_fanout(loop: asyncio.AbstractEventLoop, n: int = 300_000) -> float:
    """Many callbacks ready at once: the ready queue and handle cost."""
    noop = lambda: None  # noqa: E731
    t0 = time.perf_counter()
    for _ in range(n):
        loop.call_soon(noop)
    loop.call_soon(loop.stop)
    loop.run_forever()
    return n / (time.perf_counter() - t0)


def timers_with_cancel(loop: asyncio.AbstractEventLoop, n: int = 100_000) -> float:
    """Schedule n timers over 20 ms, cancel half of them, run until all fired."""
    rng = random.Random(1)
    noop = lambda: None  # noqa: E731
    t0 = time.perf_counter()
    handles = [loop.call_later(rng.random() * 0.02, noop) for _ in range(n)]
    for h in handles[::2]:
        h.cancel()
    loop.call_later(0.021, loop.stop)
    loop.run_forever()
    return n / (time.perf_counter() - t0)


def tasks_gather(loop: asyncio.AbstractEventLoop, n: int = 20_000) -> float:
    """Create n tasks that each yield twice: Task/Future callback traffic."""

    async def child() -> None:
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(*(child() for _ in range(n)))

    t0 = time.perf_counter()
    loop.run_until_complete(main())
    return n / (time.perf_counter() - t0)


def threadsafe_round_trip(loop: asyncio.AbstractEventLoop, n: int = 5_000) -> float:
    """A thread and the loop hand a token back and forth; the loop parks between.
    Returns microseconds per round trip."""
    to_thread = threading.Semaphore(0)
    done = threading.Event()
    fut_box: list[asyncio.Future[None]] = []

    def peer() -> None:
        for _ in range(n):
            to_thread.acquire()
            loop.call_soon_threadsafe(fut_box[0].set_result, None)
        done.set()

    async def main() -> None:
        for _ in range(n):
            fut_box[:] = [loop.create_future()]
            to_thread.release()
            await fut_box[0]

    t = threading.Thread(target=peer)
    t.start()
    t0 = time.perf_counter()
    loop.run_until_complete(main())
    elapsed = time.perf_counter() - t0
    t.join()
    return elapsed / n * 1e6


WORKLOADS: list[tuple[str, Callable[[asyncio.AbstractEventLoop], float], str]] = [
    ("call_soon chain", call_soon_chain, "callbacks/s"),
    ("call_soon fan-out", call_soon_fanout, "callbacks/s"),
    ("timers, half cancelled", timers_with_cancel, "timers/s"),
    ("tasks + gather", tasks_gather, "tasks/s"),
    ("call_soon_threadsafe round trip", threadsafe_round_trip, "us/trip"),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    factories = loop_factories()
    results: dict[str, dict[str, float]] = {}
    extra: dict[str, Any] = {}
    for name, fn, unit in WORKLOADS:
        results[name] = {}
        for impl, factory in factories.items():
            samples = []
            for _ in range(args.repeat):
                loop = factory()
                try:
                    samples.append(fn(loop))
                    if impl == "cadeloop" and fn is threadsafe_round_trip:
                        s = loop.stats()  # type: ignore[attr-defined]
                        extra["cadeloop threadsafe stats"] = {k: s[k] for k in ("parks", "wakeups_sent", "xthread_items")}
                finally:
                    loop.close()
            results[name][impl] = min(samples) if unit == "us/trip" else max(samples)
    print(f"CPython {platform.python_version()} on {platform.machine()}, best of {args.repeat}")
    impls = list(factories)
    print(f"{'workload':<34}" + "".join(f"{i:>14}" for i in impls) + "   unit")
    for name, _, unit in WORKLOADS:
        row = results[name]
        print(f"{name:<34}" + "".join(f"{row[i]:>14,.1f}" for i in impls) + f"   {unit}")
    for k, v in extra.items():
        print(f"{k}: {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"python": platform.python_version(), "results": results, "extra": extra}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
