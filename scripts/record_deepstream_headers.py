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
- runs tests/export/deepstream_lib_check.cpp, the driver that calls the library as nvinfer does;
- builds export/deepstream/nvmsgconv_dfine (the nvmsgconv payload library) with its own Makefile and
  WERROR=-Werror against the tag's nvdsmeta_schema.h and nvmsgconv.h, and runs
  tests/export/nvmsgconv_layout_probe.cpp and tests/export/nvmsgconv_check.cpp (the driver that
  loads and calls it as gst-nvmsgconv does);
- reads deepstream-app's config parser sources and records, per config group our
  deepstream_app_dfine.txt uses, the keys the parser accepts (every other key it warns about as
  unknown and ignores).

It rewrites tests/data/deepstream_headers.json with those outputs, each tag's commit and the git
blob ids of the headers read. tests/export/test_deepstream_lib.py compiles the same probe and driver
against our transcription (tests/fakes/nvdsinfer) and requires the recorded outputs, so CI, which
has neither the sources nor the network, checks the transcription against NVIDIA's headers.
CUDA's <cuda_runtime_api.h> and GLib's <glib.h> are stood in for by scripts/ds_headers/ (opaque
handle types; GLib's scalar type names).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "tests" / "data" / "deepstream_headers.json"
LIBRARY = ROOT / "export" / "deepstream" / "nvdsinfer_custom_impl_dfine"
PROBE = ROOT / "tests" / "export" / "nvdsinfer_layout_probe.cpp"
DRIVER = ROOT / "tests" / "export" / "deepstream_lib_check.cpp"
MSGCONV_LIBRARY = ROOT / "export" / "deepstream" / "nvmsgconv_dfine"
MSGCONV_PROBE = ROOT / "tests" / "export" / "nvmsgconv_layout_probe.cpp"
MSGCONV_DRIVER = ROOT / "tests" / "export" / "nvmsgconv_check.cpp"
CUDA_STANDIN = Path(__file__).parent / "ds_headers"
DS_ENV, TRT_ENV = "DFINE_DS_SOURCES", "DFINE_TRT_SOURCES"
DS_REPOSITORY = "https://github.com/NVIDIA/DeepStream"
TRT_REPOSITORY = "https://github.com/NVIDIA/TensorRT"
COMMAND = (
    f"{DS_ENV}=/path/to/DeepStream.git {TRT_ENV}=/path/to/TensorRT.git "
    "python scripts/record_deepstream_headers.py"
)
HEADERS = ("includes/nvdsinfer.h", "includes/nvdsinfer_custom_impl.h")
MSGCONV_HEADERS = ("includes/nvdsmeta_schema.h", "src/utils/nvmsgconv/nvmsgconv.h")
# deepstream-app's config parser: the key names (#define ... "key") and the functions comparing them
PARSER_SOURCES = (
    "src/apps/common/includes/deepstream_config_file_parser.h",
    "src/apps/common/src/deepstream_config_file_parser.c",
    "src/apps/sample_apps/deepstream-app/deepstream_app_config_parser.c",
)
# config group (digits of [source0], [sink1] dropped) -> the parser functions that read its keys;
# parse_sink hands the msg-conv-* keys of a type=6 sink to parse_msgconv
GROUP_PARSERS = {
    "application": ("parse_app",),
    "tiled-display": ("parse_tiled_display",),
    "source": ("parse_source",),
    "streammux": ("parse_streammux",),
    "primary-gie": ("parse_gie",),
    "tracker": ("parse_tracker",),
    "osd": ("parse_osd",),
    "sink": ("parse_sink", "parse_msgconv"),
}
# DeepStream tag -> the TensorRT tag whose include/ it builds against (its README's x86 row:
# 9.0.0 "TensorRT 10.14.x", 9.1.0 "TensorRT 10.16.x")
TAGS = {"v9.0.0": "v10.14", "v9.1.0": "v10.16"}


def _blobs(ds: Path, tag: str, paths: Sequence[str]) -> dict[str, str]:
    """The git blob id of each of `paths` at `tag`."""
    return {path: _git(ds, "rev-parse", f"{tag}:{path}").decode().strip() for path in paths}


def _copy_headers(ds: Path, tag: str, paths: Sequence[str], folder: Path) -> dict[str, str]:
    """`paths` at `tag` written flat into a new `folder`; their blob ids."""
    folder.mkdir()
    blobs = _blobs(ds, tag, paths)
    for path, blob in blobs.items():
        (folder / Path(path).name).write_bytes(_git(ds, "show", blob))
    return blobs


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


def accepted_keys(sources: list[str]) -> dict[str, list[str]]:
    """Per config group of GROUP_PARSERS, the keys its parser functions compare `*key` with."""
    text = "\n".join(sources)
    names = dict(re.findall(r'^#define\s+(\w+)\s+"([^"]*)"', text, flags=re.M))
    # a function definition starts at column 0 with its name (the return type is on the line above)
    starts = [(m.group(1), m.start()) for m in re.finditer(r"^(\w+)\s*\(", text, flags=re.M)]
    bodies: dict[str, str] = {}
    for (name, start), (_, end) in zip(starts, [*starts[1:], ("", len(text))], strict=True):
        bodies[name] = bodies.get(name, "") + text[start:end]
    keys = {}
    for group, functions in GROUP_PARSERS.items():
        found = set()
        for function in functions:
            if function not in bodies:
                raise SystemExit(f"error: {function} not found in {', '.join(PARSER_SOURCES)}")
            for token in re.findall(r'g_strcmp0\s*\(\s*\*key\s*,\s*(\w+|"[^"]*")\s*\)', bodies[function]):
                found.add(token.strip('"') if token.startswith('"') else names[token])
        keys[group] = sorted(found)
    return keys


def record_msgconv(ds: Path, tag: str, work: Path) -> dict:
    """Build and run the nvmsgconv payload library, its probe and its driver against one tag."""
    includes = work / "msgconv-includes"
    blobs = _copy_headers(ds, tag, MSGCONV_HEADERS, includes)
    glib = f"-isystem {CUDA_STANDIN}"
    build = work / "msgconv"
    shutil.copytree(MSGCONV_LIBRARY, build)
    made = _run(
        [
            "make",
            "-C",
            str(build),
            f"DS_INCLUDES={includes}",
            f"MSGCONV_INCLUDES={includes}",
            f"GLIB_CFLAGS={glib}",
            "WERROR=-Werror",
        ]
    )
    entry = {
        "msgconv_blobs": blobs,
        "msgconv_library_builds_with_werror": made.returncode == 0,
        "msgconv_library_errors": made.stderr[-2000:] if made.returncode else "",
    }
    library = build / "libnvmsgconv_dfine.so"
    for name, source, run in (
        ("msgconv_probe", MSGCONV_PROBE, []),
        ("msgconv_driver", MSGCONV_DRIVER, [str(library)]),
    ):
        exe = work / name
        flags = ["-std=c++17", "-Wall", "-Wextra", "-Werror", "-isystem", str(includes), *glib.split()]
        done = _run(["g++", *flags, str(source), "-o", str(exe), "-ldl"])
        ran = _run([str(exe), *run]) if done.returncode == 0 else None
        entry[name] = ran.stdout.splitlines() if ran and ran.returncode == 0 else None
        if entry[name] is None:
            entry[f"{name}_errors"] = (done.stderr if done.returncode else ran.stderr)[-2000:]
    parser_blobs = _blobs(ds, tag, PARSER_SOURCES)
    sources = [_git(ds, "show", blob).decode(errors="replace") for blob in parser_blobs.values()]
    entry["deepstream_app_parser_blobs"] = parser_blobs
    entry["deepstream_app_keys"] = accepted_keys(sources)
    return entry


def record_tag(ds: Path, trt: Path, tag: str, trt_tag: str, work: Path) -> dict:
    """Build and run the library, probe and driver against one DeepStream tag's headers."""
    includes, trt_includes = work / "ds", work / "trt"
    blobs = _copy_headers(ds, tag, HEADERS, includes)
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
    return entry | record_msgconv(ds, tag, work)


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
            f"driver {'ran' if tags[tag]['driver'] else 'FAILED'}; msgconv library builds "
            f"{tags[tag]['msgconv_library_builds_with_werror']}, "
            f"probe {'ran' if tags[tag]['msgconv_probe'] else 'FAILED'}, "
            f"driver {'ran' if tags[tag]['msgconv_driver'] else 'FAILED'}"
        )
    head = _git(ROOT, "rev-parse", "HEAD").decode().strip()
    record = {
        "about": "What NVIDIA's DeepStream headers say to our custom parser library and our"
        " nvmsgconv payload library (export/deepstream): build verdicts, layout probe and driver"
        " outputs per DeepStream tag, and the keys deepstream-app's config parser accepts per group;"
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
