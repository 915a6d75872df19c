"""Other libraries' own test suites (tests/conformance/peer_suites.py), run by
tests/conformance/run_peer_suites.py on asyncio and on cadeloop at the same
time: every test that passes on asyncio passes on cadeloop (or is named, with
its reason, in KNOWN_DIFFERENCES), and no test of either run hits the per-test
timeout. The suites' sources are fetched once from PyPI into build/peer/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "tests" / "conformance" / "run_peer_suites.py"
sys.path.insert(0, str(RUNNER.parent))

from peer_suites import KNOWN_DIFFERENCES, SUITES  # noqa: E402


@pytest.mark.timeout(2400)
@pytest.mark.parametrize("suite", sorted(SUITES))
def test_peer_suite_passes_on_cadeloop_where_it_passes_on_asyncio(suite: str, tmp_path: Path) -> None:
    out = tmp_path / "peer.json"
    proc = subprocess.run(
        [sys.executable, str(RUNNER), "--json", str(out), suite], capture_output=True, text=True, timeout=2350
    )
    print(proc.stdout)  # the counts of both runs (pytest -rA shows them)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    (report,) = json.loads(out.read_text())["suites"]
    assert report["unexplained"] == [], proc.stdout
    assert report["timeouts"] == {"asyncio": [], "cadeloop": []}, proc.stdout
    # The cadeloop run really ran on cadeloop: almost every test made a
    # cadeloop loop and none made another one.
    assert report["made_other_loops"] == [], proc.stdout
    assert report["on_cadeloop"] >= 0.9 * report["cadeloop"]["passed"], proc.stdout
    # Both runs ran the same tests, and most of them passed on asyncio (the
    # suite runs here at all).
    assert sum(report["asyncio"].values()) == sum(report["cadeloop"].values()), proc.stdout
    assert report["asyncio"]["passed"] >= 0.8 * sum(report["asyncio"].values()), proc.stdout
    # A known difference that no longer shows is taken off the list.
    stale = sorted(set(KNOWN_DIFFERENCES.get(suite, {})) - set(report["differences"]))
    assert stale == [], f"these pass on cadeloop now; drop them from KNOWN_DIFFERENCES: {stale}"
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
