"""How many core pairs `--cores 0` means, and which CPUs each pair is tied to with `--pin`.

Reads only the process's affinity mask, its cgroup v2 quota and the CPU
topology in /sys; imports nothing of the package.
"""

from __future__ import annotations

import os

__all__ = ["cgroup_cpu_quota", "usable_cpus", "resolve_cores", "pin_sets"]

def cgroup_cpu_quota(root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> float | None:
    """CPUs the cgroup v2 `cpu.max` quota allows this process (the smallest along its cgroup path), or None."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    path = next((line[3:] for line in lines if line.startswith("0::")), None)
    if path is None:
        return None
    parts = [p for p in path.strip("/").split("/") if p]
    quota: float | None = None
    for depth in range(len(parts), -1, -1):
        try:
            with open(os.path.join(root, *parts[:depth], "cpu.max")) as f:
                fields = f.read().split()
        except OSError:
            continue
        if len(fields) == 2 and fields[0] != "max":
            try:
                q = int(fields[0]) / int(fields[1])
            except (ValueError, ZeroDivisionError):
                continue
            quota = q if quota is None else min(quota, q)
    return quota


def usable_cpus() -> int:
    """CPUs this process may use: its affinity mask and its cgroup quota (rounded down), at least 1."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    if quota is not None:
        n = min(n, int(quota))
    return max(1, n)


def resolve_cores(cores: int) -> int:
    """The number of pairs `--cores` asks for (0: one per usable CPU)."""
    return cores if cores > 0 else usable_cpus()


def pin_sets(n: int) -> list[list[int]]:
    """For each of n pairs, the CPUs it is tied to: one physical core (its hyperthread siblings) each, in turn."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = list(range(os.cpu_count() or 1))
    cores: list[list[int]] = []
    seen: set[int] = set()
    for cpu in allowed:
        if cpu in seen:
            continue
        siblings = {cpu}
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
                for part in f.read().strip().split(","):
                    lo, _, hi = part.partition("-")
                    siblings.update(range(int(lo), int(hi or lo) + 1))
        except (OSError, ValueError):
            pass
        group = sorted(siblings & set(allowed))
        seen.update(group)
        cores.append(group)
    return [cores[i % len(cores)] for i in range(n)]
