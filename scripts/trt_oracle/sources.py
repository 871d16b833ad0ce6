"""Read trtexec's option parser of one TensorRT tag from a local NVIDIA/TensorRT git repository.

Nothing read here is kept in this repository: the files go into a temporary build folder, and only
facts about them (the tag's commit, each path's git blob id) go into the recorded verdicts
(tests/data/trt_oracle_verdicts.json). Any clone works, bare or not, as long as it has the tags:

    git clone --bare https://github.com/NVIDIA/TensorRT /path/TensorRT.git
    export DFINE_TRT_SOURCES=/path/TensorRT.git

Three kinds of input are written into the build folder:

- `sampleOptions.cpp` and `.h`: NVIDIA's parser, as the tag has them.
- `nvinfer_facts.h`: what the parser names from the tag's `include/` headers, rebuilt as bare
  declarations (each enum's enumerators and values, its count, the flag typedefs), since the
  oracle does not link libnvinfer. ../stubs/NvInfer.h includes it.
- `sample_helpers.h`: the `samples/common` helpers the parser calls (splitToStringVec, toLower,
  the _GiB literals, ASSERT), cut from the tag's files. ../stubs/sampleUtils.h includes it.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

SOURCES_ENV = "DFINE_TRT_SOURCES"
REPOSITORY = "https://github.com/NVIDIA/TensorRT"
PARSER = ("samples/common/sampleOptions.cpp", "samples/common/sampleOptions.h")
# (group, file, name, pattern, required): the samples/common code the parser calls. ORACLE_SAMPLE
# goes into namespace sample, ORACLE_SAMPLES_COMMON into samplesCommon, ORACLE_GLOBAL at file scope.
HELPERS = (
    (
        "ORACLE_SAMPLE",
        "samples/common/sampleUtils.h",
        "splitToStringVec",
        r"^std::vector<std::string> splitToStringVec\([^;]*\);\n",
        True,
    ),
    (
        "ORACLE_SAMPLE",
        "samples/common/sampleUtils.cpp",
        "splitToStringVec",
        r"^std::vector<std::string> splitToStringVec\([^)]*\)\n\{\n.*?\n\}\n",
        True,
    ),
    (
        "ORACLE_SAMPLES_COMMON",
        "samples/common/common.h",
        "toLower",
        r"^inline std::string toLower\([^)]*\)\n\{\n.*?\n\}\n",
        True,
    ),
    *(
        (
            "ORACLE_GLOBAL",
            "samples/common/common.h",
            f"_{unit}iB",
            rf"^constexpr long double operator\"\" _{unit}iB\(long double val\)\n\{{\n.*?\n\}}\n",
            False,
        )
        for unit in "GMK"
    ),
    (
        "ORACLE_GLOBAL",
        "samples/common/common.h",
        "ASSERT",
        r"^#define ASSERT\(condition\)[^\n]*\n(?:[^\n]*\\\n)*[^\n]*\n",
        False,
    ),
)
ENUM = re.compile(r"^enum class (\w+) : \w+\s*\n\{.*?\n\};\n", re.S | re.M)
# the count of an enum: `struct EnumMaxImpl<X> {... kVALUE = N;}` (also as `impl::EnumMaxImpl`), or
# in older headers `constexpr inline int32_t EnumMax<X>() noexcept { return N; }`
ENUM_MAX = re.compile(
    r"^template <>\s*\n"
    r"(?:struct (?:impl::)?EnumMaxImpl<(\w+)>|constexpr inline int32_t EnumMax<(\w+)>\(\) noexcept)"
    r"\s*\n\{[^{}]*?(?:kVALUE = |return )(\d+);[^{}]*\n\};?\n",
    re.M,
)
FLAG_TYPE = re.compile(r"^(?:using (\w+) = (u?int\d+_t);|typedef (u?int\d+_t) (\w+);)\n", re.M)


class SourcesMissing(RuntimeError):
    """DFINE_TRT_SOURCES is unset, or does not hold the tag."""


def sources_dir() -> Path | None:
    """The NVIDIA/TensorRT git repository named by DFINE_TRT_SOURCES, or None when unset."""
    value = os.environ.get(SOURCES_ENV, "").strip()
    if not value:
        return None
    path = Path(value)
    if not path.is_dir():
        raise SourcesMissing(f"{SOURCES_ENV}={value}: no such folder; point it at a clone of {REPOSITORY}")
    return path


def _git(repo: Path, *args: str) -> bytes:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False)
    if done.returncode != 0:
        raise SourcesMissing(
            f"{SOURCES_ENV}={repo}: `git {' '.join(args)}` failed ({done.stderr.decode().strip()}); "
            f"it must be a clone of {REPOSITORY} with the TensorRT tags"
        )
    return done.stdout


@dataclass
class TagSources:
    """What one tag's oracle was built from: the commit and, per path read, its git blob id."""

    tag: str
    commit: str
    blobs: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"commit": self.commit, "blobs": dict(sorted(self.blobs.items()))}


class TagReader:
    """Reads files of one tag and notes the blob id of each (for the record)."""

    def __init__(self, repo: Path, tag: str):
        self.repo = repo
        self.used = TagSources(tag, _git(repo, "rev-parse", f"{tag}^{{commit}}").decode().strip())
        listing = _git(repo, "ls-tree", "-r", tag, "--", "include", "samples/common").decode()
        self.blob_of = {line.split("\t", 1)[1]: line.split()[2] for line in listing.splitlines()}

    def read(self, path: str) -> str:
        if path not in self.blob_of:
            raise SourcesMissing(f"{SOURCES_ENV}={self.repo}: {self.used.tag} has no {path}")
        self.used.blobs[path] = self.blob_of[path]
        return _git(self.repo, "show", f"{self.blob_of[path]}").decode()


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _enum_declaration(block: str) -> str:
    """`enum class X : T { a = 0, b, ... };` from a header's declaration: names and values only."""
    head, body = block.split("{", 1)
    body = re.sub(r"//[^\n]*|/\*.*?\*/", "", body.rsplit("}", 1)[0], flags=re.S)
    body = re.sub(r"\bTRT_\w+(\([^)]*\))?", "", body)  # deprecation attribute macros
    items = [" ".join(item.split()) for item in body.split(",") if item.strip()]
    return " ".join(head.split()) + " { " + ", ".join(items) + " };\n"


def _facts(reader: TagReader, wanted: set[str]) -> str:
    """nvinfer_facts.h: each enum, enum count and flag typedef of include/ that the parser names."""
    lines: list[str] = []
    for path in sorted(p for p in reader.blob_of if p.startswith("include/") and p.endswith(".h")):
        text = _git(reader.repo, "show", reader.blob_of[path]).decode()
        found = [(m.start(), _enum_declaration(m[0])) for m in ENUM.finditer(text) if m[1] in wanted]
        found += [
            (
                m.start(),
                f"namespace impl {{ template <> struct EnumMaxImpl<{name}> "
                f"{{ static constexpr int32_t kVALUE = {m[3]}; }}; }}\n",
            )
            for m in ENUM_MAX.finditer(text)
            if (name := m[1] or m[2]) in wanted
        ]
        found += [
            (m.start(), f"using {name} = {m[2] or m[3]};\n")
            for m in FLAG_TYPE.finditer(text)
            if (name := m[1] or m[4]) in wanted
        ]
        if found:
            reader.used.blobs[path] = reader.blob_of[path]
        lines += [f"// {path}:{_line_of(text, start)}\n{decl}" for start, decl in sorted(found)]
    major = reader.used.tag.lstrip("v").split(".")[0]
    return f"#define ORACLE_TENSORRT_MAJOR {major}\n" + "".join(lines)


def _helpers(reader: TagReader) -> str:
    """sample_helpers.h: the samples/common code the parser calls, in the groups of HELPERS."""
    groups: dict[str, list[str]] = {}
    for group, path, name, pattern, required in HELPERS:
        text = reader.read(path)
        found = re.search(pattern, text, re.S | re.M)
        if found:
            groups.setdefault(group, []).append(f"// {path}:{_line_of(text, found.start())}\n{found[0]}")
        elif required:
            raise SourcesMissing(f"{reader.used.tag}: {name} not found in {path}")
    return "".join(
        f"#ifdef {group}\n" + "".join(groups.get(group, [])) + "#endif\n"
        for group in dict.fromkeys(g[0] for g in HELPERS)
    )


def write_tag_sources(repo: Path, tag: str, build: Path) -> TagSources:
    """Write the parser of `tag` and its two generated headers into `build`; say what was read."""
    reader = TagReader(repo, tag)
    parser_text = ""
    for path in PARSER:
        text = reader.read(path)
        parser_text += text
        (build / Path(path).name).write_text(text)
    (build / "nvinfer_facts.h").write_text(_facts(reader, set(re.findall(r"\b[A-Z]\w+\b", parser_text))))
    (build / "sample_helpers.h").write_text(_helpers(reader))
    return reader.used
