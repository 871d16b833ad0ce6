"""The CPU cores this process may use: the one place thread pools and worker counts are sized from.

Two limits, reported in two different places:
- the affinity mask (taskset, cpuset cgroups, Kubernetes' static CPU manager): `os.sched_getaffinity`;
- the CPU quota (`docker --cpus 2`, Kubernetes `limits.cpu`, systemd `CPUQuota=`): cgroup v2
  `cpu.max` ("200000 100000": 2 CPUs' worth of time per 100 ms), cgroup v1 `cpu.cfs_quota_us` over
  `cpu.cfs_period_us`. The affinity mask does not show it: a 2-CPU container on a 64-core host sees
  64 CPUs there, and a pool of 64 busy threads spends most of each period throttled.

Neither onnxruntime nor OpenVINO sees the quota: onnxruntime sizes its default pool from the host's
physical cores and, measured here, not from the affinity mask either (one core pinned by taskset,
two threads); OpenVINO from the cores it sees (microsoft/onnxruntime#29510,
openvinotoolkit/openvino#37838). So where anything restricts this process, `pool_threads` gives them
the count; on an unrestricted host their own default (physical cores, one socket for OpenVINO's
latency hint) is better than our logical count and is left alone.

A quota of q CPUs keeps floor(q) threads busy without throttling (at least 1), as Go's automaxprocs
rounds it (https://github.com/uber-go/automaxprocs).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
# where cgroup v1 mounts the cpu controller: alone, or joined with cpuacct (either order)
_V1_CPU_DIRS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")


@dataclass(frozen=True)
class CoreLimits:
    """What limits this process's CPU use; `usable` is what thread pools are sized to."""

    host: int  # logical CPUs of the machine (os.cpu_count)
    affinity: int  # CPUs in this process's affinity mask
    quota: float | None  # CPUs' worth of time per period the cgroups allow; None: no quota
    quota_file: str = ""  # the file the (lowest) quota came from

    @property
    def usable(self) -> int:
        if self.quota is None:
            return self.affinity
        return max(1, min(self.affinity, math.floor(self.quota + 1e-9)))

    @property
    def restricted(self) -> bool:
        """Whether anything lowers this process below the whole machine."""
        return self.usable < self.host

    def describe(self) -> str:
        """One line for logs and reports: '2 of 64 CPUs (cgroup CPU quota 2: /sys/fs/cgroup/cpu.max)'."""
        notes = []
        if self.affinity < self.host:
            notes.append(f"affinity mask {self.affinity}")
        if self.quota is not None:
            notes.append(f"cgroup CPU quota {self.quota:g}: {self.quota_file}")
        return f"{self.usable} of {self.host} CPUs" + (f" ({'; '.join(notes)})" if notes else "")


def _own_cgroups(proc_cgroup: Path) -> tuple[str, str]:
    """This process's cgroup v2 path and cgroup v1 cpu-controller path ('' where absent)."""
    v2 = v1 = ""
    try:
        text = proc_cgroup.read_text()
    except OSError:
        return v2, v1
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _candidate_dirs(base: Path, own: str) -> list[Path]:
    """`base` and the folders of `own`'s path and its parents below it that exist: a quota set on
    any of them applies (a systemd slice above a service). In a container `own` names the host's
    path, absent from its own view of the tree, so only `base` (the container's cgroup) is read."""
    parts = [p for p in own.split("/") if p]
    dirs = [base.joinpath(*parts[:n]) for n in range(len(parts), 0, -1)]
    return [d for d in dirs if d.is_dir()] + [base]


def _read_quota(folder: Path, v2: bool) -> float | None:
    """CPUs' worth of quota set in `folder`; None when none is set or the files are absent."""
    try:
        if v2:
            fields = (folder / "cpu.max").read_text().split()
            quota, period = fields[0], (fields[1] if len(fields) > 1 else "100000")
            if quota == "max":
                return None
        else:
            quota = (folder / "cpu.cfs_quota_us").read_text().strip()
            period = (folder / "cpu.cfs_period_us").read_text().strip()
            if int(quota) < 0:  # -1: no limit
                return None
        if int(period) <= 0 or int(quota) <= 0:
            raise ValueError(f"quota {quota}, period {period}")
        return int(quota) / int(period)
    except OSError:
        return None
    except (ValueError, IndexError) as exc:
        log.warning("%s: not a CPU quota (%s); ignored, threads are sized without it", folder, exc)
        return None


def read_limits(
    cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP, affinity: int | None = None
) -> CoreLimits:
    """The limits of this process, from the cgroup tree under `cgroup_root` (a parameter so tests
    can hand in a fake tree) and the affinity mask (`affinity` overrides it for the same reason)."""
    host = os.cpu_count() or 1
    if affinity is None:
        try:
            affinity = len(os.sched_getaffinity(0))
        except AttributeError:  # macOS, Windows: no affinity mask to read
            affinity = host
    v2_path, v1_path = _own_cgroups(proc_cgroup)
    found: list[tuple[float, str]] = []
    for folder in _candidate_dirs(cgroup_root, v2_path):
        quota = _read_quota(folder, v2=True)
        if quota is not None:
            found.append((quota, str(folder / "cpu.max")))
    for name in _V1_CPU_DIRS:
        base = cgroup_root / name
        if base.is_dir():
            for folder in _candidate_dirs(base, v1_path):
                quota = _read_quota(folder, v2=False)
                if quota is not None:
                    found.append((quota, str(folder / "cpu.cfs_quota_us")))
    if not found:
        return CoreLimits(host=host, affinity=affinity, quota=None)
    quota, source = min(found)
    return CoreLimits(host=host, affinity=affinity, quota=quota, quota_file=source)


def usable_cores() -> int:
    """Cores this process may keep busy: its affinity mask, lowered to its cgroup CPU quota."""
    return read_limits().usable


def pool_threads() -> int | None:
    """Threads for a library's CPU pool (onnxruntime, OpenVINO, torch) when the caller names none:
    `usable_cores()` where the affinity mask or a quota restricts this process, else None (the
    library's own default; see the module docstring)."""
    limits = read_limits()
    return limits.usable if limits.restricted else None
