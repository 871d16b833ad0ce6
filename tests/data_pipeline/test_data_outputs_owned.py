"""`dfine-data synth --out` and `convert-yolo --out` replace OUT/<split> only when it is their own."""

from __future__ import annotations

import json

import pytest

from dfine_deploy.data.cli import main
from tests.support.folders import DEAD_PID, DOCUMENTS, fill, snapshot

A_REAL_DATASET = {  # a user's COCO split, numbered the way synth numbers its images
    "000001.jpg": b"\xff\xd8 their photo",
    "000002.jpg": b"\xff\xd8 another",
    "annotations.json": json.dumps({"images": [{"id": 1, "file_name": "000001.jpg"}], "annotations": []}),
}
STRANGERS = {
    "a-real-dataset": A_REAL_DATASET,
    "documents": DOCUMENTS,
    "someone-elses-info": {"annotations.json": '{"info": {"description": "COCO 2017"}}'},
    "not-json": {"annotations.json": "<xml/>"},
}


def _synth(out, capsys, *more: str) -> tuple[int, str]:
    argv = ["synth", "--out", str(out), "--images", "3", "--size", "64", "--val-images", "1", *more]
    code = main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("split", ["train", "val"])
@pytest.mark.parametrize("files", STRANGERS.values(), ids=STRANGERS.keys())
def test_synth_refuses_a_split_folder_it_did_not_write_and_writes_neither(tmp_path, capsys, files, split):
    fill(tmp_path / split, files)
    before = snapshot(tmp_path)
    code, err = _synth(tmp_path, capsys)
    assert code == 2 and err.count("\n") == 1
    assert f"--out {tmp_path / split}: is not a synthetic dataset split written by dfine-data synth" in err
    assert "--force" not in err and "delete" not in err
    assert snapshot(tmp_path) == before  # the other split was not written either


@pytest.mark.parametrize("extra", [{"notes.txt": "mine"}, {"crops/a.png": b"png"}, {"IMG_0001.jpg": b"jpg"}])
def test_synth_refuses_its_own_split_holding_a_file_of_someone_else(tmp_path, capsys, extra):
    assert _synth(tmp_path, capsys)[0] == 0
    fill(tmp_path / "train", extra)
    before = snapshot(tmp_path)
    code, err = _synth(tmp_path, capsys, "--seed", "1")
    assert code == 2 and "is a synthetic dataset split written by dfine-data synth, but it also holds" in err
    assert snapshot(tmp_path) == before


def test_synth_replaces_its_own_split_whole_and_clears_a_killed_runs_staging(tmp_path, capsys, caplog):
    assert _synth(tmp_path, capsys, "--images", "5")[0] == 0
    killed = fill(tmp_path / f".train.staging-{DEAD_PID}-abcd", {"000001.jpg": b"half"})
    caplog.set_level("INFO")
    before = (tmp_path / "train" / "000001.jpg").read_bytes()
    assert _synth(tmp_path, capsys, "--seed", "7")[0] == 0  # three images now, another seed
    assert sorted(p.name for p in (tmp_path / "train").iterdir()) == [
        "000001.jpg",
        "000002.jpg",
        "000003.jpg",
        "annotations.json",
    ]
    assert (tmp_path / "train" / "000001.jpg").read_bytes() != before
    assert not killed.exists() and "removed 1 folder(s) an interrupted dfine-data synth left" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train", "val"]


def _yolo(folder, jpeg_writer):
    jpeg_writer(folder / "images" / "train" / "a.jpg", 50, 40)
    labels = {"labels/train/a.txt": "1 0.5 0.5 0.4 0.5\n"}
    return fill(folder, {**labels, "data.yaml": "train: images/train\nnames: [cat, dog]\n"})


@pytest.mark.parametrize("files", STRANGERS.values(), ids=STRANGERS.keys())
def test_convert_yolo_refuses_a_split_folder_it_did_not_write(tmp_path, capsys, jpeg_writer, files):
    src = _yolo(tmp_path / "yolo", jpeg_writer)
    out = fill(tmp_path / "coco" / "train", files).parent
    before = snapshot(out)
    assert main(["convert-yolo", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "is not a converted dataset split written by dfine-data convert-yolo" in err
    assert "--force" not in err
    assert snapshot(out) == before


def test_convert_yolo_replaces_its_own_conversion_but_not_a_synthetic_split(tmp_path, capsys, jpeg_writer):
    src = _yolo(tmp_path / "yolo", jpeg_writer)
    out = tmp_path / "coco"
    assert main(["convert-yolo", str(src), "--out", str(out)]) == 0
    (src / "labels" / "train" / "a.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    assert main(["convert-yolo", str(src), "--out", str(out)]) == 0  # ours: replaced
    data = json.loads((out / "train" / "annotations.json").read_text())
    assert [a["category_id"] for a in data["annotations"]] == [0]
    fill(out / "train", {"notes.txt": "mine"})
    assert main(["convert-yolo", str(src), "--out", str(out)]) == 2  # ours plus a file of theirs
    assert (out / "train" / "notes.txt").read_text() == "mine"
    synthetic = tmp_path / "synthetic"
    assert _synth(synthetic, capsys)[0] == 0
    assert main(["convert-yolo", str(src), "--out", str(synthetic)]) == 2  # another command's split
    assert "is not a converted dataset split" in capsys.readouterr().err
