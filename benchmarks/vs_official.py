"""Ours against the official D-FINE, side by side on this machine: ratios per round, interleaved.

    python benchmarks/vs_official.py --official ../D-FINE                  # every job, 8 rounds
    python benchmarks/vs_official.py --official ../D-FINE --jobs eager-n int8-n --rounds 4 --json r.json
    python benchmarks/vs_official.py --jobs train-n-640            # no checkout: the recorded official side
    python benchmarks/vs_official.py --tiny --jobs eager-n train-n-320   # the suite's form: seconds

DIR is a checkout of https://github.com/Peterande/D-FINE; nothing of it is copied here: it is
imported from DIR in child processes, with our training extra's packages (its `src/` also imports
calflops and loguru, which no job here uses: where they are not installed they get the stand-ins of
benchmarks/official_parity, as the parity scripts do). Every measurement runs in a fresh process, ours and the
official alternate within each round (the order flips every round), and each round's ratio is
ours / official of the same round, so slow phases of the machine hit both. Reported: the median
ratio [min-max] over rounds, each side's median figure and its peak RSS.

Jobs (D-FINE-N unless the name says S; 640x640, batch 1, --threads threads on both sides):
  eager-n, eager-s     PyTorch deploy() forward with postprocessor, random weights (ms)
  onnxruntime-n        image -> detections: our onnxruntime CPU graph vs the official ONNX in onnxruntime
  openvino-n           the same with our OpenVINO backend (our best CPU backend)
  openvino-bf16-n      the same with OpenVINO running our GridSample graph in BF16 (CPUs with BF16/AMX
                       units; refused where the export's bf16 gate did not pass or was not run)
  int8-n               the same with our INT8 graph on OpenVINO
  train-n-640/-320     one training step at batch 4: forward, loss, backward, AdamW (images/s)

image->detections is timed as docs/performance.md defines it (the one definition, shared with
dfine-bench's image->det rows), here on one 1280x720 frame at batch 1: the median of --iters calls
after --warmup.

For the image->detections jobs the official graph is made by the logic of the official
tools/deployment/export_onnx.py (deploy(), opset 16, dynamic batch), run in a subprocess from DIR
from a random init of the official model saved as a .pth, or from --checkpoint. Ours is exported from
the same --checkpoint, or without one from the size name `dfine-n`: random weights that our export
knows are random, so its gates run rank-free (random weights rank detections by rounding noise, and
a gate that demands the same top-k then refuses BF16). The arithmetic of D-FINE does not depend on
the weights' values, so the timings compare like with like. onnxsim is not applied to the official
graph (onnxruntime's own optimizer runs on both). Box agreement of our graphs with PyTorch is read
from the export's parity gate (model.json); on trained weights see docs/performance.md.

Without --official the official side of every round is its recorded figure (RECORDED: the official
medians of an earlier run of this script, with that run's date, CPU and threads; `--record` rewrites a
job's entry from a run with --official). The ratios then compare this machine with that one, so the
table says so, and says when the CPU class differs. `--tiny` is the form the test suite runs: one
round, one warm-up call and one timed call per process, and only the jobs that need no export.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.train_step import our_parts, random_batch, step_once  # noqa: E402
from dfine_deploy import cpu  # noqa: E402
from dfine_deploy.backend_names import BackendName, Precision  # noqa: E402

JOBS = (
    "eager-n",
    "eager-s",
    "onnxruntime-n",
    "openvino-n",
    "openvino-bf16-n",
    "int8-n",
    "train-n-640",
    "train-n-320",
)
RECORDED = REPO / "benchmarks" / "official_recorded.json"
CPU_JOBS = {
    "onnxruntime-n": (BackendName.ONNXRUNTIME, Precision.FP32),
    "openvino-n": (BackendName.OPENVINO, Precision.FP32),
    "openvino-bf16-n": (BackendName.OPENVINO, Precision.BF16),
    "int8-n": (BackendName.OPENVINO, Precision.INT8),
}


# ---------------------------------------------------------------------------------------------
# Child side: one measurement in this process, printed as one JSON line


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _official_import(official: Path):
    from benchmarks.official_parity import stand_in_unused_imports

    stand_in_unused_imports()  # calflops, loguru: imported by the official src/, unused by these jobs
    sys.path.insert(0, str(official))
    os.chdir(official)
    from src.core import YAMLConfig  # the official package, from DIR

    return YAMLConfig


def _official_cfg(official: Path, size: str, num_classes: int | None = None, imgsz: int = 640):
    yaml_config = _official_import(official)
    overrides = {"HGNetv2": {"pretrained": False}}
    if num_classes:
        overrides["num_classes"] = num_classes
    cfg = yaml_config(f"configs/dfine/dfine_hgnetv2_{size}_coco.yml", **overrides)
    cfg.yaml_cfg["eval_spatial_size"] = [imgsz, imgsz]
    return cfg


def _time(call, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def child_eager(impl: str, size: str, args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    images = torch.rand(1, 3, 640, 640)
    sizes = torch.tensor([[640, 640]])
    if impl == "official":
        cfg = _official_cfg(Path(args.official), size)
        model, post = cfg.model.deploy(), cfg.postprocessor.deploy()
        context = torch.no_grad  # as the official tools run it

        def call():
            with context():
                return post(model(images), sizes)
    else:
        from dfine_deploy.model import DeployModel, PostProcessor, build_model
        from dfine_deploy.model.spec import size_spec

        module = DeployModel(build_model(size_spec(size)), PostProcessor(80)).eval()
        module.for_eager(torch.device("cpu"))  # what our torch backend runs

        def call():
            with torch.inference_mode():
                return module(images, sizes)

    return {"value": _time(call, args.warmup, args.iters), "unit": "ms", "peak_rss_mb": _peak_rss_mb()}


def child_cpu(impl: str, job: str, args) -> dict:
    import numpy as np

    from dfine_deploy.bench.runner import FRAME_SIZE, synthetic_frames

    frame = synthetic_frames(1, FRAME_SIZE)[0]  # the frames dfine-bench times
    if impl == "official":
        import cv2
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        options.log_severity_level = 3
        session = ort.InferenceSession(
            str(Path(args.work) / "official_n.onnx"), options, providers=["CPUExecutionProvider"]
        )
        sizes = np.array([[frame.shape[1], frame.shape[0]]], dtype=np.int64)

        def call():  # the same image -> tensor steps our Detector does: resize, BGR->RGB, scale
            rgb = cv2.cvtColor(cv2.resize(frame, (640, 640)), cv2.COLOR_BGR2RGB)
            images = (rgb.transpose(2, 0, 1)[None] / np.float32(255)).astype(np.float32)
            return session.run(None, {"images": images, "orig_target_sizes": sizes})
    else:
        from dfine_deploy.runtime import Detector

        backend, precision = CPU_JOBS[job]
        detector = Detector.open(
            Path(args.work) / "ours_n",
            backend=backend,
            device="cpu",
            precision=precision,
            threads=args.threads,
        )

        def call():
            return detector.predict([frame])

    return {"value": _time(call, args.warmup, args.iters), "unit": "ms", "peak_rss_mb": _peak_rss_mb()}


def child_train(impl: str, imgsz: int, args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    batch = 4
    images, targets = random_batch(batch, imgsz, 80)
    if impl == "official":
        cfg = _official_cfg(Path(args.official), "n", imgsz=imgsz)
        model, criterion = cfg.model.train(), cfg.criterion.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=1e-4)
    else:
        _, model, criterion, optimizer = our_parts(imgsz)
    step = [0]

    def call():  # the official det_engine.train_one_epoch step, float32
        step_once(model, criterion, optimizer, images, targets, step[0])
        step[0] += 1

    ms = _time(call, max(1, args.warmup // 2), max(2, args.iters // 4))
    return {"value": batch * 1000 / ms, "unit": "img/s", "peak_rss_mb": _peak_rss_mb()}


def child(args) -> dict:
    job, impl = args.child, args.impl
    if job.startswith("eager-"):
        return child_eager(impl, job[-1], args)
    if job in CPU_JOBS:
        return child_cpu(impl, job, args)
    return child_train(impl, int(job.rsplit("-", 1)[1]), args)


# ---------------------------------------------------------------------------------------------
# Preparation (once): the official ONNX and our artifact from the same weights


def official_export(args) -> None:
    """Child: the official export_onnx.py logic (deploy(), opset 16, dynamic N), run from DIR."""
    import torch
    import torch.nn as nn

    work = Path(args.work).resolve()
    checkpoint = Path(args.checkpoint).resolve() if args.checkpoint else None
    num_classes = None
    state = None
    if checkpoint is not None:
        raw = torch.load(checkpoint, map_location="cpu", weights_only=True)
        state = raw["ema"]["module"] if "ema" in raw else raw["model"]
        num_classes = int(state["decoder.enc_score_head.weight"].shape[0])
    torch.manual_seed(0)
    cfg = _official_cfg(Path(args.official), "n", num_classes)
    if state is not None:
        cfg.model.load_state_dict(state)
    else:
        torch.save({"model": cfg.model.state_dict()}, work / "official_n.pth")

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = cfg.model.deploy()
            self.postprocessor = cfg.postprocessor.deploy()

        def forward(self, images, orig_target_sizes):
            return self.postprocessor(self.model(images), orig_target_sizes)

    model = Model()
    data, size = torch.rand(1, 3, 640, 640), torch.tensor([[640, 640]])
    dynamic_axes = {"images": {0: "N"}, "orig_target_sizes": {0: "N"}}
    torch.onnx.export(
        model,
        (data, size),
        str(work / "official_n.onnx"),
        input_names=["images", "orig_target_sizes"],
        output_names=["labels", "boxes", "scores"],
        dynamic_axes=dynamic_axes,
        opset_version=16,
        do_constant_folding=True,
        dynamo=False,
    )  # the legacy exporter the script was written for


def prepare(args, jobs: list[str]) -> dict:
    """Official ONNX + our artifact (CPU graphs, INT8 calibrated on synthetic images); gate results."""
    work = Path(args.work)
    if not any(job in CPU_JOBS for job in jobs):
        return {}
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    tools = Path(sys.executable).parent
    if args.official is not None and not (work / "official_n.onnx").is_file():
        print("exporting the official ONNX (tools/deployment/export_onnx.py logic) ...", flush=True)
        subprocess.run(
            [sys.executable, __file__, "--official-export", "--official", args.official, "--work", str(work)]
            + (["--checkpoint", args.checkpoint] if args.checkpoint else []),
            check=True,
            env=env,
            cwd=args.official,
        )
    if not (work / "ours_n" / "model.json").is_file():
        synth = work / "synth"
        if not synth.is_dir():
            subprocess.run(
                [
                    str(tools / "dfine-data"),
                    "synth",
                    "--out",
                    str(synth),
                    "--images",
                    "8",
                    "--val-images",
                    "32",
                    "--size",
                    "640",
                ],
                check=True,
                env=env,
            )
        weights = args.checkpoint or "dfine-n"
        print(f"exporting ours from {weights} (dfine-export --int8) ...", flush=True)
        # --force: a failed gate is reported with the results rather than stopping the run.
        subprocess.run(
            [
                str(tools / "dfine-export"),
                weights,
                "-o",
                str(work / "ours_n"),
                "--no-fp16",
                "--int8",
                "--data",
                str(synth / "val"),
                "--batch",
                "1",
                "1",
                "4",
                "--force",
            ],
            check=True,
            env=env,
        )
    sidecar = json.loads((work / "ours_n" / "model.json").read_text())
    return {
        key: {"passed": False, "not_run": r["reason"]}
        if r.get("run") is False
        else {
            "passed": r["passed"],
            "box_agreement": r["box_agreement"],
            "box_precision": r["box_precision"],
            "reference": r["reference"],
            "dataset_ap": r.get("dataset_ap"),
        }
        for key, r in sidecar["parity"].items()
    }


# ---------------------------------------------------------------------------------------------
# Parent: interleaved rounds


def recorded_official(jobs: list[str]) -> dict[str, dict]:
    """The recorded official figure of each job (see RECORDED); exits naming a job without one."""
    recorded = json.loads(RECORDED.read_text())
    missing = [job for job in jobs if job not in recorded]
    if missing:
        raise SystemExit(
            f"vs_official: no recorded official figure for {', '.join(missing)} in "
            f"{RECORDED.relative_to(REPO)}; give --official DIR "
            "(a clone of https://github.com/Peterande/D-FINE) to measure it"
        )
    return {job: recorded[job] for job in jobs}


def record_official(results: list[dict], args) -> None:
    """Write each job's official median of this run into RECORDED (other jobs' entries kept)."""
    recorded = json.loads(RECORDED.read_text()) if RECORDED.is_file() else {}
    for r in results:
        recorded[r["job"]] = {
            "value": round(r["official_median"], 2),
            "unit": r["unit"],
            "peak_rss_mb": round(r["official_peak_rss_mb"]),
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "machine": machine(),
            "isa_class": cpu.isa_class(),
            "threads": args.threads,
            "rounds": args.rounds,
            "source": "benchmarks/vs_official.py --record",
        }
    RECORDED.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")


def run_child(job: str, impl: str, args) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        job,
        "--impl",
        impl,
        "--work",
        str(Path(args.work).resolve()),
        "--threads",
        str(args.threads),
        "--warmup",
        str(args.warmup),
        "--iters",
        str(args.iters),
    ] + (["--official", args.official] if args.official else [])
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS=str(args.threads))
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if result.returncode:
        raise SystemExit(f"{job} ({impl}) failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def summarise(job: str, rounds: list[dict]) -> dict:
    unit = rounds[0]["ours"]["unit"]
    # ms: ours / official (lower is better); img/s: ours / official (higher is better)
    ratios = [r["ours"]["value"] / r["official"]["value"] for r in rounds]
    return {
        "job": job,
        "unit": unit,
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ours_median": statistics.median(r["ours"]["value"] for r in rounds),
        "official_median": statistics.median(r["official"]["value"] for r in rounds),
        "ours_peak_rss_mb": max(r["ours"]["peak_rss_mb"] for r in rounds),
        "official_peak_rss_mb": max(r["official"]["peak_rss_mb"] for r in rounds),
        "rounds": rounds,
    }


def machine() -> str:
    """'2-core x86_64, ISA class avx2 (AMD EPYC; no VNNI, ...)': the ratios depend on the class."""
    return f"{os.cpu_count()}-core {platform.machine()}, ISA class {cpu.describe()}"


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    p.add_argument(
        "--official", help="checkout of the official D-FINE repository (default: its recorded figures)"
    )
    p.add_argument("--jobs", nargs="+", default=list(JOBS), choices=JOBS)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--iters", type=int, default=10, help="timed calls per process (training: a quarter)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--work", default="runs/vs_official", help="folder for the two graphs and the data")
    p.add_argument(
        "--checkpoint", help="official-layout D-FINE-N .pth for the ONNX jobs (default: random init)"
    )
    p.add_argument("--json", type=Path, help="write every figure here")
    p.add_argument("--record", action="store_true", help=f"with --official: rewrite {RECORDED.name}")
    p.add_argument("--tiny", action="store_true", help="1 round, 1 warm-up, 1 call; no exporting jobs")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--impl", choices=("ours", "official"), help=argparse.SUPPRESS)
    p.add_argument("--official-export", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.official_export:
        official_export(args)
        return
    if args.child:
        print(json.dumps(child(args)))
        return
    if args.tiny:
        exporting = [job for job in args.jobs if job in CPU_JOBS]
        if exporting:
            p.error(f"--tiny: {', '.join(exporting)} export graphs first (minutes); leave them out")
        args.rounds, args.warmup, args.iters = 1, 1, 1
    if args.official is not None and not (Path(args.official) / "src" / "core").is_dir():
        raise SystemExit(
            f"--official {args.official}: not a D-FINE checkout (no src/core); clone "
            "https://github.com/Peterande/D-FINE and install its requirements.txt"
        )
    if args.record and args.official is None:
        p.error("--record needs --official: only a measured official side is recorded")
    recorded = recorded_official(args.jobs) if args.official is None else {}
    args.work = str(Path(args.work).resolve())
    if args.official is not None:
        args.official = str(Path(args.official).resolve())
    gates = prepare(args, args.jobs)
    results = []
    for job in args.jobs:
        rounds = []
        for i in range(args.rounds):
            order = ("ours", "official") if i % 2 == 0 else ("official", "ours")
            measured = {
                impl: recorded[job] if impl == "official" and recorded else run_child(job, impl, args)
                for impl in order
            }
            rounds.append(measured)
            print(
                f"  {job} round {i + 1}: ours {measured['ours']['value']:.1f} / official "
                f"{measured['official']['value']:.1f} {measured['ours']['unit']}",
                flush=True,
            )
        results.append(summarise(job, rounds))
    header = (
        f"vs_official: {time.strftime('%Y-%m-%d', time.gmtime())}, {machine()}, {args.threads} threads, "
        f"{args.rounds} rounds, fresh process per measurement"
    )
    print(header)
    for job, figure in recorded.items():
        here = cpu.isa_class()
        differs = "" if figure["isa_class"] == here else f", another CPU class than this {here}"
        print(
            f"{job}: official side RECORDED on {figure['date']}, {figure['machine']}, {figure['threads']} "
            f"threads{differs} (no --official checkout): the ratio compares this machine with that one"
        )
    print(
        "| job | unit | ours (median) | official (median) | ratio ours/official median [min-max] "
        "| peak RSS MB ours / official |"
    )
    print("|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['job']} | {r['unit']} | {r['ours_median']:.1f} | {r['official_median']:.1f} | "
            f"{r['ratio_median']:.2f} [{r['ratio_min']:.2f}-{r['ratio_max']:.2f}] | "
            f"{r['ours_peak_rss_mb']:.0f} / {r['official_peak_rss_mb']:.0f} |"
        )
    for key, gate in gates.items():
        if "not_run" in gate:
            print(f"gate {key}: not run ({gate['not_run']})")
            continue
        print(
            f"gate {key}: {'PASS' if gate['passed'] else 'FAIL'} against {gate['reference']}, box agreement "
            f"{gate['box_agreement']:.3f}, box precision {gate['box_precision']:.3f}"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "header": header,
                    "command": " ".join(sys.argv),
                    "official_recorded": recorded,
                    "jobs": results,
                    "gates": gates,
                },
                indent=2,
            )
        )
    if args.record:
        record_official(results, args)


if __name__ == "__main__":
    main()
