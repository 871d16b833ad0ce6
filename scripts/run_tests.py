"""Run the test suite one test package per pytest process, then print one total line.

Why not one process: with torch, onnxruntime, OpenVINO (TBB) and NNCF all loaded into one long
pytest process, the full suite died with SIGSEGV at varying tests (no Python traceback, faulthandler
silent), while every package passed in a process of its own. Until the cause is found, each package
of tests/ gets a fresh interpreter; a crash, if any, is reported with the package it happened in.
Arguments are passed to every pytest run (e.g. `-k name`, `-x`). The first line names the CPU's
ISA class (dfine_deploy/cpu.py): numeric tolerances and the INT8/BF16 paths depend on it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from dfine_deploy import cpu

TESTS = Path(__file__).resolve().parents[1] / "tests"
NOT_TESTS = {"data", "fakes", "support", "__pycache__"}
COUNTS = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)")


def packages() -> list[Path]:
    return sorted(p for p in TESTS.iterdir() if p.is_dir() and p.name not in NOT_TESTS)


def main(argv: list[str]) -> int:
    totals: dict[str, int] = {}
    crashed: list[str] = []
    start = time.monotonic()
    print(f"CPU ISA class: {cpu.describe()}", flush=True)
    for package in packages():
        print(f"== {package.relative_to(TESTS.parent)}", flush=True)
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", str(package), *argv], stdout=subprocess.PIPE, text=True
        )
        print(proc.stdout, end="", flush=True)
        lines = [line for line in proc.stdout.splitlines() if COUNTS.search(line)]
        for count, kind in COUNTS.findall(lines[-1] if lines else ""):
            key = "errors" if kind.startswith("error") else kind
            totals[key] = totals.get(key, 0) + int(count)
        if proc.returncode not in (0, 1, 5):  # 1: tests failed (counted above); 5: none collected
            crashed.append(f"{package.name} (exit {proc.returncode})")
    minutes = (time.monotonic() - start) / 60
    for name in crashed:
        print(f"pytest process crashed or could not run: tests/{name}")
    failed = totals.get("failed", 0) + totals.get("errors", 0) + len(crashed)
    extra = f", {totals['skipped']} skipped" if totals.get("skipped") else ""
    print(f"all packages in {minutes:.1f} min")
    print(f"{totals.get('passed', 0)} passed, {failed} failed{extra}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
