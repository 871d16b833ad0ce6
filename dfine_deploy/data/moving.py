"""A generated demo video: objects of the synthetic classes moving on known paths.

The quickstart serves it with tracking and a counting line, so a person can check what they see: each
object keeps one track id while it is in view, and the line's counts equal the crossings listed here.
Tests use it the same way (`DemoVideo.truth`, `DemoVideo.expected_crossings`).

    video = DemoVideo()
    video.write("demo.mp4")                       # MPEG-4 part 2 through OpenCV
    video.write("demo.mp4", codec="h264")         # H.264 through PyAV (the `serve` extra)
    video.truth(10)                               # [(object id, class, (x1, y1, x2, y2)), ...] in frame 10
    video.expected_crossings(video.line)          # {"in": {"rectangle": 1, ...}, "out": {...}}
    video.write("demo.mp4", truth=True)           # and demo.gt.txt (MOT Challenge), demo.truth.json

`fast_movers` is a scene for the detection rate: objects moving a third of their size per frame.

Each object has its own lane, so no two ever overlap: a box is always the whole object. The classes
are those of `shapes.CLASS_NAMES`, drawn with one flat colour per class on a muted, desaturated
background (colours a model trained on the synthetic set has seen; a test can find each class by its
colour). Deterministic: frame i's pixels depend only on the seed and i.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Tuple

import cv2
import numpy as np

from dfine_deploy.data.shapes import CLASS_NAMES
from dfine_deploy.errors import DatasetError, MissingDependency

# one saturated BGR colour per class, far from the grey background and from each other
CLASS_COLOURS: dict[str, tuple[int, int, int]] = {
    "rectangle": (40, 40, 220),  # red
    "ellipse": (60, 200, 60),  # green
    "triangle": (220, 90, 30),  # blue
    "ring": (30, 210, 230),  # yellow
}
assert tuple(CLASS_COLOURS) == CLASS_NAMES


@dataclass(frozen=True)
class Route:
    """Where an object is over its time in view, `t` from 0 (first frame) to 1 (last frame), in
    fractions of the frame's width and height.

    straight: from `start` to `end`. `bend` (a fraction of the height) curves the route sideways as
    a sine arch (0: a straight line). `back`: the object goes to `end` and returns to `start`.
    `passes`: the object goes between `start` and `end` this many times (`back` is 2).
    `stop_for`: the share of its time in view the object stands still, halfway along its way."""

    start: tuple[float, float]
    end: tuple[float, float]
    bend: float = 0.0
    back: bool = False
    passes: int = 1
    stop_for: float = 0.0

    def at(self, t: float) -> tuple[float, float]:
        if self.stop_for:  # how far along its way the object is at time t: it waits at 0.5
            moving = 1.0 - self.stop_for  # the share of the time in view spent moving
            if t < 0.5 * moving:
                t = t / moving
            elif t < 0.5 * moving + self.stop_for:
                t = 0.5
            else:
                t = (t - self.stop_for) / moving
        if self.back:
            s = 1 - abs(2 * t - 1)  # how far along start -> end
        else:
            leg = min(int(t * self.passes), self.passes - 1)
            along = t * self.passes - leg
            s = along if leg % 2 == 0 else 1 - along
        x = self.start[0] + s * (self.end[0] - self.start[0])
        y = self.start[1] + s * (self.end[1] - self.start[1]) + self.bend * math.sin(math.pi * t)
        return x, y


@dataclass(frozen=True)
class MovingObject:
    class_name: str
    route: Route
    extent: float  # size as a fraction of the frame's height
    first_frame: int  # in view from this frame ...
    last_frame: int  # ... to this one, inclusive
    angle: float = 0.0  # degrees


def _default_objects(frames: int) -> tuple[MovingObject, ...]:
    """Five objects in five lanes: straight both ways, a curved route, one that turns back, one that
    appears late and leaves early."""
    last = frames - 1
    return (
        MovingObject("rectangle", Route((0.12, 0.11), (0.88, 0.11)), 0.15, 0, last, angle=10),
        MovingObject(
            "ellipse", Route((0.86, 0.29), (0.14, 0.29)), 0.15, round(0.1 * last), round(0.9 * last)
        ),
        MovingObject("triangle", Route((0.10, 0.52), (0.90, 0.52), bend=-0.03), 0.16, 0, last),
        MovingObject("ring", Route((0.12, 0.70), (0.82, 0.72), bend=0.02, back=True), 0.15, 0, last),
        MovingObject(
            "rectangle", Route((0.30, 0.89), (0.75, 0.89)), 0.13, round(0.3 * last), round(0.8 * last)
        ),
    )


def idle_objects(frames: int, busy: float = 0.2) -> tuple[MovingObject, ...]:
    """Three objects crossing the frame together during the middle `busy` share of the frames, and
    nothing before or after: a camera that mostly watches an empty scene (the motion gate's case,
    dfine-bench --streams --motion)."""
    first, last = round((0.5 - busy / 2) * (frames - 1)), round((0.5 + busy / 2) * (frames - 1))
    return (
        MovingObject("rectangle", Route((0.10, 0.20), (0.90, 0.20)), 0.15, first, last, angle=10),
        MovingObject("ellipse", Route((0.88, 0.50), (0.12, 0.50)), 0.15, first, last),
        MovingObject("triangle", Route((0.10, 0.80), (0.90, 0.80)), 0.16, first, last),
    )


# an object's width over its extent (`MovingObject.extent`), as `DemoVideo._mask` draws it unrotated
WIDTH_PER_EXTENT = {"rectangle": 1.3, "ellipse": 1.4, "triangle": 1.2 * math.sqrt(3) / 2, "ring": 1.0}


def fast_movers(
    frames: int, width: int = 480, height: int = 360, step: float = 1 / 3
) -> tuple[MovingObject, ...]:
    """Three objects crossing the frame back and forth, each moving `step` of its own width per frame
    (a third: a car at 50 km/h seen side-on by a camera at 10 fps). Every pass crosses the middle
    line, so a tracker that loses an object between detections (dfine-serve --detect-fps) misses
    counts or hands its id to another object."""
    objects = []
    for class_name, lane in (("rectangle", 0.2), ("ellipse", 0.5), ("triangle", 0.8)):
        extent = 0.15
        pixels_per_frame = step * WIDTH_PER_EXTENT[class_name] * extent * height
        frames_per_pass = max(2, round(0.76 * width / pixels_per_frame))  # 0.12 to 0.88 of the width
        passes = max(1, (frames - 1) // frames_per_pass)
        objects.append(
            MovingObject(
                class_name,
                Route((0.12, lane), (0.88, lane), passes=passes),
                extent,
                0,
                passes * frames_per_pass,
            )
        )
    return tuple(objects)


STOP_SHARE_MAX = 0.9  # of an object's time in view: it still moves before and after its stop


def longest_stop(objects: tuple[MovingObject, ...], fps: int) -> float:
    """The longest stop (seconds) that every object's time in view holds (`STOP_SHARE_MAX` of it)."""
    return min(STOP_SHARE_MAX * max(1, obj.last_frame - obj.first_frame) / fps for obj in objects)


def stopping(objects: tuple[MovingObject, ...], seconds: float, fps: int) -> tuple[MovingObject, ...]:
    """The same objects, each standing still for `seconds` halfway along its way (straight routes:
    near the middle line; the time in view stays the same, so they move faster before and after)."""
    changed = []
    for obj in objects:
        share = min(STOP_SHARE_MAX, seconds * fps / max(1, obj.last_frame - obj.first_frame))
        changed.append(replace(obj, route=replace(obj.route, stop_for=share)))
    return tuple(changed)


def scaled(objects: tuple[MovingObject, ...], factor: float) -> tuple[MovingObject, ...]:
    """The same objects, `factor` times their size (small objects: 0.3 makes the demo's 54 px 16 px)."""
    return tuple(replace(obj, extent=obj.extent * factor) for obj in objects)


# The scenes `dfine-data video --scene` writes: name -> (objects for (frames, width, height), what it is).
SCENES = {
    "demo": (lambda frames, w, h: _default_objects(frames), "the quickstart's: five objects, six crossings"),
    "fast": (fast_movers, "three objects back and forth, each moving a third of its width a frame"),
    "idle": (lambda frames, w, h: idle_objects(frames), "three objects crossing together in the middle 20 %"),
}

# the pillar `DemoVideo.occluder` draws: its width as a share of the frame's, and its colour (BGR),
# far from every class colour and from the background
OCCLUDER_WIDTH = 0.15
OCCLUDER_COLOUR = (70, 80, 95)
# a truth row whose object shows less than this share of itself is marked 0 (not scored: the MOT
# Challenge's rule for objects a tracker cannot be asked to see)
MIN_VISIBLE = 0.25
# what `DemoVideo.write` encodes with: MPEG-4 part 2 through OpenCV's wheels, H.264 through PyAV
CODECS = ("mp4v", "h264")
ONE_COLOUR = (150, 60, 160)  # `one_colour`: every object in this purple, told apart by shape alone

Box = Tuple[
    int, int, int, int
]  # x1, y1, x2, y2 (exclusive), pixels; typing.Tuple: evaluated at import on 3.8


@dataclass(frozen=True)
class DemoVideo:
    """The scene; the defaults are the quickstart's (480x360, 10 fps, 12 s)."""

    width: int = 480
    height: int = 360
    fps: int = 10
    frames: int = 120
    seed: int = 0
    objects: tuple[MovingObject, ...] = field(default=())
    occluder: float | None = None  # a pillar hiding what passes behind it, centred at this share of the width
    one_colour: bool = False  # every object in ONE_COLOUR: classes told apart by shape alone

    def __post_init__(self) -> None:
        if self.width < 160 or self.height < 120 or self.width % 2 or self.height % 2:
            raise DatasetError(
                f"demo video: {self.width}x{self.height} pixels; use an even size of at least 160x120"
            )
        if self.frames < 10 or self.fps < 1:
            raise DatasetError(
                f"demo video: {self.frames} frames at {self.fps} fps; use >= 10 frames, >= 1 fps"
            )
        if not self.objects:
            object.__setattr__(self, "objects", _default_objects(self.frames))

    @property
    def line(self) -> dict:
        """A counting line down the middle (the stream settings' form). Drawn top to bottom, an object
        moving to the screen's right crosses it "in", to the left "out"."""
        return {"name": "middle", "start": [self.width // 2, 0], "end": [self.width // 2, self.height]}

    # -- geometry ---------------------------------------------------------------------------------
    def _mask(self, obj: MovingObject, frame: int) -> np.ndarray | None:
        """The object's [H, W] uint8 mask in `frame`, or None while it is out of view."""
        if not obj.first_frame <= frame <= obj.last_frame:
            return None
        t = (frame - obj.first_frame) / max(1, obj.last_frame - obj.first_frame)
        fx, fy = obj.route.at(t)
        cx, cy, r = fx * self.width, fy * self.height, obj.extent * self.height / 2
        mask = np.zeros((self.height, self.width), np.uint8)
        if obj.class_name == "rectangle":
            corners = cv2.boxPoints(((cx, cy), (2 * r * 1.3, 2 * r), obj.angle))
            cv2.fillPoly(mask, [np.round(corners).astype(np.int32)], 1)
        elif obj.class_name == "ellipse":
            cv2.ellipse(mask, (round(cx), round(cy)), (round(1.4 * r), round(r)), obj.angle, 0, 360, 1, -1)
        elif obj.class_name == "triangle":
            thetas = np.radians(obj.angle - 90 + np.array([0, 120, 240]))
            points = np.stack([cx + 1.2 * r * np.cos(thetas), cy + 1.2 * r * np.sin(thetas)], axis=1)
            cv2.fillPoly(mask, [np.round(points).astype(np.int32)], 1)
        else:  # ring
            thickness = max(3, round(0.35 * r))
            axes = (round(r - thickness / 2), round(r - thickness / 2))
            cv2.ellipse(mask, (round(cx), round(cy)), axes, 0, 0, 360, 1, thickness)
        return mask

    def _pillar(self) -> tuple[int, int] | None:
        """The occluder's columns [x1, x2), or None without one."""
        if self.occluder is None:
            return None
        half = OCCLUDER_WIDTH * self.width / 2
        centre = self.occluder * self.width
        return max(0, round(centre - half)), min(self.width, round(centre + half))

    def seen(self, frame: int) -> list[tuple[int, str, Box, float]]:
        """(object id, class name, box of what shows, the share of the object that shows) of every
        object in view in `frame`: the occluder hides what passes behind it. The box is the whole
        object's where nothing shows."""
        pillar = self._pillar()
        found = []
        for index, obj in enumerate(self.objects):
            mask = self._mask(obj, frame)
            if mask is None:
                continue
            whole = cv2.boundingRect(mask)
            if pillar is not None:
                area = int(mask.sum())
                mask[:, pillar[0] : pillar[1]] = 0
                shown = int(mask.sum()) / area if area else 0.0
            else:
                shown = 1.0
            x, y, w, h = cv2.boundingRect(mask) if shown else whole
            found.append((index, obj.class_name, (x, y, x + w, y + h), shown))
        return found

    def truth(self, frame: int) -> list[tuple[int, str, Box]]:
        """(object id, class name, box) of every object in view in `frame`; ids index `objects`."""
        found = []
        for index, obj in enumerate(self.objects):
            mask = self._mask(obj, frame)
            if mask is not None:
                x, y, w, h = cv2.boundingRect(mask)
                found.append((index, obj.class_name, (x, y, x + w, y + h)))
        return found

    def frames_in_view(self, index: int) -> int:
        obj = self.objects[index]
        return obj.last_frame - obj.first_frame + 1

    def expected_crossings(self, line: dict) -> dict[str, dict[str, int]]:
        """How many times each class crosses a vertical `line` (the `line` property's form), by
        direction: a crossing is the whole box going from one side to the other ("in": to the right
        for a line drawn downwards, as counted by the server's line counters)."""
        (x0, y0), (x1, y1) = line["start"], line["end"]
        if x0 != x1:
            raise ValueError(f"expected_crossings: line {line!r} is not vertical")
        downwards = y1 > y0
        counts: dict[str, Counter[str]] = {"in": Counter(), "out": Counter()}
        for index, obj in enumerate(self.objects):
            side = 0  # -1 wholly left, +1 wholly right, 0 not yet seen wholly on one side
            for frame in range(obj.first_frame, obj.last_frame + 1):
                ((_, _, (bx1, _, bx2, _)),) = [t for t in self.truth(frame) if t[0] == index]
                now = -1 if bx2 <= x0 else 1 if bx1 > x0 else 0
                if now and side and now != side:
                    to_right = now == 1
                    counts["in" if to_right == downwards else "out"][obj.class_name] += 1
                side = now or side
        return {direction: dict(sorted(c.items())) for direction, c in counts.items()}

    def describe(self) -> dict:
        """What a person checks the served video against: size, rate, the line, each object's frames
        in view and the crossings the line must count."""
        return {
            "frames": self.frames,
            "width": self.width,
            "height": self.height,
            "fps": self.fps,
            "line": self.line,
            "expected_crossings": self.expected_crossings(self.line),
            "objects": [
                {"class": o.class_name, "frames_in_view": self.frames_in_view(i)}
                for i, o in enumerate(self.objects)
            ],
        }

    # -- ground truth, as trackers are scored on it -------------------------------------------------
    def mot_rows(self) -> list[str]:
        """Every object in every frame as a line of the MOT Challenge's gt.txt
        (https://motchallenge.net/instructions/): frame and id counted from 1, the box of what shows
        as left, top, width, height, then conf (1: scored; 0: not, where less than MIN_VISIBLE of the
        object shows behind the occluder), class 1 and the share that shows. Class 1 is the MOT
        benchmark's one scored class (pedestrian): evaluators drop or ignore rows of other classes, so
        each object's own class is written to the truth file (`write_truth`) instead."""
        rows = []
        for frame in range(self.frames):
            for index, _, (x1, y1, x2, y2), shown in self.seen(frame):
                shown = round(shown, 2)  # as written
                scored = int(shown >= MIN_VISIBLE)
                rows.append(f"{frame + 1},{index + 1},{x1},{y1},{x2 - x1},{y2 - y1},{scored},1,{shown:.2f}")
        return rows

    def write_truth(self, video_path: str | os.PathLike) -> tuple[Path, Path]:
        """Write beside `video_path` its ground-truth tracks (`truth_paths`: NAME.gt.txt) and NAME.truth.json:
        the rate, the counting line, the crossings it must count and each MOT id's class."""
        tracks_path, facts_path = truth_paths(video_path)
        tracks_path.write_text("\n".join(self.mot_rows()) + "\n")
        facts = {
            "fps": self.fps,
            "frames": self.frames,
            "line": self.line,
            "expected_crossings": self.expected_crossings(self.line),
            "classes": {str(i + 1): o.class_name for i, o in enumerate(self.objects)},
        }
        facts_path.write_text(json.dumps(facts, indent=1) + "\n")
        return tracks_path, facts_path

    # -- pixels -----------------------------------------------------------------------------------
    def _background(self) -> np.ndarray:
        """A muted [H, W, 3] uint8 background: a grey ramp with soft blotches, barely tinted."""
        rng = np.random.default_rng([self.seed, 0])
        ramp = (
            np.linspace(95, 150, self.width, dtype=np.float32)[None, :]
            + np.linspace(-15, 15, self.height, dtype=np.float32)[:, None]
        )
        blotches = cv2.resize(
            rng.standard_normal((9, 12), dtype=np.float32),
            (self.width, self.height),
            interpolation=cv2.INTER_CUBIC,
        )
        grey = ramp + 18 * blotches
        tint = np.array([4, 0, -4], np.float32)  # a little warm, far from any class colour
        return np.clip(grey[..., None] + tint, 0, 255).astype(np.uint8)

    def render(self, frame: int, background: np.ndarray | None = None) -> np.ndarray:
        """Frame `frame` as a [H, W, 3] uint8 BGR image (`background`: `_background()`, reused)."""
        image = (self._background() if background is None else background).copy()
        for obj in self.objects:
            mask = self._mask(obj, frame)
            if mask is not None:
                image[mask.astype(bool)] = ONE_COLOUR if self.one_colour else CLASS_COLOURS[obj.class_name]
        pillar = self._pillar()
        if pillar is not None:
            image[:, pillar[0] : pillar[1]] = OCCLUDER_COLOUR
        noise = np.random.default_rng([self.seed, 1, frame]).integers(-6, 7, image.shape, dtype=np.int16)
        return np.clip(image.astype(np.int16) + noise, 0, 255).astype(np.uint8)  # sensor noise, per frame

    def write(self, path: str | os.PathLike, codec: str = "mp4v", truth: bool = False) -> Path:
        """Encode every frame to `path`: "mp4v" (MPEG-4 part 2, OpenCV's wheels) or "h264" (libx264
        through PyAV, what cameras send). `truth`: also write its ground truth (`write_truth`)."""
        path = Path(path)
        if truth:
            self.write_truth(path)
        background = self._background()
        if codec == "mp4v":
            writer = cv2.VideoWriter(
                str(path), cv2.VideoWriter_fourcc(*"mp4v"), self.fps, (self.width, self.height)
            )
            if not writer.isOpened():
                raise DatasetError(f"{path}: OpenCV cannot write an mp4v video here")
            for i in range(self.frames):
                writer.write(self.render(i, background))
            writer.release()
        elif codec == "h264":
            _write_h264(
                path,
                (self.render(i, background) for i in range(self.frames)),
                self.fps,
                self.width,
                self.height,
            )
        else:
            raise DatasetError(f"demo video codec {codec!r}: use one of {', '.join(CODECS)}")
        return path


def truth_paths(video_path: str | os.PathLike) -> tuple[Path, Path]:
    """Where a video's ground truth lies: NAME.gt.txt (MOT Challenge tracks) and NAME.truth.json."""
    video_path = Path(video_path)
    stem = video_path.parent / video_path.stem
    return Path(f"{stem}.gt.txt"), Path(f"{stem}.truth.json")


def _write_h264(path: Path, frames, fps: int, width: int, height: int) -> None:
    try:
        import av
    except ImportError as exc:
        raise MissingDependency("av", "serve", "writing H.264 video") from exc
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "veryfast", "tune": "zerolatency"}  # no B-frames: like a camera
        for image in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="bgr24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
