"""Typed request and response models of the HTTP API (they document the OpenAPI page).

The stream request is not written here: it is derived from `settings.StreamSpec`, the one schema of a
stream, so the API and the stream list YAML cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import MISSING, fields
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, Strict, create_model
from typing_extensions import Annotated  # typing.Annotated is 3.9; serve runs on 3.8

from dfine_deploy.compat import type_hints
from dfine_deploy.serve.settings import API_FIELDS, COUNTING_FIELDS, StreamSpec


class DetectionOut(BaseModel):
    box: list[float] = Field(description="x1, y1, x2, y2 in pixels of the frame")
    score: float
    label: int = Field(description="contiguous class index")
    name: str = Field(description="class name")
    track_id: int | None = Field(
        None,
        description="the object's id in its stream while it is followed (streams with track on); null for "
        "uploads, untracked streams, and an object's first frame",
    )


class DetectResponse(BaseModel):
    width: int
    height: int
    detections: list[DetectionOut] = Field(
        description="one per object: the best-scoring label of each box (what counting and tracking use)"
    )
    raw_detections: list[DetectionOut] | None = Field(
        None,
        description="only on a server started with --raw-detections: the model's top-K (query, class) "
        "pairs as it returned them, so one box can appear under several labels",
    )


class Counts(BaseModel):
    lines: dict[str, dict[str, dict[str, int]]] = Field(
        description="per line: 'in' and 'out', each crossings per class name, since the stream started"
    )
    zones: dict[str, dict[str, int]] = Field(
        description="per zone: objects inside per class name, latest frame"
    )


class StreamResult(DetectResponse):
    stream: str
    frame_index: int = Field(
        description="frames read from the source before this one; goes on across reconnects and loops, "
        "so stream and frame_index name one frame"
    )
    timestamp: float = Field(description="Unix time when the frame was decoded")
    position_s: float | None = Field(
        None,
        description="files and clips over HTTP: the frame's time in the video in seconds, from its "
        "timestamps (right for variable frame rates), going on across loops; null for live sources",
    )
    decode_ms: float
    inference_ms: float = Field(description="time of the batched Detector.predict call that saw this frame")
    detected: bool = Field(
        True,
        description="false: something moved but the motion gate's rate cap (detect fps) left this frame "
        "undetected; its detections are the tracks at the boxes their motion model predicts (none on an "
        "untracked stream), and nothing is counted in it",
    )
    counts: Counts | None = Field(None, description="streams with counting lines or zones")


def _spec_fields(names: tuple[str, ...], *, required: bool) -> dict[str, Any]:
    """Pydantic fields for these StreamSpec fields, with its types, defaults and descriptions."""
    hints = type_hints(StreamSpec)
    model_fields: dict[str, Any] = {}
    for f in fields(StreamSpec):
        if f.name not in names:
            continue
        if not required:
            default = None  # left out: unchanged
        elif f.default is not MISSING:
            default = f.default
        elif f.default_factory is not MISSING:
            default = f.default_factory()
        else:
            default = ...
        annotation = _strict(str if f.name == "url" else hints[f.name])  # cameras by index: trusted-only
        if not required:
            annotation = typing.Optional[annotation]  # `| None` needs 3.10; serve runs on 3.8
        model_fields[f.name] = (annotation, Field(default, description=f.metadata["description"]))
    return model_fields


def _strict(annotation: Any) -> Any:
    """`annotation` with every number, boolean and text strict, in lists, tuples and dataclasses too:
    pydantic would read a JSON `true` as the number 1 and `1` as true, and booleans are no numbers.
    A whole number still passes where a float is asked."""
    if annotation in (bool, int, float, str):
        return Annotated[annotation, Strict()]
    if dataclasses.is_dataclass(annotation):
        return _request_model(annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list and len(args) == 1:
        return typing.List[_strict(args[0])]  # typing.List: subscripted at runtime, on 3.8 too
    if origin is tuple and args and Ellipsis not in args:
        return typing.Tuple[tuple(_strict(arg) for arg in args)]
    return annotation


@functools.lru_cache(maxsize=None)  # one request model per dataclass, named as it (the OpenAPI page)
def _request_model(cls: type) -> type[BaseModel]:
    """A request model of a dataclass's fields (a counting line or zone), strict like the rest."""
    hints = type_hints(cls)
    return create_model(
        cls.__name__,
        __config__=REQUEST_CONFIG,
        **{f.name: (_strict(hints[f.name]), ...) for f in fields(cls)},
    )


# request bodies: unknown fields refused, and NaN or infinity in any number field (JSON has no such
# numbers: they would be stored and answered as null)
REQUEST_CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False)

# POST /v1/streams's body: StreamSpec's API fields plus `wait_live_s`; unknown fields are refused.
StreamRequest = create_model(
    "StreamRequest",
    __config__=REQUEST_CONFIG,
    **_spec_fields(API_FIELDS, required=True),
    wait_live_s=(
        float,
        Field(
            0.0,
            ge=0,
            le=60,
            description="wait this long at most for the stream to be live (live_frames in live_window_s); "
            "if it is not, answer 504 and drop the stream",
        ),
    ),
)

# PATCH /v1/streams/{name}'s body: tracking and counting of a running stream; fields left out stay.
CountingRequest = create_model(
    "CountingRequest", __config__=REQUEST_CONFIG, **_spec_fields(COUNTING_FIELDS, required=False)
)


class ClassThreshold(BaseModel):
    threshold: float = Field(description="as compared (float32), not rounded")
    source: str = Field(
        description="yours (--score-threshold, --class-threshold), chosen (by dfine-export for this "
        "graph), or default"
    )


class StreamInfo(BaseModel):
    name: str
    url: str = Field(description="credentials are redacted")
    kind: str
    state: str = Field(
        description="connecting (not yet live_frames frames in live_window_s), live, stalled (was live, "
        "frames now too slow), retrying (reconnecting after a failure), stopped, or failed (final)"
    )
    last_error: str | None = Field(description="why the stream is retrying or failed")
    frames_in: int
    frames_processed: int
    frames_dropped: int
    reconnects: int
    source_fps: float
    fps: float = Field(description="results published per second (smoothed)")
    latency_ms: float = Field(description="from frame decoded to its result published, latest result")
    every_frame: bool
    track: bool
    lines: list[dict[str, Any]]
    zones: list[dict[str, Any]]
    counts: Counts | None
    recording: str | None = Field(description="the folder of the stream's recording segments, when recorded")
    tiles: dict[str, Any] | None = Field(None, description="the stream's tiles (dfine_deploy/tiles.py)")
    detect: dict[str, Any] | None = Field(None, description="the stream's motion gate (serve/regions.py)")
    frames_without_inference: int = Field(0, description="frames the motion gate answered without the model")
    class_thresholds: dict[str, ClassThreshold] = Field(
        default_factory=dict,
        description="per class name: the score a detection must reach to be published, tracked and "
        "counted (every stream of this server has the same)",
    )


class Health(BaseModel):
    status: str = Field(description="ok (alive), loading, ready or failed")
    backend: str | None = None
    streams: int | None = None
    detail: str | None = Field(None, description="why the model or the start-up streams failed")
