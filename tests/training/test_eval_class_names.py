"""`--test-only -r`: the val set's categories meet the checkpoint's labels by name (another order is
remapped and the table printed, other names refused in one line), a labelling tool's export is
scored as the plain set it was made from, and class heads the checkpoint cannot fill are refused.
One tiny finished run (trainer_helpers' `finished_run`) is shared."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from trainer_helpers import finished_run, options

from dfine_deploy.errors import DatasetError, TrainingError
from dfine_deploy.training.trainer import run
from tests.data_pipeline.tool_exports import EXPORTS

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return finished_run(tmp_path_factory.mktemp("names"))


def _evaluate(trained, out: Path, *updates: str, class_map: Path | None = None) -> float:
    cfg, run_dir, _ = trained
    argv = ["-c", str(cfg), "--no-progress", "--test-only", "-r", str(run_dir / "best.pth")]
    argv += ["--output-dir", str(out)] + (["--class-map", str(class_map)] if class_map else [])
    if updates:
        argv += ["-u", *updates]  # one -u takes them all, as official train.py's
    run(options(*argv))
    return json.loads((out / "eval.json").read_text())["AP"]


def _val(trained) -> Path:
    return trained[1].parent / "data" / "val"


def _renamed_copy(src: Path, out: Path, rename: dict[int, tuple[int, str]]) -> Path:
    """The val split with category k given id and name rename[k] (its boxes keep their category)."""
    shutil.copytree(src, out)
    data = json.loads((out / "annotations.json").read_text())
    data["categories"] = [{"id": rename[c["id"]][0], "name": rename[c["id"]][1]} for c in data["categories"]]
    for a in data["annotations"]:
        a["category_id"] = rename[a["category_id"]][0]
    (out / "annotations.json").write_text(json.dumps(data))
    return out / "annotations.json"


def test_a_val_set_listing_the_classes_in_another_order_scores_the_same_and_prints_the_remap(
    trained, tmp_path, capsys
):
    reference = _evaluate(trained, tmp_path / "plain")
    names = json.loads((_val(trained) / "annotations.json").read_text())["categories"]
    order = sorted(names, key=lambda c: c["name"])  # alphabetical ids, as Label Studio numbers them
    rename = {c["id"]: (i + 1, c["name"]) for i, c in enumerate(order)}
    ann = _renamed_copy(_val(trained), tmp_path / "val", rename)
    capsys.readouterr()
    shuffled = _evaluate(
        trained,
        tmp_path / "shuffled",
        f"val_dataloader.dataset.ann_file={ann}",
        f"val_dataloader.dataset.img_folder={ann.parent}",
    )
    assert shuffled == pytest.approx(reference, abs=1e-4)
    printed = capsys.readouterr().out
    assert "lists its categories in another order than the model's labels; remapped by name:" in printed
    assert "1      1  ellipse" in printed  # category 1 'ellipse' is the model's label 1


def test_a_val_set_of_other_names_is_refused_in_one_line(trained, tmp_path):
    rename = {0: (0, "rectangle"), 1: (1, "kite"), 2: (2, "triangle"), 3: (3, "ring")}
    ann = _renamed_copy(_val(trained), tmp_path / "val", rename)
    with pytest.raises(DatasetError) as caught:
        _evaluate(  # the config's class_names would rename the categories by position: left out
            trained,
            tmp_path / "out",
            f"val_dataloader.dataset.ann_file={ann}",
            "val_dataloader.dataset.class_names=~",
        )
    message = str(caught.value)
    assert "\n" not in message and "'kite'" in message and "not among the model's 4 class names" in message
    assert "--class-map FILE" in message  # the override is named


def test_a_class_map_file_maps_the_val_set_s_other_names_and_scores_as_the_plain_set(
    trained, tmp_path, capsys
):
    reference = _evaluate(trained, tmp_path / "plain")
    rename = {0: (0, "rectangle"), 1: (1, "kite"), 2: (2, "triangle"), 3: (3, "ring")}
    ann = _renamed_copy(_val(trained), tmp_path / "val", rename)
    mapping = tmp_path / "classes.yaml"
    mapping.write_text("kite: ellipse\n")
    capsys.readouterr()
    mapped = _evaluate(
        trained,
        tmp_path / "out",
        f"val_dataloader.dataset.ann_file={ann}",
        "val_dataloader.dataset.class_names=~",
        class_map=mapping,
    )
    assert mapped == pytest.approx(reference, abs=1e-4)
    assert f"--class-map {mapping} reads 'kite' as 'ellipse'" in capsys.readouterr().out
    mapping.write_text("kite: ellipse\nbus: car\n")
    with pytest.raises(DatasetError, match=rf"--class-map {mapping}: 'bus' is no category of"):
        _evaluate(trained, tmp_path / "out2", f"val_dataloader.dataset.ann_file={ann}", class_map=mapping)


# three layouts end to end (one model run each); every layout's data path and scorer, with detections
# that score inside (0, 1): tests/data_pipeline/test_tool_exports.py
@pytest.mark.parametrize("layout", ["roboflow-coco", "label-studio-coco", "voc"])
def test_an_export_of_the_val_set_scores_as_the_plain_set(trained, tmp_path, capsys, layout):
    reference = _evaluate(trained, tmp_path / "plain")
    root, ann_file = EXPORTS[layout](_val(trained), tmp_path / layout)
    for given in (root, ann_file):
        capsys.readouterr()
        out = tmp_path / f"out-{given.name}"
        assert _evaluate(trained, out, f"val_dataloader.dataset.ann_file={given}") == pytest.approx(
            reference, abs=1e-4
        )
        assert f"data: {given} read as a" in capsys.readouterr().out


def test_class_heads_the_checkpoint_cannot_fill_are_refused(trained, tmp_path):
    """A config of 5 classes on a 4-class checkpoint: its heads would stay freshly initialised and
    their AP would be reported as the checkpoint's."""
    with pytest.raises(TrainingError, match=r"class heads do not fit this config \(4 classes in the file, 5"):
        _evaluate(trained, tmp_path / "out", "num_classes=5")
