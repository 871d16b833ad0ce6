"""The CPU's instruction-set class: the one place that decides what an x86 CPU can do for inference.

INT8 and BF16 behave differently across x86 CPUs of one generation to the next, and the classes
below are where it changes:
- ``avx2``: 256-bit vectors, no 8-bit dot-product instruction. INT8 kernels multiply u8 activations
  by s8 weights with ``vpmaddubsw``, which adds pairs into 16 bits and saturates there: full-range
  8-bit weights can overflow (NNCF's and OpenVINO's "saturation issue"), so INT8 graphs meant for
  this class quantize weights to 7 bits (NNCF's overflow fix).
- ``avx512``: 512-bit vectors, the same 16-bit pair sums, the same saturation.
- ``avx512-vnni`` and ``avx2-vnni``: ``vpdpbusd`` accumulates u8 x s8 products in 32 bits; no
  saturation, full 8-bit weights are safe.
- ``amx``: AMX tiles (INT8 and BF16 matrix units) besides AVX-512 VNNI and BF16.
Anything else is named by its architecture (``x86-64`` below AVX2, ``aarch64``, ...); an Arm CPU's
name comes from its implementer and part numbers where the kernel prints no model name (Jetson
Orin, Graviton), and its line lists the Arm units INT8/BF16 kernels use (dot product, I8MM, BF16,
SVE). Where /proc/cpuinfo lists no x86 flags (missing or empty in some containers, other OSes),
numpy's CPUID probe gives them, without AMX and AVX-VNNI: such a CPU is classed lower, never higher.

``ONEDNN_MAX_CPU_ISA`` (or the older ``DNNL_MAX_CPU_ISA``) caps the class here too, so a capped run
and the decisions taken in it agree. Who honours that cap: PyTorch's oneDNN kernels and the oneDNN
inside OpenVINO's CPU plugin (measured with OpenVINO 2026.4: its convolutions went from
``brgconv_avx2`` to ``jit_sse42`` under SSE41, its MatMul stayed ``gemm_mlas``); not OpenVINO's
MLAS GEMM or its own JIT kernels in release builds (their ``OV_CPU_MAX_ISA`` is a debug-build
switch) and not onnxruntime, whose MLAS kernels dispatch on CPUID alone. Paths those two take on an AVX2 CPU
are therefore proven only on an AVX2 CPU (`tests/export/test_cpu_graphs.py` says which ran).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

try:  # numpy's record of what its own CPUID probe found (numpy 2; numpy 1 kept it under numpy.core)
    from numpy._core._multiarray_umath import __cpu_features__ as _NUMPY_FEATURES
except ImportError:
    try:
        from numpy.core._multiarray_umath import __cpu_features__ as _NUMPY_FEATURES
    except ImportError:
        _NUMPY_FEATURES = {}

ISA_CLASSES = ("x86-64", "avx2", "avx2-vnni", "avx512", "avx512-vnni", "amx")
# Classes whose 8-bit dot products accumulate in 32 bits (no 16-bit saturation of u8 x s8 pairs).
VNNI_CLASSES = frozenset({"avx2-vnni", "avx512-vnni", "amx"})
# oneDNN's ISA names (ONEDNN_MAX_CPU_ISA) -> the highest class they allow.
_ONEDNN_CAPS = {
    "SSE41": "x86-64",
    "AVX": "x86-64",
    "AVX2": "avx2",
    "AVX2_VNNI": "avx2-vnni",
    "AVX2_VNNI_2": "avx2-vnni",
    "AVX512_MIC": "avx512",  # Xeon Phi
    "AVX512_MIC_4OPS": "avx512",
    "AVX512_CORE": "avx512",
    "AVX512_CORE_VNNI": "avx512-vnni",
    "AVX512_CORE_BF16": "avx512-vnni",
    "AVX10_1_512": "avx512-vnni",
    "AVX512_CORE_FP16": "avx512-vnni",  # oneDNN's other name of AVX10_1_512
    "AVX512_CORE_AMX": "amx",
    "AVX512_CORE_AMX_FP16": "amx",
    "AVX10_1_512_AMX": "amx",
    "AVX10_1_512_AMX_FP16": "amx",
}


def class_from_flags(flags: set[str] | frozenset[str]) -> str:
    """The ISA class of an x86 CPU with these /proc/cpuinfo flags."""
    if "amx_tile" in flags and "avx512_vnni" in flags:
        return "amx"
    if "avx512f" in flags:
        return "avx512-vnni" if "avx512_vnni" in flags else "avx512"
    if "avx2" in flags:
        return "avx2-vnni" if "avx_vnni" in flags else "avx2"
    return "x86-64"


def cap(isa: str, max_isa: str | None) -> str:
    """`isa` lowered to oneDNN's ``ONEDNN_MAX_CPU_ISA`` value `max_isa` (unknown or unset: unchanged)."""
    ceiling = _ONEDNN_CAPS.get((max_isa or "").strip().upper())
    if ceiling is None or isa not in ISA_CLASSES:
        return isa
    # avx512 without VNNI under an avx2-vnni cap: the cap's VNNI does not exist on this CPU
    if ceiling == "avx2-vnni" and isa == "avx512":
        return "avx2"
    return min(isa, ceiling, key=ISA_CLASSES.index)


# Arm cores by (CPU implementer, CPU part) of /proc/cpuinfo: mainline arm64 kernels print no model
# name, so this names the boards we ship to (the part numbers are util-linux's lscpu-arm.c table)
ARM_PARTS = {
    ("0x41", "0xd07"): "Arm Cortex-A57",  # Jetson Nano, TX1, TX2
    ("0x41", "0xd08"): "Arm Cortex-A72",  # Raspberry Pi 4
    ("0x41", "0xd0b"): "Arm Cortex-A76",  # Raspberry Pi 5
    ("0x41", "0xd0c"): "Arm Neoverse-N1",  # AWS Graviton2, Ampere Altra
    ("0x41", "0xd40"): "Arm Neoverse-V1",  # AWS Graviton3
    ("0x41", "0xd42"): "Arm Cortex-A78AE",  # Jetson Orin
    ("0x41", "0xd4f"): "Arm Neoverse-V2",  # AWS Graviton4, NVIDIA Grace
    ("0x4e", "0x003"): "NVIDIA Denver 2",  # Jetson TX2
    ("0x4e", "0x004"): "NVIDIA Carmel",  # Jetson AGX Xavier, Xavier NX
}
# Arm features that change what INT8 / BF16 kernels can do, as /proc/cpuinfo names them
ARM_UNITS = (("asimddp", "dot product"), ("i8mm", "I8MM"), ("bf16", "BF16"), ("sve", "SVE"))


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """The model name and the feature flags in a /proc/cpuinfo text (x86 'flags', Arm 'Features');
    '' for a name it does not give."""
    model, flags, arm = "", frozenset(), {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        # x86: "model name"; 32-bit Arm and some vendor kernels: "Model" (the board) or "Hardware"
        if key in ("model name", "Model", "Hardware") and value and not model:
            model = value
        elif key in ("flags", "Features") and value and not flags:
            flags = frozenset(value.split())
        elif key in ("CPU implementer", "CPU part") and key not in arm:
            arm[key] = value.lower()
    part = ARM_PARTS.get((arm.get("CPU implementer", ""), arm.get("CPU part", "")))
    if part and (not model or model.startswith("ARMv8 Processor")):  # L4T's generic "ARMv8 Processor rev 0"
        model = part
    elif not model and arm:
        model = f"Arm CPU (implementer {arm.get('CPU implementer', '?')}, part {arm.get('CPU part', '?')})"
    return model, flags


def numpy_flags() -> frozenset[str]:
    """x86 flags from numpy's own CPUID probe, named as /proc/cpuinfo names them: the fallback where
    that file is missing or lists no flags (some containers and sandboxes, Windows, macOS). AMX and
    AVX-VNNI are not among numpy's features, so such a CPU is classed lower, never higher."""
    names = {"AVX2": "avx2", "AVX512F": "avx512f", "AVX512VNNI": "avx512_vnni", "AVX512BF16": "avx512_bf16"}
    return frozenset(flag for feature, flag in names.items() if _NUMPY_FEATURES.get(feature))


_X86 = ("x86_64", "amd64")
NUMPY_NOTE = "no flags in /proc/cpuinfo: numpy's CPUID probe, AMX and AVX-VNNI unseen"


def max_isa_setting() -> tuple[str, str] | None:
    """oneDNN's cap as set: (variable, value). oneDNN reads ONEDNN_MAX_CPU_ISA, else the older
    DNNL_MAX_CPU_ISA (measured with OpenVINO 2026.4's oneDNN: both cap its convolutions, the first
    wins)."""
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        value = os.environ.get(name, "").strip()
        if value:
            return name, value
    return None


@dataclass(frozen=True)
class CpuReading:
    """What one machine's /proc/cpuinfo (or its fallback) says."""

    machine: str  # platform.machine(), lower case
    model: str
    flags: frozenset[str]
    flags_source: str = ""  # '' when the flags came from /proc/cpuinfo, else what gave them

    def isa(self, setting: tuple[str, str] | None = None) -> str:
        """The class under oneDNN's cap `setting` (`max_isa_setting()`)."""
        if self.machine not in _X86:
            return "aarch64" if self.machine == "arm64" else self.machine  # macOS says arm64
        return cap(class_from_flags(self.flags), setting[1] if setting else None)

    def describe(self, setting: tuple[str, str] | None = None) -> str:
        """One line: the class, the model name, the cap and the units it lacks."""
        isa = self.isa(setting)
        if isa in ISA_CLASSES:
            units = (
                ("VNNI", has_vnni(isa)),
                ("AVX-512", isa.startswith("avx512") or isa == "amx"),
                ("AMX", isa == "amx"),
                ("BF16", isa == "amx" or ("avx512_bf16" in self.flags and isa.startswith("avx512"))),
            )
        else:
            units = tuple((name, flag in self.flags) for flag, name in ARM_UNITS) if isa == "aarch64" else ()
        missing = [unit for unit, present in units if not present]
        notes = [self.model or self.machine] + ([self.flags_source] if self.flags_source else [])
        if setting and isa in ISA_CLASSES:
            name, value = setting
            known = value.upper() in _ONEDNN_CAPS
            notes.append(
                f"capped by {name}={value}" if known else f"{name}={value} is no oneDNN ISA known here"
            )
        notes += [f"no {', '.join(missing)}"] if missing else []
        return f"{isa} ({'; '.join(notes)})"


def read_cpu(text: str | None, machine: str) -> CpuReading:
    """A /proc/cpuinfo text (None: unreadable) of a `machine` CPU; on x86 without flags in it, numpy's
    CPUID probe of this process's CPU gives them."""
    model, flags = parse_cpuinfo(text or "")
    machine = machine.lower()
    if not flags and machine in _X86:
        return CpuReading(machine, model, numpy_flags(), NUMPY_NOTE)
    return CpuReading(machine, model, flags)


@lru_cache(maxsize=None)  # functools.cache is 3.9; the runtime runs on 3.8
def this_cpu() -> CpuReading:
    """This machine's reading (the model name falls back to what `platform` says)."""
    try:
        text: str | None = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = None
    reading = read_cpu(text, platform.machine())
    if not reading.model:
        reading = replace(reading, model=platform.processor() or platform.machine())
    return reading


def model_name() -> str:
    """The CPU's model name as the OS reports it, e.g. 'AMD EPYC' or 'Intel(R) Xeon(R) ...'."""
    return this_cpu().model


def isa_class() -> str:
    """This CPU's class (see the module docstring), after oneDNN's cap (`max_isa_setting`)."""
    return this_cpu().isa(max_isa_setting())


def has_vnni(isa: str | None = None) -> bool:
    """Whether INT8 products accumulate without 16-bit saturation on `isa` (default: this CPU)."""
    return (isa or isa_class()) in VNNI_CLASSES


def int8_saturates(isa: str | None = None) -> bool:
    """Whether INT8 kernels on `isa` (default: this CPU) add u8 x s8 pairs in 16 bits and can saturate
    with full 8-bit weights: x86 without VNNI only. onnxruntime's Arm INT8 kernels (MLAS: NEON, UDOT,
    UMMLA; onnxruntime/core/mlas/lib/qgemm_kernel_*.cpp) accumulate in 32 bits, so 8-bit weights
    are safe there."""
    isa = isa or isa_class()
    return isa in ISA_CLASSES and isa not in VNNI_CLASSES


def describe() -> str:
    """One line for logs and reports: the class, the model name and what it lacks."""
    return this_cpu().describe(max_isa_setting())
