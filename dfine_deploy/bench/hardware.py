"""What machine are we on? Jetson model, GPU name, CPU model, power mode, load.

Read from the device tree (/proc/device-tree/model), NVML (pynvml when installed) or nvidia-smi,
/proc/cpuinfo, nvpmodel and sysfs. Anything that cannot be read is reported as "not readable",
never guessed.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dfine_deploy import cores, cpu
from dfine_deploy.bench.tables import PROFILES, Profile

NOT_READABLE = "not readable"
ARCH_NAMES = {"x86_64": "x86-64", "amd64": "x86-64", "aarch64": "arm64", "arm64": "arm64"}


@dataclass
class Hardware:
    arch: str
    cpu_model: str
    cpu_isa: str  # dfine_deploy/cpu.py's class: CPU timings and INT8/BF16 accuracy depend on it
    cpu_count: int
    jetson_model: str | None
    gpus: list[str]
    gpu_source: str  # "nvml" | "nvidia-smi" | "none"
    power: dict[str, str] = field(default_factory=dict)  # Jetson power mode and clocks
    load_average: tuple[float, float, float] = (0.0, 0.0, 0.0)
    # what restricts this process below cpu_count (affinity mask, cgroup CPU quota; dfine_deploy/cores.py),
    # '' when nothing does: CPU timings depend on it
    cpu_limits: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(errors="replace").replace("\x00", "").strip()
    except OSError:
        return None


def gpu_names() -> tuple[list[str], str]:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            names = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                names.append(name.decode() if isinstance(name, bytes) else str(name))
            return names, "nvml"
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # not installed, or no driver: try the command line tool
        pass
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            names = [n.strip() for n in out.stdout.splitlines() if n.strip()]
            if out.returncode == 0 and names:
                return names, "nvidia-smi"
        except (OSError, subprocess.TimeoutExpired):
            pass
    return [], "none"


def jetson_power() -> dict[str, str]:
    """nvpmodel mode and GPU clock of a Jetson, or "not readable" for each."""
    power = {"nvpmodel": NOT_READABLE, "gpu_clock_hz": NOT_READABLE, "gpu_max_clock_hz": NOT_READABLE}
    if shutil.which("nvpmodel"):
        try:
            out = subprocess.run(["nvpmodel", "-q"], capture_output=True, text=True, timeout=10)
            mode = " ".join(out.stdout.split())
            if out.returncode == 0 and mode:
                power["nvpmodel"] = mode
        except (OSError, subprocess.TimeoutExpired):
            pass
    for folder in sorted(Path("/sys/class/devfreq").glob("*")) if Path("/sys/class/devfreq").is_dir() else []:
        name = (_read(str(folder / "device/of_node/name")) or folder.name).lower()
        if "gpu" in name or "gv11b" in name or "ga10b" in name:
            power["gpu_clock_hz"] = _read(str(folder / "cur_freq")) or NOT_READABLE
            power["gpu_max_clock_hz"] = _read(str(folder / "max_freq")) or NOT_READABLE
            break
    return power


def detect() -> Hardware:
    machine = platform.machine().lower()
    model = _read("/proc/device-tree/model")
    jetson = model if model and ("jetson" in model.lower() or "tegra" in model.lower()) else None
    gpus, source = gpu_names()
    limits = cores.read_limits()
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    return Hardware(
        arch=ARCH_NAMES.get(machine, machine or NOT_READABLE),
        cpu_model=cpu.model_name(),
        cpu_isa=cpu.isa_class(),
        cpu_count=os.cpu_count() or 1,
        jetson_model=jetson,
        gpus=gpus,
        gpu_source=source,
        power=jetson_power() if jetson else {"nvpmodel": NOT_READABLE, "gpu_clock_hz": NOT_READABLE},
        load_average=tuple(round(v, 2) for v in load),
        cpu_limits=limits.describe() if limits.restricted else "",
    )


def auto_profile(hardware: Hardware) -> Profile:
    """The profile of the machine itself; an unknown GPU is compared with the T4 table."""
    if hardware.jetson_model:
        return PROFILES["jetson-orin" if "orin" in hardware.jetson_model.lower() else "jetson"]
    for gpu in hardware.gpus:
        for profile in PROFILES.values():
            if profile.kind == "gpu" and any(m in gpu.lower() for m in profile.match):
                return profile
    return PROFILES["t4"] if hardware.gpus else PROFILES["cpu"]


def measured_on(hardware: Hardware, run_device: str) -> str:
    """Plain words for what ran: 'x86-64 CPU (Intel Xeon ...)' or 'NVIDIA T4 GPU'."""
    if hardware.jetson_model:
        return f"{hardware.jetson_model}" + (" (CPU only)" if run_device == "cpu" else "")
    if run_device.startswith("cuda") and hardware.gpus:
        index = int(run_device.partition(":")[2] or 0)
        return f"{hardware.gpus[min(index, len(hardware.gpus) - 1)]} GPU"
    limits = f", {hardware.cpu_limits}" if hardware.cpu_limits else ""
    return f"{hardware.arch} CPU ({hardware.cpu_model}, ISA class {hardware.cpu_isa}{limits})"


def matches(profile: Profile, hardware: Hardware, run_device: str) -> bool:
    if profile.kind == "cpu":
        return run_device == "cpu"
    if run_device == "cpu":
        return False
    if profile.kind == "jetson":
        return bool(hardware.jetson_model) and any(m in hardware.jetson_model.lower() for m in profile.match)
    return any(m in gpu.lower() for gpu in hardware.gpus for m in profile.match)


def measured_on_line(profile: Profile, hardware: Hardware, run_device: str) -> str:
    """'measured on: x86-64 CPU (...), not a Jetson' — said plainly when it is not the profile."""
    where = measured_on(hardware, run_device)
    if matches(profile, hardware, run_device):
        return f"measured on: {where} (matches the {profile.label} profile)"
    if profile.kind == "jetson":
        what = "a Jetson" if profile.key == "jetson" else f"a {profile.label}"
    else:
        what = f"an {profile.label}" if profile.label.startswith("NVIDIA") else f"a {profile.label}"
    return f"measured on: {where}, not {what}"
