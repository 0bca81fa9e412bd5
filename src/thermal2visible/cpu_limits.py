"""How many cores this process may use: its CPU affinity, and its cgroup's CPU quota (containers)."""

import math
import os
from pathlib import Path


def cpu_quota(cgroup_root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPUs' worth of time this process's cgroup may use (`docker --cpus`, a Kubernetes limit), None if
    unlimited: cgroup v2's cpu.max, or v1's cfs quota over its period."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if number == "0":
            limit = cgroup_root / path.lstrip("/") / "cpu.max"
            quota, period = limit.read_text().split() if limit.is_file() else ("max", "1")
        elif "cpu" in controllers.split(","):
            folder = cgroup_root / "cpu" / path.lstrip("/")
            if not (folder / "cpu.cfs_quota_us").is_file():
                continue
            quota, period = ((folder / name).read_text().strip() for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
        else:
            continue
        if quota not in ("max", "-1"):
            return int(quota) / int(period)
    return None


def usable_cores() -> int:
    """The cores this process may run on (its affinity), fewer where its cgroup's quota allows less time: more
    threads than that only queue for the quota."""
    cores, quota = len(os.sched_getaffinity(0)), cpu_quota()
    return max(1, min(cores, math.ceil(quota))) if quota else cores
