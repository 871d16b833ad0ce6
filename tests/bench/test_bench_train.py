"""dfine-bench --train: a real D-FINE-N training step beside the 4 x V100 row.

320 px: D-FINE-N needs at least 300 anchors for its 300 queries.
"""

from __future__ import annotations

import json

import pytest

from dfine_deploy.bench.cli import main

pytest.importorskip("torch")


@pytest.mark.slow
def test_train_reports_images_per_second_and_epochs_per_hour(capsys, tmp_path):
    report = tmp_path / "t.json"
    code = main(
        [
            "--model",
            "dfine-n",
            "--train",
            "--imgsz",
            "320",
            "--train-batch",
            "1",
            "--runs",
            "2",
            "--warmup",
            "0",
            "--train-images",
            "1000",
            "--device",
            "v100",
            "--json",
            str(report),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "reference: fast training iterations | 4 x V100 | dfine-m | 5 epochs / hour" in out
    assert "not an NVIDIA V100" in out
    document = json.loads(report.read_text())
    assert document["timing"]["runs"] == 2
    # epochs/hour follows from images/s and the dataset size given
    assert document["epochs_per_hour"] == pytest.approx(document["images_per_s"] * 3600 / 1000)
    assert document["table"][0][3] == "cpu"


def test_train_needs_a_size_or_config(capsys, tmp_path):
    code = main(["--model", str(tmp_path / "x.onnx"), "--train", "--device", "cpu"])
    assert code == 2 and "give a size name" in capsys.readouterr().err
