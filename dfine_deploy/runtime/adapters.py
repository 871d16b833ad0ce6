"""Adapters: how a detector graph meets frames, so that any ONNX detector fits one Detector.

A backend only knows named arrays in and named arrays out. An adapter owns everything around
that call for one family of models:

    prepare(frames, size_hw, color) -> (feeds, state)     frames -> named input arrays
    decode(outputs, state, score_threshold) -> [Detections]   named outputs -> one result per frame
    check(inputs, outputs, source)                          refuse a graph of another layout

`state` is whatever `decode` needs to map boxes back to the original frames (sizes, letterbox
transforms). To add a model family, subclass `Adapter`, implement the three methods and register
it in `ADAPTERS`; `Detector.open(path, adapter="name")` and `dfine-bench --adapter name` then use it.

Built in:
- `dfine`: the D-FINE graph of `dfine-export` (resize, postprocessing inside the graph).
- `yolo`: an Ultralytics-style export with one output [N, 4 + C, A] (cx, cy, w, h in network
  pixels, then C class scores): letterbox in, score filter + class-aware NMS in numpy out.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from dfine_deploy.class_names import check_class_names
from dfine_deploy.errors import BackendError
from dfine_deploy.runtime.detections import Detections
from dfine_deploy.runtime.preprocess import letterbox_batch, resize_batch


class Adapter(ABC):
    """Pre- and post-processing of one model family (see the module docstring)."""

    name: str = ""
    # the input that may take the resized uint8 BGR frames as they are, for a backend that scales,
    # swaps and transposes them inside its graph (OpenVINO); None: the adapter always feeds floats
    raw_pixels_input: str | None = None

    def __init__(self, class_names: Sequence[str]):
        fix = "pass one name per class of the model"
        self.class_names = check_class_names(class_names, None, f"{self.name} adapter", fix, BackendError)

    @abstractmethod
    def check(self, inputs: Sequence[str], outputs: Sequence[str], source: str) -> None:
        """Raise BackendError when the graph's tensor names do not fit this adapter."""

    @abstractmethod
    def prepare(
        self, frames: Sequence[np.ndarray], size_hw: tuple[int, int], color: str, *, raw_pixels: bool = False
    ) -> tuple[dict[str, np.ndarray], Any]:
        """Frames -> the graph's named inputs, plus what `decode` needs. `raw_pixels`: the backend
        converts the resized uint8 BGR frames itself (`Backend.raw_pixels`, `raw_pixels_input`)."""

    @abstractmethod
    def decode(self, outputs: dict[str, np.ndarray], state: Any, score_threshold: float) -> list[Detections]:
        """The graph's named outputs -> one Detections per frame, in original-frame pixels."""


class DFineAdapter(Adapter):
    """The `dfine-export` interface: images + orig_target_sizes -> labels, boxes, scores."""

    name = "dfine"
    inputs = ("images", "orig_target_sizes")
    outputs = ("labels", "boxes", "scores")
    raw_pixels_input = "images"

    def check(self, inputs: Sequence[str], outputs: Sequence[str], source: str) -> None:
        missing = [n for n in (*self.inputs, *self.outputs) if n not in (*inputs, *outputs)]
        if missing:
            raise BackendError(
                f"{source}: tensors {missing} are missing; a D-FINE graph has inputs "
                f"{list(self.inputs)} and outputs {list(self.outputs)}, this one has inputs "
                f"{list(inputs)} and outputs {list(outputs)}. Export it with `dfine-export`, or "
                "pass adapter='yolo' (or your own Adapter) for another model family"
            )

    def prepare(self, frames, size_hw, color, *, raw_pixels=False):
        images, sizes = resize_batch(frames, size_hw, color, raw_pixels=raw_pixels)
        return {"images": images, "orig_target_sizes": sizes}, None

    def decode(self, outputs, state, score_threshold):
        labels, boxes, scores = (outputs[n] for n in self.outputs)  # [N, K], [N, K, 4], [N, K]
        results = []
        for i in range(scores.shape[0]):
            keep = scores[i] > score_threshold
            results.append(
                Detections.build(boxes[i][keep], scores[i][keep], labels[i][keep], self.class_names)
            )
        return results


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Greedy non-maximum suppression; boxes [M, 4] xyxy. Returns kept indices, best first."""
    order = np.argsort(-scores, kind="stable")
    areas = np.clip(boxes[:, 2] - boxes[:, 0], 0, None) * np.clip(boxes[:, 3] - boxes[:, 1], 0, None)
    keep = []
    while order.size:
        best, rest = order[0], order[1:]
        keep.append(best)
        top_left = np.maximum(boxes[best, :2], boxes[rest, :2])  # [R, 2]
        bottom_right = np.minimum(boxes[best, 2:], boxes[rest, 2:])  # [R, 2]
        inter = np.prod(np.clip(bottom_right - top_left, 0, None), axis=1)  # [R]
        iou = inter / np.maximum(areas[best] + areas[rest] - inter, 1e-9)
        order = rest[iou <= iou_threshold]
    return np.asarray(keep, dtype=np.int64)


class YoloAdapter(Adapter):
    """Ultralytics-style YOLO export (v8/11): one input, one output [N, 4 + C, A]."""

    name = "yolo"

    def __init__(
        self,
        class_names: Sequence[str],
        conf_threshold: float = 0.25,
        iou_threshold: float = 0.7,
        max_detections: int = 300,
    ):
        super().__init__(class_names)
        self.conf_threshold = conf_threshold
        self.iou_threshold = iou_threshold
        self.max_detections = max_detections
        self.input_name = "images"
        self.output_name = "output0"

    def check(self, inputs, outputs, source):
        if len(inputs) != 1 or len(outputs) != 1:
            raise BackendError(
                f"{source}: the yolo adapter expects one input and one output [N, 4 + C, A]; the "
                f"graph has inputs {list(inputs)} and outputs {list(outputs)}"
            )
        self.input_name, self.output_name = inputs[0], outputs[0]

    def prepare(self, frames, size_hw, color, *, raw_pixels=False):
        if raw_pixels:
            raise BackendError("the yolo adapter feeds float images; its backend must not take raw pixels")
        images, transforms = letterbox_batch(frames, size_hw, color)
        sizes = np.array([f.shape[:2] for f in frames], dtype=np.float32)  # [N, 2] (h, w)
        return {self.input_name: images}, (transforms, sizes)

    def decode(self, outputs, state, score_threshold):
        transforms, sizes = state
        raw = outputs[self.output_name]  # [N, 4 + C, A]
        if raw.ndim != 3 or raw.shape[1] <= 4:
            raise BackendError(
                f"yolo adapter: output {self.output_name!r} has shape {raw.shape}; expected "
                "[N, 4 + C, A] (boxes then class scores per anchor)"
            )
        threshold = score_threshold if score_threshold > 0 else self.conf_threshold
        results = []
        for i in range(raw.shape[0]):
            preds = raw[i].T  # [A, 4 + C]
            class_scores = preds[:, 4:]  # [A, C]
            labels = class_scores.argmax(axis=1)
            scores = class_scores[np.arange(len(labels)), labels]
            keep = scores > threshold
            cxcywh, scores, labels = preds[keep, :4], scores[keep], labels[keep]
            boxes = np.concatenate(
                [cxcywh[:, :2] - cxcywh[:, 2:] / 2, cxcywh[:, :2] + cxcywh[:, 2:] / 2], axis=1
            )  # [M, 4] xyxy network pixels
            # class-aware NMS in one call: shift each class to its own region of the plane
            offsets = labels[:, None].astype(np.float32) * (boxes.max(initial=0.0) + 1.0)
            kept = nms(boxes + offsets, scores, self.iou_threshold)[: self.max_detections]
            gain, pad_x, pad_y = transforms[i]
            boxes = (boxes[kept] - np.array([pad_x, pad_y, pad_x, pad_y], np.float32)) / gain
            height, width = sizes[i]
            boxes = boxes.clip(0, [width, height, width, height])
            results.append(Detections.build(boxes, scores[kept], labels[kept], self.class_names))
        return results


ADAPTERS: dict[str, type[Adapter]] = {"dfine": DFineAdapter, "yolo": YoloAdapter}


def make_adapter(name: str, class_names: Sequence[str]) -> Adapter:
    try:
        return ADAPTERS[name](class_names)
    except KeyError:
        raise BackendError(f"adapter {name!r} is unknown; built-in adapters: {sorted(ADAPTERS)}") from None
