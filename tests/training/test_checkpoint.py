"""Checkpoint schema helpers: atomic writes, resume validation, RNG, meta (class heads: test_heads.py)."""

import random

import numpy as np
import pytest
import torch

from dfine_deploy.errors import CheckpointError
from dfine_deploy.model.spec import size_spec
from dfine_deploy.training.checkpoint import (
    atomic_torch_save,
    build_meta,
    capture_rng,
    find_auto_resume,
    load_training_checkpoint,
    restore_rng,
)


def _full_state():
    return {"model": {"w": torch.ones(2)}, "optimizer": {}, "lr_scheduler": {}, "last_epoch": 0, "step": 3}


def test_atomic_save_replaces_and_leaves_no_temp(tmp_path):
    target = tmp_path / "last.pth"
    atomic_torch_save(_full_state(), target)
    atomic_torch_save({**_full_state(), "step": 9}, target)
    assert load_training_checkpoint(target)["step"] == 9
    assert [p.name for p in tmp_path.iterdir()] == ["last.pth"]
    assert find_auto_resume(tmp_path) == target


def test_failed_save_keeps_old_file(tmp_path):
    target = tmp_path / "last.pth"
    atomic_torch_save(_full_state(), target)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        atomic_torch_save({"x": Unpicklable()}, target)
    assert load_training_checkpoint(target)["step"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["last.pth"]


def test_damaged_or_partial_checkpoints_get_clear_errors(tmp_path):
    broken = tmp_path / "broken.pth"
    broken.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(
        CheckpointError, match="broken.pth: truncated or not a PyTorch checkpoint.*checkpointNNNN"
    ):
        load_training_checkpoint(broken)
    weights_only = tmp_path / "weights.pth"
    torch.save({"model": {}}, weights_only)
    with pytest.raises(CheckpointError, match="use -t"):
        load_training_checkpoint(weights_only)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_training_checkpoint(tmp_path / "absent.pth")
    assert find_auto_resume(tmp_path / "nowhere") is None


def test_a_runs_folder_given_for_a_checkpoint_names_the_files_inside(tmp_path):
    """-r and -t take a file; given the run's folder they name its checkpoints, last.pth first for
    -r (where the run goes on) and best.pth first for -t. -r used to say "no such checkpoint"."""
    from dfine_deploy.model.weights import load_checkpoint

    run = tmp_path / "run"
    run.mkdir()
    for name in ("best.pth", "last.pth", "log.jsonl"):
        (run / name).write_bytes(b"")
    with pytest.raises(CheckpointError) as resumed:
        load_training_checkpoint(run)
    assert str(resumed.value) == (
        f"{run} is a folder, not a checkpoint file; it holds last.pth, best.pth: give one of those files "
        f"(e.g. {run / 'last.pth'})"
    )
    with pytest.raises(CheckpointError, match=r"it holds best.pth, last.pth: .*\(e.g. .*best.pth\)"):
        load_checkpoint(run)


def test_rng_round_trip():
    state = capture_rng()
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    restore_rng(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


def test_meta_carries_spec_and_classes():
    meta = build_meta(
        model_spec=size_spec("n").with_classes(3), class_names=["a", "b", "c"], config={"epochs": 1}
    )
    assert meta["schema_version"] == 1 and meta["size"] == "n"
    assert meta["model_spec"]["num_classes"] == 3
    assert meta["input_size"] == [640, 640]
    assert {"torch", "dfine_deploy"} <= set(meta["versions"])
    assert "class_heads" not in meta  # only a -t run records where its heads came from
    tuned = build_meta(model_spec=size_spec("n"), class_names=["a"], class_heads={"rows": []})
    assert tuned["class_heads"] == {"rows": []}
