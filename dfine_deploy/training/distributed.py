"""Process-group setup from torchrun's environment, and the few collectives the trainer needs.

One process (plain `python train/main.py`) never touches torch.distributed: no process group, no
"env:// needs MASTER_ADDR" errors. Under torchrun the device comes from LOCAL_RANK (the global rank
is wrong on the second node), the backend is NCCL on CUDA and gloo on CPU, and each rank gets an
equal share of the cores this process may use (`dfine_deploy.cores`: affinity mask and cgroup CPU
quota) as torch threads.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from dfine_deploy.cores import usable_cores
from dfine_deploy.errors import TrainingError


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    device: torch.device = torch.device("cpu")
    backend: str | None = None  # None: single process, no process group
    threads: int = 1

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    """torchrun's `name` variable; one line when it holds something torchrun never writes."""
    value = os.environ.get(name)
    if value in (None, ""):
        return default
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise TrainingError(
            f"environment variable {name}={value!r} is not a whole number >= 0; torchrun sets it, so "
            f"unset it to run one process (unset {name}), or start the run with torchrun"
        )
    return number


def resolve_device(requested: str | None, local_rank: int) -> torch.device:
    """`-d cuda` (or auto with a GPU) maps each rank to cuda:LOCAL_RANK; otherwise the CPU."""
    if requested in (None, "", "auto"):
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(requested)
    except RuntimeError:
        raise TrainingError(f"-d {requested!r}: not a device; use cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise TrainingError(
                f"device '{requested}' was asked for but CUDA is not available here; "
                "use -d cpu (or leave -d out to pick automatically)"
            )
        if device.index is None:
            device = torch.device("cuda", local_rank % torch.cuda.device_count())
    return device


def init_distributed(requested_device: str | None = None, timeout_s: float = 3600.0) -> DistInfo:
    """Join the torchrun job if there is one; set the device and the per-rank thread count.

    The timeout is long because ranks > 0 wait in a barrier while rank 0 evaluates."""
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world_size = _env_int("LOCAL_WORLD_SIZE", 1)
    device = resolve_device(requested_device, local_rank)
    threads = max(1, usable_cores() // max(1, local_world_size))
    torch.set_num_threads(threads)
    backend = None
    if world_size > 1:
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group(
                backend=backend,
                init_method="env://",
                timeout=datetime.timedelta(seconds=timeout_s),
                **({"device_id": device} if device.type == "cuda" else {}),
            )
    elif device.type == "cuda":
        torch.cuda.set_device(device)
    return DistInfo(rank, local_rank, world_size, local_world_size, device, backend, threads)


def cleanup(info: DistInfo) -> None:
    if info.distributed and dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def rank0_takes_all_cores(info: DistInfo) -> Iterator[None]:
    """Rank 0 runs the smoke test alone while the other ranks of this host wait in a barrier, so on
    the CPU it may use their cores meanwhile (2 threads instead of 1 on a 2-core, 2-process run).
    Validation does not (`Job.validate` says why)."""
    if info.device.type != "cpu" or info.local_world_size <= 1 or not info.is_main:
        yield
        return
    torch.set_num_threads(usable_cores())
    try:
        yield
    finally:
        torch.set_num_threads(info.threads)


def barrier(info: DistInfo) -> None:
    if info.distributed:
        if info.backend == "nccl":
            dist.barrier(device_ids=[info.device.index])
        else:
            dist.barrier()


def broadcast_object(info: DistInfo, obj: Any) -> Any:
    """Rank 0's value on every rank (e.g. 'stop now' decisions, the resume path)."""
    if not info.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def seed_everything(seed: int, rank: int = 0) -> None:
    """Seed python, numpy and torch (all devices) with seed + rank, so ranks draw different noise."""
    value = int(seed) + int(rank)
    random.seed(value)
    np.random.seed(value % (2**32))
    torch.manual_seed(value)


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model under DDP/DataParallel (what checkpoints and EMA hold)."""
    return model.module if hasattr(model, "module") else model


def wrap_model(
    model: nn.Module, info: DistInfo, *, sync_bn: bool, find_unused_parameters: bool
) -> tuple[nn.Module, bool]:
    """DDP-wrap for >1 process; SyncBatchNorm only where it works (CUDA, >1 process).

    Returns the (possibly wrapped) model and whether SyncBatchNorm was applied.
    """
    if not info.distributed:
        return model, False
    used_sync_bn = bool(sync_bn and info.device.type == "cuda")
    if used_sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    device_ids = [info.device.index] if info.device.type == "cuda" else None
    wrapped = nn.parallel.DistributedDataParallel(
        model, device_ids=device_ids, find_unused_parameters=find_unused_parameters
    )
    return wrapped, used_sync_bn
