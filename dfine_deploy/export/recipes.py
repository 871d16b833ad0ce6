"""The recipe table: one row per graph an artifact folder can hold, read by `dfine-export`
(`write_graphs` runs the rows that apply, in order), by the folder's claim (`export/pipeline.py`
`ARTIFACT`: the files a re-export may replace), by `backend_graphs` (which graph each backend runs)
and by docs/ARCHITECTURE.md's artifact table (kept equal to the rows by tests/architecture).

A row says which file it writes, in which precision and sampler, what it is made from and gated
against (and on which backends), which backends `model.json` routes to it and when it applies; its
`write` makes, gates and records the graph (`export/graphs.py` for the ONNX graphs).
docs/ARCHITECTURE.md, "Adding an export graph", is the recipe for a new row.
"""

from __future__ import annotations

import logging

from dfine_deploy.artifact import GATE_BACKEND, ArtifactInfo, parity_key
from dfine_deploy.backend_names import BackendName, Precision
from dfine_deploy.export import graphs, parity, rknn
from dfine_deploy.export.deploy_targets import DeployTarget, runs_on
from dfine_deploy.export.run import PYTORCH, ExportRun, GraphRecipe
from dfine_deploy.export.settings import ExportSettings
from dfine_deploy.export.sidecar import artifact_info
from dfine_deploy.runtime.backends import BY_NAME
from dfine_deploy.runtime.tensorrt_plan import INT8_GRAPH

log = logging.getLogger(__name__)

CPU_BACKENDS = (GATE_BACKEND, BackendName.OPENVINO)  # the backends that run the GridSample graphs
CPU_GRAPH = "fp32-grid"


def _cpu_graphs(opts: ExportSettings, target: DeployTarget | None) -> bool:
    return opts.postprocess and target is None and (opts.cpu_graph or opts.int8)


# the order is the order they are written in: a row's `source` and `reference` come before it
RECIPES: tuple[GraphRecipe, ...] = (
    GraphRecipe(
        key=Precision.FP32,
        file="model.onnx",
        precision=Precision.FP32,
        sampler=None,
        source=None,
        reference=PYTORCH,
        thresholds=parity.FP32_GATE,
        backends=(),
        gated_on=(GATE_BACKEND,),
        applies=lambda opts, target: True,
        when="always",
        write=graphs.traced_graph,
    ),
    GraphRecipe(
        key=Precision.FP16,
        file="model.fp16.onnx",
        precision=Precision.FP16,
        sampler=None,
        source=Precision.FP32,
        reference=Precision.FP32,
        thresholds=parity.FP16_GATE,
        backends=(),
        gated_on=(GATE_BACKEND,),
        applies=lambda opts, target: opts.fp16,
        when="unless `--no-fp16`",
        write=graphs.fp16_graph,
    ),
    GraphRecipe(
        key=INT8_GRAPH,
        file="model.int8.trt.onnx",
        precision=Precision.INT8,
        sampler=None,
        source=Precision.FP32,
        reference=Precision.FP32,
        thresholds=parity.INT8_GATE,
        backends=(BackendName.TENSORRT,),
        gated_on=(GATE_BACKEND,),
        applies=lambda opts, target: opts.int8 and runs_on(target, BackendName.TENSORRT),
        when="`--int8` with `--target`",
        write=graphs.tensorrt_int8_graph,
    ),
    GraphRecipe(
        key=CPU_GRAPH,
        file="model.grid.onnx",
        precision=Precision.FP32,
        sampler="grid",
        source=None,
        reference=PYTORCH,
        thresholds=parity.FP32_GATE,
        backends=CPU_BACKENDS,
        gated_on=CPU_BACKENDS,
        applies=_cpu_graphs,
        when="without `--target`, unless `--no-cpu-graph` (not with `--int8`); `--sampler grid`: model.onnx",
        write=graphs.cpu_graph,
    ),
    GraphRecipe(
        key=Precision.INT8,
        file="model.int8.onnx",
        precision=Precision.INT8,
        sampler="grid",
        source=CPU_GRAPH,
        reference=CPU_GRAPH,
        thresholds=parity.INT8_GATE,
        backends=CPU_BACKENDS,
        gated_on=CPU_BACKENDS,
        applies=lambda opts, target: opts.int8 and _cpu_graphs(opts, target),
        when="`--int8` without `--target`",
        write=graphs.cpu_int8_graph,
    ),
    GraphRecipe(
        key="rknn-fp16",
        file="model.rknn",
        precision=Precision.FP16,
        sampler=None,
        source=Precision.FP32,
        reference=PYTORCH,
        thresholds=parity.FP16_GATE,
        backends=(BackendName.RKNN,),
        gated_on=(BackendName.RKNN,),
        applies=lambda opts, target: runs_on(target, BackendName.RKNN),
        when="`--target rk3588` (or another Rockchip NPU)",
        write=rknn.rknn_graph,
    ),
    GraphRecipe(
        key="rknn-int8",
        file="model.int8.rknn",
        precision=Precision.INT8,
        sampler=None,
        source=Precision.FP32,
        reference=PYTORCH,
        thresholds=parity.INT8_GATE,
        backends=(BackendName.RKNN,),
        gated_on=(BackendName.RKNN,),
        applies=lambda opts, target: opts.int8 and runs_on(target, BackendName.RKNN),
        when="`--int8` with a Rockchip `--target`",
        write=rknn.rknn_graph,
    ),
)
BY_KEY: dict[str, GraphRecipe] = {row.key: row for row in RECIPES}
GRAPH_FILES: tuple[str, ...] = tuple(row.file for row in RECIPES)


def write_graphs(run: ExportRun) -> ArtifactInfo:
    """Write, gate and record the graph of every row that applies to the run, in table order; the
    sidecar of them (before the engine is added) is returned."""
    rows = [row for row in RECIPES if row.applies(run.settings, run.deploy_target)]
    for done, row in enumerate(rows, start=1):
        run.add(row, row.make(run))
        run.keep_references(rows[done:])
    target = {**run.deploy_target.target_record(run), **run.target} if run.deploy_target is not None else {}
    return artifact_info(run, target=target, backend_graphs=backend_graphs(run))


def backend_graphs(run: ExportRun) -> dict[str, dict[str, str]]:
    """model.json's `backend_graphs`: each backend a written row is routed to runs it at the row's
    precision where its gate there passed (or --force), and at the precisions the backend applies
    itself to an FP32 graph (OpenVINO's BF16) where that gate passed. A backend the row is gated
    on, but that could not run here, is not routed."""
    routes: dict[str, dict[str, str]] = {}
    for row in RECIPES:
        key = run.written.get(row.key)
        if key is None:
            continue
        gates = {
            b: run.parity.get(parity_key(key, b if b in row.gated_on else GATE_BACKEND)) for b in row.backends
        }
        gated = [b for b, gate in gates.items() if gate is not None]
        for backend in gated:
            if not (gates[backend]["passed"] or run.settings.force):
                _not_offered(row, backend, gates[backend], [b for b in gated if b != backend])
                continue
            routes.setdefault(backend, {})[row.precision] = key
            for applied in _applied_precisions(backend) if row.precision == Precision.FP32 else ():
                if run.parity.get(parity_key(applied, backend), {}).get("passed"):
                    routes[backend][applied] = key
    return routes


def _applied_precisions(backend: str) -> tuple[Precision, ...]:
    """The precisions `backend` applies itself to an FP32 graph (runtime/backends.py)."""
    return tuple(p for p in BY_NAME[backend.partition(":")[0]].run_precisions if p != Precision.FP32)


def _not_offered(row: GraphRecipe, backend: str, gate: dict, others: list[str]) -> None:
    precision = str(row.precision).upper()
    log.warning(
        "%s is not offered on %s: its gate failed on this CPU (class %s: %s); model.json lists the %s "
        "graph for %s only",
        precision,
        backend,
        gate.get("isa"),
        "; ".join(gate.get("failures", [])[:1]),
        precision,
        ", ".join(others),
    )
