"""Class names for models that carry none (official checkpoints) and the --names override (issue 15 #3)."""

from __future__ import annotations

import json

import pytest
import torch

from dfine_deploy.errors import ConfigError
from dfine_deploy.runtime.classes import coco_names, default_class_names, objects365_names, read_names_file


def test_names_follow_the_official_label_order():
    coco = coco_names()
    assert len(coco) == 80 and coco[0] == "person" and coco[79] == "toothbrush"
    # the official obj365_ids map COCO labels into Objects365 labels: person 0, bicycle 46, car 5
    obj365 = objects365_names()
    assert (obj365[0], obj365[46], obj365[5]) == ("Person", "Bicycle", "Car")
    assert len(obj365) == 365 and len(set(obj365)) == 365


@pytest.mark.parametrize(
    "count, first, note",
    [(80, "person", "80 = COCO"), (366, "Person", "366 = Objects365"), (4, "class_0", "names no classes")],
)
def test_names_assumed_from_the_class_count_say_so(count, first, note):
    assumed = default_class_names(count)
    assert len(assumed.names) == count and assumed.names[0] == first and note in assumed.note


def _official_checkpoint(tmp_path, num_classes):
    from dfine_deploy.model.dfine import build_model
    from dfine_deploy.model.spec import size_spec

    path = tmp_path / f"dfine_n_{num_classes}.pth"
    torch.save({"model": build_model(size_spec("n").with_classes(num_classes)).state_dict()}, path)
    return path


def test_official_366_class_checkpoint_loads_with_objects365_names(tmp_path):
    from dfine_deploy.model.hub import load_model

    loaded = load_model(_official_checkpoint(tmp_path, 366), imgsz=(320, 320))
    assert loaded.class_names[:3] == ["Person", "Sneakers", "Chair"] and len(loaded.class_names) == 366
    assert "Objects365" in loaded.class_names_note


@pytest.mark.parametrize(
    "suffix, text",
    [
        (".txt", "cat\ndog\n\nbird\n"),
        (".json", json.dumps(["cat", "dog", "bird"])),
        (".yaml", "names:\n  0: cat\n  1: dog\n  2: bird\n"),
    ],
)
def test_names_files_in_each_form(tmp_path, suffix, text):
    path = tmp_path / f"names{suffix}"
    path.write_text(text)
    assert read_names_file(path, 3) == ["cat", "dog", "bird"]


def test_a_names_file_of_the_wrong_length_is_one_clear_error(tmp_path):
    path = tmp_path / "names.txt"
    path.write_text("cat\ndog\n")
    with pytest.raises(ConfigError, match=r"names.txt: has 2 names but the model has 80 classes"):
        read_names_file(path, 80)
    with pytest.raises(ConfigError, match="cannot read it"):
        read_names_file(tmp_path / "absent.txt", 80)


def test_detector_names_override_and_note(tmp_path):
    from dfine_deploy.runtime import Detector

    ckpt = _official_checkpoint(tmp_path, 80)
    with Detector.open(str(ckpt), backend="torch", imgsz=(256, 256)) as det:
        assert det.class_names[0] == "person" and "COCO" in det.class_names_note
    names = tmp_path / "mine.txt"
    names.write_text("".join(f"thing{i}\n" for i in range(80)))
    with Detector.open(str(ckpt), backend="torch", imgsz=(256, 256), names=names) as det:
        assert det.class_names[0] == "thing0" and det.class_names_note == ""
