"""dfine-bench replaces only its own files: --json and --plot reports, exports in the --work-dir."""

from __future__ import annotations

import re

import cv2
import numpy as np
import pytest

from dfine_deploy.bench.cli import main
from tests.runtime.test_runtime_detector import make_artifact
from tests.support.folders import DOCUMENTS, TRAINING_RUN, fill, snapshot


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return make_artifact(tmp_path_factory.mktemp("bench") / "art", batch_max=1)


def _bench(capsys, artifact, *extra: str) -> tuple[int, str]:
    argv = ["--model", str(artifact), "--backend", "onnxruntime", "--device", "cpu", "--runs", "1"]
    code = main([*argv, "--warmup", "0", "--frame-size", "64", "48", *extra])
    return code, capsys.readouterr().err


def test_reports_of_ours_are_replaced(tmp_path, capsys, artifact):
    report, plot = tmp_path / "r.json", tmp_path / "r.png"
    for _ in range(2):  # the second run replaces the first one's files
        assert _bench(capsys, artifact, "--json", str(report), "--plot", str(plot))[0] == 0
    assert report.stat().st_size and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


A_REAL_PNG = cv2.imencode(".png", np.zeros((8, 8, 3), np.uint8))[1].tobytes()


@pytest.mark.parametrize(
    "option, name, content",
    [
        ("--json", "results.json", b'{"accuracy": 0.9}'),  # someone's JSON
        ("--json", "notes.json", b"not json at all"),
        ("--json", "thesis.docx", b"chapter one"),
        ("--plot", "photo.png", A_REAL_PNG),  # not ours: no Software text of ours
        ("--plot", "figure.png", b"\x89PNG\r\n\x1a\n broken"),
    ],
)
def test_a_file_we_did_not_write_is_refused(tmp_path, capsys, artifact, option, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    code, err = _bench(capsys, artifact, option, str(path))
    assert code == 2 and err.count("\n") == 1 and f"{option} {path}: is not a" in err
    assert "--force" not in err and "choose another file name" in err and path.read_bytes() == content


@pytest.mark.parametrize("files", [TRAINING_RUN, DOCUMENTS], ids=["training-run", "documents"])
def test_a_work_dir_export_folder_we_did_not_write_is_left_alone(tmp_path, capsys, monkeypatch, files):
    work = tmp_path / "wd"
    argv = ["--model", "dfine-n", "--backend", "onnxruntime", "--device", "cpu", "--imgsz", "320"]
    argv += ["--work-dir", str(work)]
    with monkeypatch.context() as patch:  # learn the export folder's name without exporting
        patch.setattr("dfine_deploy.export.cli.main", lambda argv: 2)
        assert main(argv) == 2
    folder = re.search(r"exporting dfine-n at 320x320 to (\S+) ", capsys.readouterr().out)[1]
    fill(work / folder.rsplit("/", 1)[1], files)
    before = snapshot(work)
    assert main(argv) == 2  # the real dfine-export, with the --force a size name gets
    err = capsys.readouterr().err
    assert "is not an artifact folder written by dfine-export" in err and "dfine-export failed" in err
    assert snapshot(work) == before
