"""nvinfer reads our config as DeepStream does: GLib's own key-file parser (the one gst-nvinfer loads
its config with, run here through the system Python's gi) reads every key with the getter nvinfer
uses for it, and each value lies in the range nvinfer accepts.

The key table is a set of facts read from gst-nvinfer's `gstnvinfer_property_parser.cpp` and `.h`
(DeepStream SDK sources/gst-plugins/gst-nvinfer, the same in 6.4, 7.0, 8.0 and 9.1:
https://docs.nvidia.com/metropolis/deepstream/9.1/sdk-api/sources_2gst-plugins_2gst-nvinfer_2gstnvinfer__property__parser_8h_source.html):
which GLib getter reads each key and which values it refuses. A key nvinfer does not know is only
warned about ("Unknown or legacy key") and ignored, so a misspelt one would silently change nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from dfine_deploy.artifact import read_artifact, write_artifact
from dfine_deploy.export import deepstream

SYSTEM_PYTHON = "/usr/bin/python3"  # python3-gi (scripts/install-system-deps.sh)

# key -> (GLib getter nvinfer reads it with, the values it accepts; None: any the getter reads)
PROPERTY_KEYS: dict[str, tuple[str, object]] = {
    "gpu-id": ("integer", range(0, 64)),
    "net-scale-factor": ("double", None),
    "offsets": ("double_list", range(0, 5)),  # at most 4 (_MAX_CHANNELS) values: the length is checked
    "model-color-format": ("integer", {0, 1, 2}),  # RGB, BGR, GRAY
    "onnx-file": ("string", None),
    "model-engine-file": ("string", None),
    "labelfile-path": ("string", None),
    "batch-size": ("integer", range(1, 1025)),  # [1, NVDSINFER_MAX_BATCH_SIZE]
    "network-mode": ("integer", {0, 1, 2}),  # FP32, INT8, FP16
    # DeepStream 9.0.0 and 9.1.0 (NVIDIA/DeepStream, src/gst-plugins/gst-nvinfer, parser blob 6fccfbbe):
    # a boolean; true makes nvinfer's own build a strongly typed network
    "strongly-typed": ("boolean", None),
    "num-detected-classes": ("integer", range(0, 1 << 31)),
    "infer-dims": ("integer_list", {3}),  # exactly c;h;w: the length is checked
    "network-type": ("integer", {0, 1, 2, 3, 100}),  # detector, classifier, segmentation, instance, other
    "process-mode": ("integer", {1, 2}),  # primary, secondary
    "interval": ("integer", range(0, 1 << 31)),
    "gie-unique-id": ("integer", range(1, 1 << 31)),
    "cluster-mode": ("integer", {0, 1, 2, 3, 4}),  # 4: no clustering
    "maintain-aspect-ratio": ("boolean", None),
    "symmetric-padding": ("boolean", None),
    "output-blob-names": ("string_list", None),
    "parse-bbox-func-name": ("string", None),
    "custom-lib-path": ("string", None),
}
CLASS_ATTRS_KEYS: dict[str, tuple[str, object]] = {
    "pre-cluster-threshold": ("double", None),
    "topk": ("integer", None),
}

# Runs in the system Python: reads the file with GLib.KeyFile and the getter named for each key.
_READER = """
import json, sys
from gi.repository import GLib
path, getters = sys.argv[1], json.loads(sys.argv[2])
keys = GLib.KeyFile()
keys.load_from_file(path, GLib.KeyFileFlags.NONE)
out = {}
for group in keys.get_groups()[0]:
    out[group] = {}
    for key in keys.get_keys(group)[0]:
        per_class = group.startswith("class-attrs-") and group[len("class-attrs-"):].isdigit()
        getter = getters.get("class-attrs-all" if per_class else group, {}).get(key)
        if getter is None:
            out[group][key] = {"unknown": keys.get_value(group, key)}
            continue
        try:
            out[group][key] = {"value": getattr(keys, "get_" + getter)(group, key)}
        except GLib.Error as exc:
            out[group][key] = {"error": exc.message}
print(json.dumps(out))
"""


def _gi_missing() -> str | None:
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "from gi.repository import GLib"], capture_output=True)
    return (
        None if probe.returncode == 0 else "the system Python has no gi (run scripts/install-system-deps.sh)"
    )


def nvinfer_read(path: Path) -> dict[str, dict[str, dict]]:
    """Every group and key of `path` as GLib reads it with nvinfer's getters ("unknown" for a key
    nvinfer ignores, "error" for a value its getter refuses)."""
    missing = _gi_missing() if Path(SYSTEM_PYTHON).exists() else f"{SYSTEM_PYTHON} is missing"
    if missing:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{missing}; CI must have it")
        pytest.skip(missing)
    getters = {
        "property": {k: g for k, (g, _) in PROPERTY_KEYS.items()},
        "class-attrs-all": {k: g for k, (g, _) in CLASS_ATTRS_KEYS.items()},
    }
    read = subprocess.run(
        [SYSTEM_PYTHON, "-c", _READER, str(path), json.dumps(getters)],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return json.loads(read.stdout)


def _refusals(groups: dict[str, dict[str, dict]]) -> list[str]:
    """What nvinfer would ignore or refuse in the parsed config."""
    tables = {"property": PROPERTY_KEYS, "class-attrs-all": CLASS_ATTRS_KEYS}
    # a class's own group, class-attrs-<class id>, takes the keys of class-attrs-all
    tables.update({g: CLASS_ATTRS_KEYS for g in groups if re.fullmatch(r"class-attrs-\d+", g)})
    problems = [f"[{g}] is not a group nvinfer reads" for g in groups if g not in tables]
    for group, keys in groups.items():
        for key, read in keys.items():
            if "unknown" in read or "error" in read:
                problems.append(f"[{group}] {key}: {read}")
                continue
            accepted = tables[group][key][1]
            value = read["value"]
            measured = len(value) if isinstance(value, list) else value
            if accepted is not None and measured not in accepted:
                problems.append(f"[{group}] {key}={value}: outside what nvinfer accepts")
    return problems


@pytest.mark.parametrize("target", [None, "jetpack5"], ids=["default", "trt8-constraints"])
def test_nvinfer_reads_every_key_of_our_config_with_its_own_getters(artifact, target):
    from dfine_deploy.export import targets as trt_targets

    if target:
        info = read_artifact(artifact)
        info.target = {"profile": trt_targets.get_profile(target).to_dict()}
        write_artifact(artifact, info)
    config, _, labels = deepstream.write_config(artifact)
    groups = nvinfer_read(config)
    assert _refusals(groups) == []
    settings = {k: v["value"] for k, v in groups["property"].items()}
    assert settings["infer-dims"] == [3, 320, 480]  # c;h;w of the toy artifact
    assert settings["output-blob-names"] == ["labels", "boxes", "scores"]
    assert settings["offsets"] == [0.0, 0.0, 0.0] and settings["net-scale-factor"] == pytest.approx(1 / 255)
    assert settings["maintain-aspect-ratio"] is False and settings["cluster-mode"] == 4
    # the typed FP16 graph is built in a strongly typed network (DeepStream 9), never with FP16 mode;
    # 8.x's FP32 graph has no strongly typed networks and no strongly-typed key
    typed = target is None
    assert settings["onnx-file"] == ("model.fp16.onnx" if typed else "model.onnx")
    assert settings["network-mode"] == 0
    assert settings.get("strongly-typed") is (True if typed else None), settings
    for key in ("onnx-file", "labelfile-path"):  # nvinfer resolves paths against the config's folder
        assert (config.parent / settings[key]).is_file(), key
    # the name nvinfer saves its own build under, beside the graph (nvdsinfer_model_builder.cpp
    # TrtModelBuilder::buildModel: onnx-file + _b<batch-size>_gpu<gpu-id>_<mode>.engine; mode 0: fp32)
    engine = f"{settings['onnx-file']}_b{settings['batch-size']}_gpu{settings['gpu-id']}_fp32.engine"
    assert settings["model-engine-file"] == engine
    assert groups["class-attrs-all"]["topk"]["value"] == 30
    assert len(nvinfer_detector_labels(labels)) == settings["num-detected-classes"]  # a label per class


def test_deepstream_app_names_the_engine_after_the_batch_size_it_gives_nvinfer(artifact):
    """deepstream-app's [primary-gie] batch-size overrides the nvinfer config's (is_prop_set in
    gstnvinfer_property_parser.cpp), and nvinfer names its engine after the batch it runs: the app
    config names that file, and dfine-verify reads what the engine runs in from the name."""
    info = read_artifact(artifact)
    app = deepstream.app_config_text(info)
    gie = app.split("[primary-gie]")[1].split("\n\n")[0]
    assert f"batch-size={info.batch_opt}" in gie
    assert f"model-engine-file=model.fp16.onnx_b{info.batch_opt}_gpu0_fp32.engine" in gie
    read = deepstream.nvinfer_engine_precision
    assert read(f"model.fp16.onnx_b{info.batch_opt}_gpu0_fp32.engine", info) == "fp16"  # the typed graph's
    assert read("model.onnx_b8_gpu0_fp16.engine", info) == "fp16"  # network-mode 2 on the FP32 graph
    assert read("model.onnx_b8_gpu0_fp32.engine", info) == "fp32"
    assert read("other.onnx_b8_gpu0_fp16.engine", info) is None  # not a graph of this artifact
    assert read("model.engine", info) is None


def test_the_oracle_catches_what_nvinfer_would_ignore_or_refuse(tmp_path):
    config = tmp_path / "config.txt"
    config.write_text(
        "[property]\ninfer-dim=3;320;320\nnetwork-mode=3\nmaintain-aspect-ratio=no\n[class-attrs-all]\ntopk=30\n"
    )
    problems = _refusals(nvinfer_read(config))
    assert [p.split(":")[0] for p in problems] == [
        "[property] infer-dim",  # misspelt: ignored
        "[property] network-mode=3",  # no such mode
        "[property] maintain-aspect-ratio",  # not a GLib boolean
    ]


def nvinfer_detector_labels(path: Path) -> list[str]:
    """What nvinfer's detector calls each class (NvDsInferContextImpl::parseLabelsFile, DeepStream
    sources/libs/nvdsinfer, redone here): lines split at '\\n', empty lines skipped, each line cut at
    ';' into a classifier's labels, of which a detector shows the first."""
    return [line.split(";")[0] for line in path.read_bytes().decode().split("\n") if line]


@pytest.mark.parametrize(
    "names, shown",
    [
        (["person", "traffic light", "3 wheeler"], ["person", "traffic light", "3 wheeler"]),
        (["cat;dog", "bird"], ["cat,dog", "bird"]),  # not "cat": the separator gets a stand-in
    ],
    ids=["plain", "semicolon"],
)
def test_nvinfer_shows_each_class_by_its_whole_name(artifact, caplog, names, shown):
    info = read_artifact(artifact)
    info.class_names, info.num_classes = names, len(names)
    write_artifact(artifact, info)
    with caplog.at_level("WARNING", logger=deepstream.log.name):
        _, _, labels = deepstream.write_config(artifact)
    assert nvinfer_detector_labels(labels) == shown
    changed = [n for n in names if ";" in n]
    assert ("DeepStream reads as a separator" in caplog.text) == bool(changed)
    assert all(repr(n) in caplog.text for n in changed)  # each change named


def test_a_class_threshold_is_written_only_where_it_beat_the_default_on_held_out_images(trained_export):
    """The trained model's export with --data: nvinfer reads a [class-attrs-N] for exactly the classes
    whose threshold, chosen on half of the images, did better than [class-attrs-all]'s on the other
    half (model.json's held_out verdicts), and the comments give every class's verdict."""
    info = read_artifact(trained_export)
    config = trained_export / deepstream.CONFIG_NAME
    groups = nvinfer_read(config)
    assert _refusals(groups) == []
    onnx_file = groups["property"]["onnx-file"]["value"]
    held_out = info.threshold_record(onnx_file, "onnxruntime")["held_out"]
    default = held_out["default"]
    assert groups["class-attrs-all"]["pre-cluster-threshold"]["value"] == default
    kept = {
        f"class-attrs-{info.class_names.index(name)}": verdict["threshold"]
        for name, verdict in held_out["classes"].items()
        if verdict["kept"]
    }
    written = {g: keys["pre-cluster-threshold"]["value"] for g, keys in groups.items() if g[-1].isdigit()}
    assert written == pytest.approx(kept)
    for verdict in held_out["classes"].values():
        assert verdict["kept"] == (verdict["threshold"] is not None and verdict["f1"] > verdict["default_f1"])
    assert any(v["threshold"] is not None for v in held_out["classes"].values())  # the data could tell
    text = config.read_text()
    assert all(f" {name}: " in text for name in info.class_names)
