"""A stand-in for NVIDIA's `trtexec` on PATH, for the build_engine.sh journey tests (no TensorRT here).

It builds with the FAKE tensorrt module (tests/fakes/tensorrt), so the engine it writes is one the
fake runtime deserialises, and it prints the lines real trtexec prints that our recording reads,
in trtexec's own log layout (`[date-time] [I] ...`, samples/common/logging.h): the device block of
samples/common/sampleDevice.cpp ("Selected Device: NAME", "Compute Capability: M.m") and
"TensorRT version: X.Y.Z" (samples/trtexec/trtexec.cpp). `--exportLayerInfo` gets the engine
inspector's JSON, as trtexec writes it. STUB_TRT_VERSION sets the fake's version;
STUB_TRT_DROP_FP16=1 makes a builder that runs every layer in FP32 despite `--fp16`, as a weakly
typed build may.

Only the options build_engine.sh passes are read; anything else is refused, as trtexec refuses
an unknown option.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

FAKE = Path(__file__).parents[1] / "fakes" / "tensorrt" / "__init__.py"
VALUE_OPTIONS = (
    "onnx",
    "saveEngine",
    "minShapes",
    "optShapes",
    "maxShapes",
    "memPoolSize",
    "timingCacheFile",
    "profilingVerbosity",
    "exportLayerInfo",
    "precisionConstraints",
    "layerPrecisions",
    "layerOutputTypes",
)
SWITCHES = ("stronglyTyped", "fp16", "noTF32")


def log(message: str) -> None:
    print(time.strftime("[%m/%d/%Y-%H:%M:%S]") + " [I] " + message, flush=True)


def parse(argv: list[str]) -> dict[str, str | bool]:
    options: dict[str, str | bool] = {}
    for arg in argv:
        name, _, value = arg.lstrip("-").partition("=")
        if name in VALUE_OPTIONS and value:
            options[name] = value
        elif name in SWITCHES and not value:
            options[name] = True
        else:
            print(f"Unknown option: {arg}", flush=True)
            raise SystemExit(1)
    return options


def shapes(text: str) -> dict[str, list[int]]:
    out = {}
    for item in text.split(","):
        name, _, dims = item.rpartition(":")
        out[name] = [int(d) for d in dims.split("x")]
    return out


def main(argv: list[str]) -> int:
    options = parse(argv)
    spec = importlib.util.spec_from_file_location("tensorrt", FAKE)
    trt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trt)
    trt.set_version(os.environ["STUB_TRT_VERSION"])
    print("&&&& RUNNING TensorRT.trtexec [TensorRT stub] # trtexec " + " ".join(argv), flush=True)
    log("=== Device Information ===")
    log(f"Selected Device: {trt.FAKE_GPU['name']}")
    log("Selected Device ID: 0")
    log(f"Compute Capability: {trt.FAKE_GPU['compute_capability']}")
    log("")
    log("TensorRT version: " + ".".join(trt.__version__.split(".")[:3]))

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    names = trt.NetworkDefinitionCreationFlag
    if hasattr(names, "EXPLICIT_BATCH"):
        flags |= 1 << int(names.EXPLICIT_BATCH)
    if options.get("stronglyTyped") and hasattr(names, "STRONGLY_TYPED"):
        flags |= 1 << int(names.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(Path(str(options["onnx"])).read_bytes()):
        print("[E] Failed to parse onnx file", flush=True)
        return 1
    config = builder.create_builder_config()
    if options.get("fp16") and not os.environ.get("STUB_TRT_DROP_FP16"):
        config.set_flag(trt.BuilderFlag.FP16)
    if options.get("profilingVerbosity") == "detailed":
        config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    profile = builder.create_optimization_profile()
    low, opt, high = (shapes(str(options[k])) for k in ("minShapes", "optShapes", "maxShapes"))
    for name in low:
        profile.set_shape(name, trt.Dims(low[name]), trt.Dims(opt[name]), trt.Dims(high[name]))
    config.add_optimization_profile(profile)
    cache_file = Path(str(options["timingCacheFile"])) if "timingCacheFile" in options else None
    if cache_file is not None:
        blob = cache_file.read_bytes() if cache_file.is_file() else b""
        config.set_timing_cache(config.create_timing_cache(blob), False)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        print("[E] Engine could not be created from network", flush=True)
        return 1
    plan = bytes(memoryview(serialized))
    Path(str(options["saveEngine"])).write_bytes(plan)
    log(f"Engine built in 0.1 sec. (timing cache hits: {trt.LAST_BUILD['cache_hits']})")
    if cache_file is not None:
        cache_file.write_bytes(bytes(memoryview(config.get_timing_cache().serialize())))
    if "exportLayerInfo" in options:
        engine = trt.Runtime(logger).deserialize_cuda_engine(plan)
        info = engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON)
        Path(str(options["exportLayerInfo"])).write_text(info)
    print("&&&& PASSED TensorRT.trtexec [TensorRT stub] # trtexec " + " ".join(argv), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
