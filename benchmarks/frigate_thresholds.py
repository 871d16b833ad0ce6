"""Frigate's filters for an artifact, measured inside Frigate's own post-processing on held-out images.

    python benchmarks/frigate_thresholds.py runs/quickstart/export runs/quickstart/data/val

The artifact's FP32 graph runs on onnxruntime's CPU provider as Frigate's onnx detector feeds it, on
every image of the dataset's val split; its outputs go through Frigate's post-processing as
dfine_deploy/export/frigate_post.py redoes it. The images are split as `dfine-export --data` splits
them (even positions choose, odd positions judge) and the verdict frigate.yml would carry is printed,
then, on the held-out half, three filter sets side by side: Frigate's defaults, what frigate.yml
writes, and thresholds chosen as model.json chooses them (dfine_deploy/thresholds.py, on our runtime's
own detections of the same graph) on the same selection half: what frigate.yml wrote before it
measured inside Frigate. `--json FILE` writes the figures.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def runtime_thresholds(artifact: Path, images: list, truth: list, names: list[str], target: float | None):
    """{class: threshold} chosen as `dfine-export --data` chooses model.json's, on our runtime's
    detections (onnxruntime, CPU, the FP32 graph) of `images`."""
    from dfine_deploy.backend_names import Precision
    from dfine_deploy.runtime import Detector
    from dfine_deploy.thresholds import choose_thresholds, gather_evidence

    with Detector.open(
        artifact, backend="onnxruntime", device="cpu", precision=Precision.FP32, score_threshold=0.0
    ) as detector:
        found = [detector.predict([image], color="RGB")[0] for image in images]
    evidence = gather_evidence([(f.labels, f.boxes, f.scores) for f in found], truth, len(names))
    return {names[label]: c.threshold for label, c in choose_thresholds(evidence, target).items()}


def measure(artifact: Path, data: Path, target: float | None) -> dict:
    """The verdict and the held-out figures of the three filter sets."""
    from dfine_deploy.artifact import read_artifact
    from dfine_deploy.backend_names import Precision
    from dfine_deploy.data.formats import recognise
    from dfine_deploy.export import frigate_post as fp
    from dfine_deploy.export import frigate_thresholds as ft
    from dfine_deploy.export.gate_inputs import ground_truth
    from dfine_deploy.images import read_image
    from dfine_deploy.thresholds import split_halves

    info = read_artifact(artifact)
    dataset = recognise(data)
    if dataset is None:
        raise SystemExit(f"error: {data}: no annotated dataset there (give a COCO folder or a dataset root)")
    annotations = dataset.load("val")
    truth = ground_truth((Path(annotations.source), annotations.coco_dict()), info.class_names)
    records = annotations.records
    images = [read_image(annotations.img_folder / r.file_name) for r in records]
    graph = info.graphs[Precision.FP32].file
    views = ft.detector_views(
        artifact / graph, images, [truth[r.image_id] for r in records], info.input_width, info.input_height
    )
    choice = ft.choose_filters(views, info.class_names, target)
    held = [views[i] for i in split_halves(len(views))[1]]
    runtime = runtime_thresholds(
        artifact,
        [images[i] for i in split_halves(len(views))[0]],
        [truth[records[i].image_id] for i in split_halves(len(views))[0]],
        info.class_names,
        target,
    )
    sets = {
        "frigate defaults": {},
        "frigate.yml (measured in Frigate)": choice.filters,
        "chosen on our runtime, as model.json": {n: fp.ClassFilter(t, t) for n, t in runtime.items()},
    }
    rows = {}
    for name, filters in sets.items():
        per_class, ap50 = ft.outcomes(held, info.class_names, filters)
        rows[name] = {
            "ap50": round(ap50, 4),
            "found": sum(o.found for o in per_class),
            "reported": sum(o.reported for o in per_class),
            "annotated": sum(o.instances for o in per_class),
            "macro_f1": round(float(np.mean([o.f1 for o in per_class if o.instances] or [0.0])), 4),
            "filters": {n: f.threshold for n, f in filters.items()},
        }
    return {
        "graph": graph,
        "images": list(choice.images),
        "verdict": choice.comment_lines(),
        "held_out": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("artifact", type=Path, help="an artifact folder (dfine-export)")
    parser.add_argument("data", type=Path, help="an annotated dataset (its val split is used)")
    parser.add_argument("--threshold-target", type=float, help="choose for precision P instead of F1")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    result = measure(args.artifact, args.data, args.threshold_target)
    print("\n".join(result["verdict"]))
    print(f"held-out half ({result['images'][1]} images), inside Frigate's post-processing:")
    for name, r in result["held_out"].items():
        print(
            f"  {name}: AP50 {r['ap50']:.3f}, found {r['found']} of {r['annotated']}, "
            f"reported {r['reported']}, macro-F1 {r['macro_f1']:.3f}"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
