"""Every thread pool and worker count follows `dfine_deploy.cores`: a container with a 1-CPU quota on a
64-core host (cgroup `cpu.max` "100000 100000") gets one onnxruntime, OpenVINO and torch thread,
not the host's count; an explicit count wins; an unrestricted host keeps each library's default."""

from __future__ import annotations

import numpy as np
import pytest

from dfine_deploy import cores
from dfine_deploy.runtime import Detector
from tests.runtime.tiny_graphs import dfine_like

HOST = 64


def limits(quota: float | None) -> cores.CoreLimits:
    return cores.CoreLimits(host=HOST, affinity=HOST, quota=quota, quota_file="/sys/fs/cgroup/cpu.max")


@pytest.fixture
def graph(tmp_path):
    return dfine_like(tmp_path / "model.onnx", size=32)


@pytest.fixture
def one_cpu_quota(monkeypatch):
    monkeypatch.setattr(cores, "read_limits", lambda: limits(1.0))


def ort_threads(detector: Detector) -> int:
    return detector.backend.session.get_session_options().intra_op_num_threads


def test_onnxruntime_is_sized_to_the_quota(graph, one_cpu_quota):
    assert ort_threads(Detector.open(graph, backend="onnxruntime", device="cpu")) == 1


def test_an_explicit_thread_count_wins_over_the_quota(graph, one_cpu_quota):
    assert ort_threads(Detector.open(graph, backend="onnxruntime", device="cpu", threads=2)) == 2


def test_an_unrestricted_host_keeps_onnxruntimes_own_default(graph, monkeypatch):
    monkeypatch.setattr(cores, "read_limits", lambda: limits(None))
    assert ort_threads(Detector.open(graph, backend="onnxruntime", device="cpu")) == 0  # 0: its default


def test_openvino_compiles_with_the_quota(graph, one_cpu_quota):
    detector = Detector.open(graph, backend="openvino", device="cpu")
    detector.predict([np.zeros((32, 32, 3), np.uint8)])
    compiled = [entry[0] for entry in detector.backend._compiled.values()]
    assert compiled and all(int(c.get_property("INFERENCE_NUM_THREADS")) == 1 for c in compiled)


def test_export_gates_and_trainer_threads_follow_the_quota(one_cpu_quota, monkeypatch):
    import torch

    from dfine_deploy.export.settings import ExportSettings
    from dfine_deploy.training import distributed

    assert ExportSettings(model="dfine-n", output="out").threads == 1
    before = torch.get_num_threads()
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    try:
        assert distributed.init_distributed("cpu").threads == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_loader_workers_are_lowered_to_each_ranks_share_and_say_so(monkeypatch, caplog):
    from dfine_deploy.data.loader import loader_workers

    monkeypatch.setattr(cores, "read_limits", lambda: limits(4.0))
    assert loader_workers(8, processes_on_host=2) == 2
    assert "num_workers 8 lowered to 2" in caplog.text and "cgroup CPU quota 4" in caplog.text
    assert loader_workers(2, processes_on_host=2) == 2 and loader_workers(0, processes_on_host=2) == 0
    assert loader_workers(4, processes_on_host=8) == 1  # never below one worker when asked for some
