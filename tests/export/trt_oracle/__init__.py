"""trtexec's own option parser, per TensorRT tag, as a test oracle (see docs/tensorrt.md).

`parse(tag, argv)` runs an argv through NVIDIA's `samples/common/sampleOptions.cpp` of that tag
(vendored in nvidia/<tag>/, provenance inside), compiled once with driver.cpp and the stubs in
stubs/ into a cache folder keyed by the tag and the hash of every source. g++ is a system
requirement of the test suite (scripts/install-system-deps.sh): without it the oracle fails, never
skips.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
NVIDIA = HERE / "nvidia"
TAGS = tuple(sorted(p.name for p in NVIDIA.iterdir() if p.is_dir()))
STATIC_PLUGIN_TAGS = ("v10.16", "v11.1")  # trtexec's main sets enableStaticPlugins before parsing
CACHE = Path(os.environ.get("DFINE_TRT_ORACLE_CACHE", Path(tempfile.gettempdir()) / "dfine-trt-oracle"))


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    errors: list[str]
    warnings: list[str]


def _sources(tag: str) -> list[Path]:
    return sorted([*(NVIDIA / tag).iterdir(), *(HERE / "stubs").iterdir(), HERE / "driver.cpp"])


def binary(tag: str) -> Path:
    """The oracle executable for `tag`, compiled on first use (a few seconds per tag)."""
    compiler = shutil.which("g++")
    assert compiler, "g++ is missing: run scripts/install-system-deps.sh (apt-get install g++)"
    digest = hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in _sources(tag))).hexdigest()[
        :16
    ]
    folder = CACHE / f"{tag}-{digest}"
    exe = folder / "trtexec-options"
    if exe.is_file():
        return exe
    CACHE.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f"{tag}-", dir=CACHE))
    for name in ("sampleOptions.cpp", "sampleOptions.h"):
        (build / name).write_bytes(gzip.decompress((NVIDIA / tag / f"{name}.gz").read_bytes()))
    defines = ["-DORACLE_STATIC_PLUGINS"] if tag in STATIC_PLUGIN_TAGS else []
    done = subprocess.run(
        [
            compiler,
            "-std=c++17",
            "-O0",
            "-w",
            *defines,
            f"-I{build}",
            f"-I{NVIDIA / tag}",
            f"-I{HERE / 'stubs'}",
            str(build / "sampleOptions.cpp"),
            str(HERE / "driver.cpp"),
            "-o",
            str(build / exe.name),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, (
        f"the trtexec option oracle for {tag} did not compile:\n{done.stderr[-4000:]}"
    )
    try:
        build.rename(folder)  # atomic: a parallel session that won keeps its copy
    except OSError:
        shutil.rmtree(build)
    return exe


def build_all() -> None:
    """Compile every tag's oracle that is not cached yet, side by side (one g++ per core)."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(binary, TAGS))


def parse(tag: str, argv: list[str]) -> Verdict:
    """Run `argv` (without the program name) through trtexec's option parser of `tag`."""
    done = subprocess.run([str(binary(tag)), *argv], capture_output=True, text=True, timeout=60, check=False)
    lines = done.stdout.splitlines()
    assert lines and lines[-1] in ("ACCEPTED", "REJECTED"), f"oracle output: {done.stdout!r} {done.stderr!r}"
    accepted = lines[-1] == "ACCEPTED"
    assert accepted == (done.returncode == 0)
    return Verdict(
        accepted,
        [line[2:] for line in lines if line.startswith("E ")],
        [line[2:] for line in lines if line.startswith("W ")],
    )
