"""A Frigate NVR configuration snippet for an artifact folder (`frigate.yml`, with its label map).

Frigate (https://github.com/blakeblackshear/frigate) runs D-FINE ONNX graphs with its own code
(`model_type: dfine` in its onnx and openvino detectors; read at commit e3fa701, July 2026):

* it feeds `images` float32 [1, 3, H, W]: the region it detects on, resized to the model's `width` x
  `height`, RGB (`input_pixel_format: rgb`), laid out NCHW (`input_tensor: nchw`) and divided by 255
  (`input_dtype: float`), which is exactly what our graphs take;
* and `orig_target_sizes` **int64** [[height, width]]. Our graphs take (width, height), but Frigate
  then divides the boxes by (height, width, height, width), so the swap cancels and its boxes come
  out right, square or not;
* it reads the outputs by position: labels, boxes, scores (our graphs' order), keeps scores > 0.4,
  runs NMS at IoU 0.4 and reports at most 20 objects as (class, score, y1, x1, y2, x2) in [0, 1];
* class indices become names through a label map, which its `load_labels` (frigate/util/builtin.py)
  reads as "INDEX NAME" lines when the first line starts with digits and a space, else as one name
  per line. A plain list whose first class is, say, `3 wheeler` is therefore misread (and fails to
  load), so Frigate gets its own map in the indexed form (`frigate_labelmap.txt`), which reads
  every valid class name back exactly; `labels.txt` stays DeepStream's plain list.

A graph exported for TensorRT 8.x (`--target trt8.5`, `trt8.6`, JetPack 5 / 6.0) takes INT32 sizes,
which onnxruntime refuses to fill with the int64 of Frigate's onnx detector (its openvino detector
casts each input to the graph's type first): such an artifact gets a `frigate.yml` that says so and
holds no model block. Every other export (no --target, trt10.3, trt10.14, trt11) runs on both.

Its filters (`objects.filters.<label>.min_score`, a detection's least score, and `threshold`, the least
median score of a tracked object) are chosen inside Frigate's own post-processing on the annotated
images of `--data` and written only for the classes where they beat Frigate's defaults on held-out
images (`frigate_thresholds`); every other class keeps Frigate's defaults, and the file's comments give
the figures and the reason. Without annotated data the file writes no filters.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import yaml

from dfine_deploy.artifact import ArtifactInfo
from dfine_deploy.backend_names import Precision
from dfine_deploy.export.frigate_post import FRIGATE_DEFAULT
from dfine_deploy.export.frigate_thresholds import FrigateChoice, choose_filters, detector_views
from dfine_deploy.files import atomic_write_bytes

log = logging.getLogger(__name__)

SNIPPET_NAME = "frigate.yml"
LABELMAP_NAME = "frigate_labelmap.txt"
FRIGATE_SIZES_DTYPE = "int64"  # what Frigate's dfine detectors send as orig_target_sizes
MODEL_FOLDER = "/config/model_cache"  # where Frigate's documentation puts custom models


def sizes_dtype(info: ArtifactInfo) -> str:
    """The dtype of `orig_target_sizes` in the artifact's graphs (a --target may fix INT32)."""
    return info.target.get("profile", {}).get("io_dtypes", {}).get("orig_target_sizes", "int64")


def frigate_refusal(info: ArtifactInfo) -> str | None:
    """Why Frigate cannot run this artifact's graph, or None when it can."""
    dtype = sizes_dtype(info)
    if dtype == FRIGATE_SIZES_DTYPE:
        return None
    target = info.target.get("profile", {}).get("name", "this target")
    return (
        f"this artifact was exported for {target} (TensorRT 8.x), whose graphs take orig_target_sizes as "
        f"{dtype}; Frigate's onnx detector sends {FRIGATE_SIZES_DTYPE}, which onnxruntime refuses for it "
        "(its openvino detector casts the sizes to the graph's type). For Frigate, export again without "
        "--target (or with --target trt10.3, trt10.14 or trt11)"
    )


def snippet_text(info: ArtifactInfo, folder_name: str, choice: FrigateChoice | None = None) -> str:
    """The snippet for an artifact copied to MODEL_FOLDER/`folder_name` in Frigate's container, with the
    filters `choice` writes (None: no annotated data to choose on, Frigate's defaults)."""
    header = [
        "# Frigate configuration for this D-FINE artifact (written by dfine-export; docs/frigate.md).",
        f"# Copy the whole folder to {MODEL_FOLDER}/{folder_name}/ in Frigate's config volume and merge",
        "# these keys into Frigate's config.yml (an Intel host may use `type: openvino`, device CPU or GPU).",
    ]
    refusal = frigate_refusal(info)
    if refusal is not None:
        return "\n".join([*header[:1], f"# Frigate cannot run it: {refusal}.", ""])
    where = f"{MODEL_FOLDER}/{folder_name}"
    config = {
        "detectors": {"onnx": {"type": "onnx"}},
        "model": {
            "model_type": "dfine",
            "width": info.input_width,
            "height": info.input_height,
            "input_tensor": "nchw",
            "input_pixel_format": "rgb",
            "input_dtype": "float",
            "path": f"{where}/{info.graphs[Precision.FP32].file}",
            "labelmap_path": f"{where}/{LABELMAP_NAME}",
        },
        "objects": {"track": list(info.class_names)},
    }
    if choice is None:
        header.append(
            f"# objects.filters: Frigate's defaults (min_score {FRIGATE_DEFAULT.min_score}, threshold "
            f"{FRIGATE_DEFAULT.threshold}); export with --data holding annotations to have them measured."
        )
    else:
        header += [f"# {line}" for line in choice.comment_lines()]
        if choice.filters:
            config["objects"]["filters"] = {
                name: {"min_score": f.min_score, "threshold": f.threshold}
                for name, f in choice.filters.items()
            }
    return "\n".join(header) + "\n" + yaml.safe_dump(config, sort_keys=False)


def choose_on_data(
    folder: Path,
    info: ArtifactInfo,
    images: list[np.ndarray],
    truth: list[tuple[np.ndarray, np.ndarray]],
    target_precision: float | None,
) -> FrigateChoice:
    """Frigate's filters for the artifact in `folder`, chosen and judged inside Frigate's post-processing
    of its FP32 graph (the one Frigate's onnx detector runs) on annotated RGB `images` and their `truth`
    (labels, boxes xyxy px); the verdict is logged, one line per class."""
    graph = folder / info.graphs[Precision.FP32].file
    views = detector_views(graph, images, truth, info.input_width, info.input_height)
    choice = choose_filters(views, info.class_names, target_precision)
    for line in choice.comment_lines():
        log.info("%s: %s", SNIPPET_NAME, line.strip())
    return choice


def labelmap_text(class_names: list[str]) -> str:
    """Frigate's label map in its indexed form, one "INDEX NAME" line per class: read back exactly
    whatever the names look like (they have no line breaks and no spaces around them)."""
    return "".join(f"{index} {name}\n" for index, name in enumerate(class_names))


def write_snippet(
    folder: str | Path, info: ArtifactInfo, name: str, choice: FrigateChoice | None = None
) -> list[Path]:
    """Write `frigate.yml` (its filters from `choice`, see `snippet_text`) and, when Frigate can run this
    artifact, its label map into `folder` (the export's staging folder; `name`: the artifact folder's
    final name, which the snippet's paths use); warn when Frigate cannot run it."""
    folder = Path(folder)
    path = folder / SNIPPET_NAME
    refusal = frigate_refusal(info)
    if refusal is not None:
        log.warning("%s: Frigate cannot run this artifact: %s", SNIPPET_NAME, refusal)
    atomic_write_bytes(path, snippet_text(info, name, choice).encode())
    if refusal is not None:
        return [path]
    labelmap = folder / LABELMAP_NAME
    atomic_write_bytes(labelmap, labelmap_text(info.class_names).encode())
    return [path, labelmap]
