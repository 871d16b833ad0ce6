"""An engine or graph proves itself on the device that will serve it.

It runs the artifact's reference pack (`runtime/reference_pack.py`) through the backend that serves
it, at batch 1 and at the artifact's largest batch, and is held to the export gate itself
(`export/parity.py`: IoU-matched boxes and labels, score differences, pseudo-mAP against PyTorch's
detections, the thresholds of its precision). Where the backend can say what precision each layer
ran in (TensorRT's engine inspector), that must be the precision the engine was built as
(`export/tensorrt_verify.py`'s verdict, read by the typing the engine's record gives: only a weakly
typed engine is refused for an inspector without FP16 tensors), and an INT8 engine must also beat
its FP16 (GPU) or FP32 (CPU) counterpart by `INT8_MIN_SPEEDUP`, timed in the same run on the
engines' own time where the backend can run its engine alone (TensorRT), else end to end. The result
is written to verify.json (`runtime/verify_record.py`), keyed by the file's sha256 and this device.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from dfine_deploy.artifact import ENGINE_FILES, OUTPUT_NAMES, SIDECAR_NAME, read_artifact
from dfine_deploy.backend_names import BackendName, Precision
from dfine_deploy.errors import BackendError
from dfine_deploy.export import parity
from dfine_deploy.export.deepstream import nvinfer_engine_precision
from dfine_deploy.export.tensorrt_verify import inspector_precisions, judge_precision
from dfine_deploy.files import cached_sha256
from dfine_deploy.model.reference import classify_model_ref, model_ref_forms
from dfine_deploy.runtime.detector import Detector
from dfine_deploy.runtime.reference_pack import ReferencePack, read_pack
from dfine_deploy.runtime.verify_record import device_facts, write_result

log = logging.getLogger(__name__)

# an INT8 engine must take at most this share of its FP16 (GPU) / FP32 (CPU) counterpart's p50 time:
# INT8 that is not at least 10 % faster buys nothing for the accuracy it gives up
INT8_MIN_SPEEDUP = 0.10
ENGINE_TIME = "engine alone (inputs on the device, no host copies)"
_WARMUP = 2
_PRECISION_WORD = re.compile(r"(?<![a-z0-9])(fp32|fp16|int8)(?![a-z0-9])")


@dataclass
class VerifyResult:
    """What one run measured and decided; `to_dict` is its verify.json entry."""

    file: str
    sha256: str
    precision: str
    device: dict[str, str]
    failures: list[str] = field(default_factory=list)
    gates: dict[str, Any] = field(default_factory=dict)  # by batch size: the gate's report
    layer_precision: dict[str, Any] = field(default_factory=dict)  # the inspector's verdict, if any
    latency_ms: dict[str, float] = field(default_factory=dict)  # p50, p99 at batch 1
    int8_speed: dict[str, Any] = field(default_factory=dict)
    checked_at: str = ""

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "sha256": self.sha256,
            "precision": self.precision,
            "device": self.device,
            "passed": self.passed,
            "failure": "; ".join(self.failures),
            "failures": self.failures,
            "gates": self.gates,
            "layer_precision": self.layer_precision,
            "latency_ms": self.latency_ms,
            "int8_speed": self.int8_speed,
            "checked_at": self.checked_at,
        }


def _runner(detector: Detector) -> Callable[[np.ndarray], list[np.ndarray]]:
    """Pack images [B,H,W,3] uint8 RGB -> the graph's (labels, boxes, scores), fed the way a
    server feeds it (the adapter's own preparation; the pack is already at the input size)."""

    def run(pixels: np.ndarray) -> list[np.ndarray]:
        feeds, _ = detector.prepare(list(pixels), color="RGB")
        outputs = detector.backend.run(feeds)
        return [np.asarray(outputs[name]) for name in OUTPUT_NAMES]

    return run


def _declared_precision(detector: Detector, chosen: str) -> str:
    """What the file says it is: the precision asked for, the engine's record, the artifact's
    graph entry, nvinfer's name for its own build of one of the artifact's graphs (DeepStream's
    model.fp16.onnx_b1_gpu0_fp32.engine: the typed graph's FP16), a precision word in its file name, fp32."""
    if chosen != Precision.AUTO:
        return chosen
    if detector.backend.declared_precision:
        return detector.backend.declared_precision
    name = Path(detector.source).name
    graphs = detector.artifact.graphs.values() if detector.artifact else ()
    recorded = next((g.precision for g in graphs if g.file == name), None)
    if recorded:
        return recorded
    built_by_nvinfer = nvinfer_engine_precision(name, detector.artifact)
    if built_by_nvinfer:
        return built_by_nvinfer
    word = _PRECISION_WORD.search(name.lower())
    return word.group(1) if word else Precision.FP32


def _gate(pack: ReferencePack, run: Callable, batch: int, thresholds: parity.GateThresholds, name: str):
    """The export gate on the pack at one batch size (the last batch filled by cycling the pack)."""
    count = len(pack.images)
    order = [i % count for i in range(-(-count // batch) * batch)]
    chunks = [order[s : s + batch] for s in range(0, len(order), batch)]
    candidate = [tuple(run(pack.images[c])) for c in chunks]
    reference = [pack.reference(c) for c in chunks]
    return parity.compare_outputs(
        reference,
        candidate,
        thresholds,
        reference_name="pytorch (reference pack)",
        candidate_name=name,
        batch_sizes=[batch] * len(chunks),
        rank_free=pack.rank_free,
    )


def _times(runs: list[Callable[[], Any]], count: int) -> list[list[float]]:
    """Milliseconds of each callable, interleaved run by run, so that load drifts hit both alike."""
    for run in runs:
        for _ in range(_WARMUP):
            run()
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(count):
        for slot, run in zip(times, runs):
            start = time.perf_counter()
            run()
            slot.append((time.perf_counter() - start) * 1000.0)
    return times


def _percentiles(times: list[float]) -> dict[str, float]:
    return {
        "p50": round(float(np.percentile(times, 50)), 3),
        "p99": round(float(np.percentile(times, 99)), 3),
    }


def _baseline(target: str, detector: Detector, baseline: str | None, open_args: dict[str, Any]) -> Detector:
    """INT8's counterpart on the same device: --baseline; for an engine of an artifact folder, the
    FP16 engine it records (its own file, model.engine, beside model.int8.engine) on the same backend;
    for a folder's INT8 graph (the folder given, or a graph file of it), its FP16 (GPU) / FP32 (CPU)
    graph on the same backend."""
    if baseline is not None:
        return Detector.open(baseline, **{**open_args, "precision": Precision.AUTO})
    source = Path(detector.source)
    engine = detector.artifact.engine_named(source.name) if detector.artifact else None
    if engine is not None:
        fp16 = detector.artifact.engine_for(Precision.FP16)
        if fp16 is None:
            raise BackendError(
                f"{source}: an INT8 engine is timed against the FP16 engine {ENGINE_FILES[Precision.FP16]} "
                "of its folder, and model.json records none: build it (bash export/jetson/build_engine.sh "
                "DIR) or give one with --baseline FILE"
            )
        counterpart = {**open_args, "backend": str(detector.backend.name), "precision": Precision.AUTO}
        return Detector.open(source.parent / fp16.file, **counterpart)
    if not Path(target).is_dir() and detector.artifact is None:
        raise BackendError(
            f"{target}: an INT8 engine must be timed against its FP16 (GPU) or FP32 (CPU) engine on this "
            "device: give it with --baseline FILE"
        )
    folder = target if Path(target).is_dir() else str(source.parent)
    on_gpu = detector.backend.device.startswith("cuda")
    return Detector.open(folder, **{**open_args, "precision": Precision.FP16 if on_gpu else Precision.FP32})


def verify(
    target: str,
    *,
    backend: str = BackendName.AUTO,
    device: str = "auto",
    precision: str = Precision.AUTO,
    artifact: str | None = None,
    baseline: str | None = None,
    runs: int = 20,
    threads: int | None = None,
) -> VerifyResult:
    """Verify `target` (an artifact folder, a graph or an engine) here; `artifact` names the folder
    whose reference pack it is checked against when the file lives elsewhere (DeepStream's cache)."""
    open_args = {"backend": backend, "device": device, "threads": threads, "unverified": True}
    kind = classify_model_ref(target)
    if kind.runs_on_torch and (kind.is_name or kind.exists) and not artifact:  # before a model is built
        raise BackendError(
            f"{target}: {model_ref_forms((kind.kind,))} builds a PyTorch model; dfine-verify checks what "
            f"dfine-export wrote (an artifact folder, a graph or an engine) against its reference pack: "
            f"export it first (dfine-export {target}) and verify the folder"
        )
    detector = Detector.open(target, precision=precision, **open_args)
    try:
        # the pack's folder: --artifact, the folder given, or the file's own
        folder = Path(artifact or (target if Path(target).is_dir() else Path(detector.source).parent))
        if not artifact and detector.artifact is None and not (folder / SIDECAR_NAME).is_file():
            raise BackendError(
                f"{target}: no {SIDECAR_NAME} beside it, so no reference pack to check it against; give "
                "the artifact folder it was exported to with --artifact DIR"
            )
        info = read_artifact(folder) if artifact or detector.artifact is None else detector.artifact
        pack = read_pack(folder, info.reference_pack, str(folder))
        declared = _declared_precision(detector, precision)
        if baseline is not None and declared != Precision.INT8:
            raise BackendError(
                f"--baseline {baseline}: the engine an INT8 one must beat, and {detector.source} is "
                f"{declared}; leave --baseline out (it would be ignored)"
            )
        path = Path(detector.source)
        result = VerifyResult(
            file=str(path),
            sha256=cached_sha256(path),
            precision=declared,
            device=device_facts(detector.backend),
            checked_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        )
        _check(detector, pack, declared, result)
        if declared == Precision.INT8:
            other = _baseline(target, detector, baseline, open_args)
            try:
                _check_int8_speed(detector, other, pack, runs, result)
            finally:
                other.close()
        else:
            run = _runner(detector)
            (times,) = _times([lambda: run(pack.images[:1])], runs)
            result.latency_ms = _percentiles(times)
    finally:
        detector.close()
    # another artifact's pack than the one beside the file: a result under its own key, so that a
    # check against the wrong artifact cannot replace the file's own verdict
    foreign = (path.parent / SIDECAR_NAME).is_file() and folder.resolve() != path.parent.resolve()
    write_result(path.parent, result.to_dict(), against=str(folder.resolve()) if foreign else "")
    return result


def _check(detector: Detector, pack: ReferencePack, declared: str, result: VerifyResult) -> None:
    height, width = pack.images.shape[1:3]
    if tuple(detector.input_size) != (height, width):
        result.failures.append(
            f"the model takes {list(detector.input_size)} (H, W) and the reference pack holds "
            f"{[height, width]} images: it is not a build of this artifact's graph"
        )
        return
    thresholds = parity.PRECISION_GATES[declared]
    run = _runner(detector)
    name = f"{Path(detector.source).name} on {detector.backend.name}"
    sizes = [1]
    if detector.max_batch < pack.batch_max:
        result.failures.append(
            f"the engine's batch profile stops at {detector.max_batch} "
            f"({detector.backend.max_batch_source}) and the artifact serves batches up to "
            f"{pack.batch_max}: rebuild it with max batch {pack.batch_max}"
        )
    elif pack.batch_max > 1:
        sizes.append(pack.batch_max)
    for batch in sizes:
        report = _gate(pack, run, batch, thresholds, name)
        log.info("batch %d: %s", batch, report.summary())
        result.gates[str(batch)] = report.to_dict()
        result.failures += [f"batch {batch}: {failure}" for failure in report.failures]
    inspector = detector.backend.engine_inspector()
    if inspector is not None:
        counts, gap = inspector_precisions(inspector)
        verdict = judge_precision(
            fp16=declared != Precision.FP32,
            strongly_typed=detector.backend.strongly_typed,  # the engine's record; None: not recorded
            network={},
            inspector=counts,
            inspector_gap=gap,
            int8=declared == Precision.INT8,
        )
        result.layer_precision = verdict
        if verdict["status"] == "refused":
            result.failures.append(f"declared {declared}, and {verdict['reason']}")


def _check_int8_speed(
    detector: Detector, other: Detector, pack: ReferencePack, runs: int, result: VerifyResult
) -> None:
    """INT8 against its counterpart at batch 1, judged on the engines' own time where both backends
    run their engine apart from the host copies (TensorRT: `Backend.engine_only`): copies and
    conversions both pay alike would hide a small model's gain. Else end to end, and it says so."""
    int8_run, other_run = _runner(detector), _runner(other)
    first = pack.images[:1]
    int8_times, other_times = _times([lambda: int8_run(first), lambda: other_run(first)], runs)
    result.latency_ms = _percentiles(int8_times)  # end to end, as every verify.json entry reports it
    engines = [d.backend.engine_only(d.prepare(list(first), color="RGB")[0]) for d in (detector, other)]
    timed = ENGINE_TIME
    if all(engine is not None for engine in engines):
        int8_times, other_times = _times(engines, runs)
    else:
        timed = "end to end (this backend cannot run its engine apart from its host copies)"
    mine, theirs = _percentiles(int8_times)["p50"], _percentiles(other_times)["p50"]
    speedup = 1.0 - mine / theirs
    result.int8_speed = {
        "against": other.source,
        "timed": timed,
        "against_p50_ms": theirs,
        "p50_ms": mine,
        "speedup": round(speedup, 4),
        "needed": INT8_MIN_SPEEDUP,
    }
    if speedup < INT8_MIN_SPEEDUP:
        how = f"{-speedup:.0%} slower than" if speedup < 0 else f"only {speedup:.0%} faster than"
        result.failures.append(
            f"INT8 is {how} {Path(other.source).name} on this device (p50 {mine:.2f} vs {theirs:.2f} ms, "
            f"{timed}; needed {INT8_MIN_SPEEDUP:.0%} faster): serve the faster one"
        )
