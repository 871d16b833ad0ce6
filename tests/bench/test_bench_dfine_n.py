"""The acceptance command: dfine-bench --device jetson --backend onnxruntime --model dfine-n.

The size name is exported on the fly by dfine-export (random weights, 320 px to keep it short),
then timed on onnxruntime; the report compares with the Jetson row and says plainly it is not one.
"""

from __future__ import annotations

import json
import re

import pytest

from dfine_deploy.bench.cli import main

pytest.importorskip("torch")
pytest.importorskip("dfine_deploy.export.cli")


@pytest.mark.slow
def test_bench_dfine_n_against_the_jetson_row(capsys, tmp_path):
    report, plot = tmp_path / "r.json", tmp_path / "r.png"
    code = main(
        [
            "--model",
            "dfine-n",
            "--backend",
            "onnxruntime",
            "--device",
            "jetson",
            "--imgsz",
            "320",
            "--runs",
            "3",
            "--warmup",
            "1",
            "--frame-size",
            "640",
            "480",
            "--work-dir",
            str(tmp_path / "wd"),
            "--json",
            str(report),
            "--plot",
            str(plot),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "reference: edge inference | Jetson AGX Xavier | dfine-n | 472 FPS" in out
    assert re.search(r"measured on: x86-64 CPU \(.+\), not a Jetson", out)
    assert "note: measured at 320x320; the expected figures are for 640x640" in out
    document = json.loads(report.read_text())
    rows = document["rows"]
    assert {r["scope"] for r in rows} == {"engine", "image->det"}
    assert all(r["model"] == "dfine-n" and r["expected"]["fps"] == 472 for r in rows)
    assert all(r["provider"] == "CPUExecutionProvider" and r["input_size"] == [320, 320] for r in rows)
    for row, cells in zip(rows, document["table"]):
        assert cells[0] == "dfine-n" and cells[14] == "472.0"
        if row["status"] == "ok":
            assert abs(float(cells[15]) - row["ratio"]) <= 1e-3  # the JSON figure, printed to 3 places
    assert plot.read_bytes()[:4] == b"\x89PNG"
