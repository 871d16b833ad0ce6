"""What `pip install 'dfine-deploy[EXTRAS]'` resolves to on every platform docs/install.md names.

For each case (platform, extras) it runs pip's resolver for that platform's Python and wheel tags
(`pip install --dry-run --ignore-installed --report - --platform ... --python-version ...
--only-binary=:all:`) on the requirements pyproject.toml declares, and asserts:

- onnxruntime never beside onnxruntime-gpu (together they offer no CUDA provider; onnxruntime#26996);
- a GPU case really gets onnxruntime-gpu, built for the CUDA major of the case's driver: read from the
  resolved wheel's own metadata (its `cuda` extra names the CUDA runtime package of its build, e.g.
  `nvidia-cuda-runtime-cu12~=12.0`), and that runtime package resolved at the same major;
- a TensorRT extra resolves to the TensorRT major.minor that the case's `--target` builds
  (dfine_deploy/runtime/tensorrt_plan.py PROFILES), and no pip TensorRT on a Jetson (JetPack's apt one);
- NumPy < 2 on JetPack (its torch and TensorRT wheels are built against NumPy 1).

    python scripts/check_installs.py                    # every case, a Markdown table at the end
    python scripts/check_installs.py --case x86-cuda12:gpu-cu12 --json out.json

Two substitutions, both printed in the table: torch and torchvision are left out of `train` (they
are installed first from their own index, see the Makefile, and weigh GBs), and `tensorrt-cuXX`
becomes `tensorrt-cuXX-bindings` at the same version range (the meta package and its `-libs` are
source stubs that fetch from NVIDIA's index; the bindings wheel carries the version). Exit status:
0 all cases pass, 1 a case failed, 2 PyPI could not be reached.

Any pip since 22.2 runs it (`--report`), a venv's own too: `--target` (an empty temporary folder; a
dry run writes nothing) is passed because pip before 23.3 refuses `--platform` without it.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib  # Python 3.11+: this script runs where the project is developed

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packaging.requirements import Requirement  # noqa: E402
from packaging.utils import canonicalize_name  # noqa: E402

from dfine_deploy.export.targets import get_profile, profile_for_tensorrt  # noqa: E402


@dataclass(frozen=True)
class Platform:
    name: str
    python: str  # the interpreter pip resolves for
    machine: str  # x86_64 / aarch64
    glibc: tuple[int, int]  # the oldest glibc of the platform's supported OS
    describes: str


PLATFORMS = {
    p.name: p
    for p in (
        Platform("x86-cuda12", "3.12", "x86_64", (2, 35), "x86-64, CUDA 12 driver (r535/r550, e.g. T4)"),
        Platform("x86-cuda13", "3.12", "x86_64", (2, 35), "x86-64, CUDA 13 driver (r580+)"),
        Platform("jetpack7", "3.12", "aarch64", (2, 39), "Jetson, JetPack 7 (Ubuntu 24.04, Python 3.12)"),
        Platform("jetpack6", "3.10", "aarch64", (2, 35), "Jetson, JetPack 6 (Ubuntu 22.04, Python 3.10)"),
        Platform("jetpack5", "3.8", "aarch64", (2, 31), "Jetson, JetPack 5.1 (Ubuntu 20.04, Python 3.8)"),
    )
}


@dataclass(frozen=True)
class Case:
    platform: str
    extras: tuple[str, ...]
    cuda: int = 0  # must resolve onnxruntime-gpu built for this CUDA major (0: no onnxruntime-gpu asked)
    tensorrt_target: str = ""  # pip TensorRT must resolve to a version this --target's rules hold for
    numpy_below_2: bool = False
    apt_tensorrt: str = ""  # JetPack's own TensorRT (not pip): the --target it builds, for the table
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def key(self) -> str:
        return f"{self.platform}:{','.join(self.extras)}"


CASES = (
    Case("x86-cuda12", ("cpu",)),
    Case("x86-cuda12", ("gpu-cu12",), cuda=12),
    Case("x86-cuda12", ("serve", "tracking", "gpu-cu12"), cuda=12),
    Case("x86-cuda12", ("train", "gpu-cu12"), cuda=12),
    Case("x86-cuda12", ("trt-cu12",), tensorrt_target="trt10.3"),
    Case("x86-cuda12", ("gpu-cu12", "serve", "tracking", "trt-cu12"), cuda=12, tensorrt_target="trt10.3"),
    Case("x86-cuda13", ("gpu-cu13",), cuda=13),
    Case("x86-cuda13", ("trt-cu13",), tensorrt_target="trt11"),
    Case("x86-cuda13", ("gpu-cu13", "serve", "tracking", "trt-cu13"), cuda=13, tensorrt_target="trt11"),
    Case("jetpack7", ("jetpack7",), apt_tensorrt="jetpack7"),
    Case("jetpack7", ("jetpack7", "serve", "tracking"), apt_tensorrt="jetpack7"),
    Case("jetpack7", ("jetpack7", "cpu"), apt_tensorrt="jetpack7"),
    Case("jetpack6", ("jetpack6",), numpy_below_2=True, apt_tensorrt="jetpack6"),
    Case("jetpack6", ("jetpack6", "cpu"), numpy_below_2=True, apt_tensorrt="jetpack6"),
    Case("jetpack6", ("jetpack6", "serve"), numpy_below_2=True, apt_tensorrt="jetpack6"),
    Case("jetpack5", ("jetpack5",), numpy_below_2=True, apt_tensorrt="jetpack5"),
    Case("jetpack5", ("jetpack5", "cpu"), numpy_below_2=True, apt_tensorrt="jetpack5"),
    Case("jetpack5", ("jetpack5", "serve"), numpy_below_2=True, apt_tensorrt="jetpack5"),
)
LEFT_TO_THEIR_INDEX = {"torch", "torchvision"}
TENSORRT_META = re.compile(r"^(tensorrt-cu\d+)(?=[<>=!~ ;]|$)")


class Unreachable(Exception):
    """pip could not reach the package index."""


def platform_tags(platform: Platform) -> list[str]:
    """Every manylinux tag the platform's glibc accepts (pip matches --platform tags exactly)."""
    major, minor = platform.glibc
    tags = [f"manylinux_{major}_{m}_{platform.machine}" for m in range(minor, 16, -1)]
    return [*tags, f"manylinux2014_{platform.machine}", "linux_" + platform.machine]


def marker_environment(platform: Platform) -> dict[str, str]:
    """The environment markers of the platform's Python (PEP 508)."""
    return {
        "python_version": platform.python,
        "python_full_version": platform.python + ".0",
        "platform_machine": platform.machine,
        "platform_system": "Linux",
        "sys_platform": "linux",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }


def requirements(pyproject: Path, extras: tuple[str, ...], platform: Platform) -> tuple[list[str], list[str]]:
    """The requirement strings of the base and these extras, and the substitutions made (said why)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    wanted = list(project.get("dependencies", []))
    for extra in extras:
        if extra not in optional:
            raise SystemExit(f"{pyproject}: no extra [{extra}]; it has {', '.join(sorted(optional))}")
        wanted += optional[extra]
    out, substituted = [], []
    for text in wanted:
        parsed = Requirement(text)
        if parsed.marker is not None and not parsed.marker.evaluate(marker_environment(platform)):
            continue
        parsed.marker = None  # pip would evaluate it for this interpreter, not the platform's
        requirement, name = str(parsed), canonicalize_name(parsed.name)
        if name in LEFT_TO_THEIR_INDEX:
            substituted.append(f"{name} left out (own index)")
            continue
        meta = TENSORRT_META.match(requirement)
        if meta:
            requirement = TENSORRT_META.sub(meta.group(1) + "-bindings", requirement)
            substituted.append(f"{meta.group(1)} -> {meta.group(1)}-bindings")
        out.append(requirement)
    return out, substituted


@dataclass(frozen=True)
class Resolved:
    """What pip would install: {distribution name: version}, and each one's Requires-Dist."""

    versions: dict[str, str]
    requires: dict[str, list[str]]


def resolve(
    platform: Platform, reqs: list[str], timeout: float, pip_python: str = sys.executable
) -> Resolved:
    """What pip (that of `pip_python`) would install for these requirements on this platform."""
    cmd = [pip_python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    cmd += ["--report", "-", "--only-binary=:all:", "--python-version", platform.python]
    for tag in platform_tags(platform):
        cmd += ["--platform", tag]
    with tempfile.TemporaryDirectory(prefix="check_installs-") as target:
        cmd += ["--target", target]  # pip < 23.3 wants it beside --platform; a dry run leaves it empty
        proc = subprocess.run([*cmd, *reqs], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        text = proc.stderr
        if re.search(
            r"NewConnectionError|Name or service not known|Temporary failure in name|timed out", text
        ):
            raise Unreachable(text.strip().splitlines()[-1])
        errors = [line for line in text.splitlines() if line.startswith("ERROR")]
        raise AssertionError(" / ".join(errors)[-600:] or text[-600:])
    report = json.loads(proc.stdout)
    items = {canonicalize_name(i["metadata"]["name"]): i["metadata"] for i in report["install"]}
    return Resolved(
        {name: meta["version"] for name, meta in items.items()},
        {name: meta.get("requires_dist", []) for name, meta in items.items()},
    )


CUDA_RUNTIME = re.compile(r"^nvidia-cuda-runtime(-cu\d+)?$")


def onnxruntime_gpu_cuda(requires_dist: list[str]) -> int | None:
    """The CUDA major an onnxruntime-gpu wheel is built for, from its own metadata: its `cuda` extra
    names the CUDA runtime wheel of that major (`nvidia-cuda-runtime-cu12~=12.0` up to 1.26,
    `nvidia-cuda-runtime~=13.0` from 1.27). None when it has no `cuda` extra (before 1.21)."""
    for text in requires_dist:
        requirement = Requirement(text)
        in_cuda_extra = requirement.marker is not None and requirement.marker.evaluate({"extra": "cuda"})
        if in_cuda_extra and CUDA_RUNTIME.match(canonicalize_name(requirement.name)):
            versions = [s.version for s in requirement.specifier if s.operator in ("~=", ">=", "==")]
            if versions:
                return int(versions[0].split(".")[0])
    return None


def check_case(case: Case, resolution: Resolved) -> list[str]:
    """The assertions that fail for this resolution (empty: it passes)."""
    failed = []
    resolved = resolution.versions
    if "onnxruntime" in resolved and "onnxruntime-gpu" in resolved:
        failed.append(
            f"onnxruntime {resolved['onnxruntime']} beside onnxruntime-gpu {resolved['onnxruntime-gpu']}"
        )
    if case.cuda and "onnxruntime-gpu" not in resolved:
        failed.append("no onnxruntime-gpu")
    elif case.cuda:
        version = resolved["onnxruntime-gpu"]
        built_for = onnxruntime_gpu_cuda(resolution.requires["onnxruntime-gpu"])
        runtimes = {k: v for k, v in resolved.items() if CUDA_RUNTIME.match(k)}
        if built_for != case.cuda:
            failed.append(f"onnxruntime-gpu {version} is built for CUDA {built_for}, not {case.cuda}")
        if [int(v.split(".")[0]) for v in runtimes.values()] != [case.cuda]:
            failed.append(f"CUDA runtime wheels {runtimes or 'none'}: expected one of CUDA {case.cuda}")
    tensorrt = {k: v for k, v in resolved.items() if k.startswith("tensorrt")}
    if case.tensorrt_target:
        versions = sorted(set(tensorrt.values()))
        if len(versions) != 1:
            failed.append(f"TensorRT packages {tensorrt}: expected one version")
        else:
            expected, got = get_profile(case.tensorrt_target), profile_for_tensorrt(versions[0])
            if got.tensorrt.split(".")[0] != expected.tensorrt.split(".")[0]:
                failed.append(
                    f"TensorRT {versions[0]} (rules of {got.name}) is not a build for "
                    f"--target {case.tensorrt_target} (TensorRT {expected.tensorrt})"
                )
    elif tensorrt:
        failed.append(f"pip TensorRT {tensorrt} where TensorRT comes from elsewhere")
    if case.numpy_below_2 and int(resolved.get("numpy", "0").split(".")[0]) >= 2:
        failed.append(f"numpy {resolved['numpy']} (JetPack needs < 2)")
    return failed


def apt_tensorrt(target: str) -> str:
    """What JetPack's apt ships for a --target: the versions its row names per JetPack release
    ("10.13 or 10.16" for jetpack7), else the line's own version (not the rules it is checked by)."""
    profile = get_profile(target)
    shipped = re.findall(r"\((\d+\.\d+)\)", profile.jetpack)
    return " or ".join(shipped) if shipped else profile.tensorrt


def run_case(case: Case, pyproject: Path, timeout: float, pip_python: str = sys.executable) -> dict[str, Any]:
    platform = PLATFORMS[case.platform]
    reqs, substituted = requirements(pyproject, case.extras, platform)
    started = time.perf_counter()
    try:
        resolution = resolve(platform, reqs, timeout, pip_python)
    except AssertionError as exc:
        return {"case": case.key, "passed": False, "failed": [f"does not resolve: {exc}"], "resolved": {}}
    picked = {
        k: v
        for k, v in resolution.versions.items()
        if k in KEY_PACKAGES or k.startswith("tensorrt") or CUDA_RUNTIME.match(k)
    }
    if "onnxruntime-gpu" in picked:
        built_for = onnxruntime_gpu_cuda(resolution.requires["onnxruntime-gpu"])
        picked["onnxruntime-gpu"] += f" (CUDA {built_for})"
    failed = check_case(case, resolution)
    if case.apt_tensorrt:
        picked["TensorRT (apt)"] = apt_tensorrt(case.apt_tensorrt)
    return {
        "case": case.key,
        "platform": platform.describes,
        "python": platform.python,
        "passed": not failed,
        "failed": failed,
        "resolved": picked,
        "substituted": substituted,
        "seconds": round(time.perf_counter() - started, 1),
    }


KEY_PACKAGES = ("numpy", "onnxruntime", "onnxruntime-gpu", "cuda-python", "opencv-python-headless")
KEY_PACKAGES += ("fastapi", "pydantic", "openvino", "trackers", "eval-type-backport")


def markdown(results: list[dict[str, Any]]) -> str:
    lines = ["| case | Python | resolves to | result |", "|---|---|---|---|"]
    for r in results:
        got = ", ".join(f"{k} {v}" for k, v in sorted(r["resolved"].items()))
        note = "; ".join(r.get("substituted", []))
        result = "pass" if r["passed"] else "FAIL: " + "; ".join(r["failed"])
        lines.append(
            f"| `{r['case']}` | {r.get('python', '')} | {got}{' (' + note + ')' if note else ''} | {result} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pyproject", type=Path, default=ROOT / "pyproject.toml")
    parser.add_argument("--case", nargs="+", help=f"run only these (platform:extra,extra), of {len(CASES)}")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per pip run")
    parser.add_argument(
        "--pip",
        default=sys.executable,
        metavar="PYTHON",
        help="resolve with this interpreter's pip (default: this one)",
    )
    args = parser.parse_args(argv)
    known = {c.key: c for c in CASES}
    chosen = list(CASES)
    if args.case:
        unknown = [k for k in args.case if k not in known]
        if unknown:
            parser.error(f"--case {unknown[0]}: unknown; choose from {', '.join(known)}")
        chosen = [known[k] for k in args.case]
    results = []
    for case in chosen:
        try:
            result = run_case(case, args.pyproject, args.timeout, args.pip)
        except Unreachable as exc:
            print(f"check_installs: PyPI is unreachable, nothing was checked ({exc})", file=sys.stderr)
            return 2
        results.append(result)
        status = "pass" if result["passed"] else "FAIL " + "; ".join(result["failed"])
        print(f"{case.key:<32} {status}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(markdown(results))
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
