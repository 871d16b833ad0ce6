"""Every GPU-only check of dfine-deploy in one run, written to one JSON report.

Started by benchmarks/gpu_check.sh (which refuses a machine without an NVIDIA GPU). Each check
records status ok / failed / skipped (with why), its seconds and its figures; the report is
rewritten after every check, so a run cut short still leaves what it measured.

    torch_cuda       D-FINE-N training step on CUDA (forward + loss + backward, FP16 autocast)
    trainer          dfine-train for one short epoch on CUDA (synthetic data, AMP)
    export           dfine-export of a D-FINE-N checkpoint (the artifact the rest uses), with the
                     --target of the installed TensorRT when it imports
    ort_cuda         onnxruntime CUDA provider really active; detections vs the CPU provider
    ort_trt_ep_fp32  onnxruntime TensorRT provider on model.onnx (profiles for both inputs)
    ort_trt_ep_fp16  the same on the typed model.fp16.onnx (no trt_fp16_enable: its types decide)
    tensorrt_build   the Python build (export.tensorrt.build_for_artifact): plan, verification
                     record (verified / unverified and why), timing cache status, then a second
                     build that must reuse the keyed timing cache
    trtexec_build    export/jetson/build_engine.sh (trtexec) on a copy of the artifact, when trtexec
                     is on this machine (JetPack's /usr/src/tensorrt/bin/trtexec or PATH)
    trt_run_torch    the Python-built engine through the TensorRT backend with torch buffers
    trt_run_cudart   the same with cuda-python buffers (each buffer kind is its own check, so one
                     failure never hides the other)
    torch_detector   Detector on torch CUDA (FP16 autocast) vs onnxruntime CPU
    bench_t4         dfine-bench --device t4 over every backend that loaded, --json

The report starts with the versions that decide each cell of the README's support matrix:
TensorRT, onnxruntime, cuda-python, torch, the driver and the GPU.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
    for _ in range(count):
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
            *_target_args(),
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


def _target_args() -> list[str]:
    """`--target` for the installed TensorRT (8.x needs its own graph), none without TensorRT."""
    try:
        version = _tensorrt_version()
    except Skip:
        return []
    from dfine_deploy.export.targets import profile_for_tensorrt

    return ["--target", profile_for_tensorrt(version).name]


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


def _ort_tensorrt_ep(ctx, precision: str) -> dict[str, Any]:
    import onnxruntime as ort

    _needs_artifact(ctx)
    if "TensorrtExecutionProvider" not in ort.get_available_providers():
        raise Skip(f"onnxruntime {ort.__version__} has no TensorRT provider here")
    trt_version = next((v for k, v in versions().items() if k.startswith("tensorrt")), "")
    ort_version = tuple(int(p) for p in ort.__version__.split(".")[:2])
    if trt_version.split(".")[0].isdigit() and int(trt_version.split(".")[0]) >= 11 and ort_version < (1, 27):
        raise Skip(f"TensorRT {trt_version} has no weak typing: its provider needs onnxruntime >= 1.27, "
                   f"this is {ort.__version__}")
    det = Detector.open(ctx["artifact"], backend="onnxruntime:tensorrt", precision=precision)
    if det.provider != "TensorrtExecutionProvider":
        raise AssertionError(f"asked for the TensorRT provider, onnxruntime runs {det.provider}")
    gate = FP16_GATE if precision == "fp16" else FP32_GATE
    return {
        "onnxruntime": ort.__version__,
        "provider": det.provider,
        "agreement": agreement(ctx["reference"], det.predict(ctx["frames"]), gate),
    }


def check_ort_trt_ep_fp32(ctx) -> dict[str, Any]:
    return _ort_tensorrt_ep(ctx, "fp32")


def check_ort_trt_ep_fp16(ctx) -> dict[str, Any]:
    return _ort_tensorrt_ep(ctx, "fp16")


def _tensorrt_version() -> str:
    from dfine_deploy.runtime.tensorrt_backend import load_tensorrt

    try:
        return str(load_tensorrt("gpu_check").__version__)
    except Exception as exc:  # not installed, stubs only, or its libraries do not load
        raise Skip(f"tensorrt does not import here ({exc})") from None


def check_tensorrt_build(ctx) -> dict[str, Any]:
    _needs_artifact(ctx)
    version = _tensorrt_version()
    from dfine_deploy.export.tensorrt import build_for_artifact

    first = build_for_artifact(ctx["artifact"])
    second = build_for_artifact(ctx["artifact"])  # the keyed timing cache must be reused
    ctx["engine_built"] = True
    out = {
        "tensorrt": version,
        "source_graph": first.source_graph,
        "builder": first.builder,
        "io_dtypes": first.io_dtypes,
        "verification": first.verification,
        "build_s": first.build_seconds,
        "rebuild_s": second.build_seconds,
        "rebuild_timing_cache": second.builder.get("timing_cache_status"),
    }
    if second.builder.get("timing_cache_status") != "reused":
        raise AssertionError(f"the second build did not reuse the timing cache: {out}")
    return out


def check_trtexec_build(ctx) -> dict[str, Any]:
    import shutil

    _needs_artifact(ctx)
    candidates = ("/usr/src/tensorrt/bin/trtexec", shutil.which("trtexec"))
    trtexec = next((p for p in candidates if p and Path(p).is_file()), None)
    if trtexec is None:
        raise Skip("no trtexec on this machine (JetPack: /usr/src/tensorrt/bin/trtexec)")
    copy = ctx["work"] / "artifact_trtexec"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(ctx["artifact"], copy, ignore=shutil.ignore_patterns("*.engine", "*.cache"))
    script = ["bash", "export/jetson/build_engine.sh", str(copy)]
    result = run_command(script, timeout=max(60, ctx["left"]() - 30))
    if not (copy / "model.engine").is_file():
        raise AssertionError(f"build_engine.sh exited 0 but wrote no engine: {result['output_tail'][-800:]}")
    det = Detector.open(copy, backend="tensorrt")
    return {
        "trtexec": trtexec,
        "build": result,
        "agreement": agreement(ctx["reference"], det.predict(ctx["frames"]), FP16_GATE),
    }


def _tensorrt_run(ctx, memory: str) -> dict[str, Any]:
    _needs_artifact(ctx)
    if not ctx.get("engine_built"):
        raise Skip("the tensorrt_build check built no engine")
    det = Detector.open(ctx["artifact"], backend="tensorrt", memory=memory)
    if "tensorrt" not in ctx["backends"]:
        ctx["backends"].append("tensorrt")
    return {
        "provider": det.provider,
        "max_batch": det.max_batch,
        "agreement": agreement(ctx["reference"], det.predict(ctx["frames"]), FP16_GATE),
    }


def check_trt_run_torch(ctx) -> dict[str, Any]:
    return _tensorrt_run(ctx, "torch")


def check_trt_run_cudart(ctx) -> dict[str, Any]:
    return _tensorrt_run(ctx, "cuda-python")


def versions() -> dict[str, Any]:
    """Versions that decide the support-matrix cell this run speaks for."""
    from importlib import metadata

    found: dict[str, Any] = {}
    for name in ("tensorrt", "tensorrt-cu12", "tensorrt-cu13", "onnxruntime-gpu", "onnxruntime",
                 "cuda-python", "cuda-bindings", "torch"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,compute_cap",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        found["nvidia-smi"] = smi.stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired) as exc:
        found["nvidia-smi"] = f"not run: {exc}"
    return found


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
    ("ort_trt_ep_fp32", check_ort_trt_ep_fp32, 60),
    ("ort_trt_ep_fp16", check_ort_trt_ep_fp16, 60),
    ("tensorrt_build", check_tensorrt_build, 90),
    ("trt_run_torch", check_trt_run_torch, 15),
    ("trt_run_cudart", check_trt_run_cudart, 15),
    ("trtexec_build", check_trtexec_build, 90),
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
    parser.add_argument("--budget", type=float, default=900, help="seconds for all checks together")
    parser.add_argument("--only", nargs="+", default=None, help="run only these checks")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    left = lambda: args.budget - (time.perf_counter() - started)  # noqa: E731
    ctx: dict[str, Any] = {"work": args.work.resolve(), "left": left}
    report: dict[str, Any] = {
        "hardware": detect().to_dict(),
        "python": sys.version.split()[0],
        "versions": versions(),
        "checks": {},
    }
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
