"""Extract the TensorRT Python API surface per version from NVIDIA's own binding sources.

    python scripts/trt_surface.py /path/to/NVIDIA-TensorRT.git [/path/to/onnx-tensorrt.git]

Reads, with `git show REF:PATH` (a bare clone is enough), the pybind11 sources that define the
`tensorrt` module (python/src/infer/pyFoundationalTypes.cpp, pyCore.cpp, pyGraph.cpp,
python/src/parsers/pyOnnx.cpp) and the C++ headers that give each enum member its value
(include/NvInfer*.h, NvOnnxParser.h; before 10.14 the parser header lives in onnx/onnx-tensorrt at
the submodule commit the TensorRT ref pins). Writes tests/fakes/tensorrt/surface/<version>.json:
module-level names, every enum's members and values, and for the classes in CLASSES every method
and property with its argument names, plus the repository, ref, commit and paths it came from.
The fake `tensorrt` (tests/fakes/tensorrt) is built from these files, and
tests/export/test_tensorrt_surface.py checks the project's TensorRT calls against them.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "fakes" / "tensorrt" / "surface"
TRT_REPO = "https://github.com/NVIDIA/TensorRT"
ONNX_TRT_REPO = "https://github.com/onnx/onnx-tensorrt"
# surface file name -> git ref in NVIDIA/TensorRT
REFS = {
    "8.5": "8.5.2",
    "8.6": "v8.6.1",
    "10.3": "release/10.3",
    "10.13": "release/10.13",
    "10.14": "release/10.14",
    "11": "main",
}
BINDINGS = [
    "python/src/infer/pyFoundationalTypes.cpp",
    "python/src/infer/pyCore.cpp",
    "python/src/infer/pyGraph.cpp",
    "python/src/parsers/pyOnnx.cpp",
]
# The classes whose methods are recorded (the ones an ONNX -> engine -> inference program meets).
CLASSES = {
    "ILogger",
    "Logger",
    "Builder",
    "IBuilderConfig",
    "INetworkDefinition",
    "ITensor",
    "ILayer",
    "OnnxParser",
    "ParserError",
    "IOptimizationProfile",
    "ITimingCache",
    "IHostMemory",
    "Runtime",
    "ICudaEngine",
    "IExecutionContext",
    "EngineInspector",
}
# Enums from pyGraph.cpp are layer parameters; only these are kept.
GRAPH_ENUMS: set[str] = set()


def git_show(repo: Path, ref: str, path: str) -> str | None:
    proc = subprocess.run(["git", "-C", str(repo), "show", f"{ref}:{path}"], capture_output=True)
    return proc.stdout.decode("utf-8", "replace") if proc.returncode == 0 else None


def git_rev(repo: Path, ref: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", ref], capture_output=True, text=True, check=True
    ).stdout.strip()


def strip_comments(text: str) -> str:
    """Comments out, string literals kept (they carry the Python names)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def statements(text: str) -> list[str]:
    """Statements: split on ';' outside parentheses, init braces and strings; block braces reset."""
    result, stack, start, i, n = [], [], 0, 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            continue
        if c == "{":
            line_start = text[text.rfind("\n", 0, i) + 1 : i].strip() == ""
            before = text[:i].rstrip()[-1:] or ";"
            block = not any(k != "block" for k in stack) and (line_start or before in "){};")
            stack.append("block" if block else "{")
            if block:
                start = i + 1
        elif c in "([":
            stack.append(c)
        elif c in ")]}":
            kind = stack.pop() if stack else None
            if kind == "block":
                start = i + 1
        elif c == ";" and not any(k != "block" for k in stack):
            result.append(text[start:i])
            start = i + 1
        i += 1
    return result


def calls(chain: str, names: tuple[str, ...]) -> list[tuple[str, str]]:
    """(call name, argument text) for each `.name(...)` at the top level of a call chain."""
    found = []
    pattern = re.compile(r"\.\s*(" + "|".join(names) + r")\s*\(")
    pos = 0
    while True:
        m = pattern.search(chain, pos)
        if not m:
            return found
        depth, i = 1, m.end()
        while i < len(chain) and depth:
            if chain[i] == '"':
                j = i + 1
                while j < len(chain) and chain[j] != '"':
                    j += 2 if chain[j] == "\\" else 1
                i = j
            elif chain[i] in "({[":
                depth += 1
            elif chain[i] in ")}]":
                depth -= 1
            i += 1
        found.append((m.group(1), chain[m.end() : i - 1]))
        pos = i


def top_level_args(argtext: str) -> list[str]:
    parts, depth, start = [], 0, 0
    i = 0
    while i < len(argtext):
        c = argtext[i]
        if c == '"':
            j = i + 1
            while j < len(argtext) and argtext[j] != '"':
                j += 2 if argtext[j] == "\\" else 1
            i = j
        elif c in "({[<":
            depth += 1
        elif c in ")}]>":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(argtext[start:i].strip())
            start = i + 1
        i += 1
    parts.append(argtext[start:].strip())
    return parts


def arg_names(parts: list[str]) -> list[list]:
    """pybind11 keyword arguments: "name"_a, "name"_a = default, py::arg("name") = default."""
    names = []
    for part in parts:
        m = re.match(r'^"(\w+)"_a\s*(=)?', part) or re.match(r'^py::arg\("(\w+)"\)\s*(=)?', part)
        if m:
            names.append([m.group(1), bool(m.group(2))])
    return names


def parse_bindings(text: str, wanted_enums: set[str] | None) -> tuple[dict, dict, list]:
    enums: dict[str, dict] = {}
    classes: dict[str, dict] = {}
    module_names: list[str] = []
    variables: dict[str, str] = {}  # C++ variable holding a py::class_ -> Python class name
    for stmt in statements(strip_comments(text)):
        stmt = stmt.strip()
        m = re.search(r"py::enum_<\s*([\w:]+)\s*>\s*\(\s*(\w+)\s*,\s*\"(\w+)\"", stmt)
        if m:
            cpp, scope, name = m.groups()
            if wanted_enums is not None and name not in wanted_enums:
                continue
            members = [
                (top_level_args(a)[0].strip('"'), top_level_args(a)[1])
                for _, a in calls(stmt[m.end() :], ("value",))
            ]
            owner = variables.get(scope)
            key = f"{owner}.{name}" if owner else name
            enums[key] = {"cpp": cpp, "members": members, "export_values": ".export_values()" in stmt}
            if not owner:
                module_names.append(name)
            continue
        m = re.search(
            r"py::class_<\s*([^>]*(?:<[^>]*>[^>]*)*)>\s*(\w+)?\s*[({]\s*(\w+)\s*,\s*\"(\w+)\"", stmt
        )
        head = None
        if m:
            template, var, scope, name = m.groups()
            bases = [
                b.strip()
                for b in top_level_args(template)[1:]
                if not b.strip().startswith("std::") and not b.strip().startswith("Py")
            ]
            if var:
                variables[var] = name
            if scope == "m":
                module_names.append(name)
            entry = classes.setdefault(name, {"bases": [b.split("::")[-1] for b in bases], "members": {}})
            head = (entry, stmt[m.end() :])
        else:
            m = re.match(r"(\w+)\s*\.\s*def", stmt)
            if m and m.group(1) in variables:
                head = (classes[variables[m.group(1)]], stmt[m.end() - 4 :])
            m2 = re.match(r"m\s*\.\s*def\s*\(\s*\"(\w+)\"", stmt)
            if m2:
                module_names.append(m2.group(1))
            m3 = re.match(r"m\s*\.\s*attr\s*\(\s*\"(\w+)\"", stmt)
            if m3:
                module_names.append(m3.group(1))
        if head is None:
            continue
        entry, chain = head
        kinds = (
            "def",
            "def_static",
            "def_property",
            "def_property_readonly",
            "def_readwrite",
            "def_readonly",
            "def_property_readonly_static",
            "def_property_static",
        )
        for call, argtext in calls(chain, kinds):
            parts = top_level_args(argtext)
            first = parts[0]
            if call == "def" and first.startswith("py::init"):
                name, kind = "__init__", "init"
            else:
                nm = re.match(r'^"(\w+)"$', first)
                if not nm:
                    continue
                name = nm.group(1)
                kind = {"def": "method", "def_static": "static"}.get(call, "property")
                if call in ("def_property_readonly", "def_readonly", "def_property_readonly_static"):
                    kind = "readonly"
            member = entry["members"].setdefault(name, {"kind": kind})
            if kind in ("init", "method", "static"):  # pybind11 overloads: one signature each
                signature = arg_names(parts[1:])
                if signature not in member.setdefault("signatures", []):
                    member["signatures"].append(signature)
    return enums, classes, module_names


def parse_header_enums(text: str) -> dict[str, dict[str, int]]:
    """`enum class Name : type { kA = 0, kB, ... };` -> {"Name": {"kA": 0, "kB": 1}}."""
    out: dict[str, dict[str, int]] = {}
    for m in re.finditer(r"enum\s+class\s+(\w+)\s*(?::\s*[\w:]+)?\s*\{([^}]*)\}", strip_comments(text)):
        values: dict[str, int] = {}
        nxt = 0
        for item in m.group(2).split(","):
            item = item.strip()
            if not item:
                continue
            name, _, expr = (s.strip() for s in item.partition("="))
            name = name.split()[0]
            if expr:
                expr = re.sub(r"\b(k\w+)\b", lambda x, v=values: str(v.get(x.group(1), 0)), expr)
                expr = re.sub(r"(\d+)[uUlL]+\b", r"\1", expr)
                expr = re.sub(r"\b[\w:]+::(\w+)\b", lambda x, v=values: str(v.get(x.group(1), 0)), expr)
                expr = re.sub(r"static_cast<[\w:]+>", "", expr)
                try:
                    nxt = int(eval(expr, {"__builtins__": {}}))  # integer literals and shifts
                except Exception:
                    continue
            values[name] = nxt
            nxt += 1
        out.setdefault(m.group(1), {}).update(values)
    return out


def extract(trt_repo: Path, onnx_repo: Path | None, label: str, ref: str) -> dict:
    sources = {"repository": TRT_REPO, "ref": ref, "commit": git_rev(trt_repo, ref), "paths": []}
    enums: dict[str, dict] = {}
    classes: dict[str, dict] = {}
    module_names: list[str] = ["__version__"]  # set by python/packaging/.../tensorrt/__init__.py
    for path in BINDINGS:
        text = git_show(trt_repo, ref, path)
        if text is None:
            continue
        sources["paths"].append(path)
        wanted = GRAPH_ENUMS if path.endswith("pyGraph.cpp") else None
        e, c, names = parse_bindings(text, wanted)
        for value in e.values():
            value["binding"] = path
        enums.update(e)
        for name, entry in c.items():
            merged = classes.setdefault(name, {"bases": entry["bases"], "members": {}})
            merged["members"].update(entry["members"])
        module_names += names
    header_values: dict[str, dict[str, dict[str, int]]] = {"infer": {}, "onnx": {}}
    listing = subprocess.run(
        ["git", "-C", str(trt_repo), "ls-tree", "--name-only", ref, "include/"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for path in listing:
        if path.endswith(".h") and "NvInfer" in path or path.endswith("NvOnnxParser.h"):
            group = "onnx" if path.endswith("NvOnnxParser.h") else "infer"
            header_values[group].update(parse_header_enums(git_show(trt_repo, ref, path) or ""))
            sources["paths"].append(path)
    if not header_values["onnx"] and onnx_repo is not None:
        pinned = subprocess.run(
            ["git", "-C", str(trt_repo), "ls-tree", ref, "parsers/onnx"], capture_output=True, text=True
        ).stdout.split()
        commit = pinned[2] if len(pinned) > 2 else None
        text = git_show(onnx_repo, commit, "NvOnnxParser.h") if commit else None
        if text is not None:
            header_values["onnx"] = parse_header_enums(text)
            sources["onnx_tensorrt"] = {
                "repository": ONNX_TRT_REPO,
                "commit": commit,
                "paths": ["NvOnnxParser.h"],
            }
        else:
            sources["onnx_tensorrt"] = {
                "repository": ONNX_TRT_REPO,
                "commit": commit,
                "note": "pinned parser commit not available here: parser enum values left null",
            }
    out_enums: dict[str, dict[str, int | None]] = {}
    for key, value in enums.items():
        groups = ("onnx", "infer") if value["binding"].endswith("pyOnnx.cpp") else ("infer", "onnx")
        cpp_name = value["cpp"].split("::")[-1]
        table = next((header_values[g][cpp_name] for g in groups if cpp_name in header_values[g]), {})
        members = {}
        for py_name, cpp_ref in value["members"]:
            cpp_member = cpp_ref.split("::")[-1].strip()
            members[py_name] = table.get(cpp_member)
        out_enums[key] = members
        if value["export_values"] and "." in key:  # members also reachable on the owning class
            owner = key.split(".")[0]
            for py_name in members:
                classes.setdefault(owner, {"bases": [], "members": {}})["members"].setdefault(
                    py_name, {"kind": "readonly"}
                )
    version = git_show(trt_repo, ref, "include/NvInferVersion.h") or ""
    numbers = []
    for part in ("MAJOR", "MINOR", "PATCH", "BUILD"):
        m = re.search(rf"#define\s+(?:NV_TENSORRT_{part}|TRT_{part}_ENTERPRISE)\s+(\d+)", version)
        numbers.append(m.group(1) if m else "0")
    kept = {name: entry for name, entry in classes.items() if name in CLASSES}
    return {
        "generated_by": "scripts/trt_surface.py",
        "version": ".".join(numbers),
        "source": sources,
        "module": sorted(set(module_names)),
        "enums": dict(sorted(out_enums.items())),
        "classes": {
            name: {"bases": e["bases"], "members": dict(sorted(e["members"].items()))}
            for name, e in sorted(kept.items())
        },
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("trt_repo", type=Path, help=f"a clone of {TRT_REPO} (bare is enough)")
    parser.add_argument("onnx_repo", type=Path, nargs="?", help=f"a clone of {ONNX_TRT_REPO}")
    args = parser.parse_args(argv)
    trt_repo, onnx_repo = args.trt_repo, args.onnx_repo
    for ref in REFS.values():  # before anything is written: git's own error would be a traceback
        known = subprocess.run(
            ["git", "-C", str(trt_repo), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
            capture_output=True,
        )
        if known.returncode != 0:
            print(
                f"error: {trt_repo} is not a git clone of {TRT_REPO} holding {ref}; "
                f"clone it (git clone --bare {TRT_REPO}) and give its path",
                file=sys.stderr,
            )
            return 2
    OUT.mkdir(parents=True, exist_ok=True)
    for label, ref in REFS.items():
        data = extract(trt_repo, onnx_repo, label, ref)
        path = OUT / f"{label}.json"
        path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
        print(
            f"{path.name}: TensorRT {data['version']} from {ref} ({data['source']['commit'][:10]}): "
            f"{len(data['enums'])} enums, {len(data['classes'])} classes"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
