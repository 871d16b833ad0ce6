#!/usr/bin/env bash
# Build a TensorRT engine for a dfine-export artifact ON the target (Jetson or x86 GPU host).
#
#   bash build_engine.sh ARTIFACT_DIR [--batch MIN OPT MAX] [--workspace MB] [--fp32 | --int8]
#                                     [--tf32] [--python] [--dry-run]
#
# Engines are tied to the TensorRT version and GPU they were built on, so they are built here,
# never copied from another machine. Export with the --target of this device's TensorRT; the
# script checks that the artifact's target fits the installed TensorRT and follows it:
#   TensorRT 8.5   JetPack 5.1      --target jetpack5    model.onnx  --fp16 --precisionConstraints=obey
#                                                                    --layerPrecisions/--layerOutputTypes
#   TensorRT 8.6   JetPack 6.0      --target jetpack6.0  model.onnx  the same graph and flags as 8.5
#   TensorRT 10.x  JetPack 6.1-7.2  --target jetpack6/7  model.fp16.onnx  --stronglyTyped
#   TensorRT 11.x                   --target trt11       model.fp16.onnx  (always strongly typed; no --fp16)
# --int8 (10.x/11.x, an export with --int8 --target): model.int8.trt.onnx, the Q/DQ graph, strongly
# typed with no precision flag (explicit quantization; --stronglyTyped on 10.x).
# Each precision's engine has its own file beside the graphs, so building one never replaces
# another: model.engine (FP16), model.int8.engine (--int8), model.fp32.engine (--fp32).
# The FP32 layers of 8.x builds are those recorded in model.json (dfine_deploy/export/targets.py).
# trtexec is JetPack's own /usr/src/tensorrt/bin/trtexec when present, else the one on PATH.
# Both inputs (images, orig_target_sizes) get min/opt/max shapes. After trtexec wrote the engine,
# dfine_deploy records it in model.json (sha256, TensorRT version, GPU, profile, precision evidence
# from trtexec's log and --exportLayerInfo; python -m dfine_deploy.export.tensorrt_record), so
# dfine-bench/dfine-serve open the folder; an engine the evidence refuses is not kept. The timing
# cache, in the artifact folder, is keyed by TensorRT version and GPU (timing-trtV-GPU-smCC.cache)
# and reused only by the same pair. Both need dfine_deploy importable by python3 (installed, or
# this script run from a checkout); without it the engine is written unrecorded and uncached,
# saying so. --python uses dfine_deploy's builder instead of trtexec (needs the tensorrt Python
# package too). DFINE_TRT_VERSION and DFINE_TRT_GPU=NAME:CC override the detected TensorRT version
# and GPU (for --dry-run on another machine).
set -euo pipefail

# the comment block above, without its '#'
usage() { awk 'NR > 1 { if (!/^#/) exit; sub(/^# ?/, ""); print }' "$0"; exit 0; }
# bad input: one line, status 2 (docs/bad-input.md)
die() { echo "error: $*; see build_engine.sh --help" >&2; exit 2; }
# OPTION COUNT ARGS...: the option is followed by COUNT values
takes() { [ $(($# - 2)) -ge "$2" ] || die "$1 needs $2 value(s)"; }
is_count() { [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -ge 1 ]; }

artifact="" batch="" workspace=4096 precision=fp16 tf32=0 use_python=0 dry_run=0
while [ $# -gt 0 ]; do
  case "$1" in
    --batch) takes --batch 3 "${@:2}"; batch="$2 $3 $4"; shift 4 ;;
    --workspace) takes --workspace 1 "${@:2}"; workspace="$2"; shift 2 ;;
    --fp32) precision=fp32; shift ;;
    --int8) precision=int8; shift ;;
    --tf32) tf32=1; shift ;;
    --python) use_python=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage ;;
    -*) die "unknown option $1" ;;
    *) [ -z "$artifact" ] || die "one artifact folder only, got $artifact and $1"; artifact="$1"; shift ;;
  esac
done
[ -n "$artifact" ] || die "give the artifact folder made by dfine-export"
is_count "$workspace" || die "--workspace $workspace: give the builder's memory in MB, a whole number >= 1"
if [ -n "$batch" ]; then
  read -r bmin bopt bmax <<<"$batch"
  { is_count "$bmin" && is_count "$bopt" && is_count "$bmax" && [ "$bmin" -le "$bopt" ] && [ "$bopt" -le "$bmax" ]; } ||
    die "--batch $batch: need whole numbers 1 <= MIN <= OPT <= MAX, e.g. --batch 1 1 8"
fi
sidecar="$artifact/model.json"
[ -d "$artifact" ] || die "$artifact: no such folder; give the artifact folder made by dfine-export"
[ -f "$sidecar" ] || die "$sidecar not found; copy the whole artifact folder here"

# --- what is installed -------------------------------------------------------------------------
trtexec_bin=/usr/src/tensorrt/bin/trtexec   # JetPack's (and the TensorRT .deb's) own trtexec
[ -x "$trtexec_bin" ] || trtexec_bin="$(command -v trtexec || true)"
trt_version="${DFINE_TRT_VERSION:-}"
if [ -z "$trt_version" ]; then
  trt_version="$(python3 -c 'import tensorrt; print(tensorrt.__version__)' 2>/dev/null || true)"
fi
if [ -z "$trt_version" ] && command -v dpkg-query >/dev/null; then
  trt_version="$(dpkg-query -W -f='${Version}' libnvinfer-bin 2>/dev/null | cut -d- -f1 || true)"
fi
if [ -z "$trt_version" ]; then
  echo "error: no TensorRT found (neither the tensorrt Python package nor libnvinfer-bin)." >&2
  echo "On Jetson install it with JetPack (sudo apt install nvidia-jetpack); on x86 see NVIDIA's TensorRT install guide." >&2
  exit 2
fi
# dfine_deploy records the engine and keys the timing cache; a checkout's copy serves when it is
# not installed (this script at export/jetson/ of the checkout).
checkout="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
recorder=(python3 -m dfine_deploy.export.tensorrt_record)
# (reading model.json and the GPU query go through dfine_deploy.runtime: its dependencies too)
can_record() { python3 -c 'import dfine_deploy.export.tensorrt_record, dfine_deploy.runtime' 2>/dev/null; }
have_recorder=0; if can_record; then have_recorder=1; fi
if [ "$have_recorder" = 0 ] && [ -f "$checkout/dfine_deploy/export/tensorrt_record.py" ]; then
  export PYTHONPATH="$checkout${PYTHONPATH:+:$PYTHONPATH}"
  if can_record; then have_recorder=1; fi
fi
jetpack="not a Jetson"
if [ -f /etc/nv_tegra_release ]; then
  l4t="$(sed -n 's/^# R\([0-9]*\).*/\1/p' /etc/nv_tegra_release)"
  case "$l4t" in 35) jetpack="JetPack 5.x";; 36) jetpack="JetPack 6.x";; 38) jetpack="JetPack 7.0/7.1";;
                  39) jetpack="JetPack 7.2";; *) jetpack="L4T R$l4t";; esac
fi
major="${trt_version%%.*}"
rest="${trt_version#*.}"; minor="${rest%%.*}"
echo "TensorRT $trt_version ($jetpack)" >&2

# --- the artifact -------------------------------------------------------------------------------
# One line of sizes, then the export target (or "-"), then the trtexec per-layer precision flags
# as dfine-export recorded them.
{ read -r height width bmin bopt bmax has_fp16 int8_graph; read -r target; read -r layer_flags; } < <(python3 - "$sidecar" <<'PY'
import json, sys
info = json.load(open(sys.argv[1]))
graphs = info.get("graphs", {})
int8 = graphs.get(info.get("backend_graphs", {}).get("tensorrt", {}).get("int8", ""), {}).get("file", "-")
print(info["input_height"], info["input_width"], info["batch_min"], info["batch_opt"], info["batch_max"],
      int("fp16" in graphs), int8)
target = info.get("target") or {}
print(target.get("profile", {}).get("name", "-"))
# written by dfine-export (dfine_deploy/export/targets.py trtexec_layer_flags); "-": FP32 layers
# recorded by an older export without their flags
flags = target.get("trtexec_layer_flags")
print(" ".join(flags) if flags else "-" if target.get("fp32_layers") else "")
PY
)
if [ -n "$batch" ]; then read -r bmin bopt bmax <<<"$batch"; fi

# --- does the artifact fit this TensorRT? ------------------------------------------------------
family=""
case "$major.$minor" in
  8.5) family=8.5 ;;
  8.[6-9]) family=8.6 ;;
  *) if [ "$major" -eq 10 ] || [ "$major" -eq 11 ]; then family="$major"; fi ;;
esac
refuse() { echo "error: $1" >&2; exit 2; }
exported="exported for --target $target"; [ "$target" != - ] || exported="exported without --target"
[ -n "$family" ] || refuse "TensorRT $trt_version is not a supported target (8.5, 8.6, 10.x, 11.x; JetPack 5.1 or newer)"
case "$family:$target" in
  8.5:trt8.5 | 8.6:trt8.5 | 8.6:trt8.6) ;;
  8.5:*) refuse "$artifact was $exported; TensorRT 8.5 cannot parse its graph (LayerNormalization, INT64 I/O). Re-export with: dfine-export MODEL --target jetpack5" ;;
  8.6:*) refuse "$artifact was $exported; TensorRT 8.6 has no INT64 tensors. Re-export with: dfine-export MODEL --target jetpack6.0" ;;
  10:trt8.* | 11:trt8.*) refuse "$artifact was $exported (INT32 I/O, FP32-constraint plan); for TensorRT $trt_version re-export with --target jetpack6, jetpack7 or trt11" ;;
esac

# --- per-version recipe -------------------------------------------------------------------------
flags=()
if [ "$precision" = int8 ]; then
  case "$family" in 8.*) refuse "INT8 engines are built here by explicit quantization in a strongly typed network, TensorRT 10 or newer; build FP16 (drop --int8), or use JetPack 6.1+ with an artifact exported with --int8 --target jetpack6" ;; esac
  [ "$int8_graph" != - ] || refuse "$artifact has no INT8 graph for TensorRT; re-export with: dfine-export MODEL --int8 --data DIR --target jetpack6 (or jetpack7, trt11)"
  graph="$int8_graph"                   # Q/DQ graph: precision from its types, no --fp16/--int8
  [ "$family" = 10 ] && flags+=(--stronglyTyped)
elif [ "$family" = 11 ]; then
  graph=model.fp16.onnx                 # strongly typed only; --fp16 was removed in 11.x
  [ "$precision" = fp32 ] && graph=model.onnx
elif [ "$family" = 10 ]; then
  if [ "$precision" = fp16 ] && [ "$has_fp16" = 1 ]; then graph=model.fp16.onnx; flags+=(--stronglyTyped)
  else graph=model.onnx; [ "$precision" = fp16 ] && flags+=(--fp16); fi
else
  graph=model.onnx                      # 8.x: no strong typing; FP16 flag with FP32 layers held by constraints
  if [ "$precision" = fp16 ]; then
    [ -n "$layer_flags" ] || refuse "$artifact records no FP32 layers (exported with --no-fp16?); re-export with --target $target, or build FP32 with --fp32"
    [ "$layer_flags" != - ] || refuse "$artifact records FP32 layers but not their trtexec flags (an older dfine-export); re-export with --target $target"
    read -r -a constraint_flags <<<"$layer_flags"
    flags+=(--fp16 --precisionConstraints=obey "${constraint_flags[@]}")
  fi
fi
if [ "$graph" = model.fp16.onnx ] && [ "$has_fp16" != 1 ]; then
  echo "error: TensorRT $trt_version builds FP16 only from the typed graph, and $artifact has no model.fp16.onnx;" >&2
  echo "re-export with dfine-export --fp16, or build an FP32 engine with --fp32" >&2; exit 2
fi
[ "$tf32" = 1 ] || flags+=(--noTF32)

# the names of dfine_deploy/artifact.py's ENGINE_FILES (tests/export/test_tensorrt_int8.py holds them equal)
case "$precision" in int8) engine_name=model.int8.engine ;; fp32) engine_name=model.fp32.engine ;; *) engine_name=model.engine ;; esac
# trtexec writes to model.engine.tmp whatever the precision (the line NVIDIA's parser was recorded
# with, tests/data/trt_oracle_verdicts.json); only the judged engine gets its precision's name
built="$artifact/model.engine.tmp" layers="$artifact/model.engine.layers.tmp" log="$artifact/model.engine.log.tmp"
evidence=()   # what the recording reads: the inspector JSON trtexec exports
if [ "$use_python" = 0 ] && [ "$have_recorder" = 1 ]; then
  gpu_option=(); [ -z "${DFINE_TRT_GPU+set}" ] || gpu_option=(--gpu "$DFINE_TRT_GPU")
  cache_name="$("${recorder[@]}" cache-name --tensorrt-version "$trt_version" "${gpu_option[@]}")"
  [ -z "$cache_name" ] || flags+=("--timingCacheFile=$artifact/$cache_name")
  evidence=("--exportLayerInfo=$layers")
elif [ "$use_python" = 0 ]; then
  echo "note: python3 cannot import dfine_deploy: $engine_name will not be recorded in model.json and no timing cache is used (install dfine-deploy, or run this script from its checkout)" >&2
fi

shape() { echo "images:${1}x3x${height}x${width},orig_target_sizes:${1}x2"; }
cmd=("${trtexec_bin:-trtexec}" "--onnx=$artifact/$graph" "--saveEngine=$built"
     "--minShapes=$(shape "$bmin")" "--optShapes=$(shape "$bopt")" "--maxShapes=$(shape "$bmax")"
     "--memPoolSize=workspace:${workspace}M" "--profilingVerbosity=detailed" "${evidence[@]}" "${flags[@]}")
if [ "$use_python" = 1 ]; then
  pyflags=(--workspace-mb "$workspace" --batch "$bmin" "$bopt" "$bmax")
  [ "$precision" = fp32 ] && pyflags+=(--no-fp16)
  [ "$precision" = int8 ] && pyflags+=(--int8)
  [ "$tf32" = 1 ] && pyflags+=(--tf32)
  cmd=(python3 -m dfine_deploy.export.tensorrt "$artifact" "${pyflags[@]}")
fi

if [ "$dry_run" = 1 ]; then echo "${cmd[*]}"; exit 0; fi
if [ "$use_python" = 0 ] && [ -z "$trtexec_bin" ]; then
  echo "error: trtexec not found (looked in PATH and /usr/src/tensorrt/bin); add it or use --python" >&2; exit 2
fi
if [ "$use_python" = 1 ]; then exec "${cmd[@]}"; fi
trap 'rm -f "$built" "$layers" "$log"' EXIT   # this run's files; the engine keeps its name only when judged
started=$SECONDS
"${cmd[@]}" 2>&1 | tee "$log"
if [ "$have_recorder" = 1 ]; then   # judges the engine, moves it to its precision's file, records it
  "${recorder[@]}" record "$artifact" --built "$built" --log "$log" --layer-info "$layers" \
    --tensorrt-version "$trt_version" --build-seconds "$((SECONDS - started))" -- "${cmd[@]}"
else
  mv -f "$built" "$artifact/$engine_name"   # only a finished engine gets the name
  echo "wrote $artifact/$engine_name (TensorRT $trt_version), not recorded in model.json: dfine-bench opens it by its path while model.json records no other engine" >&2
fi
