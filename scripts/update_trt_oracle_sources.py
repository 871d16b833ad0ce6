"""Vendor the trtexec option parser of each TensorRT release for the test oracle (tests/export/trt_oracle).

For every tag in TAGS this writes tests/export/trt_oracle/nvidia/<tag>/:

- `sampleOptions.cpp.gz`, `sampleOptions.h.gz`: NVIDIA's files byte for byte (Apache-2.0),
  gzip-compressed: the seven releases are ~1 MB as text, under 250 KB compressed. The test checks
  each against the git blob id recorded in PROVENANCE.md, so any change to them is caught.
- `nvinfer_facts.h`: what the parser names from the release's `include/` headers, as facts only
  (each enum's enumerators and values, its count, the flag typedefs), with the header and line each
  was read from. The 8.x headers are NVIDIA-proprietary, so no header text is copied.
- `sample_helpers.h`: the helpers the parser calls from `samples/common` (Apache-2.0), verbatim,
  with the file and line of each piece.
- `PROVENANCE.md`: repository, tag, commit, paths, blob ids and the license.

    python scripts/update_trt_oracle_sources.py --git /path/to/NVIDIA-TensorRT.git
"""

from __future__ import annotations

import argparse
import gzip
import re
import subprocess
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "export" / "trt_oracle" / "nvidia"
REPO = "https://github.com/NVIDIA/TensorRT"
SCRIPT = "scripts/update_trt_oracle_sources.py"
# tag -> what uses that TensorRT (dfine_deploy/export/targets.py PROFILES)
TAGS: dict[str, str] = {
    "8.5.2": "trt8.5 / jetpack5 (JetPack 5.1 ships 8.5.2)",
    "v8.6.1": "trt8.6 / jetpack6.0 (JetPack 6.0 ships 8.6.2; 8.6.1 is the newest 8.6 source tag)",
    "v10.3.0": "trt10.3 / jetpack6 (JetPack 6.1/6.2)",
    "v10.13.3": "trt10.14 / jetpack7 on JetPack 7.0 (10.13)",
    "v10.14": "trt10.14 / jetpack7 on JetPack 7.1 and DeepStream 9.0",
    "v10.16": "trt10.3 on x86 with a CUDA 12 driver (the [trt-cu12] extra resolves to 10.16)",
    "v11.1": "trt11",
}
VERBATIM = ("samples/common/sampleOptions.cpp", "samples/common/sampleOptions.h")
# (group, file, name, pattern, required): the samples/common code the parser calls. ORACLE_SAMPLE goes
# into namespace sample, ORACLE_SAMPLES_COMMON into samplesCommon, ORACLE_GLOBAL at file scope.
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


def git_show(git_dir: str, tag: str, path: str) -> bytes:
    return subprocess.run(
        ["git", "--git-dir", git_dir, "show", f"{tag}:{path}"], check=True, capture_output=True
    ).stdout


def git_out(git_dir: str, *args: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", git_dir, *args], check=True, capture_output=True, text=True
    ).stdout


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def enum_facts(block: str) -> str:
    """`enum class X : T { a = 0, b, ... };` from a header's declaration: names and values only."""
    head, body = block.split("{", 1)
    body = re.sub(r"//[^\n]*|/\*.*?\*/", "", body.rsplit("}", 1)[0], flags=re.S)
    body = re.sub(r"\bTRT_\w+(\([^)]*\))?", "", body)  # deprecation attribute macros
    items = [" ".join(item.split()) for item in body.split(",") if item.strip()]
    return " ".join(head.split()) + " { " + ", ".join(items) + " };\n"


def facts(git_dir: str, tag: str, wanted: set[str]) -> str:
    """nvinfer_facts.h: each enum, enum count and flag typedef of the tag's include/ that the parser
    names, as names and values (8.x headers are NVIDIA-proprietary: facts only, no text)."""
    listing = git_out(git_dir, "ls-tree", "-r", "--name-only", tag, "include/").split()
    lines: list[str] = []
    for path in sorted(p for p in listing if p.endswith(".h")):
        text = git_show(git_dir, tag, path).decode()
        found = [(m.start(), enum_facts(m.group(0))) for m in ENUM.finditer(text) if m.group(1) in wanted]
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
        lines += [f"// {path}:{line_of(text, start)}\n{decl}" for start, decl in sorted(found)]
    return (
        f"// Facts read from NVIDIA TensorRT {tag}'s include/ headers by {SCRIPT}:\n"
        "// the enumerators and values, enum counts and flag typedefs that trtexec's option parser names,\n"
        "// each after the header and line it declares. Included by ../../stubs/NvInfer.h.\n"
        f"#define ORACLE_TENSORRT_MAJOR {tag.lstrip('v').split('.')[0]}\n" + "".join(lines)
    )


def helpers(git_dir: str, tag: str) -> str:
    """sample_helpers.h: what the parser calls from samples/common, verbatim (Apache-2.0), in three
    groups the stub headers include where the original code sits (see HELPERS)."""
    groups: dict[str, list[str]] = {}
    license_header = ""
    for group, path, name, pattern, required in HELPERS:
        text = git_show(git_dir, tag, path).decode()
        license_header = license_header or text.split("*/", 1)[0] + "*/\n"
        found = re.search(pattern, text, re.S | re.M)
        if found:
            groups.setdefault(group, []).append(f"// {path}:{line_of(text, found.start())}\n{found.group(0)}")
        elif required:
            raise SystemExit(f"{tag}: {name} not found in {path}")
    body = "".join(
        f"#ifdef {group}\n" + "".join(groups.get(group, [])) + "#endif\n"
        for group in dict.fromkeys(g[0] for g in HELPERS)
    )
    return (
        license_header + f"// Verbatim excerpts of NVIDIA TensorRT {tag} ({REPO}) made by {SCRIPT},\n"
        "// each after its file and line. Included by ../../stubs/sampleUtils.h.\n" + body
    )


def vendor(git_dir: str, tag: str, purpose: str) -> None:
    folder = OUT / tag
    folder.mkdir(parents=True, exist_ok=True)
    commit = git_out(git_dir, "rev-parse", f"{tag}^{{commit}}").strip()
    rows = []
    sources = ""
    for path in VERBATIM:
        data = git_show(git_dir, tag, path)
        sources += data.decode()
        blob = git_out(git_dir, "rev-parse", f"{tag}:{path}").strip()
        name = Path(path).name + ".gz"
        (folder / name).write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
        rows.append(f"| `{name}` | `{path}` | `{blob}` |")
    wanted = set(re.findall(r"\b[A-Z]\w+\b", sources))
    (folder / "nvinfer_facts.h").write_text(facts(git_dir, tag, wanted))
    (folder / "sample_helpers.h").write_text(helpers(git_dir, tag))
    (folder / "PROVENANCE.md").write_text(
        f"# NVIDIA TensorRT {tag}: trtexec's option parser\n\n"
        f"Used for: {purpose}.\n\n"
        f"- Repository: {REPO}\n- Tag: `{tag}`\n- Commit: `{commit}`\n"
        "- License: Apache License 2.0 (NVIDIA's SPDX header at the top of each file; full text in\n"
        "  ../LICENSE, from the repository's `LICENSE`).\n\n"
        "| file here | path at the tag | git blob id (`git hash-object` of the uncompressed file) |\n"
        "|---|---|---|\n" + "\n".join(rows) + "\n\n"
        "`sampleOptions.*` are NVIDIA's files unchanged. `sample_helpers.h` holds verbatim excerpts of\n"
        "`samples/common` (Apache-2.0), each after its file and line. `nvinfer_facts.h` holds no NVIDIA\n"
        "text: the enumerators, values and typedefs the parser names, read from the tag's `include/`\n"
        "headers (proprietary-licensed in 8.x, Apache-2.0 from 10.0). Regenerate with `" + SCRIPT + "`.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--git", required=True, help="a clone (or bare git dir) of NVIDIA/TensorRT")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "LICENSE").write_bytes(git_show(args.git, "v11.1", "LICENSE"))
    for tag, purpose in TAGS.items():
        vendor(args.git, tag, purpose)
        print(f"{tag}: {OUT / tag}")


if __name__ == "__main__":
    main()
