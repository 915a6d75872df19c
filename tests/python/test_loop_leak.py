"""No leak: a round of 1,000,000 callbacks, 100,000 timers (half cancelled)
and 10,000 TCP connections opened and closed leaves the process's resident
memory within 5 % of where it was after an identical warm-up round (which
primes pymalloc's arenas, the allocator's free lists and the loop's vectors).

A leak of one object per callback, timer or connection is caught: a handle
is about 100 bytes (1M of them, 100 MB), a transport with its socket, core
and protocol several kilobytes (10,000 of them, tens of MB), against a
baseline of roughly 30-40 MB."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import struct
import warnings
import weakref

import pytest

import cadeloop

CALLBACKS = 1_000_000
TIMERS = 100_000
CONNECTIONS = 10_000
CONCURRENT = 100  # connections open at once


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def callbacks_round(loop: cadeloop.Loop) -> None:
    left = CALLBACKS
    noop_args = (1, "two")

    def step(*_: object) -> None:
        nonlocal left
        left -= 1
        if left == 0:
            loop.stop()

    # In batches, so the ready queue does not hold a million handles at once
    # (that would measure the deque's peak, not a leak).
    def batch() -> None:
        for _ in range(1000):
            loop.call_soon(step, *noop_args)
        if left > 1000:
            loop.call_soon(batch)

    loop.call_soon(batch)
    loop.run_forever()
    assert left == 0


def timers_round(loop: cadeloop.Loop) -> None:
    fired = 0

    def hit() -> None:
        nonlocal fired
        fired += 1

    handles = [loop.call_later(0.001 + (i % 100) * 0.0001, hit) for i in range(TIMERS)]
    for h in handles[::2]:
        h.cancel()
    del handles
    loop.run_until_complete(asyncio.sleep(0.05))
    assert fired == TIMERS // 2
    assert loop.stats()["timers_len"] == 0


class _Server(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)  # type: ignore[attr-defined]


class _Client(asyncio.Protocol):
    def __init__(self, done: asyncio.Future[None]) -> None:
        self.done = done

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        # Reset on close instead of TIME_WAIT, so 20,000 connections per run
        # do not use up the ephemeral ports.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.write(b"ping")  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.done.set_result(None)


def connections_round(loop: cadeloop.Loop) -> None:
    async def main() -> None:
        server = await loop.create_server(_Server, "127.0.0.1", 0, backlog=1024)
        port = server.sockets[0].getsockname()[1]

        async def one() -> None:
            done = loop.create_future()
            await loop.create_connection(lambda: _Client(done), "127.0.0.1", port)
            await done

        for _ in range(CONNECTIONS // CONCURRENT):
            await asyncio.gather(*(one() for _ in range(CONCURRENT)))
        server.close()
        await server.wait_closed()
        await asyncio.sleep(0.01)  # the server sides' connection_lost

    loop.run_until_complete(main())
    assert loop.stats()["connections"] == 0


def one_round(loop: cadeloop.Loop) -> None:
    callbacks_round(loop)
    timers_round(loop)
    connections_round(loop)
    gc.collect()


@pytest.mark.timeout(120)
def test_callbacks_timers_and_connections_do_not_leak() -> None:
    loop = cadeloop.Loop()
    try:
        one_round(loop)  # warm-up
        before = rss_bytes()
        stats_before = loop.stats()
        one_round(loop)
        after = rss_bytes()
        stats = loop.stats()
    finally:
        loop.close()
    # The measured round really did the work.
    assert stats["callbacks_dispatched"] - stats_before["callbacks_dispatched"] >= CALLBACKS + TIMERS // 2
    assert stats["timers_fired"] - stats_before["timers_fired"] >= TIMERS // 2  # (+ the rounds' own sleeps)
    assert stats["bytes_sent"] - stats_before["bytes_sent"] == 2 * 4 * CONNECTIONS
    growth = (after - before) / before
    assert growth < 0.05, f"RSS grew {growth:.1%}: {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB"


def test_an_abandoned_loop_with_queued_callbacks_is_still_collected() -> None:
    """Queued handles are hidden from the cycle collector while the loop holds
    them (see loop::release_handle); the loop's traverse must still expose
    what they reference, or a loop dropped without close() would never be
    freed (nor warn about being unclosed)."""

    class Holder:
        def __init__(self, loop: cadeloop.Loop) -> None:
            self.loop = loop  # the cycle: loop -> handle -> bound method -> holder -> loop

        def callback(self) -> None:
            pass

    loop = cadeloop.Loop()
    holder = Holder(loop)
    loop.call_soon(holder.callback)
    loop.call_later(3600, print, holder)
    ref = weakref.ref(loop)
    del loop, holder
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    assert ref() is None, "the abandoned loop was not collected"
    assert any("unclosed event loop" in str(w.message) for w in caught)
