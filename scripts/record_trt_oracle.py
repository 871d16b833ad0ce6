"""Record the verdicts of trtexec's own option parser on every trtexec line dfine-deploy emits.

    DFINE_TRT_SOURCES=/path/to/TensorRT.git python scripts/record_trt_oracle.py

DFINE_TRT_SOURCES is a local clone (bare or not) of https://github.com/NVIDIA/TensorRT with its
tags. For each tag in scripts/trt_oracle TAGS this compiles that tag's
samples/common/sampleOptions.cpp with our driver into a temporary build folder (nothing of
NVIDIA's is written into this repository), exports the real D-FINE-N graph as the tests do, runs
every emitted line and the probes through it, and rewrites tests/data/trt_oracle_verdicts.json:
the verdicts and NVIDIA's messages, each tag's commit and the blob ids of the files read, the date
and this command. It runs the pytest tests that make those lines, so the lines are the tests' own.
Commit the new record after reading its diff; `make test` then checks the product against it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.trt_oracle import TAGS  # noqa: E402
from scripts.trt_oracle.record import RECORD, RECORD_ENV  # noqa: E402
from scripts.trt_oracle.sources import SOURCES_ENV, SourcesMissing, TagReader, sources_dir  # noqa: E402

TESTS = (
    "tests/export/test_trt_targets.py::test_every_trtexec_line_we_emit_is_accepted_by_nvidias_parser_and_layer_rules",
    "tests/export/test_trt_oracle.py",
)


def main() -> int:
    try:
        repo = sources_dir()
        for tag in TAGS if repo else ():
            TagReader(repo, tag)  # every tag is there, before minutes of export
    except SourcesMissing as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if repo is None:
        print(
            f"error: set {SOURCES_ENV} to a local clone of https://github.com/NVIDIA/TensorRT",
            file=sys.stderr,
        )
        return 2
    env = dict(
        os.environ,
        **{RECORD_ENV: "1"},
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    # first the line test, which writes the record; then the checks that read it
    for tests in (TESTS[:1], TESTS[1:]):
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:warnings", *tests],
            cwd=ROOT,
            env=env,
            check=False,
        )
        if done.returncode != 0:
            return done.returncode
    print(f"wrote {RECORD.relative_to(ROOT)} from {repo}; review `git diff` and commit it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
