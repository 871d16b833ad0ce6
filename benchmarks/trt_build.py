"""The real TensorRT build, for a machine with TensorRT and an NVIDIA GPU (CI has neither).

    python benchmarks/trt_build.py                          # export dfine-n at 640, build, verify
    python benchmarks/trt_build.py --artifact my_export/    # build for an existing artifact folder
    python benchmarks/trt_build.py --size s --no-fp16

Steps: `dfine-export` (unless --artifact), `export.tensorrt.build_for_artifact` (version-gated
flags, profiles for both inputs, timing cache, engine read back and refused if not FP16), then
the engine runs through the runtime's TensorRT backend on the parity images and is gated
against the FP32 ONNX graph in ONNX Runtime (boxes, labels, pseudo-mAP), and a second build
shows the timing-cache speed-up. Prints TensorRT version, GPU, layer precisions, build times,
parity and b1/bmax latency (warm-up, min/median/max).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

from dfine_deploy.cli import friendly_errors


@friendly_errors
def main(argv: list[str] | None = None) -> None:
    """Export (unless --artifact), build twice, verify and time; a machine without TensorRT or a GPU
    gets the build's one-line refusal (status 2), not a traceback."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--artifact", type=Path)
    parser.add_argument("--size", default="n")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--no-fp16", dest="fp16", action="store_false")
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args(argv)

    from dfine_deploy.artifact import read_artifact
    from dfine_deploy.export import onnx as onnx_export
    from dfine_deploy.export import parity
    from dfine_deploy.export import tensorrt as trt_export
    from dfine_deploy.export.pipeline import export_artifact
    from dfine_deploy.export.settings import ExportSettings
    from dfine_deploy.runtime.tensorrt_backend import TensorRTBackend

    with tempfile.TemporaryDirectory() as tmp:
        folder = args.artifact
        if folder is None:
            folder = Path(tmp) / f"dfine_{args.size}"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                export_artifact(
                    ExportSettings(
                        model=f"dfine-{args.size}",
                        output=folder,
                        imgsz=(args.imgsz, args.imgsz),
                        fp16=args.fp16,
                    )
                )
        first = trt_export.build_for_artifact(folder, fp16=args.fp16)
        second = trt_export.build_for_artifact(folder, fp16=args.fp16)  # timing cache now warm
        info = read_artifact(folder)
        print(
            f"TensorRT {first.tensorrt_version} on {first.gpu_name} (sm {first.compute_capability}); "
            f"graph {first.source_graph}; builder {first.builder}"
        )
        print(f"layer precisions {first.layer_precisions}; I/O {first.io_dtypes}")
        print(f"build {first.build_seconds:.1f} s, again with the timing cache {second.build_seconds:.1f} s")

        backend = TensorRTBackend(folder / second.file)  # its precision's own file

        def engine_runner(images, sizes):
            out = backend.run({"images": images, "orig_target_sizes": sizes})
            return out["labels"], out["boxes"], out["scores"]

        batches = parity.make_batches(
            parity.synthetic_scenes(7),
            info.input_height,
            info.input_width,
            [b for b in (1, 2, 4) if b <= info.batch_max],
        )
        reference = onnx_export.ort_runner(onnx_export.ort_session(folder / "model.onnx"))
        gate = parity.FP16_GATE if args.fp16 else parity.FP32_GATE
        report = parity.run_gate(
            reference,
            engine_runner,
            batches,
            gate,
            reference_name="model.onnx (ORT)",
            candidate_name=second.file,
        )
        print(report.summary())

        for batch in sorted({1, info.batch_max}):
            images = batches[-1].images[:1].repeat(batch, 0)
            sizes = batches[-1].orig_sizes[:1].repeat(batch, 0)
            for _ in range(20):
                engine_runner(images, sizes)
            times = []
            for _ in range(args.runs):
                start = time.perf_counter()
                engine_runner(images, sizes)
                times.append((time.perf_counter() - start) * 1000)
            print(
                f"batch {batch}: min {min(times):.2f}  median {statistics.median(times):.2f}  "
                f"max {max(times):.2f} ms (host arrays in/out, {args.runs} runs)"
            )


if __name__ == "__main__":
    raise SystemExit(main())
