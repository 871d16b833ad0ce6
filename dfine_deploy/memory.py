"""Memory a command will need, checked before it starts: `--imgsz 8192 8192` ran an export for four
minutes past 8.5 GB before the kernel killed it. No torch here (bench and serve use it too).

`ModelSpec.activation_bytes` is the model's side (one inference pass); this module holds what the
machine has and the one-line refusal.
"""

from __future__ import annotations

from pathlib import Path

from dfine_deploy.errors import ModelError

GIB = 1024**3


def available_memory_bytes() -> int | None:
    """What this process may still allocate: the kernel's MemAvailable, or the room left under the
    cgroup's limit (containers, Kubernetes, systemd slices) when that is smaller. None where neither
    can be read (not Linux)."""
    room = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                room.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for limit, usage in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # cgroup v2
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            cap = Path(limit).read_text().strip()
            if cap != "max" and int(cap) < 1 << 60:  # v1 says "no limit" with a huge number
                room.append(max(int(cap) - int(Path(usage).read_text()), 0))
        except (OSError, ValueError):
            continue
    return min(room) if room else None


def check_memory(needed: int, what: str, fix: str, error: type[Exception] = ModelError) -> None:
    """Refuse `what` in one line when `needed` bytes (a lower-bound estimate) exceed what is available.
    `fix` says what to change (e.g. 'use a smaller --imgsz')."""
    available = available_memory_bytes()
    if available is None or needed <= available:
        return
    raise error(
        f"{what} needs at least {needed / GIB:.1f} GiB of memory (estimated from the input size) and "
        f"this machine has {available / GIB:.1f} GiB available: {fix}"
    )
