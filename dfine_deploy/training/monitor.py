"""Per-epoch resource figures, compared with the thresholds users work to (seed_tables.md).

data-loading time   share of step time spent waiting for the next batch   warn at >= 10 %
GPU utilisation     NVML, sampled at every step (needs pynvml)             warn below 80 %
GPU memory          torch.cuda.max_memory_allocated / card memory          warn at >= 90 %
all-reduce          DDP gradient all-reduce time per step                  warn at >= 5 ms
CPU memory          peak resident set size of this process (reported, no threshold)
"""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dfine_deploy.training.distributed import DistInfo, broadcast_object

DATA_SHARE_MAX = 0.10
GPU_UTIL_MIN = 80.0
GPU_MEMORY_SHARE_MAX = 0.90
ALLREDUCE_MS_MAX = 5.0

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def peak_rss_bytes() -> int:
    """Peak RSS since the last `reset_peak_rss` (Linux VmHWM), else since process start."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> bool:
    """Start a new peak-RSS window (writing 5 to clear_refs resets VmHWM); False if not allowed."""
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


class Nvml:
    """GPU utilisation through NVML; `available` is False (with `reason`) without pynvml or a GPU."""

    def __init__(self, device: torch.device):
        self.handle = None
        self.reason = ""
        if device.type != "cuda":
            self.reason = "no GPU in use"
            return
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            self._nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        except ImportError:
            self.reason = "pynvml is not installed (pip install nvidia-ml-py) - GPU utilisation not measured"
        except Exception as exc:  # NVML library missing or driver error
            self.reason = f"NVML unavailable ({exc}) - GPU utilisation not measured"

    @property
    def available(self) -> bool:
        return self.handle is not None

    def utilisation(self) -> float | None:
        if self.handle is None:
            return None
        return float(self._nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)


@dataclass
class EpochResources:
    steps: int = 0
    data_seconds: float = 0.0
    step_seconds: float = 0.0  # data wait + compute, i.e. the wall time of the loop
    allreduce_ms: list[float] = field(default_factory=list)
    gpu_util: list[float] = field(default_factory=list)
    peak_memory_bytes: int = 0
    memory_kind: str = "cpu_rss"  # "cpu_rss" | "cuda_max_allocated"
    memory_total_bytes: int | None = None
    gpu_util_note: str = ""

    @property
    def data_share(self) -> float:
        return self.data_seconds / self.step_seconds if self.step_seconds > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "data_time_share": round(self.data_share, 4),
            "step_time_s": round(self.step_seconds / max(1, self.steps), 4),
            "peak_memory_mb": round(self.peak_memory_bytes / 2**20, 1),
            "memory_kind": self.memory_kind,
        }
        if self.allreduce_ms:
            out["allreduce_ms_per_step"] = round(statistics.fmean(self.allreduce_ms), 3)
        if self.gpu_util:
            out["gpu_util_percent"] = round(statistics.fmean(self.gpu_util), 1)
        elif self.gpu_util_note:
            out["gpu_util_percent"] = None
        return out

    def warnings(self) -> list[str]:
        notes = []
        if self.steps and self.data_share >= DATA_SHARE_MAX:
            notes.append(
                f"data loading takes {self.data_share:.0%} of step time (target < {DATA_SHARE_MAX:.0%}): "
                "raise num_workers, enable the image cache, or use pin_memory on GPU"
            )
        if self.gpu_util and statistics.fmean(self.gpu_util) < GPU_UTIL_MIN:
            notes.append(
                f"GPU utilisation {statistics.fmean(self.gpu_util):.0f} % (target >= {GPU_UTIL_MIN:.0f} %): "
                "the GPU waits on data or on small batches"
            )
        if self.memory_kind == "cuda_max_allocated" and self.memory_total_bytes:
            share = self.peak_memory_bytes / self.memory_total_bytes
            if share >= GPU_MEMORY_SHARE_MAX:
                notes.append(
                    f"GPU memory peak {share:.0%} of the card (target < {GPU_MEMORY_SHARE_MAX:.0%}): "
                    "lower the batch size or enable AMP"
                )
        if self.allreduce_ms and statistics.fmean(self.allreduce_ms) >= ALLREDUCE_MS_MAX:
            notes.append(
                f"all-reduce {statistics.fmean(self.allreduce_ms):.1f} ms per step "
                f"(target < {ALLREDUCE_MS_MAX:.0f} ms): check the interconnect and the backend (NCCL on GPUs)"
            )
        return notes


class ResourceMonitor:
    """Timers around the loop: `data_ready()` when a batch arrives, `step_done()` after the step."""

    def __init__(self, device: torch.device):
        self.device = device
        self.nvml = Nvml(device)
        self._pending_allreduce_s = 0.0
        self.epoch = EpochResources()
        self._mark = time.perf_counter()

    def start_epoch(self) -> None:
        self.epoch = EpochResources(gpu_util_note=self.nvml.reason)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.epoch.memory_kind = "cuda_max_allocated"
            self.epoch.memory_total_bytes = torch.cuda.get_device_properties(self.device).total_memory
        else:
            reset_peak_rss()
        self._pending_allreduce_s = 0.0
        self._mark = time.perf_counter()

    def data_ready(self) -> None:
        now = time.perf_counter()
        self.epoch.data_seconds += now - self._mark

    def step_done(self, distributed: bool) -> None:
        now = time.perf_counter()
        self.epoch.step_seconds += now - self._mark
        self._mark = now
        self.epoch.steps += 1
        if distributed:
            self.epoch.allreduce_ms.append(self._pending_allreduce_s * 1e3)
            self._pending_allreduce_s = 0.0
        util = self.nvml.utilisation()
        if util is not None:
            self.epoch.gpu_util.append(util)

    def end_epoch(self) -> EpochResources:
        if self.device.type == "cuda":
            self.epoch.peak_memory_bytes = int(torch.cuda.max_memory_allocated(self.device))
        else:
            self.epoch.peak_memory_bytes = peak_rss_bytes()
        return self.epoch

    def ddp_comm_hook(self) -> Callable:
        """A DDP communication hook: the default all-reduce, timed from launch to completion."""
        import torch.distributed as dist

        monitor = self

        def timed_allreduce(process_group, bucket):
            group = process_group if process_group is not None else dist.group.WORLD
            started = time.perf_counter()
            tensor = bucket.buffer().div_(dist.get_world_size(group))
            future = dist.all_reduce(tensor, group=group, async_op=True).get_future()

            def finish(fut):
                monitor._pending_allreduce_s += time.perf_counter() - started
                return fut.value()[0]

            return future.then(finish)

        return timed_allreduce


def auto_batch_size(
    try_step: Callable[[int], None],
    device: torch.device,
    *,
    start: int = 2,
    limit: int = 256,
    memory_share: float = GPU_MEMORY_SHARE_MAX,
) -> tuple[int | None, str]:
    """Largest per-GPU batch whose training step stays under `memory_share` of the card.

    Doubles the batch until a step runs out of memory or passes the share, then returns the
    last one that fitted. On a CPU there is nothing to fit: returns (None, explanation).
    """
    if device.type != "cuda":
        return None, (
            "--auto-batch does nothing on a CPU: memory is not the limit there; "
            "the config's total_batch_size is used as it is"
        )
    total = torch.cuda.get_device_properties(device).total_memory
    best = None
    batch = start
    while batch <= limit:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        try:
            try_step(batch)
        except torch.OutOfMemoryError:
            break
        peak = torch.cuda.max_memory_allocated(device)
        if peak > memory_share * total:
            break
        best = batch
        batch *= 2
    torch.cuda.empty_cache()
    if best is None:
        return None, f"--auto-batch: even a batch of {start} does not fit in {total / 2**30:.1f} GiB"
    return (
        best,
        f"--auto-batch: {best} images per GPU fit under {memory_share:.0%} of {total / 2**30:.1f} GiB",
    )


def auto_batch_plan(
    try_step: Callable[[int], None],
    model: nn.Module,
    info: DistInfo,
    global_batch: int,
    accumulate: int,
    log: Any,
) -> tuple[int, int]:
    """--auto-batch: the largest per-GPU batch that fits. Below the configured batch per rank, accumulate
    enough micro-batches to keep the global batch; above it, the global batch grows to what fits.
    Returns (accumulate, global_batch)."""
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    found, message = auto_batch_size(try_step, info.device)
    model.load_state_dict(before)  # the trial steps must not move BatchNorm statistics
    found = broadcast_object(info, found)
    log.log(message)
    if found is None:
        return accumulate, global_batch
    per_rank = global_batch // info.world_size
    if found >= per_rank // accumulate:
        if accumulate == 1:
            log.log(f"--auto-batch: global batch {found * info.world_size} ({found} per GPU)")
            return 1, found * info.world_size
        return accumulate, global_batch
    steps = next(a for a in range(1, per_rank + 1) if per_rank % a == 0 and per_rank // a <= found)
    log.log(
        f"--auto-batch: {per_rank} images per GPU do not fit; accumulating {steps} micro-batches of "
        f"{per_rank // steps} per optimizer step keeps the global batch at {global_batch}"
    )
    return steps, global_batch
