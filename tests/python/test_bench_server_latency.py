"""bench/http/driver.py reads cadeloop's own latency percentiles from the pair's histogram (the bucket counts
of two stats snapshots) to put the server-side p99 beside the load generator's. Its reading of the buckets
must be the server's: from one real server's counters, the driver's p50 and p99 are the ones the server
reports itself.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from server_harness import ServerProcess
from server_taskset import echo_in_order

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "http"))
import driver  # noqa: E402


def test_the_drivers_percentiles_are_the_servers_own(tmp_path: Path) -> None:
    stats = tmp_path / "stats.json"
    srv = ServerProcess("raw_app:app", "--cores", "1", "--stats-json-on-exit", str(stats), tmp=tmp_path).start()
    try:
        echo_in_order(srv.port, 300)
    finally:
        assert srv.stop() == 0
    after = json.loads(stats.read_text())
    assert after["requests"] == 300, after
    assert sum(after["latency_buckets"]) == 300
    got = driver.server_latency({"latency_buckets": [0] * len(after["latency_buckets"])}, after)
    assert got == {"server_p50_us": float(after["latency_p50_us"]),
                   "server_p99_us": float(after["latency_p99_us"])}, (got, after["latency_buckets"])


def test_a_run_is_the_difference_of_two_snapshots() -> None:
    # 100 requests before the run, all under 8 µs; 100 in it, of which 98 in bucket 8 (8 µs) and 2 in
    # bucket 40 ((8 + 0) << 4 = 128 µs, up to 144 µs): the run's p99 is that bucket's upper bound.
    count = 241
    before = [0] * count
    before[3] = 100
    after = list(before)
    after[8] += 98
    after[40] += 2
    assert driver.bucket_lower_us(40) == 128 and driver.bucket_lower_us(41) == 144
    assert driver.server_latency({"latency_buckets": before}, {"latency_buckets": after}) == {
        "server_p50_us": 9.0, "server_p99_us": 144.0}
    assert driver.server_latency({}, {"latency_buckets": after}) == {}
