"""cadeloop.Loop: an asyncio event loop whose scheduling core is C++.

`Loop` inherits from `_core.LoopCore` (C++: ready queue, timer heap, run-once
step with the epoll poll, check-before-park wake-ups, the fd interest table,
call_soon/call_later/call_at/call_soon_threadsafe) and from asyncio's own
selector event loop, whose Python code supplies what is not hot yet:
run_forever/run_until_complete, tasks and futures, the exception handler,
executors and DNS, sock_* methods, TCP/Unix/UDP transports and servers
(asyncio's selector transports, driven by the C++ poller), signals,
subprocesses and TLS.
"""

from __future__ import annotations

import asyncio
import collections.abc
import selectors
import sys
from asyncio import base_events, format_helpers, selector_events
from typing import Any, Coroutine, Iterator, Mapping, TypeVar

from . import _core

__all__ = ["Loop", "EventLoopPolicy", "new_event_loop", "install", "run"]

_T = TypeVar("_T")

# Loop(**settings): name -> (type, lowest, highest, what it does).
SETTINGS: dict[str, tuple[type, int, int, str]] = {
    "spin_us": (int, 0, 1_000_000, "microseconds to spin (GIL released) before sleeping in epoll_wait"),
    "adaptive_spin": (bool, 0, 1, "stop spinning after a run of fruitless spins, probe now and then"),
}

_FORMAT_TAKES_DEBUG = sys.version_info >= (3, 12)


def _format_callback(callback: Any, args: Any, loop: Any) -> str:
    if _FORMAT_TAKES_DEBUG:
        return format_helpers._format_callback_source(callback, args, debug=loop.get_debug())
    return format_helpers._format_callback_source(callback, args)


# --- the Python half of _core.Handle / TimerHandle (cold paths) ------------------


def _handle_repr_info(handle: Any) -> list[str]:
    info = [type(handle).__name__]
    if handle._cancelled:
        info.append("cancelled")
    if handle._callback is not None:
        info.append(_format_callback(handle._callback, handle._args, handle._loop))
    if handle._source_traceback:
        frame = handle._source_traceback[-1]
        info.append(f"created at {frame[0]}:{frame[1]}")
    if isinstance(handle, _core.TimerHandle):
        info.insert(2 if handle._cancelled else 1, f"when={handle._when}")
    return info


def _handle_repr(handle: Any) -> str:
    return "<{}>".format(" ".join(_handle_repr_info(handle)))


def _report_callback_error(handle: Any, exc: BaseException) -> None:
    """A callback raised: hand it to the loop's exception handler, as asyncio.Handle._run does."""
    loop = handle._loop
    cb = _format_callback(handle._callback, handle._args, loop)
    context: dict[str, Any] = {"message": f"Exception in callback {cb}", "exception": exc, "handle": handle}
    if handle._source_traceback:
        context["source_traceback"] = handle._source_traceback
    loop.call_exception_handler(context)


# --- loop._selector, for the asyncio code that looks at it -------------------------


class _FdMap(collections.abc.Mapping):  # type: ignore[type-arg]
    def __init__(self, view: _SelectorView) -> None:
        self._view = view

    def __len__(self) -> int:
        return len(self._view._loop._fd_list())

    def __iter__(self) -> Iterator[int]:
        return iter(self._view._loop._fd_list())

    def __getitem__(self, fileobj: Any) -> selectors.SelectorKey:
        return self._view.get_key(fileobj)


class _SelectorView(selectors.BaseSelector):
    """A read-only selector over the C++ fd table.

    asyncio's transports read `loop._selector` for their repr() and its pipe
    transports to tell whether they are polling; registration itself goes
    through Loop._add_reader/_add_writer (C++), never through here.
    """

    def __init__(self, loop: Loop) -> None:
        self._loop = loop

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        raise NotImplementedError("cadeloop registers fds through loop.add_reader/add_writer")

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        raise NotImplementedError("cadeloop registers fds through loop.remove_reader/remove_writer")

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        raise NotImplementedError("cadeloop polls in C++ (Loop._run_once)")

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        found = self._loop._fd_key(fileobj)
        if found is None:
            raise KeyError(f"{fileobj!r} is not registered")
        events, reader, writer = found
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return selectors.SelectorKey(fileobj, fd, events, (reader, writer))

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return _FdMap(self)

    def close(self) -> None:
        pass


# --- the loop ---------------------------------------------------------------------


def _check_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """Loop(**settings) with defaults filled in; one clear error naming a bad setting."""
    values: dict[str, Any] = {"spin_us": 0, "adaptive_spin": False}
    for name, value in settings.items():
        if name not in SETTINGS:
            raise TypeError(f"Loop() got an unknown setting {name!r} (known: {', '.join(SETTINGS)})")
        kind, low, high, _ = SETTINGS[name]
        if kind is bool:
            if not isinstance(value, bool):
                raise TypeError(f"Loop() setting {name!r} must be a bool, not {type(value).__name__}")
        elif isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"Loop() setting {name!r} must be an int in [{low}, {high}], not {value!r}")
        values[name] = value
    return values


class Loop(_core.LoopCore, asyncio.SelectorEventLoop):  # type: ignore[misc,name-defined]
    """An asyncio event loop with its scheduling core in C++.

    Settings (keyword arguments): spin_us (int, 0..1000000, default 0) and
    adaptive_spin (bool, default False). Create, run and close it on one
    thread; call_soon_threadsafe() may be called from any thread of the same
    interpreter.
    """

    def __new__(cls, **settings: Any) -> Loop:
        # Checked before the object exists, so a bad setting leaves no
        # half-made loop for asyncio's __del__ to complain about.
        _check_settings(settings)
        return super().__new__(cls)

    def __init__(self, **settings: Any) -> None:
        values = _check_settings(settings)
        asyncio.SelectorEventLoop.__init__(self, selector=_SelectorView(self))
        self._set_spin(values["spin_us"], values["adaptive_spin"])

    # The self-pipe exists for signal wake-ups only (signal.set_wakeup_fd);
    # call_soon_threadsafe wakes the loop through the C++ parker's eventfd.
    # Made on the first add_signal_handler so an ordinary loop registers no
    # fd at all and its idle passes need no poll system call.
    def _make_self_pipe(self) -> None:
        self._ssock = None
        self._csock = None

    def _close_self_pipe(self) -> None:
        if self._ssock is not None:
            selector_events.BaseSelectorEventLoop._close_self_pipe(self)

    def add_signal_handler(self, sig: int, callback: Any, *args: Any) -> None:
        self._check_closed()
        if self._ssock is None:
            selector_events.BaseSelectorEventLoop._make_self_pipe(self)
        super().add_signal_handler(sig, callback, *args)

    def _write_to_self(self) -> None:
        self._wake()
        super()._write_to_self()

    def _add_callback_signalsafe(self, handle: Any) -> None:
        self._add_callback(handle)
        self._write_to_self()

    def close(self) -> None:
        if self.is_running():
            raise RuntimeError("Cannot close a running event loop")
        if self.is_closed():
            return
        try:
            super().close()
        finally:
            self._release_core()

    def stats(self) -> dict[str, Any]:
        """The loop's counters. Loop thread.

        Counted in C++: ticks, polls, polls_elided, parks, callbacks_dispatched,
        timers_fired, xthread_items, wakeups_sent, spins, spin_hits, ready_len,
        timers_len, fds_registered. connections is the number of live socket
        transports. bytes_received, bytes_sent and sends_posted are None: the
        transports are still asyncio's Python ones, which cadeloop does not
        meter yet.
        """
        s = self._core_stats()
        s["connections"] = 0 if self._transports is None else len(self._transports)
        s["bytes_received"] = None
        s["bytes_sent"] = None
        s["sends_posted"] = None
        return s

    # --- called from C++ ---------------------------------------------------------

    def _cadeloop_extract_stack(self) -> Any:
        # Frame 0 is this method; frame 1 is whoever called call_soon & co.
        # (a C method adds no frame).
        return format_helpers.extract_stack(sys._getframe(1))

    def _cadeloop_run_debug(self, handle: Any) -> None:
        """Debug mode: run one callback and log it if it was slow, as asyncio does."""
        try:
            self._current_handle = handle
            t0 = self.time()
            handle._run()
            dt = self.time() - t0
            if dt >= self.slow_callback_duration:
                base_events.logger.warning("Executing %s took %.3f seconds", base_events._format_handle(handle), dt)
        finally:
            self._current_handle = None
            # An exception raised under this frame may keep the frame alive
            # through a traceback; drop the handle so it does not keep the
            # callback (a task, say) alive with it. asyncio does the same.
            handle = None

    def _cadeloop_run_foreign(self, handle: Any) -> None:
        if not handle._cancelled:
            if self._debug:
                self._cadeloop_run_debug(handle)
            else:
                handle._run()


class EventLoopPolicy(asyncio.DefaultEventLoopPolicy):  # type: ignore[misc,valid-type]
    """asyncio's default policy, making cadeloop loops."""

    _loop_factory = Loop


def new_event_loop(**settings: Any) -> Loop:
    """A new cadeloop loop (for asyncio.Runner(loop_factory=...) and friends)."""
    return Loop(**settings)


def install() -> None:
    """Make asyncio use cadeloop: asyncio.run(), get_event_loop() and new_event_loop() then create cadeloop loops."""
    asyncio.set_event_loop_policy(EventLoopPolicy())


def run(main: Coroutine[Any, Any, _T], *, debug: bool | None = None) -> _T:
    """Run one coroutine on a fresh cadeloop loop, as asyncio.run() does, and close the loop."""
    with asyncio.Runner(debug=debug, loop_factory=new_event_loop) as runner:
        return runner.run(main)
