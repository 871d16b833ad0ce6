"""model.json's engine record, for an engine from our Python build or from trtexec (build_engine.sh).

`tensorrt.record_engine` is the one writer of the record: the Python build calls it, and
`export/jetson/build_engine.sh` reaches it through this module's command line after trtexec wrote
the engine:

    python -m dfine_deploy.export.tensorrt_record cache-name --tensorrt-version V [--gpu NAME:CC]
    python -m dfine_deploy.export.tensorrt_record record ARTIFACT --built FILE --log FILE
        --layer-info FILE --tensorrt-version V [--build-seconds S] -- TRTEXEC_LINE...

A trtexec build is judged from what trtexec itself wrote: its log (the device block of NVIDIA's
samples/common/sampleDevice.cpp, "Selected Device: NAME" and "Compute Capability: M.m", and
"TensorRT version: X.Y.Z" of samples/trtexec/trtexec.cpp) and the engine inspector's JSON it
exports (`--exportLayerInfo`). The graph, flags, shapes, workspace and timing cache are read from
the trtexec line that ran, so the record says what was built, not what was meant. The network
itself is not seen, so precision is judged on the inspector's evidence (`tensorrt_verify`). An
engine the evidence refuses is deleted (it was this build's) and the sidecar is left as it was.
Torch-free and `tensorrt`-free: it reads files only.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from dfine_deploy.artifact import ENGINE_FILES, EngineInfo, read_artifact, verify_file
from dfine_deploy.backend_names import Precision
from dfine_deploy.cli import friendly_errors
from dfine_deploy.errors import ExportError
from dfine_deploy.export.tensorrt import gpu_info, record_engine
from dfine_deploy.export.tensorrt_verify import check_engine, describe_fp32_outcome, inspector_io_dtypes
from dfine_deploy.files import sha256_file
from dfine_deploy.runtime.tensorrt_plan import (
    GpuInfo,
    expected_interface,
    release_line,
    timing_cache_name,
)


def trtexec_log_facts(log: str) -> tuple[str | None, GpuInfo | None]:
    """(TensorRT version, GPU) from trtexec's own log lines; None for what the log does not say."""
    version = re.search(r"\] \[I\] TensorRT version: (\d+\.\d+\.\d+)", log)
    name = re.search(r"\] \[I\] Selected Device: (.+)", log)
    capability = re.search(r"\] \[I\] Compute Capability: (\d+\.\d+)", log)
    gpu = GpuInfo(name.group(1).strip(), capability.group(1)) if name and capability else None
    return (version.group(1) if version else None), gpu


def trtexec_options(line: Sequence[str]) -> dict[str, str]:
    """`--name=value` options of a trtexec line by name ("" for a switch); the program is skipped."""
    options = {}
    for arg in line[1:]:
        if arg.startswith("--"):
            name, _, value = arg[2:].partition("=")
            options[name] = value
    return options


def _shapes(text: str, option: str) -> dict[str, list[int]]:
    try:
        return {
            name: [int(d) for d in dims.split("x")]
            for name, _, dims in (item.rpartition(":") for item in text.split(","))
        }
    except ValueError as exc:
        raise ExportError(f"trtexec line: --{option}={text} is not NAME:AxBxC,... shapes") from exc


def _profile(options: dict[str, str]) -> dict[str, list[list[int]]]:
    low, opt, high = (_shapes(options.get(k, ""), k) for k in ("minShapes", "optShapes", "maxShapes"))
    return {name: [low[name], opt[name], high[name]] for name in low if name in opt and name in high}


def record_trtexec_engine(
    folder: str | Path,
    *,
    built: str | Path,
    log: str,
    layer_info: str,
    line: Sequence[str],
    tensorrt_version: str,
    build_seconds: float = 0.0,
) -> EngineInfo:
    """Judge the engine trtexec wrote to `built`, move it to its precision's file (ENGINE_FILES:
    model.engine FP16, model.int8.engine INT8, model.fp32.engine FP32) and record it.

    `tensorrt_version` is the version build_engine.sh detected (the Python package's or
    libnvinfer's, with its build number); the log's X.Y.Z must agree with it.
    """
    folder, built = Path(folder), Path(built)
    if not built.is_file():
        raise ExportError(f"trtexec finished but wrote no engine at {built}; model.json was not changed")
    info = read_artifact(folder)
    options = trtexec_options(line)
    logged_version, gpu = trtexec_log_facts(log)
    if gpu is None:
        raise ExportError(
            "the trtexec log has no 'Selected Device:' and 'Compute Capability:' lines (trtexec prints "
            "them before every build): is it trtexec's own output? model.json was not changed"
        )
    if logged_version and not f"{tensorrt_version}.".startswith(f"{logged_version}."):
        raise ExportError(
            f"trtexec is TensorRT {logged_version}, but TensorRT {tensorrt_version} was detected (its "
            "Python package or libnvinfer-bin): the engine is for trtexec's version. Use the trtexec of "
            "the TensorRT that runs the engine, or set DFINE_TRT_VERSION. model.json was not changed"
        )
    graph_file = Path(options.get("onnx", "")).name
    graph = info.graph_named(graph_file)
    if graph is None:
        raise ExportError(
            f"trtexec built from '{options.get('onnx')}', which is not one of the graphs model.json "
            f"lists ({sorted(g.file for g in info.graphs.values())}); model.json was not changed"
        )
    verify_file(folder, info, graph_file)
    # a line without the FP16 flag (11.x) builds strongly typed networks only
    strongly_typed = "stronglyTyped" in options or not release_line(tensorrt_version).fp16_flag
    fp16_flag = "fp16" in options
    if graph.precision == Precision.INT8:
        precision = Precision.INT8
    elif strongly_typed:
        precision = graph.precision  # the typed graph's own types
    else:
        precision = Precision.FP16 if fp16_flag else Precision.FP32
    expected = expected_interface(info.target.get("profile") or {}, tensorrt_version)
    io_dtypes = inspector_io_dtypes(layer_info, expected)
    try:
        counts, verdict = check_engine(
            io_dtypes,
            layer_info,
            precision=precision,
            strongly_typed=strongly_typed,
            network={},  # trtexec does not show us its network
            expected_io={n: d for n, d in expected.items() if n in io_dtypes},
            source=str(built),
            version=tensorrt_version,
            fp32_layers=info.target.get("fp32_layers") or () if fp16_flag and not strongly_typed else (),
        )
    except ExportError:
        built.unlink(missing_ok=True)  # this build's engine, refused: not kept under any name
        raise
    unseen = sorted(set(expected) - set(io_dtypes))
    if unseen:
        verdict["io"] = f"the exported layer information types no {unseen}: their dtypes are unchecked"
    engine_path = folder / ENGINE_FILES[precision]
    os.replace(built, engine_path)
    workspace = re.fullmatch(r"workspace:(\d+)M?", options.get("memPoolSize", ""))
    cache = options.get("timingCacheFile")
    engine = EngineInfo(
        file=engine_path.name,
        sha256=sha256_file(engine_path),
        source_graph=graph_file,
        tensorrt_version=tensorrt_version,
        gpu_name=gpu.name,
        compute_capability=gpu.compute_capability,
        profile=_profile(options),
        io_dtypes=io_dtypes,
        layer_precisions=counts,
        build_seconds=round(build_seconds, 2),
        precision=precision,
        verification=verdict,
        builder={
            "built_by": "trtexec",
            "strongly_typed": strongly_typed,
            "fp16_flag": fp16_flag,
            "int8_flag": "int8" in options,
            "tf32": "noTF32" not in options,
            "workspace_mb": int(workspace.group(1)) if workspace else None,
            "timing_cache": Path(cache).name if cache else None,
            "timing_cache_status": "not reported by trtexec" if cache else "not used",
        },
    )
    record_engine(folder, engine)
    return engine


def cache_name(tensorrt_version: str, gpu: str | None) -> str | None:
    """The keyed timing cache file for this TensorRT and GPU (`gpu` "NAME:CC", else this machine's)."""
    if gpu is None:
        found = gpu_info()
    else:
        name, _, capability = gpu.rpartition(":")
        found = GpuInfo(name, capability) if name and re.fullmatch(r"\d+\.\d+", capability) else None
    return timing_cache_name(tensorrt_version, found) if found else None


@friendly_errors
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dfine_deploy.export.tensorrt_record",
        description="Record an engine built by trtexec in model.json (export/jetson/build_engine.sh).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    name = commands.add_parser("cache-name", help="print the keyed timing cache file name")
    name.add_argument("--tensorrt-version", required=True)
    name.add_argument("--gpu", help="NAME:CC instead of this machine's GPU (a dry run elsewhere)")
    record = commands.add_parser("record", help="judge and record the engine trtexec wrote")
    record.add_argument("artifact")
    record.add_argument("--built", required=True, help="the engine file trtexec wrote")
    record.add_argument("--log", required=True, help="trtexec's output")
    record.add_argument("--layer-info", required=True, help="trtexec's --exportLayerInfo file")
    record.add_argument("--tensorrt-version", required=True)
    record.add_argument("--build-seconds", type=float, default=0.0)
    record.add_argument("line", nargs="+", help="the trtexec line that ran, after --")
    args = parser.parse_args(argv)
    if args.command == "cache-name":
        found = cache_name(args.tensorrt_version, args.gpu)
        if found is None:
            print(
                f"note: no timing cache: the GPU is unknown here ({args.gpu or 'no CUDA GPU visible'}); "
                "the cache is keyed by TensorRT version and GPU (DFINE_TRT_GPU=NAME:CC names one)",
                file=sys.stderr,
            )
        else:
            print(found)
        return 0
    with warnings.catch_warnings():  # an "unverified" verdict is in the one line printed below
        warnings.simplefilter("ignore")
        engine = _record(args)
    print(
        f"recorded {Path(args.artifact) / engine.file} in model.json: TensorRT {engine.tensorrt_version} "
        f"on {engine.gpu_name} (sm {engine.compute_capability}), {engine.precision} "
        f"{engine.verification['status']} ({engine.verification['reason']})",
        file=sys.stderr,
    )
    if "fp32_layers" in engine.verification:
        print(describe_fp32_outcome(engine.verification["fp32_layers"]), file=sys.stderr)
    return 0


def _record(args: argparse.Namespace) -> EngineInfo:
    layers = Path(args.layer_info)
    return record_trtexec_engine(
        args.artifact,
        built=args.built,
        log=Path(args.log).read_text(errors="replace"),
        layer_info=layers.read_text(errors="replace") if layers.is_file() else "",  # none: "unverified"
        line=args.line,
        tensorrt_version=args.tensorrt_version,
        build_seconds=args.build_seconds,
    )


if __name__ == "__main__":
    raise SystemExit(main())
