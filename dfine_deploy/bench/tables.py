"""The figures users quote, as data: the hardware-selection table, the official latency table,
and the device profiles `dfine-bench --device` compares against.

Sources: the official D-FINE README (single T4, TensorRT 10.4, FP16, batch 1, 640x640) and the
hardware-selection table users work from. Where no public D-FINE figure exists (any Jetson), a
profile says so rather than inventing one.
"""

from __future__ import annotations

from dataclasses import dataclass

MODEL_SIZES = ("dfine-n", "dfine-s", "dfine-m", "dfine-l", "dfine-x")


@dataclass(frozen=True)
class LatencyRow:
    """One row of the official latency table."""

    model: str
    latency_ms: float
    fps: float
    coco_ap: float
    obj365_coco_ap: float | None


OFFICIAL_LATENCY_SETUP = "single T4, TensorRT 10.4, FP16, batch 1, 640x640, engine only"
OFFICIAL_LATENCY: dict[str, LatencyRow] = {
    row.model: row
    for row in (
        LatencyRow("dfine-n", 2.12, 472, 42.8, None),
        LatencyRow("dfine-s", 3.49, 287, 48.5, 50.7),
        LatencyRow("dfine-m", 5.62, 178, 52.3, 55.1),
        LatencyRow("dfine-l", 8.07, 124, 54.0, 57.3),
        LatencyRow("dfine-x", 12.89, 78, 55.8, 59.3),
    )
}


@dataclass(frozen=True)
class HardwareRow:
    """One row of the hardware-selection table, as users quote it."""

    scenario: str
    hardware: str
    model: str
    expected: str  # the cell as written
    value: float
    unit: str  # "FPS" | "epochs/hour" | "COCO AP"


HARDWARE_SELECTION: tuple[HardwareRow, ...] = (
    HardwareRow("edge inference", "Jetson AGX Xavier", "dfine-n", "472 FPS", 472, "FPS"),
    HardwareRow("cloud inference", "2 x T4", "dfine-s", "349 FPS", 349, "FPS"),
    HardwareRow("fast training iterations", "4 x V100", "dfine-m", "5 epochs / hour", 5, "epochs/hour"),
    HardwareRow("high-accuracy research", "8 x A100", "dfine-x", "COCO AP 55.8", 55.8, "COCO AP"),
)


@dataclass(frozen=True)
class Profile:
    """A `--device` choice: what hardware it names and how to recognise it."""

    key: str
    label: str  # "Jetson AGX Xavier"
    kind: str  # "jetson" | "gpu" | "cpu"
    match: tuple[str, ...]  # lower-case substrings of the device-tree model / GPU name
    rows: tuple[HardwareRow, ...]  # hardware-selection rows for this hardware
    note: str = ""


PROFILES: dict[str, Profile] = {
    p.key: p
    for p in (
        Profile(
            key="jetson",
            label="Jetson AGX Xavier",
            kind="jetson",
            match=("xavier",),
            rows=HARDWARE_SELECTION[:1],
            note="472 FPS is also the official single-T4 figure for D-FINE-N; no public D-FINE "
            "figure measured on a Jetson exists",
        ),
        Profile(
            key="jetson-orin",
            label="Jetson Orin",
            kind="jetson",
            match=("orin",),
            rows=(),
            note="no public D-FINE figure exists for Jetson Orin: the T4 figures are shown for scale only",
        ),
        Profile(key="t4", label="NVIDIA T4", kind="gpu", match=("t4",), rows=HARDWARE_SELECTION[1:2]),
        Profile(
            key="a100",
            label="NVIDIA A100",
            kind="gpu",
            match=("a100",),
            rows=HARDWARE_SELECTION[3:4],
            note="the A100 row is an accuracy figure; speed is compared with the T4 table",
        ),
        Profile(
            key="v100",
            label="NVIDIA V100",
            kind="gpu",
            match=("v100",),
            rows=HARDWARE_SELECTION[2:3],
            note="the V100 row is a training figure (dfine-bench --train); speed is compared with the "
            "T4 table",
        ),
        Profile(
            key="cpu",
            label="CPU",
            kind="cpu",
            match=(),
            rows=(),
            note="no official CPU figures exist; community reports for onnxruntime on a CPU: D-FINE-N "
            "about 110 ms (i7-6700K, busy machine), D-FINE-M 150.6 ms (i5-12400F)",
        ),
    )
}

# community CPU figures (onnxruntime, 640, batch 1): model -> (ms, where measured)
CPU_COMMUNITY_MS: dict[str, tuple[float, str]] = {
    "dfine-n": (110.0, "i7-6700K, onnxruntime, busy machine (Peterande/D-FINE#266)"),
    "dfine-m": (150.6, "i5-12400F, onnxruntime (custom_d_fine README)"),
}


@dataclass(frozen=True)
class Expectation:
    fps: float | None
    latency_ms: float | None
    coco_ap: float | None
    source: str


def expected_for(profile: Profile, model: str) -> Expectation:
    """The figure a measurement of `model` on `profile` hardware is compared with."""
    official = OFFICIAL_LATENCY.get(model)
    ap = official.coco_ap if official else None
    if profile.kind == "cpu":
        if model in CPU_COMMUNITY_MS:
            ms, where = CPU_COMMUNITY_MS[model]
            return Expectation(round(1000 / ms, 1), ms, ap, f"community: {where}")
        return Expectation(None, None, ap, "no CPU figure published for this size")
    if profile.kind == "jetson":  # the hardware-selection row is the only Jetson figure users have
        for row in profile.rows:
            if row.model == model and row.unit == "FPS":
                return Expectation(
                    row.value,
                    round(1000 / row.value, 2),
                    ap,
                    f"{row.scenario}: {row.hardware}, {row.expected}",
                )
        return Expectation(None, None, ap, f"no published D-FINE figure for {profile.label}")
    # a GPU is compared per card with the official single-T4 table (the 2 x T4 row is two cards)
    if official is None:
        return Expectation(None, None, None, "not a D-FINE size: no official figure")
    return Expectation(official.fps, official.latency_ms, ap, f"official: {OFFICIAL_LATENCY_SETUP}")
