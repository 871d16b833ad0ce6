"""`dfine-verify ARTIFACT_OR_ENGINE`: prove an engine (or graph) on the device that will serve it.

    dfine-verify runs/quickstart/export                        # the graph onnxruntime serves here
    dfine-verify runs/quickstart/export --backend openvino
    dfine-verify export/model.engine                          # TensorRT FP16 (its folder holds model.json)
    dfine-verify export/model.int8.engine                     # INT8, timed against export/model.engine
    dfine-verify export/model.fp16.onnx_b1_gpu0_fp32.engine   # the engine DeepStream's nvinfer built
    dfine-verify /elsewhere/model.int8.engine --artifact export --baseline /elsewhere/model.engine

Exit status 0 only when every check held; the last line says what failed. The result goes into
verify.json beside the file, which dfine-serve and `Detector.open` require of an engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from dfine_deploy.backend_names import BackendName, Precision
from dfine_deploy.cli import (
    ArgumentParser,
    configure_logging,
    friendly_errors,
    int_at_least,
    model_argument,
    path_text,
)
from dfine_deploy.runtime.backends import BACKEND_CHOICES, BACKEND_HELP
from dfine_deploy.runtime.verify_record import VERIFY_NAME, describe_device


def get_args_parser() -> ArgumentParser:
    p = ArgumentParser(prog="dfine-verify", description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=model_argument, help="an artifact folder, a graph (.onnx) or an engine")
    p.add_argument(
        "--backend", default=BackendName.AUTO, help=BACKEND_HELP + f" (one of {list(BACKEND_CHOICES)})"
    )
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    p.add_argument(
        "--precision",
        default=Precision.AUTO,
        choices=list(Precision),
        help="which graph of an artifact folder; for a single file, what it was built as when nothing "
        "records it",
    )
    p.add_argument(
        "--artifact",
        type=path_text,
        help="the artifact folder whose reference pack to check against (default: the file's own)",
    )
    p.add_argument(
        "--baseline",
        type=model_argument,
        help="INT8: the FP16 (GPU) / FP32 (CPU) engine it must beat on this device",
    )
    p.add_argument("--runs", type=int_at_least(5), default=20, help="timed runs for p50/p99 latency")
    p.add_argument("--threads", type=int_at_least(1), default=None, help="CPU threads of the backend")
    return p


@friendly_errors
def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    configure_logging()
    from dfine_deploy.verify.check import verify

    result = verify(
        args.model,
        backend=args.backend,
        device=args.device,
        precision=args.precision,
        artifact=args.artifact,
        baseline=args.baseline,
        runs=args.runs,
        threads=args.threads,
    )
    print(f"device: {describe_device(result.device)}")
    p50, p99 = result.latency_ms["p50"], result.latency_ms["p99"]
    print(f"{result.file} ({result.precision}): latency p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    if result.layer_precision:
        print(f"layer precision: {result.layer_precision['status']} ({result.layer_precision['reason']})")
    print(f"written: {Path(result.file).parent / VERIFY_NAME}")
    if result.passed:
        print(f"PASS: {result.file} holds the export gate's thresholds on this device")
        return 0
    print(f"FAIL: {'; '.join(result.failures)}")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
