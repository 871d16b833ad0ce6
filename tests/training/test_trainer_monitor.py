"""Resource figures and their thresholds (seed_tables.md), and --auto-batch on a CPU."""

import numpy as np
import pytest
import torch

from dfine_deploy.training.monitor import (
    EpochResources,
    Nvml,
    ResourceMonitor,
    auto_batch_size,
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
        "all-reduce 7.0 ms",
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
