"""The trainer in one process: outputs, checkpoint schema, flags, non-finite handling.

One short training run (2 epochs x 1 step of D-FINE-N at 128 px) is shared by the tests.
"""

from __future__ import annotations

import json

import pytest
import torch

from dfine_deploy.errors import TrainingError
from dfine_deploy.training.checkpoint import load_training_checkpoint
from dfine_deploy.training.cli import get_args_parser, options_from_args
from dfine_deploy.training.trainer import run

from trainer_helpers import make_dataset, read_log, write_config

pytestmark = pytest.mark.timeout(300)


def _options(*argv):
    return options_from_args(get_args_parser().parse_args(list(argv)))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(config, output folder, printed text) of `--use-amp --seed 3` over 2 epochs."""
    import contextlib
    import io

    root = tmp_path_factory.mktemp("tiny")
    data = make_dataset(root / "data", images=2, val_images=1)
    cfg = write_config(root, data, epochs=2, batch=2)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        run(_options("-c", str(cfg), "--use-amp", "--no-progress", "--seed", "3"))
    return cfg, root / "out", printed.getvalue()


def test_use_amp_flag_overrides_config_both_ways():
    assert _options("-c", "x.yml").use_amp is None  # absent flag: the config decides (official forced False)
    assert _options("-c", "x.yml", "--use-amp").use_amp is True
    assert _options("-c", "x.yml", "--no-amp").use_amp is False


def test_effective_settings_are_printed(trained):
    _, _, printed = trained
    assert "use_amp: True" in printed and "amp_dtype: bfloat16" in printed  # flag wins over use_amp: False
    assert "use_amp_source: --use-amp flag" in printed
    assert "threads_per_rank:" in printed and "backend: none (single process)" in printed
    assert "(read as ^(?=.*backbone)(?=.*(?:norm|bn)).*$)" in printed  # the regex fix, with group sizes


def test_outputs_and_checkpoint_schema(trained):
    _, out, _ = trained
    names = sorted(p.name for p in out.iterdir())
    for expected in ("best.pth", "checkpoint0000.pth", "checkpoint0001.pth", "curves.png", "last.pth",
                     "log.jsonl", "resolved_config.json", "summary"):
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
        run(_options("-c", str(cfg), "--no-progress", "-r", str(tmp_path / "poisoned.pth"),
                     "--output-dir", str(good), "--max-nonfinite", "2", "-u", "train_dataloader.total_batch_size=1"))
    assert (good / "last.pth").read_bytes() == before


def test_resume_and_tuning_exclude_each_other():
    with pytest.raises(TrainingError, match="exclude each other"):
        run(_options("-c", "x.yml", "-r", "a.pth", "-t", "b.pth"))


def test_test_only_evaluates_a_checkpoint(trained, tmp_path):
    cfg, out, _ = trained
    run(_options("-c", str(cfg), "--no-progress", "--use-amp", "--test-only", "-r", str(out / "best.pth"),
                 "--output-dir", str(tmp_path)))
    metrics = json.loads((tmp_path / "eval.json").read_text())
    best_epoch = load_training_checkpoint(out / "best.pth")["last_epoch"]
    assert metrics["AP"] == pytest.approx(read_log(out)[best_epoch]["val_AP"], abs=1e-9)
    assert not (tmp_path / "last.pth").exists()  # evaluation writes no checkpoint
