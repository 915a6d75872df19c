"""Core pairs in own-GIL sub-interpreters (CPython 3.13+), and the probe that decides between them and processes.

One process. The main thread starts a native thread per pair
(`_core.interp_start`); that thread creates an own-GIL sub-interpreter,
imports this module there and calls `run_interp_pair`, which builds and runs
a `PairServer` (lifespan included), and then ends its interpreter. The main
thread owns SIGINT/SIGTERM/SIGHUP and stops the pairs through the C++
registry (an eventfd each pair's loop watches); it waits for the pairs in
short slices with its GIL released and never finalizes before every
interpreter ended.

``--isolation auto`` imports the app in a probe sub-interpreter first
(`probe_app`) and falls back to processes when a module refuses ("module X
does not support loading in subinterpreters").

`run_interp_pair` and `probe_app` are called from C++ by module and name
(this module's `__name__`), with a JSON string and the slot id; they return
(exit code, message, stats JSON) and hand nothing Python across.
"""

from __future__ import annotations

import importlib
import json
import re
import socket
import sys
import threading
import time
import traceback
from typing import Any

from . import _core
from ._errors import AppLoadError, StartupError
from ._log import configure_pair_logging, logger
from ._pair import PairServer, load_app, record_os_exit, set_current_pair
from ._supervisor import THREAD_GRACE, SupervisedPair, Supervisor

__all__ = ["PY312_REFUSAL", "choose_isolation", "probe_app", "run_interp_pair", "InterpSupervisor"]

_REFUSED = re.compile(r"module (\S+) does not support loading in subinterpreters")
_PROBE_REFUSED = 10  # exit code of probe_app: a module refused the sub-interpreter
#: What run_interp_pair says (with code 0) when its pair drained after limit_max_requests.
REPLACED = "limit_max_requests served"

PY312_REFUSAL = (
    "own-GIL sub-interpreters are not used on CPython 3.12 (3.12.1 aborts the process when a second "
    "sub-interpreter imports datetime, sqlite3, http.client or tomllib, or runs asyncio before the main "
    "interpreter did); use CPython 3.13+ for them"
)


def _forget_dummy_thread() -> None:
    """Drops threading's record of this native thread while threading still works (3.13+).

    The thread an interpreter pair runs on was not started by `threading`,
    so `current_thread()` (logging calls it) makes a _DummyThread whose
    clean-up would otherwise run during Py_EndInterpreter, after the
    module's globals are gone ("Exception ignored in ... _DeleteDummyThreadOnDel").
    """
    info = getattr(threading, "_thread_local_info", None)
    if info is not None and hasattr(info, "_track_dummy_thread_ref"):
        del info._track_dummy_thread_ref


def _config_class_name(config: Any) -> str:
    """"module:Class" of config's class, which each sub-interpreter imports to rebuild it."""
    return f"{type(config).__module__}:{type(config).__qualname__}"


def _make_config(class_name: str, settings: dict[str, Any]) -> Any:
    """The settings class named "module:Class" (imported in this interpreter), made from `settings`."""
    module, _, name = class_name.partition(":")
    return getattr(importlib.import_module(module), name)(**settings)


def probe_app(argument: str, slot: int) -> tuple[int, str, str]:
    """Runs in a probe sub-interpreter: imports the app. (0, '', '') if it loads there."""
    data = json.loads(argument)
    try:
        load_app(data["app"], data["app_dir"], data["factory"])
    except ImportError as exc:
        m = _REFUSED.search(str(exc))
        if m:
            return _PROBE_REFUSED, m.group(1), ""
        return 1, f"{type(exc).__name__}: {exc}", ""
    except Exception as exc:
        return 1, f"{type(exc).__name__}: {exc}", ""
    finally:
        _forget_dummy_thread()
    return 0, "", ""


def _wait_interp(slot: int) -> tuple[Any, ...]:
    while not _core.interp_wait(slot, 0.05):
        pass  # slices: signal handlers run between them
    status = _core.interp_status(slot)
    _core.interp_release(slot)
    return tuple(status)


def choose_isolation(config: Any) -> tuple[str, str]:
    """(isolation, why) for config: 'subinterpreters' or 'processes', and the reason for the log line."""
    asked = config.isolation
    if asked == "processes":
        return "processes", "asked for"
    if not _core.own_gil_supported():
        why = f"CPython {sys.version_info[0]}.{sys.version_info[1]} has no own-GIL sub-interpreters"
        return "processes", why if asked == "auto" else f"--isolation subinterpreters: {why}"
    if sys.version_info < (3, 13):
        return "processes", PY312_REFUSAL
    if not isinstance(config.app, str):
        return "processes", "the app was given as an object; a sub-interpreter must import it by 'module:attribute'"
    if asked == "subinterpreters":
        return "subinterpreters", "asked for"
    argument = json.dumps({"app": config.app, "app_dir": config.app_dir, "factory": config.factory})
    slot = _core.interp_start(__name__, probe_app.__name__, argument, [], 1.0)
    _, _, _, _, code, message, _ = _wait_interp(slot)
    if code == 0:
        return "subinterpreters", "auto: the app imports in an own-GIL sub-interpreter"
    if code == _PROBE_REFUSED:
        return "processes", f"auto: module {message} does not support loading in subinterpreters"
    return "processes", f"auto: importing the app in a sub-interpreter failed ({message})"


def run_interp_pair(argument: str, slot: int) -> tuple[int, str, str]:
    """Runs in pair `slot`'s own sub-interpreter: a PairServer. Returns (exit code, message, stats JSON)."""
    try:
        return _run_interp_pair(argument, slot)
    finally:
        _run_threading_atexits(THREAD_GRACE)
        _forget_dummy_thread()


def _run_threading_atexits(timeout: float) -> None:
    """Runs threading's exit hooks, as a process's exit would, before the interpreter ends.

    concurrent.futures registers one there that tells idle pool threads
    (asgiref's, an app's own ThreadPoolExecutor) to end and joins them; in a
    worker process it runs at exit. Here the C++ side waits for every thread
    of the interpreter before Py_EndInterpreter, which would otherwise wait
    the whole thread grace for threads that were only idle. The hooks run on
    a helper thread joined for at most `timeout` seconds, so a pool thread
    stuck in a job cannot hold the pair past the grace the C++ side gives.
    Runs in the pair's sub-interpreter only (a worker process exits normally).
    """
    registered = getattr(threading, "_threading_atexits", None)
    if not registered:
        return
    hooks = list(reversed(registered))
    # Run once: Py_EndInterpreter would run them again, and _python_exit's joins would then make
    # a _DummyThread for this thread after _forget_dummy_thread, cleaned up with the globals gone.
    registered.clear()

    def run() -> None:
        for hook in hooks:
            try:
                hook()
            except Exception:  # noqa: BLE001 - one failing hook must not skip the others
                traceback.print_exc()

    helper = threading.Thread(target=run, name="cadeloop-thread-exit-hooks")
    helper.start()
    helper.join(timeout)


def _run_interp_pair(argument: str, slot: int) -> tuple[int, str, str]:
    settings = json.loads(argument)
    index = settings.pop("pair")
    class_name = settings.pop("config_class")
    page_address = settings.pop("stats_page_address")
    last_words_fd = settings.pop("last_words_fd", None)
    listen_backlog = settings.pop("listen_backlog", None)
    set_current_pair(index)
    configure_pair_logging(index, settings["log_level"])
    if last_words_fd is not None:
        record_os_exit(last_words_fd, "W")
    config = _make_config(class_name, settings)
    try:
        app = load_app(config.app, config.app_dir, config.factory)
    except AppLoadError as exc:
        return 2, str(exc), "{}"
    except Exception as exc:
        traceback.print_exc()
        return 1, f"importing {config.app!r} raised {type(exc).__name__}: {exc}", "{}"
    if listen_backlog is not None and config.fd is not None:
        # A socket the parent only bound (it replaced a dead serving process's): listen now,
        # with the app imported, so no connection waits in its queue for a pair still starting.
        listening = socket.socket(fileno=config.fd)
        try:
            listening.listen(listen_backlog)
        finally:
            listening.detach()
    srv = PairServer(app, config)
    srv.pair = index
    srv.stats_options = {"stats_page_address": page_address, "stats_index": index}
    srv.stop_source = (_core.interp_stop_fd(slot), lambda: _core.interp_take_stop(slot))
    srv.on_listening = lambda description: _core.interp_report_ready(slot, description)
    try:
        srv.run()
    except StartupError as exc:
        return exc.exit_code, str(exc), json.dumps(srv.stats)
    except BaseException as exc:  # noqa: BLE001 - the pair's thread must report, whatever happened
        traceback.print_exc()
        return 1, f"{type(exc).__name__}: {exc}", json.dumps(srv.stats)
    return 0, REPLACED if srv.replaced else "", json.dumps(srv.stats)


class InterpSupervisor(Supervisor):
    """One own-GIL sub-interpreter (on its own native thread) per pair, in this process."""

    isolation = "subinterpreters"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.slots: dict[int, int] = {}  # pair index -> slot id

    def pair_settings(self, pair: SupervisedPair) -> dict[str, Any]:
        """The settings pair `pair` is started with (JSON-able; read by run_interp_pair)."""
        return dict(self.settings, pair=pair.index, config_class=_config_class_name(self.config),
                    stats_page_address=self.region.address(pair.index))

    def start_pair(self, pair: SupervisedPair) -> None:
        settings = self.pair_settings(pair)
        self.slots[pair.index] = _core.interp_start(
            __name__, run_interp_pair.__name__, json.dumps(settings), self.pins[pair.index], THREAD_GRACE
        )
        pair.mark_started()
        logger.debug("pair %d started: sub-interpreter thread (slot %d)", pair.index, self.slots[pair.index])
        if self.stop_level:
            _core.interp_request_stop_all(self.stop_level)

    def stop_pair(self, pair: SupervisedPair, level: int) -> None:
        _core.interp_request_stop_all(level)  # one registry for the process: every pair at once

    def kill_all(self) -> None:
        # Threads cannot be killed: the process exits without finalizing (see cadeloop.server.run_server).
        for pair in self.pairs:
            if pair.running:
                pair.running = False
                self.left_alive += 1

    def wait(self, timeout: float) -> None:
        running = [p for p in self.pairs if p.running]
        if running:
            # One slice on one pair (GIL released); the others are looked at below.
            _core.interp_wait(self.slots[running[0].index], timeout, not running[0].ready)
        else:
            time.sleep(timeout)
        for pair in running:
            index = pair.index
            slot = self.slots[index]
            ready, finished, ended, description, code, message, stats = _core.interp_status(slot)
            if ready and not pair.ready and not finished:
                pair.ready = True
                pair.description = description
            if finished:
                _core.interp_release(slot)
                del self.slots[index]
                if not ended:
                    self.left_alive += 1
                try:
                    if stats:
                        pair.stats.append(json.loads(stats))
                except ValueError:
                    pass
                if code:
                    pair.error = (code, message)
                elif message == REPLACED:
                    pair.replaced = True
                how = "stopped" if code == 0 else f"ended with code {code}"
                self.pair_ended(pair, how, code == 0 and ended)
