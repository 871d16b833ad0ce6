"""The trainer in one process: outputs, checkpoint schema, flags, non-finite handling.

One short training run (2 epochs x 1 step of D-FINE-N at 128 px, trainer_helpers' `trained`) is
shared by the tests.
"""

from __future__ import annotations

import json

import pytest
import torch
from trainer_helpers import finished_run, make_dataset, options, read_log, write_config

from dfine_deploy.errors import OwnershipError, TrainingError
from dfine_deploy.ownership import claim_folder
from dfine_deploy.training.checkpoint import load_training_checkpoint
from dfine_deploy.training.runlog import TRAINING_RUN
from dfine_deploy.training.trainer import run, validates
from tests.support.folders import DOCUMENTS, fill, snapshot

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return finished_run(tmp_path_factory.mktemp("tiny"))


def test_validated_epochs_follow_eval_freq_and_always_include_the_last():
    assert [e for e in range(10) if validates(e, 10, 1)] == list(range(10))
    assert [e for e in range(10) if validates(e, 10, 2)] == [1, 3, 5, 7, 9]
    assert [e for e in range(10) if validates(e, 10, 3)] == [2, 5, 8, 9]
    assert [e for e in range(10) if validates(e, 10, 0)] == [9]


def test_use_amp_flag_overrides_config_both_ways():
    assert options("-c", "x.yml").use_amp is None  # absent flag: the config decides (official forced False)
    assert options("-c", "x.yml", "--use-amp").use_amp is True
    assert options("-c", "x.yml", "--no-amp").use_amp is False


def test_effective_settings_are_printed(trained):
    _, _, printed = trained
    assert "use_amp: True" in printed and "amp_dtype: bfloat16" in printed  # flag wins over use_amp: False
    assert "use_amp_source: --use-amp flag" in printed
    assert "threads_per_rank:" in printed and "backend: none (single process)" in printed
    assert "(read as ^(?=.*backbone)(?=.*(?:norm|bn)).*$)" in printed  # the regex fix, with group sizes


def test_outputs_and_checkpoint_schema(trained):
    _, out, _ = trained
    names = sorted(p.name for p in out.iterdir())
    for expected in (
        "best.pth",
        "checkpoint0000.pth",
        "checkpoint0001.pth",
        "curves.png",
        "last.pth",
        "log.jsonl",
        "resolved_config.json",
        "summary",
    ):
        assert expected in names
    assert not [n for n in names if n.endswith("tmp")]
    assert list((out / "summary").iterdir())  # TensorBoard event file

    log = read_log(out)
    assert [r["epoch"] for r in log] == [0, 1]
    assert all(len(r["step_losses"]) == 1 for r in log)
    assert all(0.0 <= r["val_AP"] <= 1.0 for r in log)
    assert {"data_time_share", "peak_memory_mb", "memory_kind"} <= set(log[0]["resources"])

    ckpt = load_training_checkpoint(out / "last.pth")
    for key in ("model", "ema", "optimizer", "lr_scheduler", "lr_warmup_scheduler", "scaler", "rng", "meta"):
        assert key in ckpt
    assert ckpt["last_epoch"] == 1 and ckpt["step"] == 2
    assert ckpt["ema"]["updates"] == 2 and ckpt["model"].keys() == ckpt["ema"]["module"].keys()
    meta = ckpt["meta"]
    assert meta["class_names"] == ["rectangle", "ellipse", "triangle", "ring"]
    assert meta["class_map"]["names"] == meta["class_names"]
    assert meta["model_spec"]["num_classes"] == 4 and meta["input_size"] == [128, 128]
    assert meta["schema_version"] == 1 and meta["config"]["epochs"] == 2
    assert set(ckpt["rng"]) >= {"python", "numpy", "torch"}
    first = load_training_checkpoint(out / "checkpoint0000.pth")
    assert first["last_epoch"] == 0  # the hard-linked copy kept epoch 0 when last.pth moved on
    resolved = json.loads((out / "resolved_config.json").read_text())
    assert resolved["effective"]["use_amp"] is True and resolved["effective"]["seed"] == 3


def test_best_is_written_even_when_map_stays_zero(trained):
    _, out, _ = trained
    log = read_log(out)
    best = load_training_checkpoint(out / "best.pth")
    best_epoch = max(range(len(log)), key=lambda i: (log[i]["val_AP"], i))  # ties: the later epoch
    assert best["last_epoch"] == best_epoch


def test_repeated_nonfinite_losses_stop_and_keep_last_checkpoint(trained, tmp_path):
    cfg, out, _ = trained
    poisoned = load_training_checkpoint(out / "checkpoint0000.pth")
    for value in poisoned["model"].values():
        if value.is_floating_point():
            value.fill_(float("nan"))
    torch.save(poisoned, tmp_path / "poisoned.pth")
    good = tmp_path / "out"
    good.mkdir()
    (good / "last.pth").write_bytes((out / "checkpoint0000.pth").read_bytes())
    before = (good / "last.pth").read_bytes()
    with pytest.raises(TrainingError, match="2 non-finite losses in a row"):
        run(
            options(
                "-c",
                str(cfg),
                "--no-progress",
                "-r",
                str(tmp_path / "poisoned.pth"),
                "--output-dir",
                str(good),
                "--max-nonfinite",
                "2",
                "-u",
                "train_dataloader.total_batch_size=1",
            )
        )
    assert (good / "last.pth").read_bytes() == before


def test_resume_and_tuning_exclude_each_other():
    with pytest.raises(TrainingError, match="exclude each other"):
        run(options("-c", "x.yml", "-r", "a.pth", "-t", "b.pth"))


def test_test_only_evaluates_a_checkpoint(trained, tmp_path):
    cfg, out, _ = trained
    run(
        options(
            "-c",
            str(cfg),
            "--no-progress",
            "--use-amp",
            "--test-only",
            "-r",
            str(out / "best.pth"),
            "--output-dir",
            str(tmp_path),
        )
    )
    metrics = json.loads((tmp_path / "eval.json").read_text())
    best_epoch = load_training_checkpoint(out / "best.pth")["last_epoch"]
    assert metrics["AP"] == pytest.approx(read_log(out)[best_epoch]["val_AP"], abs=1e-9)
    assert not (tmp_path / "last.pth").exists()  # evaluation writes no checkpoint


def test_test_only_without_a_checkpoint_is_refused():
    """Evaluating random weights and exiting 0 would look like a result."""
    with pytest.raises(TrainingError, match="--test-only .* add -r CHECKPOINT"):
        run(options("-c", "x.yml", "--test-only"))


def _damage_annotations(data) -> dict[str, int]:
    """One box past the image edge (fixed: clamped) and one of zero width (skipped), as the default
    policy handles them; returns what the report must count."""
    path = data / "train" / "annotations.json"
    coco = json.loads(path.read_text())
    first = coco["images"][0]
    coco["annotations"].append(
        {
            "id": 9001,
            "image_id": first["id"],
            "category_id": 1,
            "iscrowd": 0,
            "area": 400.0,
            "bbox": [first["width"] - 10.0, 5.0, 30.0, 20.0],
        }
    )
    coco["annotations"].append(
        {
            "id": 9002,
            "image_id": first["id"],
            "category_id": 1,
            "iscrowd": 0,
            "area": 0.0,
            "bbox": [10.0, 10.0, 0.0, 20.0],
        }
    )
    path.write_text(json.dumps(coco))
    return {"box_outside_image": 1, "zero_area_box": 1}


def test_crossing_the_stop_epoch_and_reporting_load_fixes(tmp_path, monkeypatch):
    """Epoch 0 with photometric distortion + multi-scale, epoch 1 without, EMA restart decay applied,
    checkpoint_freq 2; and the loader's fixes reported at start, in log.jsonl and in the checkpoint."""
    import contextlib
    import io

    from dfine_deploy.training import steps

    data = make_dataset(tmp_path / "data", images=2, val_images=1)
    expected = _damage_annotations(data)
    cfg = write_config(tmp_path, data, epochs=2, batch=2, stop_epoch=1, checkpoint_freq=2, eval_freq=2)
    seen = []
    original = steps.accumulation_groups

    def watched(loader, accumulate):
        epoch = loader.dataset.epoch
        for group in original(loader, accumulate):
            seen.append(
                (epoch, loader.dataset.transforms.active(epoch), loader.collate_fn.multi_scale_active())
            )
            yield group

    monkeypatch.setattr(steps, "accumulation_groups", watched)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        run(options("-c", str(cfg), "--no-progress", "--output-dir", str(tmp_path / "out")))
    text = printed.getvalue()
    (e0, ops0, multi0), (e1, ops1, multi1) = seen
    assert (e0, e1) == (0, 1)
    assert "RandomPhotometricDistort" in ops0 and multi0
    assert "RandomPhotometricDistort" not in ops1 and not multi1
    assert "epoch 1: strong augmentation off; EMA decay now 0.5 (applied)" in text
    out = tmp_path / "out"
    ckpt = load_training_checkpoint(out / "last.pth")
    assert ckpt["ema"]["decay"] == 0.5
    assert sorted(p.name for p in out.glob("checkpoint*.pth")) == ["checkpoint0001.pth"]  # every 2nd epoch
    first, last = read_log(out)  # eval_freq 2: only the second epoch is validated, and only it can be best
    assert "val_AP50" not in first and "val_AP50" in last
    assert "epoch 0: " in text and "not validated (eval_freq)" in text

    line = next(t for t in text.splitlines() if t.startswith("data train:"))
    assert "1 box_outside_image fixed" in line and "1 zero_area_box skipped" in line
    for counts in (read_log(out)[0]["data"]["train"], ckpt["meta"]["data"]["train"]):
        assert counts["fixed"] == {"box_outside_image": expected["box_outside_image"]}
        assert counts["skipped"] == {"zero_area_box": expected["zero_area_box"]}
        assert counts["annotations_kept"] == counts["annotations_in"] - 1


OFFICIAL_RUN = {"log.txt": "Epoch: [0]", "checkpoint0000.pth": b"official", "last.pth": b"official"}
NOT_OUR_CONFIG = {"resolved_config.json": '{"lr": 0.1}', "notes.txt": "mine"}


@pytest.mark.parametrize("test_only", [False, True], ids=["train", "test-only"])
@pytest.mark.parametrize(
    "files", [DOCUMENTS, OFFICIAL_RUN, NOT_OUR_CONFIG], ids=["documents", "official-run", "lookalike"]
)
def test_an_output_folder_we_did_not_write_is_refused_before_anything(tmp_path, files, test_only):
    data = make_dataset(tmp_path / "data", images=2, val_images=1)
    cfg = write_config(tmp_path, data)
    out = fill(tmp_path / "theirs", files)
    before = snapshot(out)
    extra = ["--test-only", "-r", str(out / "last.pth")] if test_only else []
    with pytest.raises(OwnershipError) as refused:
        run(options("-c", str(cfg), "--no-progress", "--output-dir", str(out), *extra))
    assert f"--output-dir {out}: is not an output folder written by the trainer" in str(refused.value)
    assert "--force" not in str(refused.value) and snapshot(out) == before


def test_run_and_evaluation_folders_of_ours_are_accepted(trained, tmp_path):
    _, out, _ = trained
    assert claim_folder(out, TRAINING_RUN, option="--output-dir", replaces=False)  # a run
    evaluated = fill(tmp_path / "eval", {"eval.json": '{"AP": 0.5, "data": {}}', "notes.txt": "mine"})
    assert claim_folder(evaluated, TRAINING_RUN, option="--output-dir", replaces=False)  # --test-only's
    resumable = fill(tmp_path / "copied", {"last.pth": (out / "last.pth").read_bytes()})  # to auto-resume
    assert claim_folder(resumable, TRAINING_RUN, option="--output-dir", replaces=False)
    killed = fill(tmp_path / "killed", {".resolved_config.json.x1.tmp": ""})  # killed mid-write: empty
    assert not claim_folder(killed, TRAINING_RUN, option="--output-dir", replaces=False)


def test_partial_checkpoints_a_killed_run_left_are_removed_and_counted(tmp_path, capsys):
    from dfine_deploy.training.runlog import RunLog

    fill(tmp_path, {".last.pth.k2j.tmp": b"half", ".best.pth.x9.tmp": b"half", "notes.tmp": "mine"})
    RunLog(active=True, output_dir=tmp_path, print_freq=0, progress=False).start({}, [], {})
    assert "removed 2 partial checkpoint file(s) a killed run left" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.tmp", "resolved_config.json"]
