"""Our COCO metrics against pycocotools (the independent reference) on a generated hard case."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

from dfine_deploy.data.classmap import ClassMap
from dfine_deploy.errors import DatasetError
from dfine_deploy.evaluation import STAT_NAMES, CocoEvaluator

CATEGORY_IDS = [2, 7, 11]  # gaps on purpose: labels 0..2 must map back to these


def make_case(seed: int = 0):
    """GT (with crowd regions) and per-image predictions with contiguous labels.

    Predictions include jittered true positives, wrong classes, duplicates, background false
    positives, hits on crowd regions, images without any ground truth, and one image with more
    than 100 detections (COCO keeps the best 100).
    """
    rng = np.random.default_rng(seed)
    images, annotations, ids, results = [], [], [], []
    for image_id in range(1, 61):
        width, height = int(rng.integers(200, 640)), int(rng.integers(200, 480))
        images.append({"id": image_id, "file_name": f"{image_id}.jpg", "width": width, "height": height})
        n_gt = 0 if image_id % 10 == 0 else int(rng.integers(1, 9))
        boxes, labels, scores = [], [], []
        for _ in range(n_gt):
            side = float(np.exp(rng.uniform(np.log(8), np.log(180))))  # small, medium and large
            w = min(side * rng.uniform(0.6, 1.4), 0.9 * width)
            h = min(side * rng.uniform(0.6, 1.4), 0.9 * height)
            x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
            label = int(rng.integers(3))
            crowd = int(rng.random() < 0.08)
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": CATEGORY_IDS[label],
                    "bbox": [x, y, w, h],
                    "area": w * h * rng.uniform(0.5, 1.0),
                    "iscrowd": crowd,
                }
            )
            if rng.random() < 0.85:  # detected, with jitter; sometimes with the wrong class
                jitter = rng.normal(0, 0.08 * side, 4)
                pred = label if rng.random() < 0.85 else int(rng.integers(3))
                boxes.append([x + jitter[0], y + jitter[1], x + w + jitter[2], y + h + jitter[3]])
                labels.append(pred)
                scores.append(rng.uniform(0.2, 1.0))
                if rng.random() < 0.2:  # a duplicate
                    boxes.append([x, y, x + w * 0.9, y + h * 1.1])
                    labels.append(pred)
                    scores.append(rng.uniform(0.05, 0.6))
        n_fp = 120 if image_id == 7 else int(rng.integers(0, 5))
        for _ in range(n_fp):
            x, y = rng.uniform(0, width - 20), rng.uniform(0, height - 20)
            boxes.append([x, y, x + rng.uniform(4, 150), y + rng.uniform(4, 150)])
            labels.append(int(rng.integers(3)))
            scores.append(rng.uniform(0.0, 0.7))
        ids.append(image_id)
        results.append(
            {
                "boxes": np.array(boxes, dtype=np.float32).reshape(-1, 4),
                "scores": np.array(scores, dtype=np.float32),
                "labels": np.array(labels, dtype=np.int64),
            }
        )
    categories = [{"id": c, "name": f"class{c}"} for c in CATEGORY_IDS]
    return {"images": images, "annotations": annotations, "categories": categories}, ids, results


def pycocotools_stats(gt_dict, ids, results) -> np.ndarray:
    # faster_coco_eval.init_as_pycocotools() would make this compare faster-coco-eval with itself
    import pycocotools.cocoeval as module
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    assert "faster_coco_eval" not in module.__file__, f"pycocotools is shadowed by {module.__file__}"

    dets = []
    for image_id, r in zip(ids, results):
        for box, score, label in zip(r["boxes"].tolist(), r["scores"].tolist(), r["labels"].tolist()):
            x1, y1, x2, y2 = box
            dets.append(
                {
                    "image_id": image_id,
                    "category_id": CATEGORY_IDS[label],
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "score": score,
                }
            )
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO()
        gt.dataset = json.loads(json.dumps(gt_dict))
        gt.createIndex()
        ev = COCOeval(gt, gt.loadRes(dets), "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return ev.stats, ev


@pytest.fixture(scope="module")
def case():
    gt, ids, results = make_case()
    evaluator = CocoEvaluator(gt, ClassMap.from_categories(gt["categories"], remap=True))
    for start in range(0, len(ids), 16):  # in batches, as during training
        evaluator.update(ids[start : start + 16], results[start : start + 16])
    return gt, ids, results, evaluator


def test_map_equals_pycocotools(case):
    gt, ids, results, evaluator = case
    assert sum(a["iscrowd"] for a in gt["annotations"]) >= 5 and len(gt["annotations"]) >= 200
    ours = evaluator.summarize()
    reference, ref_eval = pycocotools_stats(gt, ids, results)
    assert ours["AP"] > 0.1  # a case where the numbers mean something
    np.testing.assert_allclose(ours["stats"], reference, rtol=0, atol=1e-6)
    assert [ours[n] for n in STAT_NAMES] == ours["stats"]
    # per-class AP against the reference's precision array
    for k, row in enumerate(ours["per_class"]):
        p = ref_eval.eval["precision"][:, :, k, 0, -1]
        assert row["category_id"] == CATEGORY_IDS[k] and row["label"] == k
        assert row["AP"] == pytest.approx(p[p > -1].mean(), abs=1e-6)
        assert row["AP50"] == pytest.approx(p[0][p[0] > -1].mean(), abs=1e-6)


def test_json_table_and_plots(case, tmp_path):
    _, _, _, evaluator = case
    path = evaluator.write_json(tmp_path / "metrics.json")
    saved = json.loads(path.read_text())
    assert saved["AP"] == evaluator.summarize()["AP"] and len(saved["per_class"]) == 3
    table = evaluator.format_table()
    assert "class11" in table and table.splitlines()[0].startswith("AP ")
    for plot in (
        evaluator.plot_pr_curves(tmp_path / "pr.png"),
        evaluator.plot_confusion_matrix(tmp_path / "cm.png"),
    ):
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_confusion_matrix_counts_every_ground_truth_once(case):
    gt, _, _, evaluator = case
    matrix, names = evaluator.confusion_matrix(iou_threshold=0.5, score_threshold=0.0)
    assert names == ["class2", "class7", "class11", "background"]
    non_crowd = [a for a in gt["annotations"] if not a["iscrowd"]]
    assert matrix[:3].sum() == len(non_crowd)  # each GT matched once or missed
    assert matrix[:3, :3].trace() > matrix[:3, :3].sum() - matrix[:3, :3].trace()  # mostly right classes


def test_perfect_and_empty_predictions():
    gt, ids, _ = make_case(seed=1)
    perfect = CocoEvaluator(gt)  # no class map: labels are category ids
    for image_id in ids:
        anns = [a for a in gt["annotations"] if a["image_id"] == image_id]
        boxes = [
            [a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2], a["bbox"][1] + a["bbox"][3]]
            for a in anns
        ]
        perfect.update(
            [image_id],
            [
                {
                    "boxes": np.array(boxes).reshape(-1, 4),
                    "scores": [1.0] * len(anns),
                    "labels": [a["category_id"] for a in anns],
                }
            ],
        )
    assert perfect.summarize()["AP"] == pytest.approx(1.0)
    empty = CocoEvaluator(gt)
    empty.update(ids[:2], [{"boxes": np.zeros((0, 4)), "scores": [], "labels": []}] * 2)
    assert empty.summarize()["AP"] <= 0


def test_a_repeated_image_counts_once(case):
    """DistributedSampler pads with repeats; the second copy of an image must not add detections."""
    gt, ids, results, evaluator = case
    again = CocoEvaluator(gt, evaluator.class_map)
    again.update(ids, results)
    again.update(ids[:5], results[:5])
    assert len(again.detections) == len(evaluator.detections)
    assert again.summarize()["stats"] == evaluator.summarize()["stats"]


def test_detections_for_unknown_images_are_refused():
    gt, _, _ = make_case(seed=2)
    evaluator = CocoEvaluator(gt)
    evaluator.update([999], [{"boxes": [[0, 0, 5, 5]], "scores": [0.5], "labels": [2]}])
    with pytest.raises(DatasetError, match="image ids \\[999\\]"):
        evaluator.summarize()


def _rank_main(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    gt, ids, results = make_case()
    evaluator = CocoEvaluator(gt, ClassMap.from_categories(gt["categories"], remap=True))
    mine = list(range(rank, len(ids), world)) + [0]  # a strided share, plus a padded repeat of image 0
    evaluator.update([ids[i] for i in mine], [results[i] for i in mine])
    evaluator.synchronize()
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(evaluator.summarize()["stats"], fh)
    dist.destroy_process_group()


@pytest.mark.slow
def test_synchronize_across_two_gloo_ranks(case, tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "stats.json"
    # fork: the children reuse the imported modules instead of importing torch again
    mp.start_processes(_rank_main, args=(2, port, str(out)), nprocs=2, join=True, start_method="fork")
    assert json.loads(out.read_text()) == case[3].summarize()["stats"]
