"""Every GPU-only check of dfine-deploy in one run, written to one JSON report.

Started by benchmarks/gpu_check.sh (which refuses a machine without an NVIDIA GPU). Each check
records status ok / failed / skipped (with why), its seconds and its figures; the report is
rewritten after every check, so a run cut short still leaves what it measured.

    torch_cuda       D-FINE-N training step on CUDA (forward + loss + backward, FP16 autocast)
    trainer          dfine-train for one short epoch on CUDA (synthetic data, AMP)
    export           dfine-export of a D-FINE-N checkpoint (the artifact the rest uses)
    ort_cuda         onnxruntime CUDA provider really active; detections vs the CPU provider
    ort_tensorrt_ep  onnxruntime TensorRT provider, where onnxruntime-gpu offers it
    tensorrt         engine build + run with torch buffers and with cuda-python buffers
    torch_detector   Detector on torch CUDA (FP16 autocast) vs onnxruntime CPU
    bench_t4         dfine-bench --device t4 over every backend that loaded, --json

Agreement is IoU-matched (dfine_deploy.runtime.compare): FP32 paths need >= 95 % of the top-20
detections matched at IoU 0.9; FP16 paths >= 80 % at IoU 0.8 (random weights make near-tied scores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from dfine_deploy.artifact import atomic_write_bytes  # noqa: E402
from dfine_deploy.bench.hardware import detect  # noqa: E402
from dfine_deploy.runtime import Detector  # noqa: E402
from dfine_deploy.runtime.compare import compare_detections  # noqa: E402

FP32_GATE = (0.95, 0.9)  # (match rate, IoU)
FP16_GATE = (0.80, 0.8)


class Skip(Exception):
    """A check that cannot run here (says why)."""


def agreement(reference, other, gate) -> dict[str, Any]:
    rate, iou = gate
    result = compare_detections(reference, other, top_k=20, iou_threshold=iou).to_dict()
    result["gate"] = {"match_rate": rate, "iou": iou}
    result["passed"] = result["match_rate"] >= rate
    if not result["passed"]:
        raise AssertionError(f"detections disagree: {result}")
    return result


def frames(count: int = 4) -> list[np.ndarray]:
    import cv2

    rng = np.random.default_rng(0)
    out = []
    for i in range(count):
        small = rng.integers(0, 256, (9, 16, 3), dtype=np.uint8)
        frame = cv2.resize(small, (1280, 720), interpolation=cv2.INTER_CUBIC)
        for _ in range(5):
            x, y = int(rng.integers(0, 1100)), int(rng.integers(0, 560))
            cv2.rectangle(
                frame,
                (x, y),
                (x + int(rng.integers(40, 180)), y + int(rng.integers(40, 160))),
                tuple(int(c) for c in rng.integers(0, 256, 3)),
                -1,
            )
        out.append(frame)
    return out


def run_command(cmd: list[str], timeout: float) -> dict[str, Any]:
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    result = {
        "command": " ".join(cmd),
        "returncode": proc.returncode,
        "seconds": round(time.perf_counter() - started, 1),
        "output_tail": (proc.stdout + proc.stderr)[-3000:],
    }
    if proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}: {result['output_tail'][-800:]}")
    return result


# ---------------------------------------------------------------------------------------------
def check_torch_cuda(ctx) -> dict[str, Any]:
    import torch

    from dfine_deploy.bench.training import measure_training

    if not torch.cuda.is_available():
        raise AssertionError(
            f"torch {torch.__version__} sees no CUDA device (CUDA build: {torch.version.cuda})"
        )
    result = measure_training("dfine-n", (640, 640), batch=4, runs=6, warmup=2, device="cuda")
    timing = result.pop("timing")
    if not np.isfinite(result["loss"]):
        raise AssertionError(f"non-finite loss {result['loss']}")
    return {
        **result,
        "images_per_s": round(timing.fps, 1),
        "step_ms": timing.to_dict(),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def check_trainer(ctx) -> dict[str, Any]:
    work = ctx["work"]
    data = work / "synthetic"
    py = sys.executable
    made = run_command(
        [
            py,
            "-m",
            "dfine_deploy.data.cli",
            "synth",
            "--out",
            str(data),
            "--images",
            "64",
            "--val-images",
            "16",
        ],
        timeout=120,
    )
    ctx["data"] = data / "val"
    updates = [
        "epochs=1",
        f"output_dir={work / 'train'}",
        f"train_dataloader.dataset.img_folder={data / 'train'}",
        f"train_dataloader.dataset.ann_file={data / 'train' / 'annotations.json'}",
        f"val_dataloader.dataset.img_folder={data / 'val'}",
        f"val_dataloader.dataset.ann_file={data / 'val' / 'annotations.json'}",
    ]
    trained = run_command(
        [
            py,
            "train/main.py",
            "-c",
            "configs/quickstart/dfine_n_synthetic.yml",
            "-d",
            "cuda",
            "--use-amp",
            "--no-progress",
            "-u",
            *updates,
        ],
        timeout=ctx["left"]() - 60,
    )
    return {"data": made["seconds"], "train": trained}


def check_export(ctx) -> dict[str, Any]:
    import torch

    from dfine_deploy.model.hub import load_model

    work = ctx["work"]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        loaded = load_model("dfine-n")
    checkpoint = work / "dfine_n_random.pth"
    torch.save({"model": loaded.model.state_dict(), "meta": {"class_names": loaded.class_names}}, checkpoint)
    folder = work / "artifact"
    result = run_command(
        [
            sys.executable,
            "-m",
            "dfine_deploy.export.cli",
            str(checkpoint),
            "-o",
            str(folder),
            "--imgsz",
            "640",
            "640",
            "--force",
        ],
        timeout=300,
    )  # random weights: see the gate, don't stop
    ctx.update(checkpoint=checkpoint, artifact=folder)
    cpu = Detector.open(folder, backend="onnxruntime:cpu")
    ctx["frames"] = frames()
    ctx["reference"] = cpu.predict(ctx["frames"])
    ctx["backends"] = ["onnxruntime:cpu"]
    from dfine_deploy.artifact import read_artifact

    return {
        "export": result,
        "files": sorted(p.name for p in folder.iterdir()),
        "parity": read_artifact(folder).parity,
    }


def _needs_artifact(ctx) -> None:
    if "reference" not in ctx:
        raise Skip("the export check did not produce an artifact")


def check_ort_cuda(ctx) -> dict[str, Any]:
    import onnxruntime as ort

    _needs_artifact(ctx)
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        raise AssertionError(f"onnxruntime {ort.__version__} offers {available}: install onnxruntime-gpu")
    out: dict[str, Any] = {"onnxruntime": ort.__version__, "available": available}
    for precision, gate in (("fp32", FP32_GATE), ("fp16", FP16_GATE)):
        try:
            det = Detector.open(ctx["artifact"], backend="onnxruntime:cuda", precision=precision)
        except Exception as exc:  # e.g. no fp16 graph in the artifact
            out[precision] = f"not run: {exc}"
            continue
        if det.provider != "CUDAExecutionProvider":
            raise AssertionError(f"asked for CUDA, onnxruntime runs {det.provider}")
        out[precision] = {
            "provider": det.provider,
            "agreement": agreement(ctx["reference"], det.predict(ctx["frames"]), gate),
        }
    ctx["backends"].append("onnxruntime:cuda")
    return out


def check_ort_tensorrt_ep(ctx) -> dict[str, Any]:
    import onnxruntime as ort

    _needs_artifact(ctx)
    if "TensorrtExecutionProvider" not in ort.get_available_providers():
        raise Skip(f"onnxruntime {ort.__version__} has no TensorRT provider here")
    det = Detector.open(ctx["artifact"], backend="onnxruntime:tensorrt", precision="fp32")
    if det.provider != "TensorrtExecutionProvider":
        raise AssertionError(f"asked for the TensorRT provider, onnxruntime runs {det.provider}")
    return {
        "provider": det.provider,
        "agreement": agreement(ctx["reference"], det.predict(ctx["frames"]), FP16_GATE),
    }


def check_tensorrt(ctx) -> dict[str, Any]:
    _needs_artifact(ctx)
    try:
        import tensorrt
    except Exception as exc:
        raise Skip(f"tensorrt does not import here ({exc})") from None
    from dfine_deploy.export.tensorrt import build_for_artifact

    started = time.perf_counter()
    engine = build_for_artifact(ctx["artifact"])
    out: dict[str, Any] = {
        "tensorrt": tensorrt.__version__,
        "build_s": round(time.perf_counter() - started, 1),
        "precision": engine.precision,
        "layer_precisions": engine.layer_precisions,
    }
    for memory in ("torch", "cuda-python"):
        det = Detector.open(ctx["artifact"], backend="tensorrt", memory=memory)
        out[memory] = {
            "provider": det.provider,
            "max_batch": det.max_batch,
            "agreement": agreement(ctx["reference"], det.predict(ctx["frames"]), FP16_GATE),
        }
    ctx["backends"].append("tensorrt")
    return out


def check_torch_detector(ctx) -> dict[str, Any]:
    _needs_artifact(ctx)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        det = Detector.open(ctx["checkpoint"], backend="torch", device="cuda", imgsz=(640, 640))
    if "fp16 autocast" not in det.provider:
        raise AssertionError(f"torch backend runs {det.provider}, expected CUDA FP16 autocast")
    ctx["backends"].append("torch")
    return {
        "provider": det.provider,
        "agreement": agreement(ctx["reference"], det.predict(ctx["frames"]), FP16_GATE),
    }


def check_bench(ctx) -> dict[str, Any]:
    _needs_artifact(ctx)
    report = ctx["work"] / "bench_t4.json"
    models = [str(ctx["artifact"])]
    results = {}
    for backend in dict.fromkeys(b for b in ctx["backends"] if b != "onnxruntime:cpu"):
        model = str(ctx["checkpoint"]) if backend == "torch" else models[0]
        cmd = [
            sys.executable,
            "-m",
            "dfine_deploy.bench.cli",
            "--model",
            model,
            "--backend",
            backend,
            "--device",
            "t4",
            "--batch",
            "1",
            "4",
            "--runs",
            "60",
            "--warmup",
            "10",
            "--json",
            str(report),
        ]
        if ctx.get("data") and backend != "torch":
            cmd += ["--data", str(ctx["data"])]
        run = run_command(cmd, timeout=max(30, ctx["left"]() - 10))
        results[backend] = {"printed": run["output_tail"], "json": json.loads(report.read_text())}
    if not results:
        raise Skip("no GPU backend loaded")
    return results


CHECKS: list[tuple[str, Callable[[dict], dict], float]] = [
    ("torch_cuda", check_torch_cuda, 30),
    ("export", check_export, 60),
    ("ort_cuda", check_ort_cuda, 20),
    ("ort_tensorrt_ep", check_ort_tensorrt_ep, 60),
    ("tensorrt", check_tensorrt, 90),
    ("torch_detector", check_torch_detector, 20),
    ("bench_t4", check_bench, 40),
    ("trainer", check_trainer, 90),
]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    parser.add_argument("--work", type=Path, default=Path("runs/gpu_check"))
    parser.add_argument("--budget", type=float, default=480, help="seconds for all checks together")
    parser.add_argument("--only", nargs="+", default=None, help="run only these checks")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    left = lambda: args.budget - (time.perf_counter() - started)  # noqa: E731
    ctx: dict[str, Any] = {"work": args.work.resolve(), "left": left}
    report: dict[str, Any] = {"hardware": detect().to_dict(), "python": sys.version.split()[0], "checks": {}}
    for name, check, needs in CHECKS:
        if args.only and name not in args.only:
            continue
        entry: dict[str, Any]
        if left() < needs:
            entry = {
                "status": "skipped",
                "why": f"time budget: {left():.0f} s left, needs about {needs:.0f} s",
            }
        else:
            t0 = time.perf_counter()
            try:
                entry = {"status": "ok", **check(ctx)}
            except Skip as exc:
                entry = {"status": "skipped", "why": str(exc)}
            except Exception as exc:  # every failure is recorded; the next check still runs
                entry = {
                    "status": "failed",
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()[-2000:],
                }
            entry["seconds"] = round(time.perf_counter() - t0, 1)
        report["checks"][name] = entry
        report["seconds"] = round(time.perf_counter() - started, 1)
        atomic_write_bytes(args.out, json.dumps(report, indent=2, default=str).encode())
        print(
            f"{name:<16} {entry['status']:<8} {entry.get('seconds', 0):>6} s  "
            f"{entry.get('why', entry.get('error', ''))[:150]}",
            flush=True,
        )
    failed = [n for n, e in report["checks"].items() if e["status"] == "failed"]
    print(f"report: {args.out} ({'failed: ' + ', '.join(failed) if failed else 'no failures'})")
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
