"""Thresholds per class (dfine_deploy/thresholds.py): chosen F1-optimal or for a precision, with too
little evidence left to the default, resolved with the user's own winning, and checked in model.json."""

from __future__ import annotations

import json
import logging
import unicodedata

import numpy as np
import pytest

from dfine_deploy.artifact import ArtifactInfo
from dfine_deploy.errors import BackendError
from dfine_deploy.thresholds import (
    CHOSEN,
    DEFAULT,
    DEFAULT_SCORE_THRESHOLD,
    MIN_INSTANCES,
    YOURS,
    ClassEvidence,
    by_label,
    choose_threshold,
    gather_evidence,
    held_out_verdicts,
    macro_f1,
    precision_recall,
    resolve_thresholds,
    threshold_record,
)


def _evidence(scores, found, instances):
    order = np.argsort(-np.asarray(scores, float), kind="stable")
    return ClassEvidence(np.asarray(scores, float)[order], np.asarray(found, bool)[order], instances)


def test_gather_evidence_matches_each_object_once_by_label_and_iou():
    box = [0, 0, 10, 10]
    detections = [
        (np.array([0, 0, 1]), np.array([box, box, box], float), np.array([0.9, 0.8, 0.7])),
    ]
    truth = [(np.array([0]), np.array([box], float))]
    person, car = gather_evidence(detections, truth, 2)
    assert person.found.tolist() == [True, False]  # the duplicate of one object is a false positive
    assert person.instances == 1 and car.instances == 0 and car.found.tolist() == [False]


def test_the_f1_optimal_threshold_sits_between_the_last_kept_and_the_next_score():
    # 6 objects; the three best detections find objects, then two false positives, then two finds
    e = _evidence([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3], [1, 1, 1, 0, 0, 1, 1], 6)
    choice = choose_threshold(e)
    # F1 after 3 kept: 2*1*.5/(1.5) = .667; after all 7: p 5/7 r 5/6 -> .769: keep all
    assert choice.threshold == pytest.approx(0.15)
    assert (choice.precision, choice.recall) == pytest.approx((5 / 7, 5 / 6))
    assert precision_recall(e, choice.threshold) == pytest.approx((5 / 7, 5 / 6, choice.f1))
    strict = choose_threshold(e, target_precision=0.99)  # the most recall at precision 1
    assert strict.threshold == pytest.approx(0.65) and strict.recall == pytest.approx(0.5)
    never = choose_threshold(e, target_precision=1.01)  # never reached: the highest precision's cut, said
    assert never.short_of_target and never.threshold == pytest.approx(0.65)


def test_a_class_with_too_few_objects_or_no_find_keeps_the_default():
    assert choose_threshold(_evidence([0.9, 0.8], [1, 1], MIN_INSTANCES - 1)) is None
    assert choose_threshold(_evidence([0.9, 0.8], [0, 0], 10)) is None


def test_tied_scores_are_kept_or_dropped_together():
    e = _evidence([0.9, 0.5, 0.5, 0.5], [1, 1, 0, 0], 5)
    # keeping 2 of the three 0.5s is no threshold: the choice is between 1 and all 4 detections
    assert choose_threshold(e).threshold == pytest.approx(0.25)  # F1 .44 with all four, .33 with one


def test_macro_f1_averages_over_annotated_classes_at_their_own_thresholds():
    a = _evidence([0.9, 0.2], [1, 0], 1)
    b = _evidence([0.3], [1], 1)
    assert macro_f1([a, b], [0.5, 0.25]) == pytest.approx(1.0)
    assert macro_f1([a, b], [0.5, 0.5]) == pytest.approx(0.5)


def test_yours_win_over_the_chosen_which_win_over_the_default():
    names = ["person", "car", "dog"]
    chosen = {0: 0.41, 1: 0.33}  # by label
    resolved = resolve_thresholds(names, chosen, {"person": 0.6})
    assert resolved.values.tolist() == pytest.approx([0.6, 0.33, DEFAULT_SCORE_THRESHOLD])
    assert resolved.sources == [YOURS, CHOSEN, DEFAULT]
    assert resolved.table(names)[0] == {"class": "person", "threshold": 0.6, "source": YOURS, "chosen": 0.41}
    everyone = resolve_thresholds(names, chosen, {"dog": 0.9}, default=0.5)  # --score-threshold given
    assert everyone.values.tolist() == pytest.approx([0.5, 0.5, 0.9]) and set(everyone.sources) == {YOURS}
    with pytest.raises(BackendError, match="'cat': the model has no such class"):
        resolve_thresholds(names, chosen, {"cat": 0.5})


def _sidecar(thresholds):
    return {
        "format_version": 1,
        "model": "dfine-n",
        "num_classes": 2,
        "class_names": ["person", "car"],
        "input_height": 64,
        "input_width": 64,
        "graphs": {"fp32": {"file": "model.onnx", "sha256": "0" * 64, "precision": "fp32"}},
        "thresholds": thresholds,
    }


def test_model_json_thresholds_are_read_per_graph_and_backend_and_checked():
    entry = {"rule": "f1", "images": 8, "iou": 0.5, "classes": {"car": {"threshold": 0.3}}}
    info = ArtifactInfo.from_dict(json.loads(json.dumps(_sidecar({"fp32": entry}))))
    assert info.chosen_thresholds("model.onnx", "onnxruntime:cuda") == {"car": 0.3}  # the ORT CPU gate's
    assert info.chosen_thresholds("model.fp16.onnx", "onnxruntime:cpu") == {}
    for bad, message in (
        ({"cat": {"threshold": 0.3}}, "thresholds.fp32.classes.cat: not a class of the model"),
        ({"car": {"threshold": 1.5}}, r"thresholds.fp32.classes.car.threshold 1.5 is not in \[0, 1\]"),
    ):
        with pytest.raises(BackendError, match=message):
            ArtifactInfo.from_dict(_sidecar({"fp32": dict(entry, classes=bad)}))


def test_thresholds_recorded_by_name_are_served_by_label_and_compared_in_nfc():
    recorded = {unicodedata.normalize("NFD", "café"): 0.4, "car": 0.3}  # a name stored decomposed
    assert by_label(recorded, ["person", "car", unicodedata.normalize("NFC", "café")]) == {2: 0.4, 1: 0.3}
    # a --names file renames the classes: the labels keep what was chosen for them
    resolved = resolve_thresholds(["human", "auto", "cafe"], {1: 0.3, 2: 0.4})
    assert resolved.values.tolist() == pytest.approx([DEFAULT_SCORE_THRESHOLD, 0.3, 0.4])
    assert resolved.sources == [DEFAULT, CHOSEN, CHOSEN]


def test_a_target_precision_never_reached_keeps_the_highest_precision_cut_and_says_so(caplog):
    # the best detection is a false positive: the highest precision reached is 2/3 (the top three);
    # the default 0.25 would keep five of six at 3/5
    e = _evidence([0.9, 0.8, 0.7, 0.6, 0.3, 0.2], [0, 1, 1, 0, 1, 0], 6)
    choice = choose_threshold(e, target_precision=0.9)
    assert choice.short_of_target and choice.threshold == pytest.approx(0.65)
    assert choice.precision == pytest.approx(2 / 3) and choice.recall == pytest.approx(2 / 6)
    reached = choose_threshold(e, target_precision=0.6)
    assert not reached.short_of_target and reached.precision == pytest.approx(0.6)
    untold = _evidence([0.9], [1], MIN_INSTANCES - 1)
    with caplog.at_level(logging.WARNING, logger="dfine_deploy.thresholds"):
        record = threshold_record([e, untold], ["far", "rare"], target_precision=0.9, images=3)
    assert record["classes"]["far"]["short_of_target"] is True and "rare" not in record["classes"]
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("class far: precision 0.9 is not reached") for m in said), said
    assert any(m.startswith(f"class rare: {MIN_INSTANCES - 1} annotated object(s)") for m in said), said


def test_a_threshold_is_kept_only_where_it_does_better_on_the_held_out_half():
    """Chosen on the selection half, judged on the other against the default: a class whose choice
    generalises is kept; one whose choice overfits (the held-out half's true objects score lower), or
    whose held-out half has too few objects, or whose selection half has nothing to choose on, is not."""
    names = ["fits", "overfits", "few held out", "none to choose"]
    selection = [
        _evidence([0.9, 0.8, 0.7, 0.6, 0.5, 0.2, 0.1], [1, 1, 1, 1, 1, 0, 0], 5),
        _evidence([0.9, 0.8, 0.7, 0.6, 0.5, 0.3, 0.28], [1, 1, 1, 1, 1, 0, 0], 5),
        _evidence([0.9, 0.8, 0.7, 0.6, 0.5, 0.2], [1, 1, 1, 1, 1, 0], 5),
        _evidence([0.9], [1], 2),
    ]
    held = [
        _evidence([0.9, 0.8, 0.7, 0.6, 0.5, 0.3, 0.1], [1, 1, 1, 1, 1, 0, 0], 5),  # the default keeps 0.3
        _evidence([0.9, 0.8, 0.7, 0.35, 0.3, 0.27], [1, 1, 1, 1, 1, 0], 5),  # true objects at 0.3 and 0.35
        _evidence([0.9, 0.8, 0.2], [1, 1, 0], 2),
        _evidence([0.9], [1], 5),
    ]
    verdicts = held_out_verdicts(selection, held, names, target_precision=None)
    assert verdicts["fits"]["kept"] and verdicts["fits"]["f1"] > verdicts["fits"]["default_f1"]
    assert verdicts["fits"]["threshold"] == pytest.approx(0.35)
    assert (
        not verdicts["overfits"]["kept"] and verdicts["overfits"]["f1"] <= verdicts["overfits"]["default_f1"]
    )
    assert not verdicts["few held out"]["kept"] and "too few to judge" in verdicts["few held out"]["reason"]
    assert verdicts["none to choose"] == {
        "threshold": None,
        "kept": False,
        "reason": "2 annotated on the selection half: nothing to choose on",
    }
