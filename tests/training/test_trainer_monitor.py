"""Resource figures and their thresholds (seed_tables.md), and --auto-batch on a CPU."""

import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from dfine_deploy.training.distributed import DistInfo
from dfine_deploy.training.monitor import (
    EpochResources,
    Nvml,
    ResourceMonitor,
    auto_batch_size,
    gradient_link,
    peak_rss_bytes,
)


def test_auto_batch_says_plainly_it_does_nothing_on_cpu():
    calls = []
    found, message = auto_batch_size(calls.append, torch.device("cpu"))
    assert found is None and calls == []
    assert "does nothing on a CPU" in message


def test_thresholds_warn_only_past_the_limits():
    fine = EpochResources(steps=10, data_seconds=0.5, step_seconds=10.0, allreduce_ms=[1.0, 2.0])
    assert fine.warnings() == []
    slow = EpochResources(
        steps=10,
        data_seconds=2.0,
        step_seconds=10.0,
        allreduce_ms=[6.0, 8.0],
        gpu_util=[50.0, 60.0],
        peak_memory_bytes=95,
        memory_total_bytes=100,
        memory_kind="cuda_max_allocated",
    )
    notes = " | ".join(slow.warnings())
    for fragment in (
        "data loading takes 20%",
        "GPU utilisation 55 %",
        "GPU memory peak 95%",
    ):
        assert fragment in notes
    assert slow.summary()["allreduce_ms_per_step"] == pytest.approx(7.0)


def test_cpu_epoch_reports_peak_rss_and_data_share():
    monitor = ResourceMonitor(torch.device("cpu"))
    assert not monitor.nvml.available and monitor.nvml.reason
    monitor.start_epoch()
    monitor.data_ready()
    block = np.ones(64 * 2**20 // 8)  # 64 MiB touched inside the window
    monitor.step_done(distributed=False)
    resources = monitor.end_epoch()
    assert resources.memory_kind == "cpu_rss"
    assert resources.peak_memory_bytes >= block.nbytes
    assert resources.steps == 1 and 0.0 <= resources.data_share <= 1.0
    assert peak_rss_bytes() > 0


def test_nvml_absence_is_explained():
    assert "no GPU" in Nvml(torch.device("cpu")).reason


def _monitored_epochs(info: DistInfo, step_ms: float, allreduce_ms: float, gradient_mb: float, epochs: int):
    """The warnings of each of `epochs` epochs of 10 steps with these per-step figures, as the monitor of a
    run on `info`'s link judges them (the timers' readings are set, the judgement is the monitor's)."""
    monitor = ResourceMonitor(torch.device("cpu"))
    monitor.ddp_comm_hook(info)
    said = []
    for _ in range(epochs):
        monitor.start_epoch()
        monitor.epoch.steps = 10
        monitor.epoch.step_seconds = 10 * step_ms / 1e3
        monitor.epoch.allreduce_ms = [allreduce_ms] * 10
        monitor.epoch.allreduce_bytes = [int(gradient_mb * 1e6)] * 10
        said.append([note for note in monitor.end_epoch().warnings() if "all-reduce" in note])
    return said


GLOO_ONE_HOST = DistInfo(world_size=2, local_world_size=2, backend="gloo")
NCCL_ONE_HOST = DistInfo(world_size=8, local_world_size=8, backend="nccl", device=torch.device("cpu"))
NCCL_TWO_HOSTS = DistInfo(world_size=16, local_world_size=8, backend="nccl", device=torch.device("cpu"))


def test_gloo_on_one_cpu_host_is_quiet_when_the_all_reduce_is_a_small_share():
    """The quickstart's case: 2 processes on a 2-core host, 80 ms of a 900 ms step. Nothing to change."""
    assert _monitored_epochs(GLOO_ONE_HOST, 900.0, 80.0, 16.0, epochs=3) == [[], [], []]


def test_gloo_on_one_cpu_host_names_one_process_when_the_all_reduce_dominates():
    said = _monitored_epochs(GLOO_ONE_HOST, 900.0, 450.0, 16.0, epochs=3)
    assert [len(notes) for notes in said] == [1, 0, 0]  # once per run, not every epoch
    assert "50% of each training step (450 of 900 ms)" in said[0][0]
    assert "--nproc_per_node 1" in said[0][0]


def test_nccl_on_one_host_warns_once_at_a_big_share_with_a_lever():
    # 200 MB at 30 ms over 8 GPUs: 11.7 GB/s of bus bandwidth, a healthy link, but 30 % of the step
    said = _monitored_epochs(NCCL_ONE_HOST, 100.0, 30.0, 200.0, epochs=4)
    assert [len(notes) for notes in said] == [1, 0, 0, 0]
    assert "30% of each training step" in said[0][0] and "NCCL between the GPUs of one host" in said[0][0]
    assert "raise the batch per GPU" in said[0][0]


def test_nccl_on_one_host_is_quiet_below_its_share():
    assert _monitored_epochs(NCCL_ONE_HOST, 100.0, 8.0, 200.0, epochs=2) == [[], []]


def test_a_link_below_what_it_sustains_is_named_even_at_a_modest_share():
    # 16 MB in 200 ms across 16 GPUs on two hosts: 0.15 GB/s, a quarter of what the network sustains
    said = _monitored_epochs(NCCL_TWO_HOSTS, 1000.0, 200.0, 16.0, epochs=2)
    assert [len(notes) for notes in said] == [1, 0]
    assert "0.15 GB/s" in said[0][0] and "NCCL_SOCKET_IFNAME" in said[0][0]


def test_one_process_has_no_gradient_link():
    assert gradient_link(DistInfo()) is None


def test_the_hook_counts_the_gradient_bytes_it_all_reduces():
    """A real DDP model in a one-rank gloo group: the hook's bytes per step are the gradients' bytes."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 3))
        ddp = nn.parallel.DistributedDataParallel(model)
        monitor = ResourceMonitor(torch.device("cpu"))
        ddp.register_comm_hook(None, monitor.ddp_comm_hook(GLOO_ONE_HOST))
        monitor.start_epoch()
        for _ in range(2):
            monitor.data_ready()
            ddp(torch.randn(4, 32)).sum().backward()
            monitor.step_done(distributed=True)
        epoch = monitor.end_epoch()
    finally:
        dist.destroy_process_group()
    gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert epoch.allreduce_bytes == [gradient_bytes, gradient_bytes]
    assert len(epoch.allreduce_ms) == 2 and all(ms > 0 for ms in epoch.allreduce_ms)
