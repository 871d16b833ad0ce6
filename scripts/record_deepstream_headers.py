"""Compile the DeepStream custom library against NVIDIA's own headers and record what they say.

    DFINE_DS_SOURCES=/path/to/DeepStream.git DFINE_TRT_SOURCES=/path/to/TensorRT.git \
        python scripts/record_deepstream_headers.py

DFINE_DS_SOURCES is a local clone (bare or not) of https://github.com/NVIDIA/DeepStream with its
release tags, DFINE_TRT_SOURCES one of https://github.com/NVIDIA/TensorRT (nvdsinfer_custom_impl.h
includes TensorRT's NvInfer.h and NvOnnxParser.h). For each DeepStream tag of TAGS, with the
TensorRT headers of the release that DeepStream tag's README names, this writes the headers into a
temporary folder (nothing of NVIDIA's enters this repository) and:

- builds export/deepstream/nvdsinfer_custom_impl_dfine with its own Makefile and WERROR=-Werror;
- runs tests/export/nvdsinfer_layout_probe.cpp: the enum values, struct sizes and member offsets the
  library relies on, and both entry points' signatures against the headers' (else no compile);
- runs tests/export/deepstream_lib_check.cpp, the driver that calls the library as nvinfer does.

It rewrites tests/data/deepstream_headers.json with those outputs, each tag's commit and the git
blob ids of the headers read. tests/export/test_deepstream_lib.py compiles the same probe and driver
against our transcription (tests/fakes/nvdsinfer) and requires the recorded outputs, so CI, which
has neither the sources nor the network, checks the transcription against NVIDIA's headers.
CUDA's <cuda_runtime_api.h> is stood in for by scripts/ds_headers/ (two opaque handle types).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "tests" / "data" / "deepstream_headers.json"
LIBRARY = ROOT / "export" / "deepstream" / "nvdsinfer_custom_impl_dfine"
PROBE = ROOT / "tests" / "export" / "nvdsinfer_layout_probe.cpp"
DRIVER = ROOT / "tests" / "export" / "deepstream_lib_check.cpp"
CUDA_STANDIN = Path(__file__).parent / "ds_headers"
DS_ENV, TRT_ENV = "DFINE_DS_SOURCES", "DFINE_TRT_SOURCES"
DS_REPOSITORY = "https://github.com/NVIDIA/DeepStream"
TRT_REPOSITORY = "https://github.com/NVIDIA/TensorRT"
COMMAND = (
    f"{DS_ENV}=/path/to/DeepStream.git {TRT_ENV}=/path/to/TensorRT.git "
    "python scripts/record_deepstream_headers.py"
)
HEADERS = ("includes/nvdsinfer.h", "includes/nvdsinfer_custom_impl.h")
# DeepStream tag -> the TensorRT tag whose include/ it builds against (its README's x86 row:
# 9.0.0 "TensorRT 10.14.x", 9.1.0 "TensorRT 10.16.x")
TAGS = {"v9.0.0": "v10.14", "v9.1.0": "v10.16"}


def _git(repo: Path, *args: str) -> bytes:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"error: git {' '.join(args)} in {repo}: {done.stderr.decode().strip()}")
    return done.stdout


def _source(env: str, repository: str) -> Path:
    value = os.environ.get(env, "").strip()
    if not value or not Path(value).is_dir():
        raise SystemExit(f"error: set {env} to a local clone of {repository} (now {value!r})")
    return Path(value)


def _run(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def record_tag(ds: Path, trt: Path, tag: str, trt_tag: str, work: Path) -> dict:
    """Build and run the library, probe and driver against one DeepStream tag's headers."""
    includes, trt_includes = work / "ds", work / "trt"
    includes.mkdir()
    blobs = {}
    for path in HEADERS:
        blob = _git(ds, "rev-parse", f"{tag}:{path}").decode().strip()
        blobs[path] = blob
        (includes / Path(path).name).write_bytes(_git(ds, "show", blob))
    archive = work / "trt.tar"
    archive.write_bytes(_git(trt, "archive", trt_tag, "include"))
    trt_includes.mkdir()
    subprocess.run(["tar", "-xf", str(archive), "-C", str(trt_includes)], check=True)
    system = ["-isystem", str(trt_includes / "include"), "-isystem", str(CUDA_STANDIN)]
    build = work / "lib"
    shutil.copytree(LIBRARY, build)
    made = _run(
        [
            "make",
            "-C",
            str(build),
            f"DS_INCLUDES={includes}",
            f"CUDA_INCLUDES={' '.join(system)}",
            "WERROR=-Werror",
        ]
    )
    entry = {
        "commit": _git(ds, "rev-parse", f"{tag}^{{commit}}").decode().strip(),
        "blobs": blobs,
        "tensorrt_tag": trt_tag,
        "tensorrt_commit": _git(trt, "rev-parse", f"{trt_tag}^{{commit}}").decode().strip(),
        "library_builds_with_werror": made.returncode == 0,
        "library_names_int64": "-DDFINE_NVDSINFER_HAS_INT64" in made.stdout,
        "library_errors": made.stderr[-2000:] if made.returncode else "",
    }
    library = build / "libnvdsinfer_custom_impl_dfine.so"
    for name, source in (("probe", PROBE), ("driver", DRIVER)):
        exe = work / name
        flags = ["-std=c++17", "-Wall", "-Wextra", "-Werror", "-isystem", str(includes), *system]
        done = _run(["g++", *flags, str(source), str(library), "-o", str(exe), f"-Wl,-rpath,{build}"])
        ran = _run([str(exe)]) if done.returncode == 0 else None
        entry[name] = ran.stdout.splitlines() if ran and ran.returncode == 0 else None
        if entry[name] is None:
            entry[f"{name}_errors"] = (done.stderr if done.returncode else ran.stderr)[-2000:]
    return entry


def main() -> int:
    ds, trt = _source(DS_ENV, DS_REPOSITORY), _source(TRT_ENV, TRT_REPOSITORY)
    assert shutil.which("g++") and shutil.which("make"), "g++ and make: scripts/install-system-deps.sh"
    tags = {}
    for tag, trt_tag in TAGS.items():
        with tempfile.TemporaryDirectory(prefix=f"ds-{tag}-") as work:
            tags[tag] = record_tag(ds, trt, tag, trt_tag, Path(work))
        print(
            f"{tag}: library builds {tags[tag]['library_builds_with_werror']}, "
            f"probe {'ran' if tags[tag]['probe'] else 'FAILED'}, "
            f"driver {'ran' if tags[tag]['driver'] else 'FAILED'}"
        )
    head = _git(ROOT, "rev-parse", "HEAD").decode().strip()
    record = {
        "about": "What NVIDIA's DeepStream nvdsinfer headers say to our custom parser library"
        " (export/deepstream): build verdict, layout probe and driver outputs per DeepStream tag;"
        " facts only, no NVIDIA source. See export/deepstream/README.md.",
        "repository": DS_REPOSITORY,
        "tensorrt_repository": TRT_REPOSITORY,
        "recorded": {
            "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": COMMAND,
            "dfine_deploy_commit": head,
        },
        "tags": tags,
    }
    RECORD.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {RECORD.relative_to(ROOT)}; review `git diff` and commit it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
