"""The native module loads where the server will load it: the main interpreter
on every supported Python, and own-GIL sub-interpreters on 3.12+."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

import pytest

import cadeloop
from cadeloop import _core

ROOT = Path(__file__).resolve().parents[2]


def test_core_imports_in_main_interpreter() -> None:
    assert _core.in_main_interpreter() is True
    assert cadeloop.__version__ == _core.__version__
    # The module was built for the Python running it, not another one.
    assert _core.PY_VERSION_BUILT.split(".")[:2] == [str(sys.version_info[0]), str(sys.version_info[1])]


def test_version_matches_cmake_project() -> None:
    cmake = (ROOT / "CMakeLists.txt").read_text()
    assert f"project(cadeloop VERSION {cadeloop.__version__} " in cmake


@pytest.mark.parametrize("command", [["cadeloop"], [sys.executable, "-m", "cadeloop"]])
def test_version_command(command: list[str]) -> None:
    if command == ["cadeloop"]:
        command = [str(Path(sysconfig.get_path("scripts")) / "cadeloop")]
    out = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.startswith(f"cadeloop {cadeloop.__version__} on CPython {sys.version.split()[0]}")
    expected = "own-GIL sub-interpreters: yes" if sys.version_info >= (3, 12) else "own-GIL sub-interpreters: no"
    assert expected in out


def test_no_arguments_is_a_usage_error() -> None:
    proc = subprocess.run([sys.executable, "-m", "cadeloop"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "usage: cadeloop" in proc.stderr


def test_own_gil_support_is_reported_for_this_python() -> None:
    assert _core.own_gil_supported() is (sys.version_info >= (3, 12))


# Own-GIL sub-interpreters are driven here through 3.13's _interpreters module;
# 3.11 has none to test (the server uses worker processes there).
if sys.version_info >= (3, 13):

    def _run_isolated(code: str) -> object:
        """Run code in a fresh own-GIL ('isolated') sub-interpreter; return its error, or None."""
        import _interpreters  # type: ignore[import-not-found]

        iid = _interpreters.create("isolated")
        try:
            return _interpreters.exec(iid, code)
        finally:
            _interpreters.destroy(iid)

    def test_isolated_interpreter_refuses_modules_without_own_gil_support() -> None:
        # The control: this check is real, a module that does not declare support fails.
        err = _run_isolated("import _testsinglephase")
        assert err is not None
        assert "does not support loading in subinterpreters" in err.msg

    def test_core_imports_in_own_gil_subinterpreters_on_two_threads() -> None:
        code = (
            "import cadeloop._core as c\n"
            "assert not c.in_main_interpreter()\n"
            "assert c.own_gil_supported()\n"
        )
        errors: list[object] = []

        def worker() -> None:
            errors.append(_run_isolated(code))

        threads = [threading.Thread(target=worker) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert errors == [None, None]
