"""Parity and FP16 accuracy of dfine-export for each model size, on synthetic validation images.

    python benchmarks/export_accuracy.py --sizes n s m l x --imgsz 640
    python benchmarks/export_accuracy.py --sizes s --weights s=dfine_s_coco.pth --data synthetic_val/

For every size: export (gather sampler, postprocessor inside) with the gates recorded instead of
enforced, then print the FP32 graph against PyTorch and the typed FP16 graph against FP32: score
differences, box/label agreement, box precision and pseudo-mAP (FP32 detections taken as ground
truth: 100 = identical). With --data (a COCO folder, e.g. `dfine-data synthetic`'s val split) the
mAP of both graphs against the annotations and its change are printed (goal: FP16 within 0.5 AP).
Random weights (no --weights) make scores near-ties: the ranking figures are then noise and are
flagged as not gated.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", nargs="+", default=["n", "s", "m", "l", "x"])
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--data", type=Path, help="COCO-layout validation folder")
    parser.add_argument("--weights", nargs="*", default=[], metavar="SIZE=PTH")
    args = parser.parse_args()
    weights = dict(item.split("=", 1) for item in args.weights)

    from dfine_deploy.export.pipeline import export_artifact
    from dfine_deploy.export.settings import ExportSettings

    print(
        f"{'size':5s} {'graph':6s} {'score max|d|':>12s} {'box agr':>8s} {'label agr':>9s} {'box prec':>8s} "
        f"{'decisive':>8s} {'pseudo-mAP':>10s} {'AP ref':>7s} {'AP cand':>7s} {'dAP':>6s}  time"
    )
    for size in args.sizes:
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            start = time.perf_counter()
            info = export_artifact(
                ExportSettings(
                    model=f"dfine-{size}",
                    output=Path(tmp) / size,
                    imgsz=(args.imgsz, args.imgsz),
                    force=True,
                    data=args.data,
                    weights=Path(weights[size]) if size in weights else None,
                )
            )
            seconds = time.perf_counter() - start
        for key, r in info.parity.items():
            ap = r.get("dataset_ap") or {}
            d_ap = ap["candidate"] - ap["reference"] if ap else float("nan")
            ap_ref, ap_cand = ap.get("reference", float("nan")), ap.get("candidate", float("nan"))
            not_gated = "" if r["pseudo_ap_gated"] else "*"
            verdict = "PASS" if r["passed"] else "FAIL " + "; ".join(r["failures"])
            print(
                f"{size:5s} {key:6s} {r['score_max_abs']:12.2e} {r['box_agreement']:8.3f} "
                f"{r['label_agreement']:9.3f} {r['box_precision']:8.3f} {r['decisive']:8d} "
                f"{r['pseudo_ap']:9.1f}{not_gated} {ap_ref:7.2f} {ap_cand:7.2f} {d_ap:+6.2f}  "
                f"{seconds:.0f}s {verdict}"
            )
    print("* not gated: the reference's top scores are near-ties (random weights), so ranks are noise")


if __name__ == "__main__":
    main()
