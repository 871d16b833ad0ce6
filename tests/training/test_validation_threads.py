"""Rank 0 validates on its own share of the cores while the other ranks of its host wait: a team of
OpenMP threads spins at every join, so taking the waiting ranks' cores made each validation of a
2-rank quickstart 2-4x slower whenever another process wanted a core (docs/performance.md)."""

from pathlib import Path

import pytest
import torch
from torch import nn

from dfine_deploy.training import distributed
from dfine_deploy.training.build import Job, TrainData
from dfine_deploy.training.distributed import DistInfo


class ThreadsAtSummary:
    """An evaluator that records the torch thread count the validation pass ran with."""

    def __init__(self) -> None:
        self.threads: int | None = None

    def update(self, image_ids, results) -> None:  # the loader below is empty
        raise AssertionError("no batch was given")

    def summarize(self) -> dict[str, float]:
        self.threads = torch.get_num_threads()
        return {"AP": 0.0, "AP50": 0.0}


def _job(info: DistInfo, evaluator: ThreadsAtSummary) -> Job:
    data = TrainData(
        train_loader=None,
        val_loader=[],
        class_map=None,
        reports={},
        evaluator=lambda class_map=None: evaluator,
        lines=[],
    )
    return Job(
        options=None,
        cfg=None,
        info=info,
        output_dir=Path("."),
        log=None,
        use_amp=False,
        amp_dtype=torch.bfloat16,
        seed=0,
        model=nn.Identity(),
        criterion=nn.Identity(),
        postprocessor=nn.Identity(),
        global_batch=2,
        accumulate=1,
        micro_batch=1,
        sizing="",
        data=data,
        class_heads=None,
    )


@pytest.mark.parametrize("ranks", [1, 2])
def test_rank0_validates_with_its_own_threads(monkeypatch, ranks):
    monkeypatch.setattr(distributed, "usable_cores", lambda: 2)
    info = DistInfo(
        world_size=ranks, local_world_size=ranks, backend="gloo" if ranks > 1 else None, threads=2 // ranks
    )
    before = torch.get_num_threads()
    torch.set_num_threads(info.threads)
    try:
        evaluator = ThreadsAtSummary()
        metrics = _job(info, evaluator).validate(nn.Identity())
        assert metrics == {"AP": 0.0, "AP50": 0.0}
        assert evaluator.threads == info.threads
        assert torch.get_num_threads() == info.threads  # nothing changed after the pass either
    finally:
        torch.set_num_threads(before)
