"""frigate.yml's filters are chosen inside Frigate's post-processing (dfine_deploy/export/frigate_post.py)
on half of --data and written only for the classes where they beat Frigate's defaults on the other half;
the file says so, with the held-out figures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from dfine_deploy.artifact import read_artifact
from dfine_deploy.export import frigate
from dfine_deploy.export import frigate_post as fp
from dfine_deploy.export import frigate_thresholds as ft
from dfine_deploy.thresholds import MIN_INSTANCES, split_halves

SIDE = 100  # the synthetic images' side, px


def view(detections, truth) -> ft.FrigateImage:
    """A still image of SIDE px as Frigate's detector saw it: `detections` (label, score, box px) as its
    rows, best first; `truth` (label, box px)."""
    rows = np.zeros((fp.DETECTOR_ROWS, 6), np.float32)
    for i, (label, score, (x1, y1, x2, y2)) in enumerate(sorted(detections, key=lambda d: -d[1])):
        rows[i] = [label, score, y1 / SIDE, x1 / SIDE, y2 / SIDE, x2 / SIDE]
    labels = np.array([t[0] for t in truth], np.int64)
    boxes = np.array([t[1] for t in truth], np.float64).reshape(-1, 4)
    return ft.FrigateImage(rows, (SIDE, SIDE), (labels, boxes))


DOG, CAT, BIRD = 0, 1, 2
A, B, C, D = (10, 10, 30, 30), (50, 10, 70, 30), (10, 50, 30, 70), (50, 50, 70, 70)


def test_a_threshold_is_written_only_where_it_beats_frigates_defaults_on_the_held_out_half():
    """dog: every dog of the selection half is scored 0.55, so a threshold near it wins there; on the
    held-out half 0.55 is a false alarm beside a dog at 0.8, so it loses to the defaults and is not
    written. cat: 0.6 on both halves, written. bird: two annotated, too few to choose."""
    views = []
    for i in range(12):
        if i % 2 == 0:  # selection
            dets = [(DOG, 0.55, A), (CAT, 0.6, B)]
        else:  # held-out
            dets = [(DOG, 0.8, A), (DOG, 0.55, C), (CAT, 0.6, B)]
        truth = [(DOG, A), (CAT, B)] + ([(BIRD, D)] if i < 2 else [])
        dets += [(BIRD, 0.9, D)] if i < 2 else []
        views.append(view(dets, truth))
    choice = ft.choose_filters(views, ["dog", "cat", "bird"])
    by_name = {v.name: v for v in choice.classes}
    dog, cat, bird = by_name["dog"], by_name["cat"], by_name["bird"]
    assert dog.chosen is not None and dog.chosen < 0.55 and dog.selection.f1 == 1.0
    assert not dog.written and dog.held_default.f1 == 1.0 and dog.held_chosen.f1 < 1.0
    assert cat.written and cat.chosen is not None and 0.5 <= cat.chosen < 0.6
    assert cat.held_chosen.f1 == 1.0 and cat.held_default.f1 == 0.0  # the defaults' 0.7 misses every cat
    assert bird.chosen is None and not bird.written and f"needs {MIN_INSTANCES}" in bird.reason
    assert choice.filters == {"cat": fp.ClassFilter(cat.chosen, cat.chosen)}
    assert choice.found == {"default": 7, "written": 13} and choice.instances == 13  # 6 dogs, 6 cats, a bird


def test_with_no_class_beating_the_defaults_the_file_keeps_them_and_says_why():
    views = [view([(DOG, 0.8, A), (DOG, 0.55, C)], [(DOG, A)]) for _ in range(12)]
    choice = ft.choose_filters(views, ["dog"])
    assert choice.filters == {}
    lines = choice.comment_lines()
    assert any("No class beat the defaults" in line for line in lines)
    assert any(line.strip().startswith("dog: defaults kept") for line in lines)


def held_out(trained_export, trained_model):
    """The trained model's FP32 graph as Frigate runs it on the held-out half of the export's --data."""
    from dfine_deploy.data.formats import recognise
    from dfine_deploy.export.gate_inputs import ground_truth
    from dfine_deploy.images import read_image

    annotations = recognise(trained_model.val).load("val")  # as the export reads --data
    records = annotations.records
    images = [read_image(annotations.img_folder / r.file_name) for r in records]
    names = read_artifact(trained_export).class_names
    truth = ground_truth((Path(annotations.source), annotations.coco_dict()), names)
    views = ft.detector_views(
        trained_export / "model.onnx", images, [truth[r.image_id] for r in records], trained_model.imgsz,
        trained_model.imgsz,
    )  # fmt: skip
    return [views[i] for i in split_halves(len(views))[1]], names


def test_the_trained_exports_frigate_filters_beat_frigates_defaults_on_the_held_out_images(
    trained_export, trained_model
):
    """What frigate.yml writes, applied inside Frigate's post-processing to the held-out half, does better
    than Frigate's defaults for each class written (F1) and over all classes; each class is named with
    its verdict, and the file's held-out AP50 is the one measured here."""
    text = (trained_export / frigate.SNIPPET_NAME).read_text()
    written = yaml.safe_load(text)["objects"].get("filters", {})
    views, names = held_out(trained_export, trained_model)
    as_written = {n: fp.ClassFilter(f["min_score"], f["threshold"]) for n, f in written.items()}
    mine, ap_mine = ft.outcomes(views, names, as_written)
    theirs, ap_theirs = ft.outcomes(views, names, {})
    for label, name in enumerate(names):
        assert f"#   {name}: " in text, name
        if name in written:
            assert mine[label].f1 > theirs[label].f1, (name, mine[label], theirs[label])
        else:
            assert mine[label] == theirs[label], name
    assert np.mean([o.f1 for o in mine]) >= np.mean([o.f1 for o in theirs])
    assert f"AP50 {ap_mine:.3f}" in text and f"AP50 {ap_theirs:.3f}" in text
    assert sum(o.instances for o in theirs) >= len(names) * MIN_INSTANCES  # judged on real evidence
