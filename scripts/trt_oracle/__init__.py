"""trtexec's own option parser, per TensorRT tag, as a test oracle (see docs/tensorrt.md).

NVIDIA's parser is not kept in this repository. `parse(tag, argv)` compiles it from the local
NVIDIA/TensorRT clone named by DFINE_TRT_SOURCES (sources.py) with our driver.cpp and the stand-in
headers in stubs/, into a cache folder keyed by the tag's commit and the hash of our own files, and
runs the argv through it. `make test` does not need the clone: it checks the product's lines
against the verdicts recorded with it (record.py, scripts/record_trt_oracle.py). g++ is a system
requirement of the live oracle (scripts/install-system-deps.sh): without it the oracle fails.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from scripts.trt_oracle.sources import TagReader, TagSources, sources_dir, write_tag_sources

HERE = Path(__file__).parent


@dataclass(frozen=True)
class OracleTag:
    """One NVIDIA/TensorRT source tag the oracle is built from."""

    tag: str
    profile: str  # the `tensorrt_plan.PROFILES` row whose lines it judges
    version: str  # the version build_engine.sh is told it runs
    stands_for: str  # the release it stands for
    static_plugins: bool = False  # trtexec's main sets enableStaticPlugins before parsing


_TAGS = (
    OracleTag(
        "8.5.2", profile="trt8.5", version="8.5.2.2", stands_for="--target jetpack5 (JetPack 5.1 ships 8.5.2)"
    ),
    OracleTag(
        "v8.6.1",
        profile="trt8.6",
        version="8.6.2.3",
        stands_for="--target jetpack6.0 (JetPack 6.0 ships 8.6.2, which has no tag)",
    ),
    OracleTag(
        "v10.3.0", profile="trt10.3", version="10.3.0.30", stands_for="--target jetpack6 (JetPack 6.1/6.2)"
    ),
    OracleTag(
        "v10.16",
        profile="trt10.3",
        version="10.16.1.11",
        stands_for="trt10.3 on x86 with a CUDA 12 driver ([trt-cu12])",
        static_plugins=True,
    ),
    OracleTag(
        "v10.13.3", profile="trt10.14", version="10.13.3.9", stands_for="--target jetpack7 on JetPack 7.0"
    ),
    OracleTag(
        "v10.14",
        profile="trt10.14",
        version="10.14.1.48",
        stands_for="--target jetpack7 on JetPack 7.1 and DeepStream 9.0",
    ),
    OracleTag("v11.1", profile="trt11", version="11.1.0.7", stands_for="--target trt11", static_plugins=True),
)
TAGS: dict[str, OracleTag] = {row.tag: row for row in _TAGS}
CACHE = Path(os.environ.get("DFINE_TRT_ORACLE_CACHE", Path(tempfile.gettempdir()) / "dfine-trt-oracle"))
OUR_FILES = sorted([*(HERE / "stubs").iterdir(), HERE / "driver.cpp", HERE / "sources.py"])


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    errors: list[str]
    warnings: list[str]


def _repo() -> Path:
    repo = sources_dir()
    assert repo, "the live oracle needs DFINE_TRT_SOURCES (a clone of NVIDIA/TensorRT)"
    return repo


@cache
def binary(tag: str) -> tuple[Path, TagSources]:
    """The oracle executable for `tag` and what it was built from, compiled on first use."""
    compiler = shutil.which("g++")
    assert compiler, "g++ is missing: run scripts/install-system-deps.sh (apt-get install g++)"
    repo = _repo()
    commit = TagReader(repo, tag).used.commit
    ours = hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in OUR_FILES)).hexdigest()
    folder = CACHE / f"{tag}-{commit[:12]}-{ours[:12]}"
    exe = folder / "trtexec-options"
    if exe.is_file():
        return exe, TagSources(**{"tag": tag, **_read_used(folder)})
    CACHE.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f"{tag}-", dir=CACHE))
    used = write_tag_sources(repo, tag, build)
    defines = ["-DORACLE_STATIC_PLUGINS"] if TAGS[tag].static_plugins else []
    done = subprocess.run(
        [
            compiler,
            "-std=c++17",
            "-O0",
            "-w",
            *defines,
            f"-I{build}",
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
    (build / "used.txt").write_text(
        used.commit + "\n" + "".join(f"{path} {blob}\n" for path, blob in used.blobs.items())
    )
    try:
        build.rename(folder)  # atomic: a parallel session that won keeps its copy
    except OSError:
        shutil.rmtree(build)
    return exe, used


def _read_used(folder: Path) -> dict:
    commit, *rows = (folder / "used.txt").read_text().splitlines()
    return {"commit": commit, "blobs": dict(row.split(" ", 1) for row in rows)}


def parse(tag: str, argv: list[str]) -> Verdict:
    """Run `argv` (without the program name) through trtexec's option parser of `tag`."""
    exe, _ = binary(tag)
    done = subprocess.run([str(exe), *argv], capture_output=True, text=True, timeout=60, check=False)
    lines = done.stdout.splitlines()
    assert lines and lines[-1] in ("ACCEPTED", "REJECTED"), f"oracle output: {done.stdout!r} {done.stderr!r}"
    accepted = lines[-1] == "ACCEPTED"
    assert accepted == (done.returncode == 0)
    return Verdict(
        accepted,
        [line[2:] for line in lines if line.startswith("E ")],
        [line[2:] for line in lines if line.startswith("W ")],
    )
