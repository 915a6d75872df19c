"""pytest plugin the peer-suite runner loads (-p peer_plugin) into a suite's run.

CADELOOP_PEER_MODE=cadeloop makes cadeloop the loop before the suite's own
conftest is imported: asyncio's policy becomes cadeloop.EventLoopPolicy (and
stays so when a test resets it with set_event_loop_policy(None)), so
asyncio.new_event_loop(), asyncio.run() and asyncio.Runner() make cadeloop
loops; asyncio.EventLoop (3.13) is cadeloop.Loop too. CADELOOP_PEER_MODE=asyncio
changes nothing.

In both modes every event loop created is counted per test (by class), and at
the end the outcome of each test is written to CADELOOP_PEER_RESULTS as JSON:
{"tests": {nodeid: {"outcome", "timeout", "loops"}}}. An outcome is "passed"
(xfail counts as passed: the suite expects it), "failed" or "skipped".
"""

from __future__ import annotations

import asyncio
import json
import os
from asyncio import base_events
from typing import Any

import pytest

MODE = os.environ.get("CADELOOP_PEER_MODE", "asyncio")
RESULTS = os.environ.get("CADELOOP_PEER_RESULTS")

if MODE == "cadeloop":
    import cadeloop

    _set_policy = asyncio.events.set_event_loop_policy

    def _keep_cadeloop(policy: Any) -> None:
        _set_policy(cadeloop.EventLoopPolicy() if policy is None else policy)

    asyncio.set_event_loop_policy = asyncio.events.set_event_loop_policy = _keep_cadeloop
    _keep_cadeloop(None)
    if hasattr(asyncio, "EventLoop"):
        asyncio.EventLoop = cadeloop.Loop
elif MODE != "asyncio":
    raise RuntimeError(f"CADELOOP_PEER_MODE={MODE!r}: expected 'asyncio' or 'cadeloop'")

_loops_now: list[str] = []
_base_init = base_events.BaseEventLoop.__init__


def _counting_init(self: Any, *args: Any, **kwargs: Any) -> None:
    _loops_now.append(type(self).__module__ + "." + type(self).__qualname__)
    _base_init(self, *args, **kwargs)


base_events.BaseEventLoop.__init__ = _counting_init  # type: ignore[method-assign]

_results: dict[str, dict[str, Any]] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Any:
    _loops_now.clear()
    yield
    entry = _results.setdefault(item.nodeid, {"outcome": "passed", "timeout": False})
    entry["loops"] = sorted(set(_loops_now))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _results.setdefault(report.nodeid, {"outcome": "passed", "timeout": False})
    if report.failed:
        entry["outcome"] = "failed"
        text = str(report.longrepr)
        if "Timeout (>" in text or "Timeout >" in text:
            entry["timeout"] = True
    elif report.skipped and entry["outcome"] != "failed":
        # An xfail the suite expects is a pass of the suite; a plain skip is a skip.
        entry["outcome"] = "passed" if hasattr(report, "wasxfail") else "skipped"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if RESULTS:
        with open(RESULTS, "w") as f:
            json.dump({"mode": MODE, "exitstatus": int(exitstatus), "tests": _results}, f)
