#!/usr/bin/env python3
"""Run CPython's own test_asyncio modules against cadeloop.Loop.

Every module runs in a child process of the interpreter under test (the one
running this script), with:

- asyncio's event loop policy replaced by cadeloop.EventLoopPolicy (and kept
  there when a module resets it with set_event_loop_policy(None)), so
  asyncio.new_event_loop(), asyncio.run() and asyncio.Runner make cadeloop loops;
- every test case's create_event_loop() (test_events, test_sock_lowlevel,
  test_sendfile, ... build "real loop" suites that way) returning cadeloop.Loop(),
  and so does new_loop() where a case defines it as asyncio.SelectorEventLoop()
  (the selector suites of test_buffered_proto, test_server, test_sslproto);
- the cases listed in skips.py skipped, each with its one-line reason.

A test counts as *on cadeloop* when it created at least one cadeloop.Loop;
the rest of test_asyncio tests asyncio's Python pieces with mock loops and
says nothing about cadeloop, so the table shows both figures.

Usage:
    python tests/conformance/run_asyncio_tests.py [--json FILE] [--timeout S] [module ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from skips import DEFAULT_MODULES, skipped_ids  # noqa: E402

CHILD = r"""
import asyncio, json, signal, sys, unittest, importlib, fnmatch
sys.path.insert(0, {here!r})
import cadeloop
from skips import skipped_ids

module_name, per_test_timeout = {module!r}, {per_test!r}
created = [0]
_orig_init = cadeloop.Loop.__init__
def _counting_init(self, *a, **kw):
    created[0] += 1
    _orig_init(self, *a, **kw)
cadeloop.Loop.__init__ = _counting_init

_orig_set_policy = asyncio.events.set_event_loop_policy
def _set_policy(policy):
    _orig_set_policy(cadeloop.EventLoopPolicy() if policy is None else policy)
asyncio.set_event_loop_policy = asyncio.events.set_event_loop_policy = _set_policy
_set_policy(None)

mod = importlib.import_module("test.test_asyncio." + module_name)
import inspect
for obj in list(vars(mod).values()):
    if isinstance(obj, type) and issubclass(obj, unittest.TestCase):
        if hasattr(obj, "create_event_loop"):
            obj.create_event_loop = lambda self: cadeloop.Loop()
        # The selector variants of test_buffered_proto, test_server and
        # test_sslproto make their loop with an explicit SelectorEventLoop().
        own_new_loop = obj.__dict__.get("new_loop")
        if own_new_loop is not None:
            try:
                source = inspect.getsource(own_new_loop)
            except (OSError, TypeError):
                source = ""
            if "asyncio.SelectorEventLoop()" in source:
                obj.new_loop = lambda self: cadeloop.Loop()

skips = skipped_ids(module_name, sys.version_info[:2])

def _matches(test_id):
    short = test_id.split(".", 2)[-1] if test_id.startswith("test.") else test_id
    short = test_id[len("test.test_asyncio." + module_name) + 1:]
    for pattern, reason in skips.items():
        if fnmatch.fnmatchcase(short, pattern):
            return reason
    return None

class Result(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.outcomes = {{}}
        self.on_cadeloop = set()
    def startTest(self, test):
        self._created = created[0]
        signal.alarm(per_test_timeout)
        super().startTest(test)
    def stopTest(self, test):
        signal.alarm(0)
        if created[0] > self._created:
            self.on_cadeloop.add(test.id())
        super().stopTest(test)
    def addSuccess(self, test): self.outcomes[test.id()] = "passed"
    def addFailure(self, test, err):
        self.outcomes[test.id()] = "failed"; super().addFailure(test, err)
    def addError(self, test, err):
        self.outcomes.setdefault(test.id(), "failed"); super().addError(test, err)
    def addSkip(self, test, reason): self.outcomes[test.id()] = "skipped"
    def addExpectedFailure(self, test, err): self.outcomes[test.id()] = "passed"
    def addUnexpectedSuccess(self, test): self.outcomes[test.id()] = "failed"
    def addSubTest(self, test, subtest, err):
        if err is not None:
            self.outcomes[test.id()] = "failed"
            super().addSubTest(test, subtest, err)

class TestTimeout(Exception):
    pass
def _on_alarm(signum, frame):
    raise TestTimeout(f"test ran longer than {{per_test_timeout}}s")
signal.signal(signal.SIGALRM, _on_alarm)

suite = unittest.defaultTestLoader.loadTestsFromModule(mod)
def _flatten(s):
    for t in s:
        if isinstance(t, unittest.TestSuite):
            yield from _flatten(t)
        else:
            yield t
tests = unittest.TestSuite()
for t in _flatten(suite):
    reason = _matches(t.id())
    if reason is not None:
        setattr(t, t._testMethodName, unittest.skip("cadeloop: " + reason)(getattr(t, t._testMethodName)))
    tests.addTest(t)
# Module-level fixtures (setUpModule/tearDownModule) run through a suite.
result = Result()
unittest.TestSuite([tests]).run(result)
failures = {{t.id(): tb for t, tb in result.failures + result.errors}}
print("@@RESULT@@" + json.dumps({{
    "outcomes": result.outcomes,
    "on_cadeloop": sorted(result.on_cadeloop),
    "failures": failures,
}}))
"""


def run_module(module: str, timeout: float, per_test: int) -> dict:
    code = CHILD.format(here=str(HERE), module=module, per_test=per_test)
    start = time.monotonic()
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONASYNCIODEBUG="")
    env.pop("PYTHONASYNCIODEBUG")
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"module": module, "error": f"module timed out after {timeout:.0f}s", "seconds": timeout}
    seconds = time.monotonic() - start
    for line in proc.stdout.splitlines():
        if line.startswith("@@RESULT@@"):
            data = json.loads(line[len("@@RESULT@@"):])
            data["module"] = module
            data["seconds"] = seconds
            return data
    tail = (proc.stderr or proc.stdout)[-2000:]
    return {"module": module, "error": f"child exited {proc.returncode}: {tail}", "seconds": seconds}


def summarize(data: dict) -> dict:
    if "error" in data:
        return {"module": data["module"], "error": data["error"], "seconds": data["seconds"]}
    outcomes = data["outcomes"]
    on = set(data["on_cadeloop"])
    count = lambda kind, only_on=False: sum(1 for t, o in outcomes.items() if o == kind and (not only_on or t in on))  # noqa: E731
    return {
        "module": data["module"],
        "passed": count("passed"),
        "failed": count("failed"),
        "skipped": count("skipped"),
        "passed_on_cadeloop": count("passed", True),
        "failed_on_cadeloop": count("failed", True),
        "seconds": round(data["seconds"], 1),
        "failed_tests": sorted(t for t, o in outcomes.items() if o == "failed"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("modules", nargs="*", help=f"test_asyncio modules (default: {' '.join(DEFAULT_MODULES)})")
    ap.add_argument("--json", help="write the per-module summary here")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per module (default 600)")
    ap.add_argument("--per-test-timeout", type=int, default=30, help="seconds per test (default 30)")
    ap.add_argument("--show-failures", action="store_true", help="print the tracebacks of failed tests")
    args = ap.parse_args(argv)
    modules = args.modules or DEFAULT_MODULES
    # A module this Python does not ship (test_staggered before 3.12) is not run.
    absent = [m for m in modules if importlib.util.find_spec(f"test.test_asyncio.{m}") is None]
    modules = [m for m in modules if m not in absent]
    py = ".".join(map(str, sys.version_info[:3]))
    print(f"cadeloop conformance on CPython {py} ({sys.executable})")
    header = f"{'module':<22} {'passed':>7} {'failed':>7} {'skipped':>8} {'on cadeloop (pass/fail)':>24} {'time':>7}"
    print(header)
    print("-" * len(header))
    rows = []
    for module in modules:
        data = run_module(module, args.timeout, args.per_test_timeout)
        row = summarize(data)
        rows.append(row)
        if "error" in row:
            print(f"{module:<22} ERROR: {row['error'].splitlines()[0] if row['error'] else ''}")
            continue
        on = f"{row['passed_on_cadeloop']}/{row['failed_on_cadeloop']}"
        print(f"{module:<22} {row['passed']:>7} {row['failed']:>7} {row['skipped']:>8} {on:>24} {row['seconds']:>6.1f}s")
        if args.show_failures:
            for test_id, tb in sorted(data.get("failures", {}).items()):
                print(f"--- {test_id}\n{tb}")
    ok = [r for r in rows if "error" not in r]
    total = {k: sum(r[k] for r in ok) for k in ("passed", "failed", "skipped", "passed_on_cadeloop", "failed_on_cadeloop")}
    print("-" * len(header))
    on = f"{total['passed_on_cadeloop']}/{total['failed_on_cadeloop']}"
    print(f"{'total':<22} {total['passed']:>7} {total['failed']:>7} {total['skipped']:>8} {on:>24}")
    ran = total["passed"] + total["failed"]
    ratio = total["passed"] / ran if ran else 0.0
    print(f"pass ratio {ratio:.4f} ({total['passed']}/{ran}); modules with errors: {len(rows) - len(ok)}")
    if absent:
        print(f"not shipped with this Python: {' '.join(absent)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"python": py, "modules": rows, "absent": absent, "total": total, "pass_ratio": ratio}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
