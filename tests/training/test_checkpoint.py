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


def test_obj365_to_coco_rows_follow_the_id_table():
    old = torch.arange(366, dtype=torch.float32)[:, None].repeat(1, 4)  # row i holds value i
    ckpt = {
        "decoder.dec_score_head.0.weight": old,
        "decoder.enc_score_head.bias": old[:, 0],
        "decoder.other.weight": torch.zeros(5),
    }
    model = {
        "decoder.dec_score_head.0.weight": torch.zeros(80, 4),
        "decoder.enc_score_head.bias": torch.zeros(80),
        "decoder.other.weight": torch.zeros(5),
    }
    new, remapped = remap_class_heads(ckpt, model)
    assert sorted(remapped) == ["decoder.dec_score_head.0.weight", "decoder.enc_score_head.bias"]
    assert new["decoder.dec_score_head.0.weight"][:, 0].tolist() == [i + 1 for i in OBJ365_IDS]
    assert new["decoder.enc_score_head.bias"][0].item() == 1  # person: Objects365 id 0 -> row 1
    # and back: growing places COCO rows at their Objects365 rows
    back, _ = remap_class_heads(
        {"decoder.enc_score_head.bias": new["decoder.enc_score_head.bias"]},
        {"decoder.enc_score_head.bias": torch.full((366,), -1.0)},
    )
    grown = back["decoder.enc_score_head.bias"]
    assert grown[47].item() == 47 and grown[0].item() == -1  # bicycle (id 46) kept, unused row fresh


def test_custom_ids_for_a_subset():
    old = torch.arange(366, dtype=torch.float32)
    new, _ = remap_class_heads(
        {"decoder.enc_score_head.bias": old},
        {"decoder.enc_score_head.bias": torch.zeros(2)},
        class_ids=[0, 5],
    )
    assert new["decoder.enc_score_head.bias"].tolist() == [1.0, 6.0]


def test_finetune_from_objects365_sized_checkpoint_remaps_real_heads(tmp_path):
    """-t with a real D-FINE-N: a 366-class file into a 4-class model keeps every shared weight
    and takes class rows OBJ365_IDS[i] + 1 for the class heads."""
    from dfine_deploy.model.dfine import build_model
    from dfine_deploy.training.checkpoint import load_finetune_weights

    spec = size_spec("n").with_input_size(128, 128)
    torch.manual_seed(0)
    source = build_model(spec.with_classes(366))
    torch.save({"model": source.state_dict()}, tmp_path / "obj365.pth")
    target = build_model(spec.with_classes(4))
    report, remapped = load_finetune_weights(target, tmp_path / "obj365.pth", OBJ365_IDS)

    assert "decoder.enc_score_head.weight" in remapped
    rows = [i + 1 for i in OBJ365_IDS[:4]]
    mine, theirs = target.state_dict(), source.state_dict()
    assert torch.equal(mine["decoder.enc_score_head.weight"], theirs["decoder.enc_score_head.weight"][rows])
    assert torch.equal(mine["decoder.dec_score_head.0.bias"], theirs["decoder.dec_score_head.0.bias"][rows])
    assert torch.equal(mine["backbone.stem.stem1.conv.weight"], theirs["backbone.stem.stem1.conv.weight"])
    assert not torch.equal(
        mine["decoder.denoising_class_embed.weight"][:4], theirs["decoder.denoising_class_embed.weight"][:4]
    )  # class-count bound: fresh
    assert report.loaded


def test_checkpoint_contents_load_weights_only(tmp_path):
    """Everything we store (meta, RNG states, history) loads with torch's safe weights-only mode
    plus numpy's array rebuild, so downstream tools never need to trust pickled code."""
    from dfine_deploy.model.weights import load_checkpoint

    state = {
        **_full_state(),
        "rng": capture_rng(),
        "history": [{"epoch": 0, "val_AP": 0.0}],
        "ema": {"module": {"w": torch.zeros(2)}, "updates": 1},
        "meta": build_meta(model_spec=size_spec("n"), class_names=["a"], config={"x": [1, 2]}),
    }
    atomic_torch_save(state, tmp_path / "c.pth")
    loaded = load_checkpoint(tmp_path / "c.pth")
    assert loaded.source_key == "ema.module" and loaded.meta["class_names"] == ["a"]


class _RunsCodeWhenUnpickled:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_resume_never_unpickles_code(tmp_path, capsys):
    hostile = tmp_path / "last.pth"
    torch.save({"model": {}, "payload": _RunsCodeWhenUnpickled()}, hostile)
    with pytest.raises(CheckpointError, match=r"last.pth: refused.*'print'"):
        load_training_checkpoint(hostile)
    assert "this must never run" not in capsys.readouterr().out
