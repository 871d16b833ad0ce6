"""The GPU checks on the torch side: a CUDA training step with AMP fp16 and bf16, eager FP16 latency
per size, dfine-train for one epoch (--use-amp --auto-batch, NVML sampled), dfine-export (the artifact
every later check uses), the torch CUDA Detector, and dfine-bench over every backend that loaded.

In `--dry` mode (ctx["dry"]) the same code runs on the CPU at a tiny size and budget: it proves the
set-up and control flow here, not the GPU figures."""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

import numpy as np

from benchmarks.gpu_checks.common import (
    FP16_GATE,
    Skip,
    agreement,
    frames,
    needs_artifact,
    run_command,
    tensorrt_version,
)
from dfine_deploy.backend_names import BackendName, Precision
from dfine_deploy.runtime import Detector

# --dry: the plumbing, at a CPU's pace. The training steps take the quickstart's D-FINE-N (100 queries)
# at 160 px (125 feature tokens), every other check runs at 256 px (320 tokens for D-FINE-N's 300 queries)
DRY_CONFIG = "configs/quickstart/dfine_n_synthetic.yml"
DRY_TRAIN_IMGSZ = 160
DRY_IMGSZ = 256


def device(ctx) -> str:
    """ "cuda", after checking torch sees it; "cpu" in --dry mode."""
    import torch

    if ctx["dry"]:
        return "cpu"
    if not torch.cuda.is_available():
        raise AssertionError(
            f"torch {torch.__version__} sees no CUDA device (CUDA build: {torch.version.cuda})"
        )
    return "cuda"


def _train_step(ctx, amp: str) -> dict[str, Any]:
    import torch

    from dfine_deploy.bench.training import measure_training

    dev = device(ctx)
    size, batch, runs = ((DRY_TRAIN_IMGSZ, DRY_TRAIN_IMGSZ), 1, 1) if ctx["dry"] else ((640, 640), 4, 6)
    model = DRY_CONFIG if ctx["dry"] else "dfine-n"
    result = measure_training(
        model, size, batch=batch, runs=runs, warmup=0 if ctx["dry"] else 2, device=dev, amp=amp
    )
    timing = result.pop("timing")
    if not np.isfinite(result["loss"]):
        raise AssertionError(f"non-finite loss {result['loss']}")
    return {
        **result,
        "images_per_s": round(timing.fps, 1),
        "step_ms": timing.to_dict(),
        "gpu": torch.cuda.get_device_name(0) if dev == "cuda" else "none (dry run)",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def check_train_step_fp16(ctx) -> dict[str, Any]:
    return _train_step(ctx, Precision.FP16)


def check_train_step_bf16(ctx) -> dict[str, Any]:
    return _train_step(ctx, Precision.BF16)


def check_eager_fp16(ctx) -> dict[str, Any]:
    """Eager D-FINE latency per size, batch 1 at 640, FP16 autocast (random weights)."""
    import time

    import torch

    from dfine_deploy.hub.loader import load_model
    from dfine_deploy.model.dfine import DeployModel

    dev = torch.device(device(ctx))
    sizes, imgsz, runs = (("n",), DRY_IMGSZ, 2) if ctx["dry"] else (("n", "s", "m", "l", "x"), 640, 30)
    out: dict[str, Any] = {"imgsz": imgsz, "batch": 1, "runs": runs, "autocast": dev.type == "cuda"}
    for size in sizes:
        if ctx["left"]() < 20:
            out[size] = "not run: time budget"
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # random weights: latency does not depend on them
            loaded = load_model(f"dfine-{size}", imgsz=(imgsz, imgsz))
        module = DeployModel(loaded.model, loaded.postprocessor).eval().for_eager(dev)
        images = torch.rand(1, 3, imgsz, imgsz, device=dev)
        sizes_t = torch.tensor([[imgsz, imgsz]], device=dev)
        times = []
        with (
            torch.inference_mode(),
            torch.autocast(dev.type, dtype=torch.float16, enabled=dev.type == "cuda"),
        ):
            warm = 1 if ctx["dry"] else 5
            for i in range(runs + warm):
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                start = time.perf_counter()
                module(images, sizes_t)
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                if i >= warm:  # the first ones warm up
                    times.append((time.perf_counter() - start) * 1000)
        times.sort()
        out[size] = {"median_ms": round(times[len(times) // 2], 2), "min_ms": round(times[0], 2)}
    return out


def check_trainer(ctx) -> dict[str, Any]:
    work = ctx["work"]
    data = work / "synthetic"
    py = sys.executable
    images, val = ("2", "2") if ctx["dry"] else ("64", "16")
    made = run_command(
        [
            py,
            "-m",
            "dfine_deploy.data.cli",
            "synth",
            "--out",
            str(data),
            "--images",
            images,
            "--val-images",
            val,
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
    if ctx["dry"]:  # one step of 2 images, 2 validated: the plumbing, not a CPU's training speed
        updates += ["train_dataloader.total_batch_size=2", "val_dataloader.total_batch_size=2"]
    trained = run_command(
        [
            py,
            "train/main.py",
            "-c",
            "configs/quickstart/dfine_n_synthetic.yml",
            "-d",
            device(ctx),
            "--use-amp",
            "--auto-batch",
            "--no-progress",
            "-u",
            *updates,
        ],
        timeout=max(30, ctx["left"]() - 10),
    )
    log = trained["output_tail"]
    nvml = "not measured" if "GPU utilisation not measured" in log else "sampled"
    if not ctx["dry"] and nvml != "sampled":
        raise AssertionError(f"NVML did not sample GPU utilisation: {log[-600:]}")
    return {"data": made["seconds"], "train": trained, "nvml": nvml}


def check_export(ctx) -> dict[str, Any]:
    import torch

    from dfine_deploy.hub.loader import load_model

    work = ctx["work"]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        loaded = load_model("dfine-n")
    checkpoint = work / "dfine_n_random.pth"
    torch.save({"model": loaded.model.state_dict(), "meta": {"class_names": loaded.class_names}}, checkpoint)
    folder = work / "artifact"
    imgsz = str(DRY_IMGSZ) if ctx["dry"] else "640"
    target = target_args()
    result = run_command(
        [
            sys.executable,
            "-m",
            "dfine_deploy.export.cli",
            str(checkpoint),
            "-o",
            str(folder),
            "--imgsz",
            imgsz,
            imgsz,
            "--force",
            *(target or (["--no-cpu-graph"] if ctx["dry"] else [])),  # a --target writes no CPU graph
        ],
        timeout=min(300, max(30, ctx["left"]() - 10)),
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


def target_args() -> list[str]:
    """`--target` for the installed TensorRT (8.x needs its own graph), none without TensorRT."""
    try:
        version = tensorrt_version()
    except Skip:
        return []
    from dfine_deploy.export.targets import profile_for_tensorrt

    return ["--target", profile_for_tensorrt(version).name]


def check_torch_detector(ctx) -> dict[str, Any]:
    needs_artifact(ctx)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dev, imgsz = device(ctx), DRY_IMGSZ if ctx["dry"] else 640
        det = Detector.open(ctx["checkpoint"], backend="torch", device=dev, imgsz=(imgsz, imgsz))
    if dev == "cuda" and "fp16 autocast" not in det.provider:
        raise AssertionError(f"torch backend runs {det.provider}, expected CUDA FP16 autocast")
    ctx["backends"].append("torch")
    return {
        "provider": det.provider,
        "agreement": agreement(ctx["reference"], det.predict(ctx["frames"]), FP16_GATE),
    }


def check_bench(ctx) -> dict[str, Any]:
    needs_artifact(ctx)
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
            "--device",  # a dry run's engine runs on the fake GPU (tests/fakes), the rest on the CPU
            "t4" if backend == BackendName.TENSORRT or not ctx["dry"] else "cpu",
            "--batch",
            *(["1", "2", "--imgsz", str(DRY_IMGSZ)] if ctx["dry"] else ["1", "4"]),  # else the .pth's 640
            "--runs",
            "3" if ctx["dry"] else "60",
            "--warmup",
            "1" if ctx["dry"] else "10",
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
