"""Per-epoch resource figures, compared with the thresholds users work to (seed_tables.md).

data-loading time   share of step time spent waiting for the next batch   warn at >= 10 %
GPU utilisation     NVML, sampled at every step (needs pynvml)             warn below 80 %
GPU memory          torch.cuda.max_memory_allocated / card memory          warn at >= 90 %
all-reduce          DDP gradient all-reduce share of step time, against    warn once per run, by link
                    what the backend and link sustain (`GRADIENT_LINKS`)
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
# an all-reduce under this share of a step is not worth a word, whatever the link moves
ALLREDUCE_SHARE_MIN = 0.05
# a link moving less than this part of what it sustains is called slow
SLOW_LINK_RATIO = 0.5


@dataclass(frozen=True)
class GradientLink:
    """How DDP's gradients travel between ranks: the bus bandwidth the link sustains at least (None where
    the ranks share one host's cores, so the all-reduce competes with the step rather than waits on a
    wire), the share of a step worth a warning, and what a user changes in each case."""

    name: str
    floor_gb_s: float | None
    share_max: float
    check_link: str  # the remedy when the link moves less than its floor
    lower_share: str  # the remedy when the link is fine but the all-reduce is a large share of the step


# Floors: PCIe 3.0 x16 carries about 12 GB/s each way and NCCL's ring reaches most of it between GPUs
# of one host (NVLink far more); 10 Gb Ethernet carries 1.25 GB/s. Half of each, so a warning means
# a link that is misconfigured or shared, not one a little below its best.
GRADIENT_LINKS: dict[tuple[str, bool], GradientLink] = {
    ("nccl", False): GradientLink(
        "NCCL between the GPUs of one host",
        6.0,
        0.10,
        "check that the GPUs reach each other directly (`nvidia-smi topo -m`: NVLink or PCIe P2P; "
        "NCCL_P2P_DISABLE unset)",
        "raise the batch per GPU (more work per all-reduce) or train on fewer GPUs",
    ),
    ("nccl", True): GradientLink(
        "NCCL across hosts",
        0.6,
        0.15,
        "give NCCL the fastest network between the hosts (InfiniBand or RoCE; NCCL_SOCKET_IFNAME / "
        "NCCL_IB_HCA name it; NCCL_DEBUG=INFO shows which it took)",
        "raise the batch per GPU (more work per all-reduce) or put more GPUs in each host",
    ),
    ("gloo", False): GradientLink(
        "gloo between processes of one CPU host",
        None,
        0.25,
        "",
        "the processes share this host's cores: run one process (`--nproc_per_node 1`, or plain "
        "python) and it uses them all with no all-reduce",
    ),
    ("gloo", True): GradientLink(
        "gloo across CPU hosts",
        0.6,
        0.25,
        "the network between the hosts is the limit: a faster or less busy one, or fewer hosts",
        "use fewer, larger hosts",
    ),
}


def gradient_link(info: DistInfo) -> GradientLink | None:
    """The link DDP's gradients take in this job; None for one process (nothing is all-reduced)."""
    if not info.distributed or info.backend is None:
        return None
    return GRADIENT_LINKS.get((info.backend, info.world_size > info.local_world_size))


def allreduce_note(
    link: GradientLink, world_size: int, allreduce_ms: float, step_ms: float, gradient_bytes: float
) -> str | None:
    """The warning for one epoch's means, or None: the all-reduce's share of a step, and the bus
    bandwidth it reached (a ring all-reduce moves 2 (n-1)/n of the gradients per rank) against the
    link's floor. A slow link is named at any share worth a word; a healthy link only past its share."""
    share = allreduce_ms / step_ms if step_ms > 0 else 0.0
    if share < ALLREDUCE_SHARE_MIN:
        return None
    cost = f"all-reduce takes {share:.0%} of each training step ({allreduce_ms:.0f} of {step_ms:.0f} ms)"
    if link.floor_gb_s is not None and allreduce_ms > 0:
        bus_gb_s = 2 * (world_size - 1) / world_size * gradient_bytes / (allreduce_ms / 1e3) / 1e9
        if bus_gb_s < SLOW_LINK_RATIO * link.floor_gb_s:
            return (
                f"{cost}, moving {bus_gb_s:.2f} GB/s where {link.name} sustains "
                f">= {link.floor_gb_s:g} GB/s: {link.check_link}"
            )
    if share >= link.share_max:
        return f"{cost} over {link.name}: {link.lower_share}"
    return None


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
    allreduce_bytes: list[int] = field(default_factory=list)
    allreduce_warning: str | None = None  # set by the monitor, on the first epoch that earns it
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
        if self.allreduce_warning:
            notes.append(self.allreduce_warning)
        return notes


class ResourceMonitor:
    """Timers around the loop: `data_ready()` when a batch arrives, `step_done()` after the step."""

    def __init__(self, device: torch.device):
        self.device = device
        self.nvml = Nvml(device)
        self._pending_allreduce_s = 0.0
        self._pending_allreduce_bytes = 0
        self.link: GradientLink | None = None  # set with the DDP hook
        self.world_size = 1
        self.allreduce_warned = False  # the all-reduce warning is said once per run
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
        self._pending_allreduce_bytes = 0
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
            self.epoch.allreduce_bytes.append(self._pending_allreduce_bytes)
            self._pending_allreduce_s = 0.0
            self._pending_allreduce_bytes = 0
        util = self.nvml.utilisation()
        if util is not None:
            self.epoch.gpu_util.append(util)

    def end_epoch(self) -> EpochResources:
        if self.device.type == "cuda":
            self.epoch.peak_memory_bytes = int(torch.cuda.max_memory_allocated(self.device))
        else:
            self.epoch.peak_memory_bytes = peak_rss_bytes()
        self._judge_allreduce()
        return self.epoch

    def _judge_allreduce(self) -> None:
        """Attach the all-reduce warning to the first epoch that earns it, and to no later one: the
        link and the model do not change within a run, so once is enough to act on."""
        epoch = self.epoch
        if self.allreduce_warned or self.link is None or not epoch.allreduce_ms or not epoch.steps:
            return
        epoch.allreduce_warning = allreduce_note(
            self.link,
            self.world_size,
            statistics.fmean(epoch.allreduce_ms),
            epoch.step_seconds / epoch.steps * 1e3,
            statistics.fmean(epoch.allreduce_bytes),
        )
        self.allreduce_warned = epoch.allreduce_warning is not None

    def ddp_comm_hook(self, info: DistInfo) -> Callable:
        """A DDP communication hook: the default all-reduce, timed from launch to completion, with the
        bytes it moved; `info` names the link they take (`gradient_link`)."""
        import torch.distributed as dist

        self.link = gradient_link(info)
        self.world_size = info.world_size
        monitor = self

        def timed_allreduce(process_group, bucket):
            group = process_group if process_group is not None else dist.group.WORLD
            started = time.perf_counter()
            tensor = bucket.buffer().div_(dist.get_world_size(group))
            monitor._pending_allreduce_bytes += tensor.numel() * tensor.element_size()
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
