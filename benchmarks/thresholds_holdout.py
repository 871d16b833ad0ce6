"""Do thresholds per class chosen on one half of a validation set beat the one global threshold on the
other half? For each graph of an artifact folder, on onnxruntime's CPU provider.

    python benchmarks/thresholds_holdout.py runs/quickstart/export runs/quickstart/data --precisions fp32 int8

Every image of the val split is detected once (no threshold); the images are split in two halves (even
and odd positions). Thresholds per class are chosen on one half as `dfine-export --data` chooses them
(dfine_deploy/thresholds.py: F1-optimal, or `--threshold-target P`), and the macro-F1 (the mean over
the classes of F1 at IoU 0.5) on the other half is printed beside the macro-F1 there at the global
default (dfine-serve's --score-threshold default) and at the one threshold for every class that is
best on the choosing half; then the halves swap. `--json FILE` writes the figures.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GRID = [i / 100 for i in range(5, 96)]  # the single thresholds tried for every class at once


def holdout(artifact: Path, data: Path, precision: str, target: float | None) -> list[dict]:
    """Both directions (chosen on one half, scored on the other) for one graph of `artifact`."""
    from dfine_deploy.bench.accuracy import annotated_truth
    from dfine_deploy.data.classmap import ClassMap
    from dfine_deploy.data.formats import open_dataset
    from dfine_deploy.images import read_image
    from dfine_deploy.runtime import Detector
    from dfine_deploy.thresholds import (
        DEFAULT_SCORE_THRESHOLD,
        choose_thresholds,
        gather_evidence,
        macro_f1,
    )

    annotations = open_dataset(data).load("val")
    gt = annotations.coco_dict()
    images = gt["images"]
    with Detector.open(
        artifact, backend="onnxruntime", device="cpu", precision=precision, score_threshold=0.0
    ) as detector:
        names = detector.class_names
        class_map = ClassMap.for_model(gt["categories"], names).class_map
        detections = []
        for record in images:
            (found,) = detector.predict(
                [read_image(annotations.img_folder / record["file_name"])], color="RGB"
            )
            detections.append((found.labels, found.boxes, found.scores))
        graph = Path(detector.source).name
    truth = annotated_truth(gt, images, class_map)
    halves = [list(range(0, len(images), 2)), list(range(1, len(images), 2))]
    evidence = [
        gather_evidence([detections[i] for i in half], [truth[i] for i in half], len(names))
        for half in halves
    ]
    rows = []
    for chosen_on, scored_on in ((0, 1), (1, 0)):
        chosen = choose_thresholds(evidence[chosen_on], target)
        one = max(GRID, key=lambda t: macro_f1(evidence[chosen_on], [t] * len(names)))
        per_class = [
            chosen[c].threshold if c in chosen else DEFAULT_SCORE_THRESHOLD for c in range(len(names))
        ]
        rows.append(
            {
                "graph": graph,
                "precision": precision,
                "chosen_on": "even" if chosen_on == 0 else "odd",
                "images": [len(halves[chosen_on]), len(halves[scored_on])],
                "thresholds": {names[c]: round(t, 3) for c, t in enumerate(per_class)},
                "macro_f1_chosen": macro_f1(evidence[scored_on], per_class),
                "macro_f1_default": macro_f1(evidence[scored_on], [DEFAULT_SCORE_THRESHOLD] * len(names)),
                # one threshold for every class, the best on the same half: is it the per-class part?
                "one_tuned": round(one, 2),
                "macro_f1_one_tuned": macro_f1(evidence[scored_on], [one] * len(names)),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("artifact", type=Path, help="an artifact folder (dfine-export)")
    parser.add_argument("data", type=Path, help="the dataset (its val split is used)")
    parser.add_argument(
        "--precisions", nargs="+", default=["fp32"], help="graphs to compare (fp32, fp16, int8)"
    )
    parser.add_argument("--threshold-target", type=float, help="choose for precision P instead of F1")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    rows = [r for p in args.precisions for r in holdout(args.artifact, args.data, p, args.threshold_target)]
    for r in rows:
        print(
            f"{r['graph']} ({r['precision']}): chosen on the {r['chosen_on']} half "
            f"({r['images'][0]} images), "
            f"macro-F1 on the other ({r['images'][1]}): {r['macro_f1_chosen']:.3f} per class vs "
            f"{r['macro_f1_default']:.3f} at the default, "
            f"{r['macro_f1_one_tuned']:.3f} at one threshold tuned on the same half ({r['one_tuned']}); "
            f"thresholds {r['thresholds']}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
