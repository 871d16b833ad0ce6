"""dfine-info: parameter and GFLOP counts against the official table, config printing, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from dfine_deploy.hub.cli import count_gflops, count_params, main
from dfine_deploy.hub.loader import load_model

REPO = Path(__file__).resolve().parents[2]
# Official figures (the model table of https://github.com/Peterande/D-FINE): params of the
# training-form model, calflops GFLOPs of the deploy model at 1x3x640x640 (measured on the official code).
OFFICIAL = {
    "n": (3_782_693, 7.165),
    "s": (10_321_877, 25.171),
    "m": (19_590_064, 56.684),
    "l": (31_244_152, 91.034),
    "x": (62_621_560, 202.486),
}


def test_flop_counter_counts_two_flops_per_mac():
    """The counter we rely on: a multiply-accumulate is 2 FLOPs for linear and conv layers."""
    linear, x = nn.Linear(10, 20), torch.rand(3, 10)
    with FlopCounterMode(display=False) as counter:
        linear(x)
    assert counter.get_total_flops() == 2 * 3 * 10 * 20
    conv, image = nn.Conv2d(4, 8, 3, padding=1), torch.rand(1, 4, 16, 16)
    with FlopCounterMode(display=False) as counter:
        conv(image)
    assert counter.get_total_flops() == 2 * (16 * 16 * 8) * (4 * 3 * 3)


@pytest.mark.parametrize(
    "size",
    [
        "n",
        "s",
        *(pytest.param(s, marks=pytest.mark.slow) for s in "mlx"),  # big models: slow to build
    ],
)
def test_counts_match_official_table(size):
    with pytest.warns(UserWarning, match="random weights"):
        loaded = load_model(f"dfine-{size}")
    params, gflops = OFFICIAL[size]
    assert count_params(loaded.model) == params
    assert abs(count_gflops(loaded, (640, 640)) / gflops - 1) < 0.01


def test_json_and_text_output(capsys):
    assert main(["dfine-n", "--imgsz", "320", "320", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report) == ["model", "imgsz", "params", "gflops"]
    assert report["model"] == "dfine-n" and report["imgsz"] == [320, 320]
    assert report["params"] == OFFICIAL["n"][0]
    # convolutions scale with the input area (a quarter), the 300-query decoder does not
    assert 0.25 < report["gflops"] / OFFICIAL["n"][1] < 0.5 and round(report["gflops"], 2) == report["gflops"]
    assert main(["dfine-n", "--imgsz", "320", "320"]) == 0
    text = capsys.readouterr().out
    assert "input       320 x 320" in text and "params      3,782,693" in text
    assert f"GFLOPs      {report['gflops']:.2f}" in text and "random" in text


def test_print_config_shows_provenance(capsys):
    config = REPO / "configs" / "dfine" / "dfine_hgnetv2_n_coco.yml"
    assert main(["-c", str(config), "--print-config", "-u", "epochs=5"]) == 0
    out = capsys.readouterr().out
    assert "epochs: 5  # -u epochs=5" in out
    assert "name: B0  # " + str(config) in out


def test_user_errors_exit_2_without_traceback(tmp_path):
    bad = tmp_path / "typo.yml"
    bad.write_text("HGNetv2: {nmae: B0}\n")
    result = subprocess.run(
        [str(Path(sys.executable).parent / "dfine-info"), "-c", str(bad), "--print-config"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert "HGNetv2.nmae" in result.stderr and "HGNetv2.name" in result.stderr
    assert "Traceback" not in result.stderr
    assert main(["dfine-z"]) == 2


def test_overrides_change_the_counted_model(capsys):
    """`dfine-info CFG -u KEY=VALUE` counts the modified config, not the file as written."""
    config = str(REPO / "configs" / "dfine" / "dfine_hgnetv2_n_coco.yml")
    assert main([config, "--imgsz", "320", "320", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([config, "--imgsz", "320", "320", "--json", "-u", "DFINETransformer.num_layers=2"]) == 0
    fewer = json.loads(capsys.readouterr().out)
    assert plain["params"] == OFFICIAL["n"][0] and fewer["params"] < plain["params"]
    assert fewer["gflops"] < plain["gflops"]
    # -u changes a config; on a size name it is refused with the reason, not ignored
    assert main(["dfine-n", "-u", "num_classes=3"]) == 2
    assert "overrides change a config file" in capsys.readouterr().err


def test_an_option_the_task_does_not_read_is_refused_not_ignored(capsys):
    """`--list-weights dfine-n --imgsz 320` listed the weights as if neither had been given, and
    `--print-config --json` printed YAML."""
    config = str(REPO / "configs" / "dfine" / "dfine_hgnetv2_n_coco.yml")
    for argv, words in (
        (["--list-weights", "dfine-n"], "--list-weights does not read a model ('dfine-n')"),
        (["--list-weights", "--imgsz", "320"], "--list-weights does not read --imgsz, and would ignore it"),
        (["--list-weights", "-c", config, "--allow-pickle"], "does not read --config or --allow-pickle"),
        (["-c", config, "--print-config", "--json"], "--print-config does not read --json"),
        (["-c", config, "--print-config", "--imgsz", "640"], "--print-config does not read --imgsz"),
    ):
        assert main(argv) == 2, argv
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert words in line, line
    assert main(["--list-weights", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["name"] == "dfine-n-coco"


def test_print_config_of_a_model_that_is_no_config_names_what_it_is(capsys):
    """`dfine-info dfine-n --print-config` said "config file not found: dfine-n"."""
    assert main(["dfine-n", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "'dfine-n' is a size name" in err and "give the .yml it comes from" in err, err


def test_a_model_written_after_the_overrides_is_named(capsys):
    """-u reads every word after it: `dfine-info -u epochs=12 dfine-n` said "give a model"."""
    with pytest.raises(SystemExit) as exit_:
        main(["-u", "epochs=12", "dfine-n"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "override 'dfine-n' is not of the form key.sub=value" in err and "write it before -u" in err, err


def test_allow_pickle_where_no_pth_is_read_is_refused_not_ignored(capsys):
    """`--allow-pickle` beside a size name or a config loaded nothing with torch.load: it was ignored."""
    config = str(REPO / "configs" / "dfine" / "dfine_hgnetv2_n_coco.yml")
    for model, form in (("dfine-n", "a size name"), (config, "a config file")):
        assert main([model, "--allow-pickle", "--json"]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert f"--allow-pickle: '{model}' is {form}" in line and "leave --allow-pickle out" in line, line
