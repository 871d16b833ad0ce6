"""The recorded verdicts of NVIDIA's trtexec option parser, and the checks made against them.

tests/data/trt_oracle_verdicts.json holds facts only: per TensorRT tag the commit and the git blob
ids of what the oracle was built from, and per trtexec line (the argv, its sha256) whether that
tag's parser ACCEPTED or REJECTED it, with the parser's own messages. `make test` compares the
product's current lines with it and needs neither NVIDIA's sources nor the network;
`scripts/record_trt_oracle.py` rewrites it from a local NVIDIA/TensorRT clone (sources.py).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from scripts.trt_oracle.sources import REPOSITORY, SOURCES_ENV

ROOT = Path(__file__).parents[2]
RECORD = ROOT / "tests" / "data" / "trt_oracle_verdicts.json"
RECORD_ENV = "DFINE_TRT_ORACLE_RECORD"  # set by scripts/record_trt_oracle.py: write, do not compare
COMMAND = f"{SOURCES_ENV}=/path/to/TensorRT.git python scripts/record_trt_oracle.py"
SHOWN_VALUE = 200
ARTIFACT = "ARTIFACT"  # stands for the artifact folder in a recorded build_engine.sh line
BASE = ("--onnx=model.onnx", "--saveEngine=model.engine")
# Lines the product never emits, recorded to show the parser can fail, in NVIDIA's words: what one
# version's trtexec has, another's refuses. (tag, extra flag, the expected errors; [] = ACCEPTED)
PROBES: tuple[tuple[str, str, list[str] | None], ...] = (
    ("8.5.2", "--stronglyTyped", ["Unknown option: --stronglyTyped "]),
    ("v8.6.1", "--stronglyTyped", ["Unknown option: --stronglyTyped "]),
    ("v10.3.0", "--stronglyTyped", []),
    ("v11.1", "--fp16", ["Unknown option: --fp16 "]),
    ("8.5.2", "--layerOutputTypes=a:fp33", ["Invalid DataType fp33"]),
    ("8.5.2", "--skipInference", ["Unknown option: --skipInference "]),
)


@dataclass(frozen=True)
class Line:
    """One trtexec line for one tag: where it comes from, and its arguments after the program name."""

    tag: str
    source: str
    argv: tuple[str, ...]

    @property
    def sha256(self) -> str:
        return hashlib.sha256("\0".join(self.argv).encode()).hexdigest()

    @property
    def text(self) -> str:
        """The line as recorded: an option value over SHOWN_VALUE characters (the 8.x layer lists,
        ~20 KB each) is shown by its entry count and sha256; the argv's own sha256 stays exact."""
        shown = []
        for arg in self.argv:
            option, sep, value = arg.partition("=")
            if sep and len(value) > SHOWN_VALUE:
                digest = hashlib.sha256(value.encode()).hexdigest()
                arg = f"{option}=<{value.count(',') + 1} entries, sha256 {digest}>"
            shown.append(arg)
        return " ".join(("trtexec", *shown))


def probe_lines() -> list[Line]:
    return [Line(tag, f"probe {flag}", (*BASE, flag)) for tag, flag, _ in PROBES]


def load(path: Path = RECORD) -> dict:
    return json.loads(path.read_text())


def verdicts_by_line(record: dict) -> dict[tuple[str, str], dict]:
    """(tag, argv sha256) -> the recorded entry, lines and probes alike."""
    return {(entry["tag"], entry["argv_sha256"]): entry for entry in [*record["lines"], *record["probes"]]}


def problems(lines: list[Line], record: dict) -> list[str]:
    """One line per emitted trtexec line that has no recorded verdict or a REJECTED one."""
    known = verdicts_by_line(record)
    out = []
    for line in lines:
        entry = known.get((line.tag, line.sha256))
        if entry is None:
            out.append(
                f"{line.tag} {line.source}: this line has no recorded verdict of NVIDIA's parser "
                f"(it changed); re-record with {COMMAND}"
            )
        elif entry["verdict"] != "ACCEPTED":
            out.append(f"{line.tag} {line.source}: NVIDIA's parser REJECTED it: {'; '.join(entry['errors'])}")
    return out


def entry(line: Line, accepted: bool, errors: list[str], warnings: list[str]) -> dict:
    return {
        "tag": line.tag,
        "from": line.source,
        "argv_sha256": line.sha256,
        "line": line.text,
        "verdict": "ACCEPTED" if accepted else "REJECTED",
        "errors": errors,
        "warnings": warnings,
    }


def write(lines: list[dict], probes: list[dict], tags: dict[str, dict], path: Path = RECORD) -> None:
    """Write the record: the verdicts, what each tag's oracle was built from, when and by what."""
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    record = {
        "about": "Verdicts of trtexec's own option parser (NVIDIA/TensorRT samples/common/sampleOptions.cpp)"
        " per tag on every trtexec line dfine-deploy emits; facts only, no NVIDIA source."
        " See docs/tensorrt.md.",
        "repository": REPOSITORY,
        "recorded": {
            "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": COMMAND,
            "dfine_deploy_commit": head,
        },
        "tags": tags,
        "lines": sorted(lines, key=lambda e: (e["tag"], e["from"])),
        "probes": probes,
    }
    path.write_text(json.dumps(record, indent=1) + "\n")
