"""What `pip install 'dfine-deploy[EXTRAS]'` resolves to on every platform docs/install.md names.

For each case (platform, extras) it runs pip's resolver for that platform's Python and wheel tags
(`pip install --dry-run --ignore-installed --report - --platform ... --python-version ...
--only-binary=:all:`) on the requirements pyproject.toml declares, and asserts:

- onnxruntime never beside onnxruntime-gpu (together they offer no CUDA provider; onnxruntime#26996);
- a GPU case really gets onnxruntime-gpu;
- a TensorRT extra resolves to the TensorRT major.minor that the case's `--target` builds
  (dfine_deploy/runtime/tensorrt_plan.py PROFILES), and no pip TensorRT on a Jetson (JetPack's apt one);
- NumPy < 2 on JetPack (its torch and TensorRT wheels are built against NumPy 1).

    python scripts/check_installs.py                    # every case, a Markdown table at the end
    python scripts/check_installs.py --case x86-cuda12:gpu --json out.json

Two substitutions, both printed in the table: torch and torchvision are left out of `train` (they
are installed first from their own index, see the Makefile, and weigh GBs), and `tensorrt-cuXX`
becomes `tensorrt-cuXX-bindings` at the same version range (the meta package and its `-libs` are
source stubs that fetch from NVIDIA's index; the bindings wheel carries the version). Exit status:
0 all cases pass, 1 a case failed, 2 PyPI could not be reached.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
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
        Platform("jetpack6", "3.10", "aarch64", (2, 35), "Jetson, JetPack 6 (Ubuntu 22.04, Python 3.10)"),
        Platform("jetpack5", "3.8", "aarch64", (2, 31), "Jetson, JetPack 5.1 (Ubuntu 20.04, Python 3.8)"),
    )
}


@dataclass(frozen=True)
class Case:
    platform: str
    extras: tuple[str, ...]
    gpu_onnxruntime: bool = False  # must resolve onnxruntime-gpu
    tensorrt_target: str = ""  # pip TensorRT must resolve to a version this --target's rules hold for
    numpy_below_2: bool = False
    apt_tensorrt: str = ""  # JetPack's own TensorRT (not pip): the --target it builds, for the table
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def key(self) -> str:
        return f"{self.platform}:{','.join(self.extras)}"


CASES = (
    Case("x86-cuda12", ("cpu",)),
    Case("x86-cuda12", ("gpu",), gpu_onnxruntime=True),
    Case("x86-cuda12", ("serve", "tracking", "gpu"), gpu_onnxruntime=True),
    Case("x86-cuda12", ("train", "gpu"), gpu_onnxruntime=True),
    Case("x86-cuda12", ("trt-cu12",), tensorrt_target="trt10.3"),
    Case("x86-cuda12", ("serve", "gpu", "trt-cu12"), gpu_onnxruntime=True, tensorrt_target="trt10.3"),
    Case("x86-cuda13", ("gpu",), gpu_onnxruntime=True),
    Case("x86-cuda13", ("trt-cu13",), tensorrt_target="trt11"),
    Case("x86-cuda13", ("serve", "gpu", "trt-cu13"), gpu_onnxruntime=True, tensorrt_target="trt11"),
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


def resolve(platform: Platform, reqs: list[str], timeout: float) -> dict[str, str]:
    """{distribution name: version} pip would install for these requirements on this platform."""
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    cmd += ["--report", "-", "--only-binary=:all:", "--python-version", platform.python]
    for tag in platform_tags(platform):
        cmd += ["--platform", tag]
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
    return {
        re.sub(r"[-_.]+", "-", i["metadata"]["name"]).lower(): i["metadata"]["version"]
        for i in report["install"]
    }


def check_case(case: Case, resolved: dict[str, str]) -> list[str]:
    """The assertions that fail for this resolution (empty: it passes)."""
    failed = []
    if "onnxruntime" in resolved and "onnxruntime-gpu" in resolved:
        failed.append(
            f"onnxruntime {resolved['onnxruntime']} beside onnxruntime-gpu {resolved['onnxruntime-gpu']}"
        )
    if case.gpu_onnxruntime and "onnxruntime-gpu" not in resolved:
        failed.append("no onnxruntime-gpu")
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


def run_case(case: Case, pyproject: Path, timeout: float) -> dict[str, Any]:
    platform = PLATFORMS[case.platform]
    reqs, substituted = requirements(pyproject, case.extras, platform)
    started = time.perf_counter()
    try:
        resolved = resolve(platform, reqs, timeout)
    except AssertionError as exc:
        return {"case": case.key, "passed": False, "failed": [f"does not resolve: {exc}"], "resolved": {}}
    picked = {k: v for k, v in resolved.items() if k in KEY_PACKAGES or k.startswith("tensorrt")}
    failed = check_case(case, resolved)
    if case.apt_tensorrt:
        picked["TensorRT (apt)"] = get_profile(case.apt_tensorrt).tensorrt
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
            result = run_case(case, args.pyproject, args.timeout)
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
