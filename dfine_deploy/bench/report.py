"""The report: a terminal table in the `yolo benchmark` layout plus our columns, --json, --plot.

Every figure printed is also in the JSON (the same cell strings under "table", the raw numbers
under "rows"), so scripts never have to parse the terminal output.

An existing --json or --plot file is replaced only when it is a report of ours (`check_outputs`):
a JSON document with our "hardware" and "profile", a PNG whose Software text is `PLOT_SOFTWARE`.
"""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path
from typing import Any

from dfine_deploy.bench.runner import BenchResult, Row, summary
from dfine_deploy.bench.tables import OFFICIAL_LATENCY, OFFICIAL_LATENCY_SETUP
from dfine_deploy.errors import MissingDependency
from dfine_deploy.files import atomic_write_bytes
from dfine_deploy.ownership import claim_file

PLOT_SOFTWARE = "dfine-bench"  # the PNG text chunk "Software" of our plots
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

COLUMNS = (
    "Model",
    "Format",
    "Scope",
    "Status",
    "Size (MB)",
    "mAP50-95",
    "Inference time (ms/im)",
    "FPS",
    "Backend/provider",
    "Batch",
    "p50 (ms)",
    "p90 (ms)",
    "p99 (ms)",
    "Spread min/med/max (ms)",
    "Expected FPS",
    "Ratio",
)
DASH = "—"


def _num(value: float | None, digits: int = 1) -> str:
    return DASH if value is None else f"{value:.{digits}f}"


def cells(row: Row) -> list[str]:
    t = row.timing
    if row.noisy:  # a range, never one misleading number
        ms_cell = f"{t.min / t.batch:.2f}-{t.max / t.batch:.2f}"
        low, high = t.fps_range
        fps_cell = f"{low:.1f}-{high:.1f}"
        ratio = (
            DASH if not row.expected.fps else f"{low / row.expected.fps:.3f}-{high / row.expected.fps:.3f}"
        )
        status = "noisy machine"
    else:
        ms_cell, fps_cell = f"{t.ms_per_image:.2f}", f"{t.fps:.1f}"
        ratio = DASH if row.ratio is None else f"{row.ratio:.3f}"
        status = "ok"
    if row.verify:
        status += f", verify: {row.verify}"
    return [
        row.model,
        row.format,
        row.scope,
        status,
        _num(row.size_mb),
        _num(row.map50_95, 4),
        ms_cell,
        fps_cell,
        row.provider,
        str(row.batch),
        f"{t.p50:.2f}",
        f"{t.p90:.2f}",
        f"{t.p99:.2f}",
        f"{t.min:.2f}/{t.median:.2f}/{t.max:.2f}",
        _num(row.expected.fps),
        ratio,
    ]


def render_table(header: list[str] | tuple[str, ...], body: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *body)]
    line = lambda values: "| " + " | ".join(str(v).ljust(w) for v, w in zip(values, widths)) + " |"  # noqa: E731
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in body)])


def reference_lines(result: BenchResult) -> list[str]:
    profile = result.profile
    lines = [f"profile: --device {profile.key} ({profile.label})"]
    for row in profile.rows:
        lines.append(f"reference: {row.scenario} | {row.hardware} | {row.model} | {row.expected}")
    for model in sorted({r.model for r in result.rows}):
        if model in OFFICIAL_LATENCY:
            o = OFFICIAL_LATENCY[model]
            lines.append(
                f"official {model}: {o.latency_ms} ms, {o.fps:g} FPS, COCO AP {o.coco_ap} "
                f"({OFFICIAL_LATENCY_SETUP})"
            )
    expectations = {(r.model, r.expected.source) for r in result.rows}
    for model, source in sorted(expectations):
        lines.append(f"expected FPS for {model}: {source}")
    if profile.note:
        lines.append(f"note: {profile.note}")
    unlike = sorted(
        {f"{r.input_size[0]}x{r.input_size[1]}" for r in result.rows if tuple(r.input_size) != (640, 640)}
    )
    if unlike and any(r.expected.fps for r in result.rows):
        lines.append(
            f"note: measured at {', '.join(unlike)}; the expected figures are for 640x640, so the ratio "
            "is not like for like"
        )
    return lines


def notes(result: BenchResult) -> list[str]:
    lines = []
    for row in result.rows:
        if row.noisy:
            lines.append(
                f"noisy machine ({row.model} {row.format} {row.scope} b{row.batch}): {'; '.join(row.noise)}"
            )
    if not any(r.noisy for r in result.rows) and result.rows:
        worst = max(r.timing.round_ratio for r in result.rows)
        lines.append(f"stable: round medians within x{worst:.3f} of each other in every row")
    seen = set()
    for row in result.rows:
        key = (row.backend, row.device)
        if key in seen:
            continue
        seen.add(key)
        m = row.memory
        gpu = "n/a" if m.get("gpu_mb") is None else f"{m['gpu_mb']:.1f} MB"
        lines.append(
            f"memory ({row.backend}, {row.device}): host RSS {_num(m.get('rss_mb'))} MB, "
            f"peak {_num(m.get('peak_rss_mb'))} MB, GPU {gpu}"
        )
    power = result.hardware.power
    lines.append(
        "Jetson power mode: " + ", ".join(f"{k} {v}" for k, v in power.items())
        if result.hardware.jetson_model
        else "Jetson power mode / clocks: not readable (not a Jetson)"
    )
    r = result.request
    rounds = max((row.timing.rounds for row in result.rows), default=r.rounds)  # at most one per run
    lines.append(
        f"runs: {r.warmup} warm-up + {r.runs} timed calls in {rounds} rounds per row; frames "
        f"{r.frame_size[0]}x{r.frame_size[1]} BGR; total {result.seconds:.1f} s"
    )
    lines.append(
        "scopes: engine = the backend call on prepared arrays (host<->device copies included on a GPU); "
        "image->det = Detector.predict on frames (resize, colour, run, decode)"
    )
    return lines + result.data_lines


def build_report(result: BenchResult) -> tuple[str, dict[str, Any]]:
    """The printed text and the JSON document holding every printed figure."""
    body = [cells(r) for r in result.rows]
    refs = reference_lines(result)
    tail = notes(result)
    text = "\n".join([*refs, *result.measured_on, "", render_table(COLUMNS, body), "", *tail])
    document = summary(result)
    document.update(
        reference=refs,
        columns=list(COLUMNS),
        table=body,
        notes=tail,
        rows=[row_dict(r) for r in result.rows],
    )
    return text, document


def row_dict(row: Row) -> dict[str, Any]:
    return {
        "model": row.model,
        "format": row.format,
        "scope": row.scope,
        "status": "noisy machine" if row.noisy else "ok",
        "verify": row.verify,
        "backend": row.backend,
        "provider": row.provider,
        "device": row.device,
        "batch": row.batch,
        "size_mb": row.size_mb,
        "map50_95": row.map50_95,
        "timing": row.timing.to_dict(),
        "fps": round(row.timing.fps, 2),
        "fps_range": [round(v, 2) for v in row.timing.fps_range],
        "noise": row.noise,
        "expected": {
            "fps": row.expected.fps,
            "latency_ms": row.expected.latency_ms,
            "coco_ap": row.expected.coco_ap,
            "source": row.expected.source,
        },
        "ratio": None if row.ratio is None else round(row.ratio, 4),
        "memory": row.memory,
        "input_size": list(row.input_size),
    }


def _is_report(path: Path) -> bool:
    data = json.loads(path.read_text(encoding="utf-8"))
    return isinstance(data, dict) and {"hardware", "profile"} <= data.keys()


def _png_text(path: Path) -> dict[str, str]:
    """The tEXt chunks a PNG holds before its pixels (where matplotlib writes its metadata)."""
    text: dict[str, str] = {}
    with open(path, "rb") as fh:
        if fh.read(8) != _PNG_SIGNATURE:
            return text
        while len(header := fh.read(8)) == 8:
            length, kind = struct.unpack(">I4s", header)
            if kind in (b"IDAT", b"IEND"):
                break
            body = fh.read(length)
            fh.read(4)  # CRC
            if kind == b"tEXt":
                key, _, value = body.partition(b"\0")
                text[key.decode("latin-1")] = value.decode("latin-1")
    return text


def _is_plot(path: Path) -> bool:
    return _png_text(path).get("Software") == PLOT_SOFTWARE


def check_outputs(json_path: Path | None, plot_path: Path | None = None) -> None:
    """Refuse, before anything is measured, a --json or --plot file that is not a report of ours."""
    if json_path is not None:
        claim_file(
            json_path, command="dfine-bench", kind="a JSON report", recognise=_is_report, option="--json"
        )
    if plot_path is not None:
        claim_file(plot_path, command="dfine-bench", kind="a PNG chart", recognise=_is_plot, option="--plot")


def write_json(path: Path, document: dict[str, Any]) -> None:
    """Write a report's --json and say where."""
    atomic_write_bytes(path, json.dumps(document, indent=2, ensure_ascii=False).encode())
    print(f"json: {path}")


def write_plot(path: Path, result: BenchResult) -> None:
    """Measured FPS (median, with the min-max range) per row beside the expected figure."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingDependency("matplotlib", "train", "--plot") from exc
    rows = result.rows
    labels = [f"{r.model} {r.format} {r.scope} b{r.batch}" for r in rows]
    fps = [r.timing.fps for r in rows]
    low = [r.timing.fps - r.timing.fps_range[0] for r in rows]
    high = [r.timing.fps_range[1] - r.timing.fps for r in rows]
    figure, axis = plt.subplots(figsize=(9, 1.2 + 0.45 * len(rows)))
    positions = list(range(len(rows)))
    colours = ["tab:orange" if r.noisy else "tab:blue" for r in rows]
    axis.barh(positions, fps, xerr=[low, high], color=colours, capsize=3, label="measured (median, min-max)")
    expected = [r.expected.fps for r in rows]
    if any(e for e in expected):
        axis.scatter(
            [e or float("nan") for e in expected],
            positions,
            marker="|",
            s=300,
            color="black",
            label="expected",
        )
    axis.set_yticks(positions, labels, fontsize=8)
    axis.invert_yaxis()
    axis.set_xlabel("images per second")
    axis.set_xscale("log")
    axis.set_title(f"dfine-bench vs {result.profile.label}: {'; '.join(result.measured_on)}", fontsize=8)
    axis.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=110, metadata={"Software": PLOT_SOFTWARE})
    plt.close(figure)
    atomic_write_bytes(path, png.getvalue())  # the one writer of files: a link is followed
