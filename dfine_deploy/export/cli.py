"""`dfine-export MODEL`: a verified artifact folder (ONNX, typed FP16 ONNX, optional engine)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from dfine_deploy.artifact import BF16_GATE_KEY
from dfine_deploy.cli import (
    MODEL_HELP,
    ArgumentParser,
    add_input_size,
    check_option_owners,
    configure_logging,
    friendly_errors,
    given_options,
    model_argument,
    option_flags,
    quiet_third_party_warnings,
)
from dfine_deploy.errors import ExportError
from dfine_deploy.export import deploy_targets
from dfine_deploy.export.onnx import DEFAULT_OPSET, MIN_OPSET
from dfine_deploy.files import user_path
from dfine_deploy.model.spec import EXPORT_SAMPLER, SAMPLERS


def get_args_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="dfine-export",
        description="Export D-FINE to a checked artifact folder: model.onnx (FP32, postprocessor inside), "
        "model.fp16.onnx (typed FP16 with FP32 islands), model.grid.onnx (for CPU backends), model.json; "
        "optionally model.int8.onnx, a TensorRT engine (model.engine; with --int8 model.int8.engine) "
        "and a Triton repository. Each graph must pass the parity "
        "gate (boxes, labels, mAP) or nothing is written.",
    )
    p.add_argument("model", type=model_argument, help=MODEL_HELP)
    p.add_argument(
        "--weights",
        type=user_path,
        metavar="PTH",
        help="checkpoint to load into a size name or config given as MODEL",
    )
    p.add_argument(
        "--allow-pickle",
        action="store_true",
        help="load a checkpoint you trust with full unpickling (files with non-tensor objects)",
    )
    p.add_argument(
        "--names",
        type=user_path,
        metavar="FILE",
        help="class names, one per line (or a JSON/YAML list): overrides the model's, and the "
        "COCO/Objects365 names assumed for an official 80/366-class checkpoint",
    )
    p.add_argument(
        "--hf",
        type=user_path,
        metavar="DIR",
        help="write a Hugging Face transformers folder (config.json, model.safetensors) instead of an "
        "artifact; checked against transformers' own forward when it is installed",
    )
    p.add_argument(
        "-o",
        "--output",
        type=user_path,
        help="artifact folder, new or empty or an artifact of ours (default: ./<model name>_export)",
    )
    add_input_size(p, (640, 640), "input size: S or H W pixels, multiples of 32 (default 640)")
    p.add_argument(
        "--batch",
        type=int,
        nargs=3,
        metavar=("MIN", "OPT", "MAX"),
        default=(1, 1, 8),
        help="dynamic batch range for the engine profile and Triton (default 1 1 8)",
    )
    p.add_argument(
        "--opset",
        type=int,
        help=f"ONNX opset, {MIN_OPSET} or newer (default {DEFAULT_OPSET}, or what --target fixes)",
    )
    p.add_argument(
        "--target",
        choices=deploy_targets.target_names(),
        metavar="TARGET",
        help=deploy_targets.targets_help(),
    )
    p.add_argument(
        "--sampler",
        choices=SAMPLERS,
        default=EXPORT_SAMPLER,
        help="deformable sampling: gather (default; no GridSample node, TensorRT-safe) or grid",
    )
    p.add_argument(
        "--no-postprocess",
        dest="postprocess",
        action="store_false",
        help="export the bare network (outputs pred_logits, pred_boxes)",
    )
    p.add_argument(
        "--no-fp16",
        dest="fp16",
        action="store_false",
        help="FP32 graph only (by default the typed FP16 graph is written too)",
    )
    p.add_argument(
        "--no-cpu-graph",
        dest="cpu_graph",
        action="store_false",
        help="skip model.grid.onnx, the GridSample graph that CPU backends run (faster there)",
    )
    p.add_argument(
        "--int8",
        action="store_true",
        help="also write model.int8.onnx: INT8 QDQ calibrated on --data, gated against FP32 "
        "in onnxruntime and OpenVINO; with --target trt10.3/trt10.14/trt11 instead model.int8.trt.onnx, "
        "the Q/DQ graph TensorRT builds an INT8 engine from (--trt builds it)",
    )
    p.add_argument(
        "--calibration-images",
        type=int,
        default=32,
        metavar="N",
        help="images of --data used to calibrate --int8 (default 32)",
    )
    p.add_argument(
        "--trt",
        action="store_true",
        help="build the engine here: model.engine, with --int8 model.int8.engine (needs TensorRT and a GPU)",
    )
    p.add_argument("--triton", type=user_path, metavar="DIR", help="also write a Triton model repository")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an artifact (and Triton model folders) of ours at the output, and keep graphs that "
        "fail the parity gate; any other folder there is refused (docs/folders.md)",
    )
    p.add_argument(
        "--data",
        type=user_path,
        metavar="DIR",
        help="validation images for the gate (with COCO annotations: mAP is compared too)",
    )
    p.add_argument(
        "--threshold-target",
        type=float,
        metavar="P",
        help="with --data holding annotations: choose each class's score threshold for the most recall "
        "at precision P or more (e.g. 0.9), instead of the F1-optimal one; recorded per graph and backend "
        "in model.json, read by dfine-serve, frigate.yml, the DeepStream and Triton configs",
    )
    p.add_argument(
        "--gate-images",
        type=int,
        default=100,
        metavar="N",
        help="images of --data every gate runs and compares, and scores for mAP (default 100; a few "
        "images make the mAP comparison noise)",
    )
    p.add_argument("--json", action="store_true", help="print the sidecar as JSON")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show every warning of torch.onnx, onnxconverter-common etc. (default: a one-line count)",
    )
    return p


# an option ignored without the option it belongs to (dfine_deploy.cli.check_option_owners)
OPTION_OWNERS = {
    "--calibration-images": ("--int8",),
    "--gate-images": ("--data",),
}
# what --hf reads; every other option is the artifact's
HF_OPTIONS = ("--hf", "--weights", "--allow-pickle", "--names", "--imgsz", "--force", "--verbose")


def _export_hf(parser: argparse.ArgumentParser, argv: Sequence[str] | None, args: argparse.Namespace) -> int:
    """--hf: the model as a transformers folder; the artifact's options are refused, not ignored."""
    from dfine_deploy.hub.hf import export_hf
    from dfine_deploy.hub.loader import load_model

    artifact_options = [flag for flag in option_flags(parser) if flag not in HF_OPTIONS]
    given = given_options(parser, argv, artifact_options)
    if given:
        raise ExportError(
            f"--hf writes a transformers folder, and {' and '.join(given)} "
            f"{'is an option' if len(given) == 1 else 'are options'} of an artifact: leave "
            f"{'it' if len(given) == 1 else 'them'} out, or export an artifact without --hf"
        )
    with quiet_third_party_warnings(args.verbose):
        loaded = load_model(
            args.model,
            imgsz=args.imgsz,
            weights=args.weights,
            allow_pickle=args.allow_pickle,
            names=args.names,
        )
        print(export_hf(loaded, Path(args.hf), force=args.force))
    return 0


def _check_no_cpu_graph(args: argparse.Namespace) -> None:
    """--no-cpu-graph where no CPU graph would be written, or one is written anyway: refused, not ignored."""
    why = (
        f"--target {args.target} writes the graphs of its device and no CPU graph"
        if args.target
        else "--no-postprocess writes no CPU graph"
        if not args.postprocess
        else "--int8 quantizes the CPU graph, which it keeps"
        if args.int8
        else None
    )
    if why:
        raise ExportError(f"--no-cpu-graph: {why}; leave --no-cpu-graph out (it would be ignored)")


@friendly_errors
def main(argv: Sequence[str] | None = None) -> int:
    parser = get_args_parser()
    args = parser.parse_args(argv)
    configure_logging()
    if args.hf is not None:
        return _export_hf(parser, argv, args)
    check_option_owners(parser, argv, OPTION_OWNERS, ExportError)
    if not args.cpu_graph:
        _check_no_cpu_graph(args)
    from dfine_deploy.export.pipeline import export_artifact
    from dfine_deploy.export.settings import ExportSettings

    output = args.output or Path(f"{Path(args.model).stem.replace('.', '_')}_export")
    with quiet_third_party_warnings(args.verbose):
        info = export_artifact(
            ExportSettings(
                model=args.model,
                output=output,
                imgsz=args.imgsz,
                batch=tuple(args.batch),
                opset=args.opset,
                sampler=args.sampler,
                target=args.target,
                postprocess=args.postprocess,
                fp16=args.fp16,
                cpu_graph=args.cpu_graph,
                int8=args.int8,
                calibration_images=args.calibration_images,
                gate_images=args.gate_images,
                threshold_target=args.threshold_target,
                trt=args.trt,
                triton=args.triton,
                force=args.force,
                data=args.data,
                weights=args.weights,
                allow_pickle=args.allow_pickle,
                names=args.names,
            )
        )
    if args.json:
        print(json.dumps(asdict(info), indent=2))
        return 0
    print(
        f"wrote {output}/ ({', '.join(g.file for g in info.graphs.values())}"
        + "".join(f", {engine.file}" for engine in info.engines.values())
        + (f", {info.reference_pack['file']}" if info.reference_pack else "")
        + ", model.json)"
    )
    if args.target:
        print("  " + deploy_targets.get_target(args.target).describe)
        for file, check in info.target.get("parser_check", {}).items():
            print(
                f"  {file}: every node imports in TensorRT {check['tensorrt']}'s ONNX parser "
                f"(static check, {check['table']})"
            )
    if info.target.get("int8_plan"):
        print("  INT8 engine on the target: " + info.target["int8_plan"]["trtexec"])
    for key, report in info.parity.items():
        if report.get("run") is False:
            print(f"  {key}: not run: {report['reason']}")
            continue
        refused = "precision bf16 refused" if key == BF16_GATE_KEY else "kept with --force"
        verdict = "PASS" if report["passed"] else f"FAIL ({refused}): " + "; ".join(report["failures"])
        print(
            f"  {key}: boxes {report['box_agreement']:.1%} matched "
            f"at IoU {report['thresholds']['match_iou']}, "
            f"labels {report['label_agreement']:.1%}, pseudo-mAP {report['pseudo_ap']:.1f}, "
            f"score |d| p99 {report['score_p99_abs']:.1e} (max {report['score_max_abs']:.1e}) -> {verdict}"
        )
    for key, record in info.thresholds.items():
        chosen = ", ".join(f"{name} {c['threshold']:.2f}" for name, c in record["classes"].items())
        print(
            f"  {key}: thresholds per class ({record['rule']}, {record['images']} images): "
            + (chosen or "none (too few annotated objects per class)")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
