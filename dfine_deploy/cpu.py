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
Anything else is named by its architecture (``x86-64`` below AVX2, ``aarch64``, ...).

``ONEDNN_MAX_CPU_ISA`` caps the class here too, so a capped run and the decisions taken in it agree.
Who honours that cap: PyTorch's oneDNN kernels and the oneDNN inside OpenVINO's CPU plugin; not
OpenVINO's own JIT kernels in release builds (their ``OV_CPU_MAX_ISA`` is a debug-build switch) and
not onnxruntime, whose MLAS kernels dispatch on CPUID alone. Paths those two take on an AVX2 CPU
are therefore proven only on an AVX2 CPU (`tests/export/test_cpu_graphs.py` says which ran).
"""

from __future__ import annotations

import os
import platform
from functools import lru_cache
from pathlib import Path

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
    "AVX512_CORE": "avx512",
    "AVX512_CORE_VNNI": "avx512-vnni",
    "AVX512_CORE_BF16": "avx512-vnni",
    "AVX10_1_512": "avx512-vnni",
    "AVX512_CORE_AMX": "amx",
    "AVX512_CORE_AMX_FP16": "amx",
    "AVX10_1_512_AMX": "amx",
    "AVX10_1_512_AMX_FP16": "amx",
}


def class_from_flags(flags: set[str]) -> str:
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


@lru_cache(maxsize=None)  # functools.cache is 3.9; the runtime runs on 3.8
def _cpuinfo() -> tuple[str, set[str]]:
    """The model name and the feature flags of /proc/cpuinfo (x86 'flags', ARM 'Features')."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.processor() or platform.machine(), set()
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        # x86: "model name"; ARM: "Model" (the board) or "Hardware"
        if key in ("model name", "Model", "Hardware") and value.strip() and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    return model or platform.processor() or platform.machine(), flags


def model_name() -> str:
    """The CPU's model name as the OS reports it, e.g. 'AMD EPYC' or 'Intel(R) Xeon(R) ...'."""
    return _cpuinfo()[0]


def isa_class() -> str:
    """This CPU's class (see the module docstring), after ``ONEDNN_MAX_CPU_ISA``."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return machine
    return cap(class_from_flags(_cpuinfo()[1]), os.environ.get("ONEDNN_MAX_CPU_ISA"))


def has_vnni(isa: str | None = None) -> bool:
    """Whether INT8 products accumulate without 16-bit saturation on `isa` (default: this CPU)."""
    return (isa or isa_class()) in VNNI_CLASSES


def describe() -> str:
    """One line for logs and reports: the class, the model name and what it lacks."""
    isa = isa_class()
    model, flags = _cpuinfo()
    missing = [
        unit
        for unit, present in (
            ("VNNI", has_vnni(isa)),
            ("AVX-512", isa.startswith("avx512") or isa == "amx"),
            ("AMX", isa == "amx"),
            ("BF16", isa == "amx" or ("avx512_bf16" in flags and isa.startswith("avx512"))),
        )
        if not present
    ]
    capped = os.environ.get("ONEDNN_MAX_CPU_ISA")
    notes = [model] + ([f"capped by ONEDNN_MAX_CPU_ISA={capped}"] if capped else [])
    notes += [f"no {', '.join(missing)}"] if missing else []
    return f"{isa} ({'; '.join(notes)})"
