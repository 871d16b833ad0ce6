#!/usr/bin/env bash
# Every GPU-only check of dfine-deploy in one run (at most 8 minutes), one JSON report: every
# TensorRT path this host can run (Python build, trtexec, onnxruntime TensorRT provider, each buffer
# kind) is its own entry, so the first person with a GPU proves or refutes each support-matrix cell
# (docs/targets.md). A package the host lacks (TensorRT, onnxruntime-gpu) is reported "not installed".
#
#   benchmarks/gpu_check.sh                 # writes gpu_check.json in the repository root
#   benchmarks/gpu_check.sh /tmp/report.json
#   benchmarks/gpu_check.sh --dry [REPORT]  # no GPU needed: every check's plumbing on the CPU, the
#                                           # TensorRT ones on the fake TensorRT/CUDA of tests/fakes
#   benchmarks/gpu_check.sh REPORT --only export tensorrt_build   # further options go to gpu_check.py
#
# On a host without network: prepare the wheels here first (python benchmarks/gpu_wheels.py, at most
# ~60 MiB) and copy the repository with benchmarks/gpu_wheels/; this script installs them into
# runs/gpu_check/site (pip --target --no-index; nothing outside the repository is touched).
#
# What it checks and the agreement tolerances: see benchmarks/gpu_check.py. On a machine without an
# NVIDIA GPU it stops at once with exit status 2 and says so (unless --dry).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
DRY=""
if [ "${1:-}" = "--dry" ]; then DRY="--dry"; shift; fi
OUT="${1:-gpu_check.json}"
[ $# -gt 0 ] && shift
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
WHEELS="${GPU_CHECK_WHEELS:-benchmarks/gpu_wheels}"
WORK="${GPU_CHECK_WORK:-runs/gpu_check}"
BUDGET=420  # seconds for the checks; with set-up the run ends within 8 minutes

if [ -z "$DRY" ]; then
    if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
        echo "gpu_check: no NVIDIA GPU on this machine (nvidia-smi is missing or lists no GPU)." >&2
        echo "gpu_check: these checks need a GPU and its driver; run this script on a GPU machine." >&2
        exit 2
    fi
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
fi

if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    SITE="$WORK/site"
    mkdir -p "$WORK"
    rm -rf "$SITE.new"
    if ! "$PY" -m pip install -q --no-index --no-deps --disable-pip-version-check --target "$SITE.new" "$WHEELS"/*.whl; then
        echo "gpu_check: installing the wheels of $WHEELS into $SITE.new failed (see above)." >&2
        exit 2
    fi
    rm -rf "$SITE" && mv "$SITE.new" "$SITE"
    echo "gpu_check: $(ls "$WHEELS"/*.whl | wc -l) wheels of $WHEELS installed into $SITE"
    export PYTHONPATH="$PWD/$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
# Every check imports the runtime: without these nothing can run, so say which are missing at once.
if ! MISSING="$("$PY" - <<'PYEOF'
import importlib.util
names = {"numpy": "numpy", "cv2": "opencv-python-headless", "yaml": "pyyaml", "PIL": "pillow", "torch": "torch"}
print(" ".join(pip for module, pip in names.items() if importlib.util.find_spec(module) is None))
PYEOF
)"; then
    echo "gpu_check: $PY could not be run" >&2
    exit 2
fi
if [ -n "$MISSING" ]; then
    echo "gpu_check: $PY lacks $MISSING; add their wheels to the folder (python benchmarks/gpu_wheels.py --binary NAME ...; torch from its own index) or install them" >&2
    exit 2
fi
if [ -n "$DRY" ]; then
    BUDGET=240
    # No GPU: NVIDIA's Python API surface as recorded in tests/fakes (TensorRT, whose engines run their
    # graph with onnxruntime, and cuda-python's runtime over host memory) and a trtexec that builds
    # with it (tests/support/stub_trtexec.py), so every TensorRT check runs to its end here.
    mkdir -p "$WORK/dry_bin"
    DRY_BIN="$(cd "$WORK/dry_bin" && pwd)"
    export PYTHONPATH="$PWD/tests/fakes${PYTHONPATH:+:$PYTHONPATH}"
    if ! STUB_TRT_VERSION="$("$PY" -c 'import tensorrt; print(tensorrt.__version__)')"; then
        echo "gpu_check: the fake TensorRT of tests/fakes does not import with $PY (see above)" >&2
        exit 2
    fi
    export STUB_TRT_VERSION
    printf '#!/bin/sh\nexec "%s" "%s" "$@"\n' "$PY" "$PWD/tests/support/stub_trtexec.py" > "$DRY_BIN/trtexec"
    chmod +x "$DRY_BIN/trtexec"
    export PATH="$DRY_BIN:$PATH"
fi
exec timeout --signal=TERM --kill-after=10 "$((BUDGET + 50))" "$PY" benchmarks/gpu_check.py \
    --out "$OUT" --work "$WORK" --budget "$BUDGET" $DRY "$@"
