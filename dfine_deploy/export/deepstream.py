"""A DeepStream `nvinfer` configuration for an artifact folder.

D-FINE needs no NMS (`cluster-mode=4`), is trained on a plain resize (`maintain-aspect-ratio=0`),
its graph takes RGB in [0, 1] (`net-scale-factor`, `offsets` and `model-color-format` come from
`model/contracts.py`'s `GRAPH_INPUT`; a family's own mean/std, ECDet's, is inside the graph), and
its graph has a second input, `orig_target_sizes`, that nvinfer does not fill by itself. The
custom library therefore implements two functions (export/deepstream/README.md):

* `NvDsInferInitializeInputLayers`: writes (net width, net height) into `orig_target_sizes` for
  every batch slot, so boxes come out in network-input pixels, which nvinfer scales to the frame;
* the bbox parser (`parse-bbox-func-name`): reads `labels`, `boxes` (xyxy), `scores` by name and
  emits one object per detection above the class threshold: `[class-attrs-N]`'s, else
  `[class-attrs-all]`'s (dfine-serve's default score threshold).

With cluster-mode=4 that threshold is all DeepStream does with the graph's detections, so a class's
threshold is chosen on them as `dfine-export --data` chooses thresholds, on one half of the data, and
`[class-attrs-N]` is written only where it beats `[class-attrs-all]` on the other half
(`thresholds.held_out_verdicts`); the config's comments give the figures and each class's reason.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from dfine_deploy.artifact import GATE_BACKEND, ArtifactInfo, read_artifact
from dfine_deploy.backend_names import Precision
from dfine_deploy.errors import ExportError
from dfine_deploy.files import atomic_write_bytes
from dfine_deploy.model.contracts import GRAPH_INPUT
from dfine_deploy.runtime.tensorrt_plan import ENGINE_NAME, LAYER_CONSTRAINTS
from dfine_deploy.thresholds import DEFAULT_SCORE_THRESHOLD

CONFIG_NAME = "config_infer_primary_dfine.txt"
APP_CONFIG_NAME = "deepstream_app_dfine.txt"
LABELS_NAME = "labels.txt"
PARSER_FUNCTION = "NvDsInferParseDfine"
CUSTOM_LIB = "nvdsinfer_custom_impl_dfine/libnvdsinfer_custom_impl_dfine.so"
# the payload library nvmsgconv loads (export/deepstream/nvmsgconv_dfine), asked for NVIDIA's
# NVDS_PAYLOAD_CUSTOM (0x101) payload type
MSGCONV_LIB = "nvmsgconv_dfine/libnvmsgconv_dfine.so"
PAYLOAD_TYPE_CUSTOM = 257
DS_ROOT = "/opt/nvidia/deepstream/deepstream"
# MQTT as deepstream's mqtt adaptor takes it ("host;port"), and dfine-serve's default events topic
DEFAULT_BROKER, DEFAULT_TOPIC = "localhost;1883", "dfine/events"
# nvinfer's label reader (NvDsInferContextImpl::parseLabelsFile) cuts each line at ';' (a classifier's
# several labels) and a detector shows the first piece: a name holding it is written with this instead
LABEL_SEPARATOR, LABEL_SEPARATOR_STANDIN = ";", ","

log = logging.getLogger(__name__)

# The engine nvinfer builds itself (no model-engine-file, or one that does not deserialise) is saved
# under its own name, beside the graph: the onnx-file path (made absolute against the config's
# folder: gstnvinfer_property_parser.cpp) + "_b<batch-size>_gpu<gpu-id>_<mode>.engine", <mode> the
# network-mode's word (NVIDIA/DeepStream v9.0.0 and v9.1.0, src/utils/nvdsinfer/
# nvdsinfer_model_builder.cpp TrtModelBuilder::buildModel; networkMode2Str in nvdsinfer_func_utils.cpp;
# modes: nvdsinfer_context.h NvDsInferNetworkMode). The batch-size is the one nvinfer runs with:
# deepstream-app's [primary-gie] batch-size overrides the nvinfer config's.
NVINFER_MODES = {0: "fp32", 1: "int8", 2: "fp16", 3: "best"}
NVINFER_ENGINE_PATTERN = "*.onnx_b*_*.engine"  # what nvinfer leaves in an artifact folder
_NVINFER_ENGINE = re.compile(
    r"(?P<graph>.+)_b(?P<batch>\d+)_(?:gpu|dla)\d+_(?P<mode>fp32|int8|fp16|best)\.engine"
)


def nvinfer_engine_name(onnx_file: str, batch_size: int, network_mode: int, gpu_id: int = 0) -> str:
    """The file name nvinfer gives the engine it builds from `onnx_file` (in the graph's folder)."""
    return f"{onnx_file}_b{batch_size}_gpu{gpu_id}_{NVINFER_MODES[network_mode]}.engine"


def nvinfer_engine_precision(name: str, info: ArtifactInfo | None) -> str | None:
    """What an engine nvinfer named `name` runs in, when its graph is one of the artifact's: a typed
    graph's own precision (nvinfer's strongly typed build keeps it under mode fp32), else the mode's."""
    found = _NVINFER_ENGINE.fullmatch(name)
    graph = info.graph_named(found["graph"]) if found and info else None
    if graph is None or found["mode"] == "best":
        return None
    return graph.precision if graph.precision != Precision.FP32 else found["mode"]


def _nvinfer_build(info: ArtifactInfo) -> tuple[str, int, bool]:
    """(onnx-file, network-mode, strongly-typed) of the engine nvinfer builds for this artifact."""
    typed = Precision.FP16 in info.graphs
    # A typed FP16 graph carries its own precision: nvinfer's FP16 mode (2) would set the legacy
    # builder flag, which TensorRT 11 no longer has and which 10.x must not mix with typed graphs.
    # nvinfer's own build keeps the graph's types only in a strongly typed network, which DeepStream 9
    # creates when `strongly-typed` is true (gstnvinfer_property_parser.cpp reads it with
    # g_key_file_get_boolean; nvdsinfer_model_builder.cpp then sets kSTRONGLY_TYPED: NVIDIA/DeepStream
    # v9.0.0 and v9.1.0); without it the build is weakly typed and runs the graph in FP32.
    # TensorRT 8.x targets (--target trt8.5/trt8.6) build from model.onnx with per-layer FP32
    # constraints that only build_engine.sh sets; nvinfer's own build cannot, so its fallback is FP32.
    constraints = info.target.get("profile", {}).get("precision") == LAYER_CONSTRAINTS
    strongly_typed = typed and not constraints
    onnx_file = info.graphs[Precision.FP16 if strongly_typed else Precision.FP32].file
    return onnx_file, 0 if typed or constraints else 2, strongly_typed


# nvinfer's model-color-format values
_NVINFER_COLOUR = {"RGB": 0, "BGR": 1}


def _nvinfer_pixels() -> list[str]:
    """The graph input (`GRAPH_INPUT`) in nvinfer's terms: y = net-scale-factor * (x - offsets), one
    factor for all channels, so a per-channel std cannot be said here (the graph holds any such step)."""
    if len(set(GRAPH_INPUT.std)) != 1:
        raise ExportError(f"nvinfer takes one scale factor; the graph input has std {list(GRAPH_INPUT.std)}")
    factor = GRAPH_INPUT.scale / GRAPH_INPUT.std[0]
    offsets = ";".join(f"{m / GRAPH_INPUT.scale:g}" for m in GRAPH_INPUT.mean)
    return [
        f"net-scale-factor={factor!r}",
        f"offsets={offsets}",
        f"model-color-format={_NVINFER_COLOUR[GRAPH_INPUT.colour]}",
    ]


def config_text(info: ArtifactInfo, *, batch_size: int | None = None) -> str:
    onnx_file, network_mode, strongly_typed = _nvinfer_build(info)
    batch = batch_size or info.batch_max
    engine = nvinfer_engine_name(onnx_file, batch, network_mode)
    lines = [
        "# DeepStream nvinfer config for a D-FINE artifact (written by dfine-export).",
        f"# model-engine-file is the name nvinfer saves its own build under ({onnx_file}_b<batch-size>_",
        "# gpu<id>_<mode>.engine, here, beside the graph): it builds the engine from onnx-file on the first",
        "# start and deserialises it after. Prove it with dfine-verify ENGINE (verify.json lands here).",
        "# To serve the engine build_engine.sh built and model.json records instead, set",
        f"# model-engine-file={ENGINE_NAME}.",
        "[property]",
        "gpu-id=0",
        *_nvinfer_pixels(),
        f"onnx-file={onnx_file}",
        f"model-engine-file={engine}",
        f"labelfile-path={LABELS_NAME}",
        f"batch-size={batch}",
        f"network-mode={network_mode}",
        *(["strongly-typed=1"] if strongly_typed else []),
        f"num-detected-classes={info.num_classes}",
        f"infer-dims=3;{info.input_height};{info.input_width}",
        "network-type=0",
        "process-mode=1",
        "interval=0",
        "gie-unique-id=1",
        "cluster-mode=4",  # D-FINE is NMS-free: no clustering
        "maintain-aspect-ratio=0",  # plain resize, as in training
        "symmetric-padding=0",
        "output-blob-names=labels;boxes;scores",
        f"parse-bbox-func-name={PARSER_FUNCTION}",
        f"custom-lib-path={CUSTOM_LIB}",
        "",
        "[class-attrs-all]",
        f"pre-cluster-threshold={DEFAULT_SCORE_THRESHOLD}",
        f"topk={info.num_top_queries}",
        "",
    ]
    return "\n".join(lines + _class_attrs(info, onnx_file))


def _class_attrs(info: ArtifactInfo, onnx_file: str) -> list[str]:
    """`[class-attrs-N]` of each class whose threshold, chosen on half of --data's images for the graph
    nvinfer builds its engine from (on onnxruntime), beat `[class-attrs-all]`'s on the other half; a
    comment line for every class saying what was measured."""
    record = info.threshold_record(onnx_file, GATE_BACKEND) or {}
    held_out = record.get("held_out") or {}
    if not held_out.get("classes"):
        return ["# no [class-attrs-N]: no threshold was judged on held-out images (dfine-export --data)"]
    default = held_out["default"]
    lines = [
        f"# [class-attrs-N]: class N's threshold ({record['rule']}), chosen by dfine-export on half of",
        f"# --data's images for {onnx_file}, written only where it beat {default:g} on the other half:",
    ]
    sections = []
    for index, name in enumerate(info.class_names):
        verdict = held_out["classes"].get(name) or {"threshold": None, "reason": "not measured"}
        if verdict["threshold"] is None:
            lines.append(f"#   {index} {name}: {verdict['reason']}")
            continue
        outcome = "written" if verdict["kept"] else "not written"
        lines.append(
            f"#   {index} {name}: {verdict['threshold']:.4f} {outcome}, {verdict['reason']} "
            f"(held-out F1 {verdict['f1']:.3f}, at {default:g} {verdict['default_f1']:.3f})"
        )
        if verdict["kept"]:
            sections += [f"[class-attrs-{index}]", f"pre-cluster-threshold={verdict['threshold']:.4f}", ""]
    return [*lines, "", *sections]


def app_config_text(info: ArtifactInfo, *, broker: str = DEFAULT_BROKER, topic: str = DEFAULT_TOPIC) -> str:
    """A deepstream-app configuration: one file source, nvinfer with CONFIG_NAME, NVIDIA's
    NvMultiObjectTracker, OSD, a fake sink, and a message sink (msgconv with our payload library,
    msgbroker over MQTT to `broker`, "host;port", on `topic`)."""
    onnx_file, network_mode, _ = _nvinfer_build(info)
    lines = [
        "# deepstream-test5-app -c deepstream_app_dfine.txt (written by dfine-export; deepstream-app reads",
        "# it too but attaches no event messages, so [sink1] sends nothing there). Build both libraries",
        "# into this folder first (export/deepstream/README.md): make -C export/deepstream/<library> install",
        "# ARTIFACT=<this folder>. Set [source0] uri to your stream, [sink1] msg-broker-conn-str to your",
        "# MQTT broker; [sink0] type=2 shows the stream on screen.",
        "[application]",
        "enable-perf-measurement=1",
        "perf-measurement-interval-sec=5",
        "",
        "[tiled-display]",
        "enable=0",
        "",
        "[source0]",
        "enable=1",
        "type=3",  # URI source
        "uri=file:///opt/nvidia/deepstream/deepstream/samples/streams/sample_1080p_h264.mp4",
        "num-sources=1",
        "gpu-id=0",
        "",
        "[streammux]",
        "gpu-id=0",
        f"batch-size={info.batch_opt}",
        "width=1920",
        "height=1080",
        "batched-push-timeout=40000",
        "live-source=0",
        "",
        "[primary-gie]",
        "enable=1",
        "gpu-id=0",
        "gie-unique-id=1",
        f"batch-size={info.batch_opt}",
        f"config-file={CONFIG_NAME}",
        "# this batch-size overrides the nvinfer config's, and nvinfer names its engine after it",
        f"model-engine-file={nvinfer_engine_name(onnx_file, info.batch_opt, network_mode)}",
        "",
        "# NVIDIA's multi-object tracker with its NvDCF sample config: track ids for the messages",
        "[tracker]",
        "enable=1",
        "tracker-width=960",
        "tracker-height=544",
        "gpu-id=0",
        f"ll-lib-file={DS_ROOT}/lib/libnvds_nvmultiobjecttracker.so",
        f"ll-config-file={DS_ROOT}/samples/configs/deepstream-app/config_tracker_NvDCF_perf.yml",
        "display-tracking-id=1",
        "",
        "[osd]",
        "enable=1",
        "gpu-id=0",
        "border-width=2",
        "text-size=12",
        "",
        "[sink0]",
        "enable=1",
        "type=1",  # fakesink: measure without a display
        "sync=0",
        "",
        "# one JSON message per object per frame, shaped like dfine-serve's events, to MQTT",
        "[sink1]",
        "enable=1",
        "type=6",  # nvmsgconv + nvmsgbroker
        f"msg-conv-payload-type={PAYLOAD_TYPE_CUSTOM}",
        f"msg-conv-msg2p-lib={MSGCONV_LIB}",
        f"msg-broker-proto-lib={DS_ROOT}/lib/libnvds_mqtt_proto.so",
        f"msg-broker-conn-str={broker}",
        f"topic={topic}",
        "sync=0",
        "",
    ]
    return "\n".join(lines)


def labels_text(class_names: list[str]) -> str:
    """labels.txt: one name per line, each as nvinfer's detector shows it whole; a name holding the
    separator nvinfer cuts lines at gets a stand-in, and each such change is logged."""
    changed = [name for name in class_names if LABEL_SEPARATOR in name]
    if changed:
        log.warning(
            "%s: %d class name(s) hold %r, which DeepStream reads as a separator; written with %r "
            "instead: %s",
            LABELS_NAME,
            len(changed),
            LABEL_SEPARATOR,
            LABEL_SEPARATOR_STANDIN,
            ", ".join(repr(name) for name in changed[:5]) + (" ..." if len(changed) > 5 else ""),
        )
    return "".join(name.replace(LABEL_SEPARATOR, LABEL_SEPARATOR_STANDIN) + "\n" for name in class_names)


def write_config(artifact: str | Path, **kwargs: Any) -> list[Path]:
    """Write the nvinfer config, the deepstream-app config and labels.txt into the artifact folder."""
    artifact = Path(artifact)
    info = read_artifact(artifact)
    config = artifact / CONFIG_NAME
    app = artifact / APP_CONFIG_NAME
    labels = artifact / LABELS_NAME
    atomic_write_bytes(config, config_text(info, **kwargs).encode())
    atomic_write_bytes(app, app_config_text(info).encode())
    atomic_write_bytes(labels, labels_text(info.class_names).encode())
    return [config, app, labels]
