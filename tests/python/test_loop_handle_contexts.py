"""The context copy a callback runs in, and the cycle collector.

cadeloop keeps the context copy of a queued callback out of the cycle
collector's lists while only the loop holds the callback (as it does the
callback's handle), so a burst of call_soon_threadsafe does not make every
collection walk a million contexts. Nothing may leak for it: a cycle through
such a context (a context variable whose value leads back to the handle, or
to the loop) is still found, whether the callback ran or the loop was
abandoned with it queued, and every callback still sees its own context."""

from __future__ import annotations

import contextvars
import gc
import threading
import warnings
import weakref
from typing import Any

import pytest

import cadeloop

pytestmark = pytest.mark.timeout(60)

var: contextvars.ContextVar[Any] = contextvars.ContextVar("cadeloop_handle_contexts")


class Holder:
    ref: Any = None


def test_a_cycle_through_a_run_callbacks_context_is_collected() -> None:
    loop = cadeloop.Loop()
    try:
        holder = Holder()
        token = var.set(holder)
        handle = loop.call_soon(lambda: None)  # its context copy holds `holder`
        var.reset(token)
        holder.ref = handle  # handle -> context -> holder -> handle
        loop.call_soon(loop.stop)
        loop.run_forever()
        gone = weakref.ref(holder)
        del holder, handle
        gc.collect()
        assert gone() is None, "the cycle through the handle's context leaked"
    finally:
        loop.close()


def test_an_abandoned_loop_whose_queued_callback_context_leads_back_to_it_is_collected() -> None:
    def abandon() -> weakref.ref[cadeloop.Loop]:
        loop = cadeloop.Loop()
        holder = Holder()
        holder.ref = loop
        token = var.set(holder)
        loop.call_soon(lambda: None)  # queued, never run: loop -> handle -> context -> holder -> loop
        loop.call_soon_threadsafe(lambda: None)
        var.reset(token)
        return weakref.ref(loop)

    gone = abandon()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # "unclosed event loop", as asyncio warns
        gc.collect()
    assert gone() is None, "the abandoned loop leaked through a queued callback's context"


def test_callbacks_from_threads_run_in_their_own_contexts() -> None:
    loop = cadeloop.Loop()
    try:
        seen: list[tuple[int, Any]] = []
        done = loop.create_future()

        def record(i: int) -> None:
            seen.append((i, var.get(None)))
            var.set("changed by the callback")  # stays in this callback's copy
            if len(seen) == 8:
                done.set_result(None)

        def producer(i: int) -> None:
            var.set(f"thread {i}")
            loop.call_soon_threadsafe(record, i)

        threads = [threading.Thread(target=producer, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        loop.run_until_complete(done)
        for t in threads:
            t.join()
        assert sorted(seen) == [(i, f"thread {i}") for i in range(8)]
        handle = loop.call_soon(lambda: None)
        ctx = handle.get_context()  # handed out: an ordinary, tracked context from now on
        assert gc.is_tracked(ctx)
        loop.call_soon(loop.stop)
        loop.run_forever()
    finally:
        loop.close()
