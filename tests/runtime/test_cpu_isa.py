"""The CPU's ISA class, from /proc/cpuinfo flags of real CPU families and oneDNN's ISA cap, and the
whole /proc/cpuinfo texts of CPUs the suite never runs on (`cpuinfo_samples.py` says where each
came from)."""

from __future__ import annotations

import pytest

from dfine_deploy import cpu
from tests.runtime.cpuinfo_samples import SAMPLES

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
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    assert cpu.isa_class() in (*cpu.ISA_CLASSES, "aarch64", "arm64", "ppc64le", "s390x")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    if cpu.isa_class() in cpu.ISA_CLASSES:
        assert cpu.isa_class() in ("x86-64", "avx2") and not cpu.has_vnni()
        line = cpu.describe()
        assert "\n" not in line and "ONEDNN_MAX_CPU_ISA=AVX2" in line and "no VNNI" in line


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_a_foreign_cpuinfo_gets_its_class_name_and_missing_units(name):
    machine, text, isa, model, missing = SAMPLES[name]
    reading = cpu.read_cpu(text, machine)
    assert reading.flags_source == "" and reading.model == model
    assert reading.isa() == isa
    line = reading.describe()
    assert line.startswith(f"{isa} ({model}") and "\n" not in line
    assert (f"no {', '.join(missing)}" in line) if missing else ("no " not in line.partition(model)[2])


def test_arm_cpus_never_count_as_saturating_int8():
    """The 16-bit pair sums are x86's (vpmaddubsw); an Arm INT8 graph keeps 8-bit weights."""
    for machine, text, *_ in SAMPLES.values():
        isa = cpu.read_cpu(text, machine).isa()
        assert cpu.int8_saturates(isa) == (isa in ("x86-64", "avx2", "avx512"))


@pytest.mark.parametrize("text", [None, "", "processor\t: 0\nvendor_id\t: GenuineIntel\n"])
def test_x86_without_flags_in_proc_cpuinfo_asks_numpy_and_says_so(text):
    reading = cpu.read_cpu(text, "x86_64")
    assert reading.flags_source == cpu.NUMPY_NOTE and reading.flags == cpu.numpy_flags()
    assert reading.isa() in cpu.ISA_CLASSES and "numpy's CPUID probe" in reading.describe()
    if cpu.this_cpu().machine in ("x86_64", "amd64") and cpu.this_cpu().flags_source == "":
        here = cpu.this_cpu().isa()  # numpy sees no AMX or AVX-VNNI: never a higher class than the file's
        assert cpu.ISA_CLASSES.index(reading.isa()) <= cpu.ISA_CLASSES.index(here)


def test_an_arm_container_without_proc_cpuinfo_is_still_aarch64():
    reading = cpu.read_cpu(None, "aarch64")
    assert reading.isa() == "aarch64" and reading.describe().startswith("aarch64 (aarch64; no dot product")
    assert cpu.read_cpu(None, "arm64").isa() == "aarch64"  # macOS names it arm64


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({"DNNL_MAX_CPU_ISA": "AVX2"}, "avx2"),  # oneDNN's older name caps it as well
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "DNNL_MAX_CPU_ISA": "AVX2"}, "avx512"),  # the newer wins
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_FP16"}, "avx512-vnni"),  # oneDNN's alias of AVX10_1_512
        ({"ONEDNN_MAX_CPU_ISA": "ALL"}, "amx"),
    ],
)
def test_both_onednn_cap_variables_lower_a_sapphire_rapids(monkeypatch, variables, expected):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    machine, text, *_ = SAMPLES["Intel Sapphire Rapids (Xeon Platinum 8480+)"]
    reading = cpu.read_cpu(text, machine)
    setting = cpu.max_isa_setting()
    assert reading.isa(setting) == expected
    assert ("capped by" in reading.describe(setting)) == (expected != "amx")
