"""Regenerate dfine_deploy/export/trt_operators/trt*.json from onnx-tensorrt's docs/operators.md.

Each TensorRT release pins the ONNX parser it ships as the `parsers/onnx` submodule of
NVIDIA/TensorRT; the commit of that submodule at the release tag is the `ref` below, and the
table is read from `docs/operators.md` at that commit of onnx/onnx-tensorrt. What is kept: the
opset range from the page's first sentence, every operator marked `Y`, and the restriction text of
the operators in LIMITED_OPS (the ones our graphs contain that carry a limit somewhere), which
`dfine_deploy.export.targets.check_parser_support` turns into checks.

    python scripts/update_trt_operator_tables.py                       # download from GitHub
    python scripts/update_trt_operator_tables.py --git ~/onnx-tensorrt  # a local clone instead
    python scripts/update_trt_operator_tables.py --markdown 11.1=ops.md # one version from a file
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "dfine_deploy" / "export" / "trt_operators"
SOURCE = "https://github.com/onnx/onnx-tensorrt"
DOC_PATH = "docs/operators.md"


@dataclass(frozen=True)
class ParserPin:
    """Where one TensorRT version's ONNX parser is pinned."""

    tag: str  # the NVIDIA/TensorRT tag whose parsers/onnx submodule pins it
    commit: str  # that onnx/onnx-tensorrt commit


# TensorRT version (a `tensorrt_plan.PROFILES` row's operator_table) -> its parser's pin
VERSIONS: dict[str, ParserPin] = {
    "8.5": ParserPin(tag="8.5.2", commit="7583da4c62475e84b7be31f4b8fb0c101873d434"),
    "8.6": ParserPin(tag="v8.6.1", commit="6ba67d3428e05f690145373ca87fb8d32f98df45"),
    "10.3": ParserPin(tag="v10.3.0", commit="62bdde2a04fcd53c2409cb895ee18db445b7e755"),
    "10.14": ParserPin(tag="v10.14", commit="c72727708d4ed8a379c04c4ea235c157ce9c3870"),
    "11.1": ParserPin(tag="v11.1", commit="7c51a63a719180eb5160c874c111746f3fb46a6b"),
}
# Operators of our graphs (any target) whose row carries a restriction in some version.
LIMITED_OPS = (
    "GatherElements",
    "LayerNormalization",
    "MaxPool",
    "Pad",
    "ReduceMax",
    "ReduceMean",
    "ReduceSum",
    "Resize",
    "Slice",
    "Split",
    "Squeeze",
    "TopK",
    "Unsqueeze",
)
_OPSET_RANGE = re.compile(r"inclusive range of opset (\d+) to opset (\d+)", re.IGNORECASE)
_OPSET_MAX = re.compile(r"supports operators up to Opset (\d+)", re.IGNORECASE)


def parse(markdown: str) -> dict:
    """The opset range, the supported operators and the kept restrictions of one operators.md."""
    if m := _OPSET_RANGE.search(markdown):
        opset_min, opset_max = int(m.group(1)), int(m.group(2))
    elif m := _OPSET_MAX.search(markdown):
        opset_min, opset_max = 1, int(m.group(1))
    else:
        raise ValueError("no opset range in the first paragraph; has the page's wording changed?")
    ops, restrictions = [], {}
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or cells[1] != "Y" or not re.fullmatch(r"[A-Za-z0-9]+", cells[0]):
            continue
        ops.append(cells[0])
        text = cells[3] if len(cells) > 3 else ""
        if cells[0] in LIMITED_OPS and text:
            restrictions[cells[0]] = text
    if not ops:
        raise ValueError("no operator marked Y; has the table's layout changed?")
    return {
        "opset_min": opset_min,
        "opset_max": opset_max,
        "ops": sorted(ops, key=str.lower),
        "restrictions": dict(sorted(restrictions.items())),
    }


def read_markdown(version: str, git_dir: Path | None) -> str:
    commit = VERSIONS[version].commit
    if git_dir is not None:
        return subprocess.run(
            ["git", "-C", str(git_dir), "show", f"{commit}:{DOC_PATH}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    url = f"https://raw.githubusercontent.com/onnx/onnx-tensorrt/{commit}/{DOC_PATH}"
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read().decode()


def table(version: str, markdown: str) -> dict:
    pin = VERSIONS[version]
    return {
        "tensorrt": version,
        "source": SOURCE,
        "ref": pin.commit,
        "ref_from": f"parsers/onnx submodule of NVIDIA/TensorRT at tag {pin.tag}",
        "path": DOC_PATH,
        **parse(markdown),
    }


def write(data: dict) -> Path:
    path = OUT / f"trt{data['tensorrt']}.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--git", type=Path, help="a clone of onnx/onnx-tensorrt with the pinned commits")
    p.add_argument(
        "--markdown",
        action="append",
        default=[],
        metavar="VERSION=FILE",
        help="read one version's operators.md from a file (repeatable)",
    )
    args = p.parse_args()
    files = dict(item.split("=", 1) for item in args.markdown)
    for version in files or VERSIONS:
        markdown = Path(files[version]).read_text() if version in files else read_markdown(version, args.git)
        print(write(table(version, markdown)))


if __name__ == "__main__":
    main()
