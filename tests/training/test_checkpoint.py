"""Checkpoint schema helpers: atomic writes, resume validation, RNG, class-head remapping."""

import random

import numpy as np
import pytest
import torch

from dfine_deploy.errors import CheckpointError
from dfine_deploy.model.spec import size_spec
from dfine_deploy.training.checkpoint import (
    OBJ365_IDS,
    atomic_torch_save,
    build_meta,
    capture_rng,
    find_auto_resume,
    load_training_checkpoint,
    remap_class_heads,
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
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_training_checkpoint(broken)
    weights_only = tmp_path / "weights.pth"
    torch.save({"model": {}}, weights_only)
    with pytest.raises(CheckpointError, match="use -t"):
        load_training_checkpoint(weights_only)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_training_checkpoint(tmp_path / "absent.pth")
    assert find_auto_resume(tmp_path / "nowhere") is None


def test_rng_round_trip():
    state = capture_rng()
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    restore_rng(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


def test_meta_carries_spec_and_classes():
    meta = build_meta(model_spec=size_spec("n").with_classes(3), class_names=["a", "b", "c"], config={"epochs": 1})
    assert meta["schema_version"] == 1 and meta["size"] == "n"
    assert meta["model_spec"]["num_classes"] == 3
    assert meta["input_size"] == [640, 640]
    assert {"torch", "dfine_deploy"} <= set(meta["versions"])


def test_obj365_to_coco_rows_follow_the_id_table():
    old = torch.arange(366, dtype=torch.float32)[:, None].repeat(1, 4)  # row i holds value i
    ckpt = {"decoder.dec_score_head.0.weight": old, "decoder.enc_score_head.bias": old[:, 0],
            "decoder.other.weight": torch.zeros(5)}
    model = {"decoder.dec_score_head.0.weight": torch.zeros(80, 4), "decoder.enc_score_head.bias": torch.zeros(80),
             "decoder.other.weight": torch.zeros(5)}
    new, remapped = remap_class_heads(ckpt, model)
    assert sorted(remapped) == ["decoder.dec_score_head.0.weight", "decoder.enc_score_head.bias"]
    assert new["decoder.dec_score_head.0.weight"][:, 0].tolist() == [i + 1 for i in OBJ365_IDS]
    assert new["decoder.enc_score_head.bias"][0].item() == 1  # person: Objects365 id 0 -> row 1
    # and back: growing places COCO rows at their Objects365 rows
    back, _ = remap_class_heads({"decoder.enc_score_head.bias": new["decoder.enc_score_head.bias"]},
                                {"decoder.enc_score_head.bias": torch.full((366,), -1.0)})
    grown = back["decoder.enc_score_head.bias"]
    assert grown[47].item() == 47 and grown[0].item() == -1  # bicycle (id 46) kept, unused row fresh


def test_custom_ids_for_a_subset():
    old = torch.arange(366, dtype=torch.float32)
    new, _ = remap_class_heads({"decoder.enc_score_head.bias": old}, {"decoder.enc_score_head.bias": torch.zeros(2)},
                               class_ids=[0, 5])
    assert new["decoder.enc_score_head.bias"].tolist() == [1.0, 6.0]
