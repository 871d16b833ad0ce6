"""/proc/cpuinfo texts of CPUs our tests never run on: the first processor block of each, as Linux
prints it (tabs included). x86 flag lines are shortened to the flags up to and around the ones the
ISA class reads, in the kernel's order; Arm blocks are whole.

Provenance (public dumps read for the flags and numbers; the texts are retyped here):
- Sapphire Rapids: the flags tail of a 2-socket Xeon Platinum 8480+ (112 cores, 225 MiB L3) in a
  public lscpu dump (amx_bf16 avx512_fp16 amx_tile amx_int8 after arch_lbr).
- Ice Lake SP: Xeon Platinum 8380 (family 6 model 106), as Linux 5.15 lists it: avx512_vnni, no AMX
  and no avx512_bf16.
- Zen 4: AMD EPYC 9654 (Genoa), Linux 6.1: avx512f, avx512_vnni, avx512_bf16, no AMX.
- Zen 2: AMD EPYC 7742 (Rome): avx2, no AVX-512.
- Sandy Bridge: Xeon E5-2670: avx, no avx2 (the "old CPU without AVX2").
- Jetson Xavier NX, L4T R32.4 (kernel 4.9): a public DeepStream setup note's `cat /proc/cpuinfo`
  (NVIDIA Carmel: implementer 0x4e, part 0x004; L4T prints a generic "model name").
- Jetson AGX Orin, L4T R36 (kernel 5.15.148-tegra): the Features of public lscpu dumps of Orin
  developer kits (Cortex-A78AE, implementer 0x41, part 0xd42); mainline arm64 prints no model name.
- Graviton2 (c6g) and Graviton3 (c7g): a public AWS Graviton verification note (parts 0xd0c Neoverse
  N1 and 0xd40 Neoverse V1, their Features lines).
Part numbers: util-linux sys-utils/lscpu-arm.c.
"""

from __future__ import annotations

_X86_BASE = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 "
    "ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid pni pclmulqdq "
    "ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm"
)


def _x86(vendor: str, model: str, flags: str) -> str:
    return (
        f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: 6\nmodel name\t: {model}\n"
        f"stepping\t: 8\ncpu MHz\t\t: 2000.000\ncache size\t: 107520 KB\nflags\t\t: {flags}\n"
        "vmx flags\t: vnmi preemption_timer invvpid ept_x_only\nbugs\t\t: spectre_v1 spectre_v2\n"
        "bogomips\t: 4000.00\n\n"
    )


def _arm(features: str, implementer: str, part: str, extra: str = "") -> str:
    return (
        f"processor\t: 0\n{extra}BogoMIPS\t: 62.50\nFeatures\t: {features}\n"
        f"CPU implementer\t: {implementer}\nCPU architecture: 8\nCPU variant\t: 0x0\n"
        f"CPU part\t: {part}\nCPU revision\t: 1\n\n"
    )


_ARMV82 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"

# name -> (machine, /proc/cpuinfo text, expected class, expected model name, units the line says are missing)
SAMPLES = {
    "Intel Sapphire Rapids (Xeon Platinum 8480+)": (
        "x86_64",
        _x86(
            "GenuineIntel",
            "Intel(R) Xeon(R) Platinum 8480+",
            _X86_BASE + " avx2 smep bmi2 erms avx512f avx512dq avx512bw avx512vl avx_vnni avx512_bf16 "
            "avx512vbmi umip pku avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg "
            "avx512_vpopcntdq serialize tsxldtrk pconfig arch_lbr ibt amx_bf16 avx512_fp16 amx_tile "
            "amx_int8 flush_l1d arch_capabilities",
        ),
        "amx",
        "Intel(R) Xeon(R) Platinum 8480+",
        [],
    ),
    "Intel Ice Lake SP (Xeon Platinum 8380)": (
        "x86_64",
        _x86(
            "GenuineIntel",
            "Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz",
            _X86_BASE + " avx2 smep bmi2 erms avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl "
            "avx512vbmi umip pku avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg "
            "avx512_vpopcntdq la57 rdpid md_clear pconfig flush_l1d arch_capabilities",
        ),
        "avx512-vnni",
        "Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz",
        ["AMX", "BF16"],
    ),
    "AMD Zen 4 (EPYC 9654)": (
        "x86_64",
        _x86(
            "AuthenticAMD",
            "AMD EPYC 9654 96-Core Processor",
            _X86_BASE + " avx2 smep bmi2 erms avx512f avx512dq rdseed adx smap avx512ifma clflushopt "
            "clwb avx512cd sha_ni avx512bw avx512vl xsaveopt avx512_bf16 clzero avx512vbmi umip pku "
            "avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg avx512_vpopcntdq rdpid",
        ),
        "avx512-vnni",
        "AMD EPYC 9654 96-Core Processor",
        ["AMX"],
    ),
    "AMD Zen 2 (EPYC 7742)": (
        "x86_64",
        _x86(
            "AuthenticAMD",
            "AMD EPYC 7742 64-Core Processor",
            _X86_BASE + " avx2 smep bmi2 cqm rdt_a rdseed adx smap clflushopt clwb sha_ni xsaveopt "
            "xsavec xgetbv1 clzero irperf xsaveerptr rdpru wbnoinvd arat umip rdpid",
        ),
        "avx2",
        "AMD EPYC 7742 64-Core Processor",
        ["VNNI", "AVX-512", "AMX", "BF16"],
    ),
    "Intel Sandy Bridge (Xeon E5-2670), no AVX2": (
        "x86_64",
        _x86(
            "GenuineIntel",
            "Intel(R) Xeon(R) CPU E5-2670 0 @ 2.60GHz",
            _X86_BASE.replace(" fma", "").replace(" movbe", "").replace(" f16c", "")
            + " tsc_deadline_timer xsaveopt pti ssbd ibrs ibpb stibp",
        ),
        "x86-64",
        "Intel(R) Xeon(R) CPU E5-2670 0 @ 2.60GHz",
        ["VNNI", "AVX-512", "AMX", "BF16"],
    ),
    "Jetson Xavier NX (NVIDIA Carmel, L4T R32)": (
        "aarch64",
        _arm(
            "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp",
            "0x4e",
            "0x004",
            extra="model name\t: ARMv8 Processor rev 0 (v8l)\n",
        )
        + "MTS version\t: 50168445\n",
        "aarch64",
        "NVIDIA Carmel",
        ["dot product", "I8MM", "BF16", "SVE"],
    ),
    "Jetson AGX Orin (Cortex-A78AE, L4T R36)": (
        "aarch64",
        _arm(_ARMV82 + " uscat ilrcpc flagm paca pacg", "0x41", "0xd42"),
        "aarch64",
        "Arm Cortex-A78AE",
        ["I8MM", "BF16", "SVE"],
    ),
    "AWS Graviton2 (Neoverse N1, c6g)": (
        "aarch64",
        _arm(_ARMV82 + " ssbs", "0x41", "0xd0c"),
        "aarch64",
        "Arm Neoverse-N1",
        ["I8MM", "BF16", "SVE"],
    ),
    "AWS Graviton3 (Neoverse V1, c7g)": (
        "aarch64",
        _arm(
            "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma "
            "lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs paca pacg "
            "dcpodp svei8mm svebf16 i8mm bf16 dgh rng",
            "0x41",
            "0xd40",
        ),
        "aarch64",
        "Arm Neoverse-V1",
        [],
    ),
    "an Arm part not in the table": (
        "aarch64",
        _arm("fp asimd", "0x61", "0x022"),
        "aarch64",
        "Arm CPU (implementer 0x61, part 0x022)",
        ["dot product", "I8MM", "BF16", "SVE"],
    ),
}
