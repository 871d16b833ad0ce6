"""dfine-serve's signal tests, many times in a row: a stop that hangs one run in fifty shows here.

    python benchmarks/stress_signals.py [--rounds 50] [--keep-going]

The tests are found, not listed: every test function under tests/serve/ that sends a real
`dfine-serve` process a signal (`.send_signal(` in its body: SIGTERM, SIGHUP, SIGINT, SIGKILL, and
the stop deadline's tests). Each round runs all of them in one pytest process; the script stops at
the first round that fails (unless --keep-going), prints that round's output, and ends with the
count of rounds that passed, the time they took and the load average beside the CPU. Run it on a
busy machine too: the races it is for show under load. Acceptance (docs/serve.md, "Stopping"): 50
rounds in a row pass.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests" / "serve"


def signal_tests(folder: Path = TESTS) -> list[str]:
    """Node ids (relative to the repository) of the test functions whose body calls `.send_signal(`."""
    found = []
    for path in sorted(folder.glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            if any(_sends_a_signal(n) for n in ast.walk(node)):
                found.append(f"{path.relative_to(ROOT)}::{node.name}")
    return found


def _sends_a_signal(node: ast.AST) -> bool:
    called = isinstance(node, ast.Call) and node.func
    return isinstance(called, ast.Attribute) and called.attr == "send_signal"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=50, help="rounds to run (default 50)")
    parser.add_argument("--keep-going", action="store_true", help="run every round even after a failure")
    args = parser.parse_args(argv)
    tests = signal_tests()
    if not tests:
        print(f"no test under {TESTS} sends a signal", file=sys.stderr)
        return 2
    print(f"{len(tests)} signal tests, {args.rounds} rounds; load average {_load()} at the start")
    for test in tests:
        print(f"  {test}")
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--no-header", *tests]
    passed = failed = 0
    started = time.monotonic()
    for index in range(1, args.rounds + 1):
        round_start = time.monotonic()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        took = time.monotonic() - round_start
        summary = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
        ok = done.returncode == 0
        passed += ok
        failed += not ok
        verdict = "pass" if ok else "FAIL"
        print(f"round {index}: {verdict} in {took:.0f} s ({summary}); load {_load()}", flush=True)
        if not ok:
            print(done.stdout[-20_000:] + done.stderr[-5_000:])
            if not args.keep_going:
                break
    minutes = (time.monotonic() - started) / 60
    print(f"{passed} of {passed + failed} rounds passed in {minutes:.1f} min; load {_load()} at the end")
    return 0 if failed == 0 and passed == args.rounds else 1


if __name__ == "__main__":
    raise SystemExit(main())
