"""cadeloop.Loop's signal handlers (C++, loop_signal.cpp) and a replaced loop.time, against asyncio.

Signals are process-wide, so each signal scenario runs in a child process of
this Python: the child runs it on asyncio's selector loop, then on
cadeloop.Loop, in its main thread, and prints both transcripts; the test
compares them. A transcript holds what a program sees: which handler ran with
which arguments and context, in which order against call_soon callbacks,
results and exceptions (type and message) of add/remove_signal_handler, the
Python-level signal handler left installed and the wakeup fd left set.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

import cadeloop
from test_loop_differential import assert_same_as_asyncio

pytestmark = pytest.mark.timeout(60)

HERE = Path(__file__).resolve().parent
var: contextvars.ContextVar[str] = contextvars.ContextVar("cadeloop_signals", default="unset")


def _handler_name(h: Any) -> str:
    if h is signal.SIG_DFL:
        return "SIG_DFL"
    if h is signal.SIG_IGN:
        return "SIG_IGN"
    return getattr(h, "__qualname__", repr(h))


def _err(e: BaseException) -> tuple[str, str]:
    return (type(e).__name__, str(e))


async def _passes_until(cond: Callable[[], bool], limit: int = 2000) -> bool:
    """Runs loop passes (sleep(0)) until cond() or `limit` passes."""
    for _ in range(limit):
        if cond():
            return True
        await asyncio.sleep(0)
        time.sleep(0.0005)  # let a signal's byte reach the socket
    return cond()


# --- the scenarios (run in the child) ------------------------------------------------


async def once_per_signal(out: list[Any]) -> None:
    loop = asyncio.get_running_loop()
    calls: list[Any] = []
    var.set("at add")
    loop.add_signal_handler(signal.SIGUSR1, lambda *a: calls.append((a, var.get())), "x", 2)
    var.set("after add")
    out.append(("installed", _handler_name(signal.getsignal(signal.SIGUSR1))))
    for i in range(3):
        os.kill(os.getpid(), signal.SIGUSR1)
        out.append(("handled", i, await _passes_until(lambda: len(calls) > i)))
    await asyncio.sleep(0.01)
    out.append(("calls", calls))
    out.append(("removed", loop.remove_signal_handler(signal.SIGUSR1)))
    out.append(("removed again", loop.remove_signal_handler(signal.SIGUSR1)))
    out.append(("left", _handler_name(signal.getsignal(signal.SIGUSR1))))


async def order_against_call_soon(out: list[Any]) -> None:
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR2, out.append, "signal handler")

    def marker(k: int) -> None:
        out.append(("marker", k))
        if k == 0:
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(0.01)  # the byte is in the socket before the next poll
        if k < 6:
            loop.call_soon(marker, k + 1)

    loop.call_soon(marker, 0)
    await _passes_until(lambda: "signal handler" in out)
    await asyncio.sleep(0.01)
    loop.remove_signal_handler(signal.SIGUSR2)


async def replace_and_cancel(out: list[Any]) -> None:
    loop = asyncio.get_running_loop()
    calls: list[str] = []
    loop.add_signal_handler(signal.SIGUSR1, calls.append, "first")
    loop.add_signal_handler(signal.SIGUSR1, calls.append, "second")
    os.kill(os.getpid(), signal.SIGUSR1)
    out.append(("handled", await _passes_until(lambda: bool(calls))))
    await asyncio.sleep(0.01)
    out.append(("calls", calls))
    # A cancelled handle is removed properly when its signal next arrives.
    loop._signal_handlers[signal.SIGUSR1].cancel()
    os.kill(os.getpid(), signal.SIGUSR1)
    out.append(("removed", await _passes_until(lambda: signal.SIGUSR1 not in loop._signal_handlers)))
    out.append(("calls after cancel", calls))
    out.append(("left", _handler_name(signal.getsignal(signal.SIGUSR1))))
    out.append(("keys", sorted(loop._signal_handlers)))


async def errors(out: list[Any]) -> None:
    loop = asyncio.get_running_loop()

    async def coro_fn() -> None:
        pass

    coro = coro_fn()
    attempts: list[tuple[str, Callable[[], Any]]] = [
        ("add str", lambda: loop.add_signal_handler("boom", print)),  # type: ignore[arg-type]
        ("remove str", lambda: loop.remove_signal_handler("boom")),  # type: ignore[arg-type]
        ("add NSIG+1", lambda: loop.add_signal_handler(signal.NSIG + 1, print)),
        ("remove NSIG+1", lambda: loop.remove_signal_handler(signal.NSIG + 1)),
        ("add 0", lambda: loop.add_signal_handler(0, print)),
        ("add -1", lambda: loop.add_signal_handler(-1, print)),
        ("add 32", lambda: loop.add_signal_handler(32, print)),
        ("add 2**70", lambda: loop.add_signal_handler(2**70, print)),
        ("add SIGKILL", lambda: loop.add_signal_handler(signal.SIGKILL, print)),
        ("add SIGSTOP", lambda: loop.add_signal_handler(signal.SIGSTOP, print)),
        ("remove SIGKILL", lambda: loop.remove_signal_handler(signal.SIGKILL)),
        ("add coroutine function", lambda: loop.add_signal_handler(signal.SIGUSR1, coro_fn)),
        ("add coroutine", lambda: loop.add_signal_handler(signal.SIGUSR1, coro)),
        ("add bad int first", lambda: loop.add_signal_handler("boom", coro_fn)),  # type: ignore[arg-type]
    ]
    for name, call in attempts:
        try:
            out.append((name, "returned", call()))
        except Exception as e:  # noqa: BLE001
            out.append((name, *_err(e), type(e.__context__).__name__ if e.__context__ else None))
    coro.close()
    out.append(("handlers", dict(loop._signal_handlers)))
    # After a refused SIGKILL no wakeup fd is left set (no handler left).
    out.append(("wakeup fd left", signal.set_wakeup_fd(-1)))


async def from_another_thread(out: list[Any]) -> None:
    loop = asyncio.get_running_loop()
    got: list[Any] = []

    def other() -> None:
        try:
            got.append(("returned", loop.add_signal_handler(signal.SIGUSR1, print)))
        except Exception as e:  # noqa: BLE001
            got.append(_err(e))
            got.append(("context", type(e.__context__).__name__))
        got.append(("remove", loop.remove_signal_handler(signal.SIGUSR1)))

    t = threading.Thread(target=other)
    t.start()
    t.join()
    out.append(("other thread", got))
    out.append(("left", _handler_name(signal.getsignal(signal.SIGUSR1))))
    out.append(("handlers", dict(loop._signal_handlers)))


async def sigint_restored(out: list[Any]) -> None:
    loop = asyncio.get_running_loop()
    seen: list[str] = []
    loop.add_signal_handler(signal.SIGINT, seen.append, "sigint")
    out.append(("installed", _handler_name(signal.getsignal(signal.SIGINT))))
    os.kill(os.getpid(), signal.SIGINT)
    out.append(("handled", await _passes_until(lambda: bool(seen))))
    out.append(("removed", loop.remove_signal_handler(signal.SIGINT)))
    out.append(("restored", signal.getsignal(signal.SIGINT) is signal.default_int_handler))


def close_removes_everything(loop_factory: Callable[[], Any], out: list[Any]) -> None:
    loop = loop_factory()
    loop.add_signal_handler(signal.SIGUSR1, print)
    loop.add_signal_handler(signal.SIGUSR2, print)
    loop.close()
    out.append(("after close", _handler_name(signal.getsignal(signal.SIGUSR1)),
                _handler_name(signal.getsignal(signal.SIGUSR2))))
    out.append(("wakeup fd left", signal.set_wakeup_fd(-1)))
    out.append(("handlers", dict(loop._signal_handlers)))
    try:
        loop.add_signal_handler(signal.SIGUSR1, print)
    except Exception as e:  # noqa: BLE001
        out.append(("add on closed", *_err(e)))
    out.append(("remove on closed", loop.remove_signal_handler(signal.SIGUSR1)))


ASYNC_SCENARIOS = {
    f.__name__: f
    for f in (once_per_signal, order_against_call_soon, replace_and_cancel, errors, from_another_thread,
              sigint_restored)
}
SYNC_SCENARIOS = {f.__name__: f for f in (close_removes_everything,)}


def _json_safe(x: Any) -> Any:
    return json.loads(json.dumps(x, default=repr))


def _child_transcripts(name: str, factories: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for label, factory in factories.items():
        out: list[Any] = []
        if name in SYNC_SCENARIOS:
            SYNC_SCENARIOS[name](factory, out)
        else:
            scenario = ASYNC_SCENARIOS[name]

            def run() -> None:
                with asyncio.Runner(loop_factory=factory) as runner:
                    runner.run(scenario(out))

            contextvars.Context().run(run)
        # What each loop left behind must not leak into the next one's run.
        out.append(("finally", _handler_name(signal.getsignal(signal.SIGUSR1)), signal.set_wakeup_fd(-1)))
        result[label] = _json_safe(out)
    return result


def child_main(name: str, mode: str) -> None:
    """Entry point of the child: prints the transcripts as one JSON line."""
    factories: dict[str, Callable[[], Any]] = {"asyncio": asyncio.SelectorEventLoop, "cadeloop": cadeloop.Loop}
    if mode == "native-proof":
        # asyncio's Python signal code must not run under cadeloop: replaced by
        # a raise, cadeloop still handles its signals, asyncio's loop does not.
        def refuse(*_a: Any, **_k: Any) -> Any:
            raise AssertionError("asyncio's Python signal code ran")

        import asyncio.unix_events as ue

        for meth in ("add_signal_handler", "remove_signal_handler", "_handle_signal", "_process_self_data",
                     "_read_from_self"):
            setattr(ue._UnixSelectorEventLoop, meth, refuse)
        for meth in ("_read_from_self",):
            setattr(asyncio.selector_events.BaseSelectorEventLoop, meth, refuse)
        out: dict[str, Any] = {}
        for label, factory in factories.items():
            try:
                out[label] = _child_transcripts(name, {label: factory})[label]
            except AssertionError as e:
                out[label] = ["refused", str(e)]
        print("@@" + json.dumps(out))
        return
    print("@@" + json.dumps(_child_transcripts(name, factories)))


def run_child(name: str, mode: str = "compare") -> dict[str, Any]:
    code = (
        f"import sys; sys.path.insert(0, {str(HERE)!r}); import test_loop_native_signals as t; "
        f"t.child_main({name!r}, {mode!r})"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("@@")]
    assert proc.returncode == 0 and lines, f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1][2:])


@pytest.mark.parametrize("name", sorted(ASYNC_SCENARIOS) + sorted(SYNC_SCENARIOS))
def test_signal_handlers_as_asyncio(name: str) -> None:
    got = run_child(name)
    expected, mine = got["asyncio"], got["cadeloop"]
    assert mine == expected, "\n".join(
        f"{'  ' if a == b else '!!'} asyncio={a!r} cadeloop={b!r}" for a, b in zip(expected, mine)
    ) + f"\n(asyncio {len(expected)} entries, cadeloop {len(mine)})"
    assert expected, "the scenario recorded nothing"


def test_signal_handling_is_cadeloops_own_code() -> None:
    got = run_child("once_per_signal", "native-proof")
    # asyncio's own loop needs the Python methods replaced above...
    assert got["asyncio"][0] == "refused"
    # ...cadeloop's does not: every signal handled once, the handler removed.
    mine = got["cadeloop"]
    assert ["handled", 0, True] in mine and ["handled", 2, True] in mine
    assert ["removed", True] in mine and ["left", "SIG_DFL"] in mine


SUBINTERPRETER_CHILD = r"""
import json, os, sys
try:
    import _interpreters as interp  # 3.13
except ImportError:
    import _xxsubinterpreters as interp  # 3.11
r, w = os.pipe()
code = '''
import asyncio, json, os, signal
import cadeloop
out = {}
for name, factory in (("asyncio", asyncio.SelectorEventLoop), ("cadeloop", cadeloop.Loop)):
    loop = factory()
    try:
        out[name] = ["returned", loop.add_signal_handler(signal.SIGUSR1, print)]
    except Exception as e:
        out[name] = [type(e).__name__, str(e), type(e.__context__).__name__]
    out[name + " removed"] = loop.remove_signal_handler(signal.SIGUSR1)
    out[name + " fds"] = len(loop._selector.get_map())
    loop.close()
os.write(%d, json.dumps(out).encode())
''' % w
iid = interp.create()
interp.run_string(iid, code)
interp.destroy(iid)
os.close(w)
print("@@" + os.read(r, 65536).decode())
"""


def check_sub_interpreter() -> None:
    proc = subprocess.run([sys.executable, "-c", SUBINTERPRETER_CHILD], capture_output=True, text=True, timeout=50)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("@@")]
    assert proc.returncode == 0 and lines, proc.stderr
    got = json.loads(lines[-1][2:])
    assert got["cadeloop"] == got["asyncio"]
    assert got["cadeloop"][0] == "RuntimeError"
    assert got["cadeloop removed"] is got["asyncio removed"] is False
    # asyncio's self-pipe is made in __init__; cadeloop made its socketpair for
    # the attempt and closed it again.
    assert got["cadeloop fds"] == 0


# cadeloop runs in sub-interpreters from 3.12 (own GIL, PEP 684); on 3.11 it
# runs in processes, and a legacy sub-interpreter that imported it does not exit.
if sys.version_info >= (3, 12):

    def test_add_signal_handler_in_a_sub_interpreter_raises_as_asyncio() -> None:
        check_sub_interpreter()


def test_signal_socketpair_lives_from_the_first_handler_to_close() -> None:
    code = (
        "import signal, cadeloop\n"
        "loop = cadeloop.Loop()\n"
        "print(len(loop._fd_list()))\n"
        "loop.add_signal_handler(signal.SIGUSR1, print)\n"
        "print(len(loop._fd_list()))\n"
        "loop.remove_signal_handler(signal.SIGUSR1)\n"
        "print(len(loop._fd_list()))\n"
        "loop.close()\n"
        "print(len(loop._fd_list()), signal.set_wakeup_fd(-1))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "1", "1", "0", "-1"]


def test_no_internal_fd_until_the_first_signal_handler() -> None:
    loop = cadeloop.Loop()
    try:
        assert loop._fd_list() == []
        assert loop._ssock is None and loop._csock is None
    finally:
        loop.close()
    assert loop._fd_list() == []


# --- loop.time replaced on the instance ------------------------------------------------


async def patched_time_scenario(out: list[Any]) -> None:
    loop = asyncio.get_running_loop()
    real = loop.time
    shift = [0.0]
    fired: list[str] = []
    loop.call_later(100, fired.append, "in 100 s")  # on the real clock
    loop.time = lambda: real() + shift[0]  # type: ignore[method-assign]
    out.append(("patched time", round(loop.time() - real())))
    shift[0] = 150.0  # 150 s later, as the loop sees it: the 100 s timer is due
    out.append(("early", await _passes_until(lambda: "in 100 s" in fired, 50), list(fired)))
    loop.call_later(0.01, fired.append, "in 10 ms")  # scheduled on the patched clock
    shift[0] -= 1000.0  # the clock goes back: not due for 1000 s
    end = time.monotonic() + 0.1
    while time.monotonic() < end:
        await asyncio.sleep(0)
    out.append(("late", list(fired)))
    shift[0] += 1000.5
    out.append(("fired", await _passes_until(lambda: "in 10 ms" in fired, 50), list(fired)))
    del loop.time  # type: ignore[method-assign]
    out.append(("real clock again", abs(loop.time() - real()) < 1))
    await asyncio.sleep(0.01)
    out.append(("sleep on the real clock", True))


def test_loop_time_replaced_on_the_instance_moves_timers_as_asyncio() -> None:
    expected = assert_same_as_asyncio(patched_time_scenario)
    assert ("late", ["in 100 s"]) in expected


if __name__ == "__main__":  # pragma: no cover
    child_main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "compare")
