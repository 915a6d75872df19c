"""Timers and wake-ups of one event loop, for bench/http/driver.py (run in each peer's venv).

    python timers.py LOOP [SAMPLES]     LOOP: asyncio, uvloop, cadeloop (either the C++ one or the PyPI one,
                                        whichever the venv has)

Prints one JSON object: how late `asyncio.sleep(0.001)` returns (µs past the 1 ms, p50 and p99), and how
long a callback handed over with `call_soon_threadsafe()` from another thread takes to run on a loop that
is waiting for work (µs, p50 and p99).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import threading
import time


def new_loop(name: str) -> asyncio.AbstractEventLoop:
    if name == "asyncio":
        return asyncio.new_event_loop()
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    if name == "cadeloop":
        import cadeloop

        return cadeloop.new_event_loop()
    raise SystemExit(f"timers.py: unknown loop {name!r}")


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


async def sleep_lateness(samples: int) -> list[float]:
    late = []
    for _ in range(samples):
        t0 = time.perf_counter()
        await asyncio.sleep(0.001)
        late.append((time.perf_counter() - t0 - 0.001) * 1e6)
    return late


async def wakeups(samples: int) -> list[float]:
    loop = asyncio.get_running_loop()
    out: list[float] = []
    done = asyncio.Event()

    def arrived(t0: float) -> None:
        out.append((time.perf_counter() - t0) * 1e6)
        if len(out) == samples:
            done.set()

    def poker() -> None:
        for _ in range(samples):
            time.sleep(0.002)  # the loop is parked by now, waiting with nothing to do
            loop.call_soon_threadsafe(arrived, time.perf_counter())

    threading.Thread(target=poker, daemon=True).start()
    await done.wait()
    return out


def main() -> int:
    name = sys.argv[1]
    samples = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    loop = new_loop(name)
    try:
        late = loop.run_until_complete(sleep_lateness(samples))
        wake = loop.run_until_complete(wakeups(samples))
    finally:
        loop.close()
    print(json.dumps({"loop": name, "samples": samples,
                      "sleep_1ms_late_p50_us": statistics.median(late), "sleep_1ms_late_p99_us": pct(late, 99),
                      "wakeup_p50_us": statistics.median(wake), "wakeup_p99_us": pct(wake, 99)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
