"""call_soon_threadsafe and check before park, seen from Python: nothing is
lost from many threads, a busy loop costs producers no system call, a parked
loop is woken at once, spinning finds work without parking, and two loops run
TCP traffic in two own-GIL sub-interpreters at once (3.13)."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import Iterator

import pytest

import cadeloop


@pytest.fixture
def loop() -> Iterator[cadeloop.Loop]:
    lp = cadeloop.Loop()
    try:
        yield lp
    finally:
        lp.close()


def test_call_soon_threadsafe_from_eight_threads_loses_nothing(loop: cadeloop.Loop) -> None:
    threads_n, per_thread = 8, 5000
    received: dict[int, list[int]] = {i: [] for i in range(threads_n)}
    done = loop.create_future()
    count = 0

    def record(t: int, i: int) -> None:
        nonlocal count
        received[t].append(i)
        count += 1
        if count == threads_n * per_thread:
            done.set_result(None)

    def producer(t: int) -> None:
        for i in range(per_thread):
            loop.call_soon_threadsafe(record, t, i)
            if i % 500 == 0:
                time.sleep(0.001)  # let the loop drain and park now and then

    threads = [threading.Thread(target=producer, args=(t,)) for t in range(threads_n)]
    for t in threads:
        t.start()
    loop.run_until_complete(asyncio.wait_for(done, 60))
    for t in threads:
        t.join()
    for t in range(threads_n):
        assert received[t] == list(range(per_thread)), f"thread {t}: lost or reordered"
    stats = loop.stats()
    assert stats["xthread_items"] == threads_n * per_thread


def test_a_busy_loop_costs_its_producers_no_system_call(loop: cadeloop.Loop) -> None:
    """While the loop always has work it never parks, so call_soon_threadsafe
    from another thread must not write the eventfd even once."""
    stop = threading.Event()
    pushed = 0

    def producer() -> None:
        nonlocal pushed
        while not stop.is_set():
            loop.call_soon_threadsafe(lambda: None)
            pushed += 1
            time.sleep(0)

    async def busy() -> None:
        # Until the producer got the GIL often enough (every switch interval,
        # 5 ms, at best), or 20 s on a very loaded machine.
        deadline = loop.time() + 20
        while pushed < 30 and loop.time() < deadline:
            await asyncio.sleep(0)  # always something ready: never parks

    t = threading.Thread(target=producer)
    before = loop.stats()
    t.start()
    try:
        loop.run_until_complete(busy())
    finally:
        stop.set()
        t.join()
    after = loop.stats()
    assert pushed >= 30, "the producer did not get to run"
    assert after["xthread_items"] - before["xthread_items"] > 0
    assert after["wakeups_sent"] == before["wakeups_sent"] == 0
    assert after["polls_elided"] > 0  # no fd registered: the zero-timeout polls were skipped


def test_a_parked_loop_is_woken_at_once_by_another_thread(loop: cadeloop.Loop) -> None:
    """The loop sleeps with no timer due for an hour; each call_soon_threadsafe
    from a thread must wake it (one eventfd write) well before any timeout."""
    rounds = 200
    latencies: list[float] = []

    async def main() -> None:
        guard = loop.call_later(3600, lambda: None)  # a timer, far away
        for _ in range(rounds):
            fut = loop.create_future()
            sent = 0.0

            def from_thread() -> None:
                nonlocal sent
                time.sleep(0.0005)  # the loop is parked by now
                sent = time.monotonic()
                loop.call_soon_threadsafe(fut.set_result, None)

            t = threading.Thread(target=from_thread)
            t.start()
            await fut
            latencies.append(time.monotonic() - sent)
            t.join()
        guard.cancel()

    before = loop.stats()
    loop.run_until_complete(asyncio.wait_for(main(), 120))
    after = loop.stats()
    assert max(latencies) < 1.0, f"a wake-up was lost or late: {max(latencies):.3f}s"
    woken = after["wakeups_sent"] - before["wakeups_sent"]
    assert 0 < woken <= after["parks"] - before["parks"]
    assert woken >= rounds // 2  # most rounds found the loop asleep


def test_spin_before_park_finds_work_without_sleeping() -> None:
    loop = cadeloop.Loop(spin_us=20_000)
    try:

        async def main() -> None:
            for _ in range(20):
                fut = loop.create_future()
                threading.Timer(0.001, loop.call_soon_threadsafe, (fut.set_result, None)).start()
                await fut

        loop.run_until_complete(main())
        s = loop.stats()
        assert s["spins"] > 0
        assert s["spin_hits"] > 0
    finally:
        loop.close()


def test_stats_counters_move(loop: cadeloop.Loop) -> None:
    keys = {
        "backend", "ticks", "polls", "polls_elided", "parks", "callbacks_dispatched", "timers_fired",
        "xthread_items", "wakeups_sent", "spins", "spin_hits", "ready_len", "timers_len",
        "fds_registered", "connections", "bytes_received", "bytes_sent", "sends_posted",
        "sock_calls", "sock_waits",  # loop_sock.cpp
        "accepted",  # loop_accept.cpp
    }
    s0 = loop.stats()
    assert set(s0) == keys
    assert s0["backend"] == "epoll"
    loop.call_soon(lambda: None)
    loop.call_later(0.001, lambda: None)
    loop.call_soon_threadsafe(lambda: None)
    assert loop.stats()["ready_len"] == 1 and loop.stats()["timers_len"] == 1
    loop.call_later(0.002, loop.stop)
    loop.run_forever()
    s1 = loop.stats()
    assert s1["ticks"] > s0["ticks"]
    assert s1["callbacks_dispatched"] - s0["callbacks_dispatched"] == 4
    assert s1["timers_fired"] - s0["timers_fired"] == 2
    assert s1["xthread_items"] - s0["xthread_items"] == 1
    assert s1["ready_len"] == 0 and s1["timers_len"] == 0


# Own-GIL sub-interpreters through 3.13's _interpreters module.
if sys.version_info >= (3, 13):

    SUBINTERPRETER_ECHO = """
import asyncio, cadeloop, threading
async def main():
    async def handle(reader, writer):
        while line := await reader.readline():
            writer.write(line.upper())
            await writer.drain()
        writer.close()
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for i in range(300):
        writer.write(b"line %d\\n" % i)
        await writer.drain()
        assert await reader.readline() == b"LINE %d\\n" % i
    writer.close()
    await writer.wait_closed()
    fut = asyncio.get_running_loop().create_future()
    threading.Thread(target=lambda: fut.get_loop().call_soon_threadsafe(fut.set_result, 1)).start()
    assert await fut == 1
    server.close()
    await server.wait_closed()
    return type(asyncio.get_running_loop()).__name__
assert cadeloop.run(main()) == "Loop"
"""

    def test_two_loops_in_two_own_gil_subinterpreters_run_tcp_traffic() -> None:
        import _interpreters  # type: ignore[import-not-found]

        results: list[object] = []

        def worker() -> None:
            iid = _interpreters.create("isolated")
            try:
                results.append(_interpreters.exec(iid, SUBINTERPRETER_ECHO))
            finally:
                _interpreters.destroy(iid)

        threads = [threading.Thread(target=worker) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert results == [None, None]
