"""cadeloop.Loop's scheduling core: what an asyncio user sees of run/stop/close,
call_soon/call_later/call_at, handles, contexts, exceptions, debug mode,
settings and the way asyncio is told to use it."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import signal
import sys
from typing import Any, Iterator

import pytest

import cadeloop
from cadeloop import _core


@pytest.fixture
def loop() -> Iterator[cadeloop.Loop]:
    lp = cadeloop.Loop()
    try:
        yield lp
    finally:
        lp.close()


def test_loop_is_an_asyncio_event_loop_with_a_cpp_core(loop: cadeloop.Loop) -> None:
    assert isinstance(loop, asyncio.AbstractEventLoop)
    assert isinstance(loop, _core.LoopCore)
    # The hot methods are the C++ ones, not asyncio's Python ones.
    assert type(loop).call_soon is _core.LoopCore.call_soon
    assert type(loop)._run_once is _core.LoopCore._run_once
    assert not loop.is_running() and not loop.is_closed()


def test_run_forever_runs_its_passes_in_cpp_on_every_python(loop: cadeloop.Loop) -> None:
    # asyncio's run_forever calls self._run_once() once per pass; cadeloop's
    # (3.11 included) runs its passes in C++ and never looks the method up.
    looked_up: list[int] = []

    def run_once() -> None:
        looked_up.append(1)
        _core.LoopCore._run_once(loop)

    loop._run_once = run_once  # type: ignore[method-assign]
    seen: list[Any] = []

    async def agen() -> Any:
        yield 1

    async def work() -> None:
        seen.append(asyncio.get_running_loop() is loop)
        gen = agen()
        await gen.__anext__()
        seen.append(gen in loop._asyncgens)  # the loop's asyncgen hooks are installed
        await gen.aclose()
        loop.stop()

    loop.create_task(work())
    loop.run_forever()
    assert looked_up == []
    assert seen == [True, True]
    assert not loop.is_running() and asyncio.events._get_running_loop() is None
    loop.run_until_complete(asyncio.sleep(0))  # stop() was reset: runs again


def test_run_until_complete_stop_and_close() -> None:
    loop = cadeloop.Loop()

    async def work() -> str:
        assert loop.is_running()
        assert asyncio.get_running_loop() is loop
        await asyncio.sleep(0.001)
        return "done"

    assert loop.run_until_complete(work()) == "done"
    assert not loop.is_running()
    loop.call_soon(loop.stop)
    loop.run_forever()  # returns after stop()
    loop.close()
    assert loop.is_closed()
    loop.close()  # idempotent
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.call_soon(print)
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.call_later(1, print)
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.call_soon_threadsafe(print)


def test_cannot_close_a_running_loop(loop: cadeloop.Loop) -> None:
    errors: list[BaseException] = []

    def try_close() -> None:
        try:
            loop.close()
        except RuntimeError as exc:
            errors.append(exc)
        loop.stop()

    loop.call_soon(try_close)
    loop.run_forever()
    assert len(errors) == 1 and "running" in str(errors[0])


def test_call_soon_runs_callbacks_in_order_with_their_arguments(loop: cadeloop.Loop) -> None:
    seen: list[tuple[Any, ...]] = []
    for i in range(100):
        loop.call_soon(lambda *a: seen.append(a), i, str(i))
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert seen == [(i, str(i)) for i in range(100)]


def test_callbacks_scheduled_by_a_callback_run_on_the_next_pass(loop: cadeloop.Loop) -> None:
    order: list[str] = []

    def first() -> None:
        order.append("first")
        loop.call_soon(order.append, "nested")

    loop.call_soon(first)
    loop.call_soon(order.append, "second")
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert order == ["first", "second"]  # "nested" was queued after stop: next run
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert order == ["first", "second", "nested"]


def test_handle_semantics(loop: cadeloop.Loop) -> None:
    ran: list[int] = []
    h = loop.call_soon(ran.append, 1)
    assert isinstance(h, _core.Handle)
    assert not h.cancelled()
    assert isinstance(h.get_context(), contextvars.Context)
    h.cancel()
    h.cancel()
    assert h.cancelled()
    assert h._callback is None and h._args is None
    assert "cancelled" in repr(h)
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert ran == []


def test_timers_fire_in_deadline_order_and_ties_in_call_order(loop: cadeloop.Loop) -> None:
    fired: list[str] = []
    now = loop.time()
    loop.call_at(now + 0.03, fired.append, "c")
    loop.call_later(0.01, fired.append, "a1")
    t = loop.call_at(now + 0.02, fired.append, "b")
    loop.call_later(0.01, fired.append, "a2")  # may share a deadline with a1 at 1 ns resolution
    assert isinstance(t, _core.TimerHandle)
    assert t.when() == pytest.approx(now + 0.02)
    assert f"when={t.when()}" in repr(t)
    loop.call_later(0.05, loop.stop)
    start = loop.time()
    loop.run_forever()
    assert fired == ["a1", "a2", "b", "c"]
    assert loop.time() - start >= 0.05 - 0.002


def test_a_cancelled_timer_leaves_the_heap_at_once(loop: cadeloop.Loop) -> None:
    ran: list[int] = []
    timers = [loop.call_later(3600, ran.append, i) for i in range(1000)]
    assert loop.stats()["timers_len"] == 1000
    for t in timers[::2]:
        t.cancel()
    # No lazy deletion: the heap shrinks when cancel() returns, no pass needed.
    assert loop.stats()["timers_len"] == 500
    assert all(not t._scheduled for t in timers[::2])
    assert all(t._scheduled for t in timers[1::2])
    for t in timers[1::2]:
        t.cancel()
    assert loop.stats()["timers_len"] == 0
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert ran == []


def test_a_timer_cancelled_by_an_earlier_callback_does_not_run(loop: cadeloop.Loop) -> None:
    ran: list[str] = []
    late = loop.call_later(0.02, ran.append, "late")
    loop.call_later(0.01, late.cancel)
    loop.call_later(0.03, loop.stop)
    loop.run_forever()
    assert ran == []
    assert late.cancelled()


def test_timer_handles_compare_by_deadline(loop: cadeloop.Loop) -> None:
    a = loop.call_at(10.0, print)
    b = loop.call_at(20.0, print)
    assert a < b and b > a and a <= b and not (a == b)
    c = loop.call_at(10.0, print)
    assert a == c and hash(a) == hash(c)
    for t in (a, b, c):
        t.cancel()


def test_none_delays_are_refused(loop: cadeloop.Loop) -> None:
    with pytest.raises(TypeError, match="delay must not be None"):
        loop.call_later(None, print)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="when cannot be None"):
        loop.call_at(None, print)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        loop.call_soon(print, bogus=1)  # type: ignore[call-arg]


def test_callbacks_run_in_their_context(loop: cadeloop.Loop) -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    seen: list[str] = []
    ctx = contextvars.copy_context()
    ctx.run(var.set, "in ctx")
    loop.call_soon(lambda: seen.append(var.get()), context=ctx)
    var.set("current")
    loop.call_soon(lambda: seen.append(var.get()))  # a copy of the current context
    loop.call_later(0.001, lambda: seen.append(var.get()), context=ctx)
    loop.call_later(0.002, loop.stop)
    loop.run_forever()
    assert seen == ["in ctx", "current", "in ctx"]


def test_a_failing_callback_goes_to_the_exception_handler_and_the_loop_goes_on(loop: cadeloop.Loop) -> None:
    contexts: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda lp, ctx: contexts.append(ctx))
    after: list[int] = []

    def boom() -> None:
        raise ValueError("boom")

    h = loop.call_soon(boom)
    loop.call_later(0.001, boom)
    loop.call_soon(after.append, 1)
    loop.call_later(0.005, loop.stop)
    loop.run_forever()
    assert after == [1]
    assert len(contexts) == 2
    assert contexts[0]["handle"] is h
    assert isinstance(contexts[0]["exception"], ValueError)
    assert contexts[0]["message"].startswith("Exception in callback ")
    assert "boom" in contexts[0]["message"]
    assert contexts[0]["exception"].__traceback__ is not None


def test_the_default_exception_handler_logs(loop: cadeloop.Loop, caplog: pytest.LogCaptureFixture) -> None:
    def boom() -> None:
        raise KeyError("nope")

    loop.call_soon(boom)
    loop.call_soon(loop.stop)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        loop.run_forever()
    assert "Exception in callback" in caplog.text
    assert "KeyError: 'nope'" in caplog.text


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_keyboard_interrupt_and_system_exit_leave_run_forever(loop: cadeloop.Loop, exc: type) -> None:
    def raise_it() -> None:
        raise exc()

    ran: list[int] = []
    loop.call_soon(raise_it)
    loop.call_soon(ran.append, 1)
    with pytest.raises(exc):
        loop.run_forever()
    assert not loop.is_running()
    # What was queued behind it is still there and runs next time.
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert ran == [1]


def test_tasks_futures_and_gather(loop: cadeloop.Loop) -> None:
    async def square(x: int) -> int:
        await asyncio.sleep(0.001 * (5 - x))
        return x * x

    async def main() -> list[int]:
        return list(await asyncio.gather(*(square(i) for i in range(5))))

    assert loop.run_until_complete(main()) == [0, 1, 4, 9, 16]


def test_wait_for_and_timeouts(loop: cadeloop.Loop) -> None:
    async def main() -> str:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.sleep(10), 0.01)
        async with asyncio.timeout(0.01):  # a TimerHandle rescheduled and cancelled
            pass
        return "ok"

    assert loop.run_until_complete(main()) == "ok"
    assert loop.stats()["timers_len"] == 0


def test_run_in_executor_and_getaddrinfo(loop: cadeloop.Loop) -> None:
    import threading

    async def main() -> tuple[int, list[Any]]:
        ident = await loop.run_in_executor(None, threading.get_ident)
        infos = await loop.getaddrinfo("127.0.0.1", 80, type=1)
        return ident, infos

    ident, infos = loop.run_until_complete(main())
    assert ident != threading.get_ident()
    assert infos and infos[0][4] == ("127.0.0.1", 80)
    loop.run_until_complete(loop.shutdown_default_executor())


def test_shutdown_asyncgens(loop: cadeloop.Loop) -> None:
    closed: list[bool] = []

    async def agen() -> Any:
        try:
            yield 1
            yield 2
        finally:
            closed.append(True)

    async def main() -> None:
        g = agen()
        assert await g.__anext__() == 1

    loop.run_until_complete(main())
    loop.run_until_complete(loop.shutdown_asyncgens())
    assert closed == [True]


def test_debug_mode_logs_slow_callbacks_and_records_where_handles_came_from(
    loop: cadeloop.Loop, caplog: pytest.LogCaptureFixture
) -> None:
    import time

    loop.set_debug(True)
    loop.slow_callback_duration = 0.01
    h = loop.call_soon(time.sleep, 0.02)
    lineno = sys._getframe().f_lineno - 1
    assert h._source_traceback[-1][:3] == (__file__, lineno, "test_debug_mode_logs_slow_callbacks_and_records_where_handles_came_from")
    assert f"created at {__file__}:{lineno}" in repr(h)
    loop.call_soon(loop.stop)
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        loop.run_forever()
    assert "Executing <Handle sleep(0.02)" in caplog.text and "took" in caplog.text
    # In debug mode call_soon refuses non-callables and coroutines, as asyncio does.
    with pytest.raises(TypeError):
        loop.call_soon(42)  # type: ignore[arg-type]
    loop.set_debug(False)


def test_signal_handlers(loop: cadeloop.Loop) -> None:
    got: list[int] = []

    def on_usr1() -> None:
        got.append(signal.SIGUSR1)
        loop.stop()

    loop.add_signal_handler(signal.SIGUSR1, on_usr1)
    loop.call_later(0.01, os.kill, os.getpid(), signal.SIGUSR1)
    loop.call_later(5, loop.stop)  # a guard, not expected to fire
    loop.run_forever()
    assert got == [signal.SIGUSR1]
    assert loop.remove_signal_handler(signal.SIGUSR1)


def test_settings_are_checked() -> None:
    with pytest.raises(TypeError, match="unknown setting 'bogus'"):
        cadeloop.Loop(bogus=1)
    with pytest.raises(ValueError, match="spin_us"):
        cadeloop.Loop(spin_us=-1)
    with pytest.raises(TypeError, match="adaptive_spin"):
        cadeloop.Loop(adaptive_spin=1)
    cadeloop.Loop(spin_us=50, adaptive_spin=True).close()


# --- how asyncio is told to use cadeloop ------------------------------------------


def test_cadeloop_run_returns_the_result_on_a_fresh_loop_and_closes_it() -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    async def main() -> int:
        loops.append(asyncio.get_running_loop())
        await asyncio.sleep(0)
        return 7

    assert cadeloop.run(main()) == 7
    assert isinstance(loops[0], cadeloop.Loop)
    assert loops[0].is_closed()


def test_cadeloop_run_debug() -> None:
    async def main() -> bool:
        return asyncio.get_running_loop().get_debug()

    assert cadeloop.run(main(), debug=True) is True
    assert cadeloop.run(main(), debug=False) is False


def test_runner_with_loop_factory() -> None:
    async def main() -> type:
        return type(asyncio.get_running_loop())

    with asyncio.Runner(loop_factory=cadeloop.new_event_loop) as runner:
        assert runner.run(main()) is cadeloop.Loop
        assert runner.run(main()) is cadeloop.Loop


def test_install_makes_asyncio_run_use_cadeloop() -> None:
    old = asyncio.get_event_loop_policy()
    try:
        cadeloop.install()
        assert isinstance(asyncio.get_event_loop_policy(), cadeloop.EventLoopPolicy)

        async def main() -> type:
            return type(asyncio.get_running_loop())

        assert asyncio.run(main()) is cadeloop.Loop
        loop = asyncio.new_event_loop()
        assert isinstance(loop, cadeloop.Loop)
        loop.close()
    finally:
        asyncio.set_event_loop_policy(old)
