"""`dfine-export -o`: a folder is replaced only when it is an artifact of ours holding nothing else.

The refusals come before the model loads, so these run the console script's `main` in seconds; the
replacement of a real artifact, with leftovers of a killed export beside it, is in
test_export_dfine.py (it exports).
"""

from __future__ import annotations

import json
import os

import pytest

from dfine_deploy.export.cli import main as export_main
from dfine_deploy.export.pipeline import ARTIFACT
from dfine_deploy.ownership import sweep_leftovers
from tests.support.folders import DEAD_PID, DOCUMENTS, TRAINING_RUN, fill, snapshot

STRANGERS = {
    "training-run": TRAINING_RUN,
    "documents": DOCUMENTS,
    "someone-elses-model-json": {"model.json": '{"name": "bert"}', "model.onnx": b"their graph"},
    "only-our-file-names": {"labels.txt": "cat\ndog\n", "model.onnx": b"their graph"},
    "broken-model-json": {"model.json": "{not json", "notes.txt": "mine"},
}


def _export(argv: list[str], capsys) -> tuple[int, str]:
    code = export_main(["dfine-n", "--imgsz", "320", "320", *argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
@pytest.mark.parametrize("files", STRANGERS.values(), ids=STRANGERS.keys())
def test_a_folder_we_did_not_write_is_refused_untouched_with_or_without_force(tmp_path, capsys, files, force):
    out = fill(tmp_path / "out", files)
    before = snapshot(out)
    code, err = _export(["-o", str(out)] + (["--force"] if force else []), capsys)
    assert code == 2 and err.count("\n") == 1, err  # one line
    assert f"-o {out}: is not an artifact folder written by dfine-export" in err
    assert "--force" not in err and "delete" not in err and "choose another folder" in err
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging folder beside it


def test_the_training_run_being_exported_survives_force(tmp_path, capsys):
    """`-o` naming the training run that holds the checkpoint being exported, with --force: the
    export would load it, export it, then swap its artifact in over the run; it is refused and the
    run is left as it was."""
    import torch

    from dfine_deploy.model.families import build_model
    from dfine_deploy.model.spec import size_spec

    run = fill(tmp_path / "runs" / "s" / "train", TRAINING_RUN)
    torch.save({"model": build_model(size_spec("n")).state_dict()}, run / "best.pth")
    before = snapshot(run)
    code = export_main([str(run / "best.pth"), "-o", str(run), "--force", "--imgsz", "320", "320"])
    err = capsys.readouterr().err
    assert code == 2 and "best.pth" in err and "is not an artifact folder" in err
    assert snapshot(run) == before


@pytest.mark.parametrize(
    "extra",
    [{"notes.txt": "mine"}, {"their/file.bin": b"x"}, {"photos/a.jpg": b"jpg"}, {"model.onnx.bak": b"x"}],
    ids=["a-note", "a-folder-of-theirs", "photos", "a-backup"],
)
def test_an_artifact_with_a_file_of_someone_else_is_refused_even_with_force(artifact, capsys, extra):
    fill(artifact, extra)
    before = snapshot(artifact)
    code, err = _export(["-o", str(artifact), "--force"], capsys)
    assert code == 2 and "is an artifact folder written by dfine-export, but it also holds" in err
    assert "--force" not in err and snapshot(artifact) == before


def test_our_artifact_needs_force_and_with_it_passes_the_check(artifact, capsys, tmp_path):
    fill(artifact, {"ov_cache/123.blob": b"compiled", "trt_cache/engine": b"x", ".model.json.ab.tmp": b""})
    assert ARTIFACT.foreign(artifact) == []  # what the runtimes and a killed write leave is ours
    code, err = _export(["-o", str(artifact)], capsys)
    assert code == 2 and "holds an artifact folder written by dfine-export; pass --force" in err
    # with --force the check passes and the export goes on: a missing --weights file stops it next
    code, err = _export(["-o", str(artifact), "--force", "--weights", str(tmp_path / "none.pth")], capsys)
    assert code == 2 and "none.pth" in err and "artifact folder" not in err
    assert json.loads((artifact / "model.json").read_text())["model"] == "custom"  # still the old one


def test_output_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "out").write_text("a file")
    code, err = _export(["-o", str(tmp_path / "out"), "--force"], capsys)
    assert code == 2 and "exists and is not a folder" in err and (tmp_path / "out").read_text() == "a file"


def test_leftovers_of_a_killed_export_are_removed_when_ours_and_named_when_not(tmp_path):
    out = tmp_path / "out"
    ours = [
        fill(tmp_path / f".out.staging-{DEAD_PID}-empty", {}),  # killed before the first graph
        fill(tmp_path / f".out.staging-{DEAD_PID}-half", {"model.onnx": b"half a graph"}),
        fill(tmp_path / f".out.old-{DEAD_PID}-abcd1234", {"model.json": "{}", "model.onnx": b"x"}),
        fill(tmp_path / ".out.staging-k3j_x9ab", {}),  # the name earlier versions gave
    ]
    theirs = fill(tmp_path / f".out.staging-{DEAD_PID}-mine", {"notes.txt": "mine"})
    running = fill(tmp_path / f".out.staging-{os.getppid()}-live", {})  # a live process's work
    other = fill(tmp_path / f".other.staging-{DEAD_PID}-x", {})  # another target's
    lines = sweep_leftovers(out, ARTIFACT)
    assert not any(p.exists() for p in ours)
    assert theirs.is_dir() and running.is_dir() and other.is_dir()
    assert lines[0].startswith(f"removed {len(ours)} folder(s) an interrupted dfine-export left beside {out}")
    assert any(str(theirs) in line and "notes.txt" in line for line in lines[1:])
    assert any(str(running) in line and "still writing" in line for line in lines[1:])
    assert len(lines) == 3
