"""A path means the same file from any folder: every option and config field that names a file or
folder resolves against the folder the command started in (`~` expanded), whatever the form:
`set`, `./set`, `../set`, `set/`, `~/set`, `/abs/set`. Commands here run from a folder other than the
repository root, as users run them."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dfine_deploy.bench.cli import get_args_parser as bench_parser
from dfine_deploy.cli import model_argument, path_text
from dfine_deploy.data.cli import get_args_parser as data_parser
from dfine_deploy.export.cli import get_args_parser as export_parser
from dfine_deploy.files import user_path
from dfine_deploy.hub.cli import _parser as info_parser
from dfine_deploy.serve.cli import get_args_parser as serve_parser
from dfine_deploy.training.cli import get_args_parser as train_parser

ROOT = Path(__file__).resolve().parents[2]
PATH_TYPES = (user_path, path_text, model_argument)
PARSERS = {
    "dfine-export": export_parser,
    "dfine-bench": bench_parser,
    "dfine-serve": serve_parser,
    "dfine-data": data_parser,
    "dfine-info": info_parser,
    "train/main.py": train_parser,
}
# The forms a user types for the folder `set` beside the working folder `work` (HOME is their parent).
FORMS = ["../set", "../set/", "./../set", "~/set", "~/work/../set", "{abs}"]


def _actions(parser: argparse.ArgumentParser):
    """Every option of the parser and of its subcommands: (subcommand or '', action)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from ((name, a) for (a,) in ((x,) for x in sub._actions))
        else:
            yield "", action


def _path_options() -> list[tuple[str, str, argparse.Action]]:
    return [
        (command, sub, action)
        for command, make in PARSERS.items()
        for sub, action in _actions(make())
        if action.type in PATH_TYPES
    ]


def test_no_option_takes_a_path_as_it_was_typed():
    """A file or folder option goes through `files.user_path` (or the two types built on it); a plain
    `Path` or string would keep a relative path, which code below joins with other folders."""
    plain = [
        f"{command} {sub} {'/'.join(a.option_strings) or a.dest}".replace("  ", " ")
        for command, make in PARSERS.items()
        for sub, a in _actions(make())
        if a.type is Path or (a.type is None and str(a.metavar) in ("FILE", "DIR", "PTH", "PATH"))
    ]
    assert not plain, f"path options without user_path: {plain}"
    assert len(_path_options()) >= 25  # the listing finds the options at all


@pytest.mark.parametrize("form", FORMS)
def test_every_path_option_names_the_same_folder_from_any_form(tmp_path, monkeypatch, form):
    (tmp_path / "set").mkdir()
    (tmp_path / "work").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path / "work")
    text = form.format(abs=tmp_path / "set")
    for command, sub, action in _path_options():
        value = action.type(text)
        where = f"{command} {sub} {action.option_strings or action.dest}: {text!r} -> {value}"
        assert Path(value).is_absolute(), where
        assert Path(value).resolve() == (tmp_path / "set").resolve(), where


def test_a_size_name_stays_a_size_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert model_argument("dfine-s") == "dfine-s"
    assert model_argument("no-such-model") == "no-such-model"  # its refusal shows what was typed
    (tmp_path / "best.pth").write_bytes(b"")
    assert model_argument("./best.pth") == str(tmp_path / "best.pth")


def test_config_fields_resolve_against_the_working_folder(tmp_path, monkeypatch):
    """img_folder, ann_file, output_dir: relative as official D-FINE reads them (from the folder the
    command runs in), `~` expanded; held absolute so no later join can repeat them."""
    from dfine_deploy.config import load_config

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    cfg = tmp_path / "work" / "my.yml"
    cfg.write_text(
        f"__include__: ['{ROOT}/configs/quickstart/dfine_n_synthetic.yml']\n"
        "output_dir: ~/runs/x\n"
        "train_dataloader: {dataset: {img_folder: ../sets/train/, ann_file: ./a.json}}\n"
    )
    loaded = load_config(str(cfg))
    assert loaded.train.output_dir == str(tmp_path / "runs" / "x")
    assert loaded.train_data.img_folder == str(tmp_path / "work" / ".." / "sets" / "train")
    assert loaded.train_data.ann_file == str(tmp_path / "work" / "a.json")
    # the quickstart config's own relative paths (configs/dataset/synthetic_detection.yml)
    assert loaded.val_data.img_folder == str(tmp_path / "work" / "runs" / "synthetic" / "val")


def _coco_set(folder: Path, images: int = 3) -> Path:
    from dfine_deploy.data.synthetic import SyntheticSpec, generate

    generate(folder, SyntheticSpec(images=images, val_images=images, size=64, seed=0))
    return folder


def test_the_export_gate_finds_the_images_of_a_relative_data_folder(tmp_path, monkeypatch):
    """`dfine-export ... --data runs/quickstart/data/val` looked every image up under the folder
    twice (runs/.../val/runs/.../val/000001.jpg) and refused the set as missing images."""
    from dfine_deploy.export.gate_inputs import parity_inputs
    from dfine_deploy.export.settings import ExportSettings

    _coco_set(tmp_path / "runs" / "data")
    monkeypatch.chdir(tmp_path)
    for data in ("runs/data/val", "./runs/data/val/"):
        opts = ExportSettings(model="dfine-n", output=tmp_path / "out", imgsz=(64, 64), data=Path(data))
        batches, scorer = parity_inputs(opts)
        assert sum(len(b.images) for b in batches) == 3 and scorer is not None


def _run(argv: list[str], cwd: Path, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(ROOT)}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_dfine_data_reads_and_writes_relative_paths_from_another_folder(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    data = [sys.executable, "-m", "dfine_deploy.data.cli"]
    made = _run([*data, "synth", "--out", "~/sets/", "--images", "2", "--size", "64"], work, tmp_path)
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "sets" / "val" / "annotations.json").is_file()
    for source, extra in (
        ("../sets/val", []),
        ("~/sets/val/annotations.json", ["--img-folder", "../sets/val/"]),
        ("./../sets/train/", []),
    ):
        proc = _run([*data, "validate", source, *extra, "--json"], work, tmp_path)
        assert proc.returncode == 0, f"{source}: {proc.stderr}"
        assert json.loads(proc.stdout)["report"]["images_kept"] >= 1, source
