"""The GPU checks on the torch side: a CUDA training step, dfine-train, dfine-export (the artifact
every later check uses), the torch CUDA Detector, and dfine-bench over every backend that loaded."""

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
from dfine_deploy.runtime import Detector


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
            *target_args(),
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
        det = Detector.open(ctx["checkpoint"], backend="torch", device="cuda", imgsz=(640, 640))
    if "fp16 autocast" not in det.provider:
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
