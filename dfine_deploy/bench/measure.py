"""Timing with warm-up, rounds and a verdict on noise; host and GPU memory.

A figure is measured in `rounds` rounds of `runs` calls each, after `warmup` untimed calls. The
report gives percentiles over all calls and the spread of the round medians. A machine is called
noisy, and the report then gives a range instead of one number, when any of these holds:
- the coefficient of variation of all calls is above NOISY_CV,
- the slowest round median is more than NOISY_ROUND_RATIO times the fastest,
- the slowest call took more than NOISY_MAX_MIN times the fastest,
- the 1-minute load average before measuring was above NOISY_LOAD x the number of cores.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

NOISY_CV = 0.15
NOISY_ROUND_RATIO = 1.15
NOISY_MAX_MIN = 2.0
NOISY_LOAD = 0.75


@dataclass
class Timing:
    """Latency of one call (one batch) in milliseconds."""

    batch: int
    warmup: int
    runs: int  # timed calls in all
    rounds: int
    samples_ms: list[float] = field(repr=False)
    round_medians_ms: list[float]
    p50: float
    p90: float
    p99: float
    min: float
    median: float
    max: float
    mean: float
    cv: float  # std / mean over all calls

    @property
    def ms_per_image(self) -> float:
        return self.p50 / self.batch

    @property
    def fps(self) -> float:
        """Images per second at the median latency."""
        return 1000.0 * self.batch / self.p50

    @property
    def fps_range(self) -> tuple[float, float]:
        return 1000.0 * self.batch / self.max, 1000.0 * self.batch / self.min

    @property
    def round_ratio(self) -> float:
        return max(self.round_medians_ms) / max(min(self.round_medians_ms), 1e-9)

    def to_dict(self) -> dict:
        data = asdict(self)
        data.pop("samples_ms")
        data.update(ms_per_image=self.ms_per_image, fps=self.fps, round_ratio=self.round_ratio)
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in data.items()}


def time_calls(
    call: Callable[[], object],
    *,
    batch: int,
    warmup: int = 3,
    runs: int = 20,
    rounds: int = 3,
    synchronize: Callable[[], None] | None = None,
) -> Timing:
    """Time `call` after warm-up; `synchronize` waits for asynchronous GPU work to finish."""
    for _ in range(warmup):
        call()
    if synchronize:
        synchronize()
    rounds = max(1, min(rounds, runs))
    per_round = [runs // rounds + (1 if i < runs % rounds else 0) for i in range(rounds)]
    measured: list[list[float]] = []
    for count in per_round:
        this_round = []
        for _ in range(count):
            start = time.perf_counter()
            call()
            if synchronize:
                synchronize()
            this_round.append((time.perf_counter() - start) * 1000.0)
        measured.append(this_round)
    return summarize(measured, batch=batch, warmup=warmup)


def summarize(rounds_ms: list[list[float]], *, batch: int, warmup: int) -> Timing:
    """Percentiles over all calls and the median of each round."""
    samples = [s for round_ms in rounds_ms for s in round_ms]
    array = np.asarray(samples)
    return Timing(
        batch=batch,
        warmup=warmup,
        runs=len(samples),
        rounds=len(rounds_ms),
        samples_ms=samples,
        round_medians_ms=[float(np.median(r)) for r in rounds_ms],
        p50=float(np.percentile(array, 50)),
        p90=float(np.percentile(array, 90)),
        p99=float(np.percentile(array, 99)),
        min=float(array.min()),
        median=float(np.median(array)),
        max=float(array.max()),
        mean=float(array.mean()),
        cv=float(array.std() / array.mean()) if array.mean() > 0 else 0.0,
    )


def noise_reasons(timing: Timing, load_average: float, cpu_count: int) -> list[str]:
    """Why this measurement should not be read as one number (empty: it can)."""
    reasons = []
    if timing.cv > NOISY_CV:
        reasons.append(f"call-to-call variation {timing.cv:.0%} > {NOISY_CV:.0%}")
    if timing.rounds > 1 and timing.round_ratio > NOISY_ROUND_RATIO:
        reasons.append(f"round medians differ by x{timing.round_ratio:.2f} > x{NOISY_ROUND_RATIO}")
    if timing.max > NOISY_MAX_MIN * timing.min:
        reasons.append(
            f"slowest call x{timing.max / max(timing.min, 1e-9):.2f} the fastest > x{NOISY_MAX_MIN}"
        )
    if load_average > NOISY_LOAD * cpu_count:
        reasons.append(f"load average {load_average:.2f} on {cpu_count} cores before measuring")
    return reasons


def host_memory_mb() -> dict[str, float | None]:
    """This process's resident memory now and at its peak (VmRSS / VmHWM), in MB."""
    values: dict[str, float | None] = {"rss_mb": None, "peak_rss_mb": None}
    try:
        with open(f"/proc/{os.getpid()}/status") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    values["rss_mb" if key == "VmRSS" else "peak_rss_mb"] = round(
                        int(rest.split()[0]) / 1024, 1
                    )
    except OSError:
        pass
    return values


def gpu_memory_mb(device: str) -> float | None:
    """GPU memory in use on the device (torch's peak when torch owns it, else NVML), in MB."""
    if not device.startswith("cuda"):
        return None
    index = int(device.partition(":")[2] or 0)
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.max_memory_allocated(index) > 0:
        return round(torch.cuda.max_memory_allocated(index) / 2**20, 1)
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index))
            return round(info.used / 2**20, 1)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None
