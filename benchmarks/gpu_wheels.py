"""Prepare the wheel folder benchmarks/gpu_check.sh installs on a GPU host without network.

The host we can sometimes use has Python 3.12 and torch (CUDA 13) but no network; what the checks
need beyond that comes from this folder, at most ~60 MiB. pip resolves the checks' requirements for
that host (CPython 3.12, manylinux x86-64) and keeps the pure-Python wheels (`py3-none-any`) of
what the host lacks, plus our own wheel; a binary wheel is kept only when named with `--binary`
(they are large: OpenCV alone is ~50 MiB). `manifest.json` lists each wheel, its size, and the
binary packages left out, which the host must already have (the check reports a missing one as
"not installed").

    python benchmarks/gpu_wheels.py                      # -> benchmarks/gpu_wheels/
    python benchmarks/gpu_wheels.py --have torch numpy opencv-python-headless --binary onnxruntime

It writes only into --out, a folder it made itself (or empty); an older run's wheels there are
replaced, and the count is printed.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What the checks import beyond the host's torch: the runtime, the export (onnx, onnxslim,
# onnxconverter-common), training (scipy, faster-coco-eval) and NVML (nvidia-ml-py, for the trainer's
# GPU utilisation samples).
NEEDS = [
    "numpy>=1.24",
    "pyyaml>=6.0",
    "opencv-python-headless>=4.8",
    "pillow>=9.4",
    "tqdm>=4.66",
    "onnxruntime>=1.17",
    "onnx>=1.16",
    "onnxslim>=0.1.40",
    "onnxconverter-common>=1.14",
    "scipy>=1.10",
    "faster-coco-eval>=1.6.5",
    "nvidia-ml-py>=12",
]
# The GPU host's own packages (torch 2.11 and what its wheel pulls in).
HOST_HAS = ["torch", "torchvision", "filelock", "typing-extensions", "sympy", "mpmath", "networkx"]
HOST_HAS += ["jinja2", "markupsafe", "fsspec", "setuptools", "triton"]
MARKER = ".dfine-gpu-wheels"
LIMIT_MIB = 60


def build_own_wheel(out: Path, scratch: Path) -> subprocess.CompletedProcess:
    """`pip wheel` of this project from a copy (setuptools writes build/ and *.egg-info beside
    the sources: never into the repository)."""
    scratch.mkdir(parents=True, exist_ok=True)
    for part in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / part, scratch / part)
    shutil.copytree(
        ROOT / "dfine_deploy", scratch / "dfine_deploy", ignore=shutil.ignore_patterns("__pycache__")
    )
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(scratch)]
    return subprocess.run(cmd, capture_output=True, text=True)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(path: Path) -> str:
    return canonical(path.name.split("-")[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "gpu_wheels")
    parser.add_argument("--have", nargs="*", default=[], help="more packages the host already has")
    parser.add_argument("--binary", nargs="*", default=[], help="binary wheels to keep anyway")
    parser.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
    parser.add_argument("--python-version", default="3.12")
    args = parser.parse_args(argv)
    out: Path = args.out
    if out.exists() and any(out.iterdir()) and not (out / MARKER).exists():
        print(
            f"gpu_wheels: {out} holds files this script did not write; choose an empty --out", file=sys.stderr
        )
        return 2
    have = {canonical(n) for n in HOST_HAS + args.have}
    binary_ok = {canonical(n) for n in args.binary}
    with tempfile.TemporaryDirectory() as tmp:
        download = Path(tmp) / "all"
        platforms = [f"--platform=manylinux_2_{m}_x86_64" for m in range(28, 16, -1)]
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(download)]
        cmd += [f"--python-version={args.python_version}", *platforms, *NEEDS]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"gpu_wheels: pip download failed: {done.stderr.strip().splitlines()[-1]}", file=sys.stderr)
            return 2
        ours = build_own_wheel(Path(tmp) / "ours", Path(tmp) / "src")
        if ours.returncode != 0:
            print(f"gpu_wheels: building our wheel failed: {ours.stderr[-400:]}", file=sys.stderr)
            return 2
        kept, left_out = [], []
        for wheel in sorted(download.glob("*.whl")):
            name = wheel_name(wheel)
            if name in have:
                continue
            if wheel.name.endswith("-none-any.whl") or name in binary_ok:
                kept.append(wheel)
            else:
                left_out.append(name)
        kept += sorted((Path(tmp) / "ours").glob("*.whl"))
        total = sum(w.stat().st_size for w in kept) / 2**20
        if total > args.limit_mib:
            largest = ", ".join(
                f"{w.name} {w.stat().st_size / 2**20:.1f} MiB"
                for w in sorted(kept, key=lambda w: -w.stat().st_size)[:3]
            )
            print(
                f"gpu_wheels: {total:.1f} MiB is over --limit-mib {args.limit_mib:g} (largest: {largest})",
                file=sys.stderr,
            )
            return 2
        replaced = 0
        if out.exists():
            for old in out.glob("*.whl"):
                old.unlink()
                replaced += 1
        out.mkdir(parents=True, exist_ok=True)
        (out / MARKER).write_text("written by benchmarks/gpu_wheels.py\n")
        for wheel in kept:
            shutil.copy2(wheel, out / wheel.name)
    manifest = {
        "python": args.python_version,
        "wheels": {w.name: round(w.stat().st_size / 2**20, 2) for w in sorted(out.glob("*.whl"))},
        "total_mib": round(total, 1),
        "host_must_have": sorted(set(left_out)),
        "host_has_assumed": sorted(have),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    print(
        f"gpu_wheels: {len(kept)} wheels, {total:.1f} MiB in {out} ({replaced} older wheels replaced); "
        f"the host must already have: {', '.join(manifest['host_must_have']) or 'nothing more'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
