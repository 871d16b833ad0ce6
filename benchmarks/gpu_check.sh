#!/usr/bin/env bash
# Every GPU-only check of dfine-deploy in one run (at most 15 minutes), one JSON report: every
# TensorRT path this host can run (Python build, trtexec, onnxruntime TensorRT provider, each buffer
# kind) is its own entry, so the first person with a GPU proves or refutes each support-matrix cell.
#
#   benchmarks/gpu_check.sh                 # writes gpu_check.json in the repository root
#   benchmarks/gpu_check.sh /tmp/report.json
#
# What it checks and the agreement tolerances: see benchmarks/gpu_check.py. On a machine without an
# NVIDIA GPU it stops at once with exit status 2 and says so.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT="${1:-gpu_check.json}"
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
    echo "gpu_check: no NVIDIA GPU on this machine (nvidia-smi is missing or lists no GPU)." >&2
    echo "gpu_check: these checks need a GPU and its driver; run this script on a GPU machine." >&2
    exit 2
fi

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
exec timeout --signal=TERM --kill-after=10 960 "$PY" benchmarks/gpu_check.py --out "$OUT" --budget 900
