"""verify.json: what `dfine-verify` proved, keyed by the engine's (or graph's) sha256 and the device.

An engine is only as good as the device, driver and library that built and run it, so a result
counts for the exact bytes (sha256) on the exact device: the GPU's name, compute capability and
driver, or the CPU's class (`dfine_deploy/cpu.py`), the JetPack release on a Jetson, and the version
of the library that runs it (TensorRT, onnxruntime, OpenVINO). verify.json sits beside the file it
vouches for and holds one entry per (file, device) pair, so one folder shared by several devices
keeps each one's result. `require_verified` is what dfine-serve and `Detector.open` ask before they
serve an engine (`BackendInfo.needs_verify` rows).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from dfine_deploy import cpu
from dfine_deploy.errors import BackendError
from dfine_deploy.files import atomic_write_bytes, cached_sha256
from dfine_deploy.runtime.backends import BY_NAME

VERIFY_NAME = "verify.json"
FORMAT_VERSION = 1
VERIFY_COMMAND = "dfine-verify"
_JETSON_RELEASE = Path("/etc/nv_tegra_release")  # L4T's release line: JetPack 5 = R35, 6 = R36, 7 = R38
_JETSON_MODEL = Path("/proc/device-tree/model")


class UnverifiedEngine(BackendError):
    """An engine without a passing dfine-verify result here: never quietly replaced by another backend."""


def _library_version(module: str) -> str:
    """The version of an already imported runtime library (the backend imported it)."""
    loaded = sys.modules.get(module)
    return str(getattr(loaded, "__version__", "unknown")) if loaded is not None else "not loaded"


def _nvidia_smi(index: int) -> dict[str, str]:
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return {}
    query = "--query-gpu=name,compute_cap,driver_version"
    try:
        out = subprocess.run(
            [tool, query, "--format=csv,noheader", f"--id={index}"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    parts = [p.strip() for p in out.stdout.strip().split(",")]
    if out.returncode != 0 or len(parts) != 3:
        return {}
    return {"gpu": parts[0], "compute_capability": parts[1], "driver": parts[2]}


def _jetson() -> dict[str, str]:
    facts = {}
    for key, path in (("jetpack_l4t", _JETSON_RELEASE), ("board", _JETSON_MODEL)):
        try:
            facts[key] = path.read_text(errors="replace").strip("\x00 \n").splitlines()[0]
        except (OSError, IndexError):
            continue
    return facts


def device_facts(backend: Any) -> dict[str, str]:
    """What a result holds for: the backend and its provider, the library's version, and the device
    (GPU name, compute capability, driver and JetPack release, or the CPU's class and model)."""
    facts = {"backend": str(backend.name)}
    row = BY_NAME.get(str(backend.name))
    if row is not None and row.providers:
        facts["provider"] = str(getattr(backend, "provider", ""))
    if row is not None and row.verify_version:
        facts[str(row.name)] = _library_version(row.requires)
    device = str(getattr(backend, "device", "cpu"))
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        facts.update(_nvidia_smi(index) or {"gpu": device})
        facts.update(_jetson())
    else:
        facts.update(cpu=cpu.isa_class(), cpu_model=cpu.model_name())
    return facts


def device_key(facts: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def describe_device(facts: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in facts.items())


def record_key(sha256: str, facts: dict[str, str], against: str = "") -> str:
    """The key of a result: the file's bytes on this device, checked against its own artifact's
    reference pack; `against` names another artifact folder it was checked against (`dfine-verify
    FILE --artifact OTHER`), a result of its own that never stands for the file's own verdict."""
    key = f"{sha256}@{device_key(facts)}"
    return f"{key} against {against}" if against else key


def read_results(folder: Path) -> dict[str, Any]:
    """verify.json's entries by record key; {} when there is none or it is unreadable (then nothing
    counts as verified, and dfine-verify rewrites it)."""
    path = Path(folder) / VERIFY_NAME
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    results = data.get("results") if isinstance(data, dict) else None
    return results if isinstance(results, dict) and data.get("format_version") == FORMAT_VERSION else {}


def write_result(folder: Path, result: dict[str, Any], against: str = "") -> Path:
    """Add (or replace) one result, keyed by its sha256, device and the artifact it was checked
    against when not its own (`record_key`)."""
    results = read_results(folder)
    results[record_key(result["sha256"], result["device"], against)] = result
    path = Path(folder) / VERIFY_NAME
    body = {"format_version": FORMAT_VERSION, "results": results}
    if path.is_dir():
        raise BackendError(f"{path} is a folder; remove it: {VERIFY_COMMAND} writes its results in that file")
    try:
        atomic_write_bytes(path, (json.dumps(body, indent=2) + "\n").encode())
    except OSError as exc:  # named by the folder, never by the hidden temporary file it failed on
        raise BackendError(
            f"cannot write {path}: the folder {path.parent} is not writable ({exc.strerror}); make it "
            f"writable, or copy the file to a writable folder and run {VERIFY_COMMAND} there"
        ) from None
    return path


def lookup(path: Path, backend: Any) -> dict[str, Any] | None:
    """The result verify.json holds for this file's bytes on this device, if any."""
    return read_results(Path(path).parent).get(record_key(cached_sha256(path), device_facts(backend)))


def verify_status(path: Path, backend: Any) -> str:
    """'passed', 'failed' or 'not verified' for this file on this device (dfine-bench's column)."""
    found = lookup(path, backend)
    return "not verified" if found is None else ("passed" if found.get("passed") else "failed")


def require_verified(path: Path, backend: Any, because: str | None = None) -> dict[str, Any]:
    """Refuse, in one line naming the command to run, an engine without a passing result here, or a
    graph that must prove itself `because` (an INT8 graph gated on another CPU class)."""
    found = lookup(path, backend)
    if found is not None and found.get("passed"):
        return found
    why = (
        f"its {VERIFY_NAME} result here failed ({found.get('failure', '')})"
        if found is not None
        else f"no passing {VERIFY_NAME} result for its sha256 on this device "
        f"({describe_device(device_facts(backend))})"
    )
    if because is None:
        what, command = "this engine has not proved itself on this device", f"{VERIFY_COMMAND} {path}"
    else:
        what = f"{because}, and it has not proved itself on this one"
        command = f"{VERIFY_COMMAND} {path} --backend {backend.name}"
    raise UnverifiedEngine(
        f"{path}: {what}: {why}. Run `{command}` here first (or serve it anyway with --unverified)"
    )
