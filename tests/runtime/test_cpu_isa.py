"""The CPU's ISA class, from /proc/cpuinfo flags of real CPU families and oneDNN's ISA cap."""

from __future__ import annotations

import pytest

from dfine_deploy import cpu

BASE = {"sse4_2", "avx", "fma", "f16c"}
# Flag subsets as Linux lists them on each family (the rest of each line does not matter here).
FAMILIES = {
    "AMD EPYC Zen 3 (Milan)": (BASE | {"avx2"}, "avx2"),
    "Intel Alder Lake (AVX-VNNI)": (BASE | {"avx2", "avx_vnni"}, "avx2-vnni"),
    "Intel Skylake-SP": (BASE | {"avx2", "avx512f", "avx512bw"}, "avx512"),
    "Intel Cascade Lake": (BASE | {"avx2", "avx512f", "avx512_vnni"}, "avx512-vnni"),
    "AMD EPYC Zen 4 (Genoa)": (BASE | {"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}, "avx512-vnni"),
    "Intel Sapphire Rapids": (
        BASE | {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"},
        "amx",
    ),
    "Intel Sandy Bridge": (BASE - {"fma", "f16c"}, "x86-64"),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_gets_its_class(family):
    flags, expected = FAMILIES[family]
    assert cpu.class_from_flags(flags) == expected


@pytest.mark.parametrize(
    ("isa", "max_isa", "expected"),
    [
        ("amx", "AVX2", "avx2"),
        ("amx", "avx512_core_vnni", "avx512-vnni"),
        ("amx", "AVX512_CORE", "avx512"),
        ("avx512", "AVX2_VNNI", "avx2"),  # the cap allows VNNI, the CPU has none
        ("avx512-vnni", "AVX2_VNNI", "avx2-vnni"),
        ("avx2", "AVX512_CORE_AMX", "avx2"),  # a cap never raises
        ("avx2", None, "avx2"),
        ("avx2", "NO_SUCH_ISA", "avx2"),
    ],
)
def test_onednn_cap_lowers_the_class(isa, max_isa, expected):
    assert cpu.cap(isa, max_isa) == expected


def test_only_classes_with_32_bit_int8_accumulation_count_as_vnni():
    assert {isa for isa in cpu.ISA_CLASSES if cpu.has_vnni(isa)} == {"avx2-vnni", "avx512-vnni", "amx"}


def test_this_machine_is_described_in_one_line_under_a_cap(monkeypatch):
    assert cpu.isa_class() in (*cpu.ISA_CLASSES, "aarch64", "arm64", "ppc64le", "s390x")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    if cpu.isa_class() in cpu.ISA_CLASSES:
        assert cpu.isa_class() in ("x86-64", "avx2") and not cpu.has_vnni()
        line = cpu.describe()
        assert "\n" not in line and "ONEDNN_MAX_CPU_ISA=AVX2" in line and "no VNNI" in line
