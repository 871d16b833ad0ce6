"""A tiny run whose validation AP is 0: the alarm is raised once, with its causes, the class map and
the pointer to --smoke, and kept in log.jsonl; the start lines say what sizing and the smoke test did."""

from __future__ import annotations

import contextlib
import io

import pytest
from trainer_helpers import make_dataset, options, read_log, write_config

from dfine_deploy.training.diagnosis import AP50_NEAR_ZERO
from dfine_deploy.training.trainer import run

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def zero_ap_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("alarm")
    data = make_dataset(root / "data", images=2, val_images=1)
    cfg = write_config(root, data, epochs=2, batch=2)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        run(options("-c", str(cfg), "--no-progress", "-d", "cpu", "--ap-alarm-after", "0.5"))
    return cfg, root / "out", printed.getvalue()


def test_alarm_once_with_causes_and_class_map(zero_ap_run):
    _, out, printed = zero_ap_run
    records = read_log(out)
    assert [r["val_AP50"] < AP50_NEAR_ZERO for r in records] == [True, True], records  # the premise
    assert printed.count("alarm: validation AP50 has stayed below") == 1, printed
    assert "for 1 of 2 epochs" in printed
    assert "likely causes, in the order checked:" in printed
    assert "category_id  label  name" in printed and "rectangle" in printed  # the class map
    assert "--smoke" in printed.split("alarm:", 1)[1]
    alarm = records[0]["alarm"]
    assert alarm["kind"] == "ap50_near_zero" and alarm["epochs_done"] == 1
    assert alarm["class_map"]["names"] == ["rectangle", "ellipse", "triangle", "ring"]
    assert isinstance(alarm["findings"], list) and "alarm" not in records[1]


def test_start_lines_name_sizing_and_the_smoke_test(zero_ap_run):
    cfg, _, printed = zero_ap_run
    sizing = next(line for line in printed.splitlines() if line.startswith("  sizing: "))
    assert sizing.startswith("  sizing: 2 images, median ") and ", scale 0.25: epochs 2 (set in " in sizing
    assert f"epochs 2 (set in {cfg})" in sizing  # the test config sets its own schedule: kept
    assert (
        "smoke test skipped: the run takes 2 optimizer steps, fewer than 300 (--smoke runs it alone)"
        in printed
    )
