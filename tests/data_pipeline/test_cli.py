from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from dfine_deploy.data.cli import main


def test_synth_validate_and_convert_round_trip(tmp_path, capsys):
    assert (
        main(
            [
                "synth",
                "--out",
                str(tmp_path / "s"),
                "--images",
                "6",
                "--seed",
                "1",
                "--size",
                "96",
                "--val-images",
                "2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "train: 6 images" in out and "val: 2 images" in out

    assert main(["validate", str(tmp_path / "s" / "train")]) == 0
    out = capsys.readouterr().out
    assert "no problems found" in out and "ring" in out and "category_id  label  name" in out

    assert main(["validate", str(tmp_path / "s" / "val" / "annotations.json"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["report"]["images_kept"] == 2 and report["class_map"]["names"][0] == "rectangle"


def test_validate_reports_problems_and_exits_2(tmp_path, capsys):
    main(["synth", "--out", str(tmp_path), "--images", "3", "--size", "64", "--val-images", "0"])
    capsys.readouterr()
    (tmp_path / "train" / "000002.jpg").unlink()
    assert main(["validate", str(tmp_path / "train")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "missing_image (1)" in err and "000002.jpg" in err
    assert main(["validate", str(tmp_path / "train"), "--policy", "missing_image=skip"]) == 0
    assert "missing_image: 1 skipped" in capsys.readouterr().out
    assert main(["validate", str(tmp_path / "train"), "--policy", "missing_image=maybe"]) == 2
    assert "accepts error, skip" in capsys.readouterr().err


def test_convert_yolo(tmp_path, capsys, jpeg_writer):
    src = tmp_path / "yolo"
    jpeg_writer(src / "images" / "train" / "a.jpg", 50, 40)
    (src / "labels" / "train").mkdir(parents=True)
    (src / "labels" / "train" / "a.txt").write_text("1 0.5 0.5 0.4 0.5\n")
    (src / "data.yaml").write_text("train: images/train\nnames: {0: cat, 1: dog}\n")
    assert main(["convert-yolo", str(src), "--out", str(tmp_path / "coco")]) == 0
    data = json.loads((tmp_path / "coco" / "train" / "annotations.json").read_text())
    assert (
        data["annotations"][0]["bbox"] == [15.0, 10.0, 20.0, 20.0]
        and data["annotations"][0]["category_id"] == 1
    )
    assert (tmp_path / "coco" / "train" / "a.jpg").is_file()
    assert "dog" in capsys.readouterr().out


def test_console_script_runs_as_a_real_process(tmp_path):
    script = Path(sys.executable).parent / "dfine-data"
    done = subprocess.run(
        [str(script), "validate", str(tmp_path / "nothing.json")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (
        done.returncode == 2
        and f"dataset {tmp_path / 'nothing.json'} not found" in done.stderr
        and "Traceback" not in done.stderr
    )


def test_annotation_tools_and_evaluation_do_not_import_torch():
    """validate/synth/convert and the evaluator serve torch-free tools (bench, quick checks)."""
    code = (
        "import sys, dfine_deploy.data.cli, dfine_deploy.data.coco, dfine_deploy.data.yolo, "
        "dfine_deploy.data.synthetic, dfine_deploy.evaluation; from dfine_deploy.data import ClassMap; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
