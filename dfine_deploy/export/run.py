"""One export's context (`ExportRun`) and the shape of a graph recipe (`GraphRecipe`).

`export/recipes.py` holds the rows and runs them in order; each row's `write` function (in
`export/graphs.py` for the ONNX graphs) makes its graph from an `ExportRun`: it reads the staging
folder, the settings, the loaded model, the gate's batches and scorer, and the --target's row; it
gates what it wrote with `run.gate` and returns what it adds to the export's records (`Written`),
which `write_graphs` puts into the run before the next row runs. docs/ARCHITECTURE.md,
"Adding an export graph", is the recipe for a new row.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dfine_deploy.artifact import GraphInfo, parity_key
from dfine_deploy.backend_names import Precision
from dfine_deploy.boxes import postprocess_numpy
from dfine_deploy.export import onnx as onnx_export
from dfine_deploy.export import parity
from dfine_deploy.export.settings import ExportSettings
from dfine_deploy.thresholds import gather_evidence, split_halves, threshold_record

if TYPE_CHECKING:
    from dfine_deploy.export.deploy_targets import DeployTarget
    from dfine_deploy.hub.loader import LoadedModel
    from dfine_deploy.runtime.tensorrt_plan import TargetProfile

log = logging.getLogger(__name__)

PYTORCH = "pytorch"  # a recipe's `reference` when its graph is gated against the PyTorch model itself
DatasetScorer = Callable[[Sequence[parity.ParityBatch], list], float]
Outputs = tuple[np.ndarray, np.ndarray, np.ndarray]  # labels [B,K], boxes [B,K,4], scores [B,K]


@dataclass(frozen=True)
class Recorded:
    """A graph (None: more gates of a graph recorded already) and its gate results by the backend
    each ran on: what model.json's `graphs`, `parity` and `thresholds` are made of."""

    key: str  # the model.json graphs key
    graph: GraphInfo | None
    reports: Mapping[str, parity.ParityReport | Mapping[str, Any]]


@dataclass(frozen=True)
class Written:
    """What one recipe adds to the export: the graphs key its graph is under (another recipe's key
    when that graph already is this one, as model.onnx with --sampler grid) and its records."""

    key: str
    records: tuple[Recorded, ...] = ()
    target: Mapping[str, Any] = field(default_factory=dict)  # for model.json's `target`
    fp32_islands: Mapping[str, str] = field(default_factory=dict)  # an FP16 graph's FP32 nodes
    unavailable: Mapping[str, str] = field(default_factory=dict)  # backend -> why it is not gated here

    def __add__(self, more: Written) -> Written:
        """Both records, under `more`'s key (a recipe that builds on another write function's)."""
        return Written(
            more.key,
            (*self.records, *more.records),
            {**self.target, **more.target},
            {**self.fp32_islands, **more.fp32_islands},
            {**self.unavailable, **more.unavailable},
        )


@dataclass(frozen=True)
class GraphRecipe:
    """One graph an export can write: everything outside its `write` function needs to know."""

    key: str  # its model.json graphs key
    file: str  # its file in the artifact folder
    precision: Precision
    sampler: str | None  # deformable sampling in the graph; None: the export's --sampler
    source: str | None  # the recipe key of the graph it is made from; None: traced from PyTorch
    reference: str  # what its gate compares it against: PYTORCH or a recipe key
    thresholds: parity.GateThresholds
    # the backends `model.json` routes to it (backend_graphs); () routes none: a backend that lists
    # no graph for a precision runs the graph keyed by that precision
    backends: tuple[str, ...]
    # the backends it is gated on at export (parity key `parity_key(key, backend)`); a backend it is
    # routed to but not gated on here is routed by the GATE_BACKEND gate
    gated_on: tuple[str, ...]
    applies: Callable[[ExportSettings, DeployTarget | None], bool]  # from the settings and --target's row
    when: str  # `applies` in words, for docs/ARCHITECTURE.md's artifact table
    # writes and gates the graph; returns what it adds to the export's records
    write: Callable[[ExportRun, GraphRecipe], Written]

    def make(self, run: ExportRun) -> Written:
        return self.write(run, self)


@dataclass(frozen=True)
class ExportRun:
    """What every recipe of one export reads, and what they recorded: frozen, so a recipe cannot swap
    the settings or batches another one gates with; the records fill in from each recipe's `Written`
    (`add`) as the recipes run."""

    staging: Path  # the hidden folder the artifact is written into (export/pipeline.py)
    settings: ExportSettings
    module: Any  # the torch module traced: DeployModel, or RawOutputs for --no-postprocess
    loaded: LoadedModel
    batches: list[parity.ParityBatch]
    scorer: DatasetScorer | None  # mAP against --data's annotations, when it has them
    deploy_target: DeployTarget | None  # the --target's row (export/deploy_targets.py), if any
    # --data's annotations of the gate's images, by image id: (labels, boxes xyxy px) in the model's
    # labels; each gate's detections then choose the graph's thresholds per class on that backend
    truth: dict[int, tuple[np.ndarray, np.ndarray]] | None = None
    graphs: dict[str, GraphInfo] = field(default_factory=dict)
    parity: dict[str, dict[str, Any]] = field(default_factory=dict)  # by parity key
    written: dict[str, str] = field(default_factory=dict)  # recipe key -> the graphs key it recorded
    # what the recipes' `Written` added: to model.json's `target`, the FP16 graph's FP32 nodes, and
    # the backends their gates could not run on here (with why)
    target: dict[str, Any] = field(default_factory=dict)
    fp32_islands: dict[str, str] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    thresholds: dict[str, dict[str, Any]] = field(default_factory=dict)  # by parity key (thresholds.py)
    _detections: dict[str, list] = field(default_factory=dict)  # gate candidate name -> its outputs
    _references: dict[str, parity.Runner] = field(default_factory=dict)
    _pytorch_outputs: dict[int, Outputs] = field(default_factory=dict)  # by index in `batches`

    @property
    def profile(self) -> TargetProfile | None:
        """The TensorRT line of a TensorRT --target (what its graphs and engine are made for)."""
        return self.deploy_target.profile if self.deploy_target is not None else None

    @property
    def io_dtypes(self) -> dict[str, str] | None:
        """The graphs' interface dtypes the --target fixes (None: the D-FINE interface)."""
        fixed = self.deploy_target.io_dtypes if self.deploy_target is not None else None
        return dict(fixed) if fixed else None

    @property
    def min_opset(self) -> int:
        """The lowest opset a graph of this export may have: the one the --target fixes, else ours."""
        fixed = self.deploy_target.opset if self.deploy_target is not None else None
        return onnx_export.MIN_OPSET if fixed is None else fixed

    @property
    def num_top_queries(self) -> int:
        return self.loaded.spec.num_top_queries

    def sampler(self, recipe: GraphRecipe) -> str:
        return recipe.sampler or self.settings.sampler

    def path(self, key: str) -> Path:
        """The file of a written recipe's graph (by recipe key)."""
        return self.staging / self.graphs[self.written.get(key, key)].file

    def name(self, key: str) -> str:
        """How gate reports name a recipe's graph: its file, or "pytorch"."""
        return key if key == PYTORCH else self.path(key).name

    def runner(self, graph: str | Path) -> parity.Runner:
        """A parity Runner of PyTorch (PYTORCH) or of a graph file in a new onnxruntime session."""
        if str(graph) == PYTORCH:
            return _torch_runner(self.module, self.settings.postprocess, self.num_top_queries)
        session = onnx_export.ort_session(graph, self.settings.threads)
        return onnx_export.ort_runner(
            session, postprocess=self.settings.postprocess, num_top_queries=self.num_top_queries
        )

    def reference(self, recipe: GraphRecipe) -> parity.Runner:
        """The runner `recipe`'s graph is gated against, kept while a later recipe compares
        against it too (`keep_references`)."""
        if recipe.reference not in self._references:
            graph = recipe.reference if recipe.reference == PYTORCH else self.path(recipe.reference)
            runner = self.runner(graph)
            self._references[recipe.reference] = self._remembered(runner) if graph == PYTORCH else runner
        return self._references[recipe.reference]

    def _remembered(self, runner: parity.Runner) -> parity.Runner:
        """PyTorch's runner, its detections of each gate batch kept: every gate against PyTorch and
        the reference pack read them, and the model runs once per batch."""
        index = {id(batch.images): i for i, batch in enumerate(self.batches)}  # alive for the run

        def run(images: np.ndarray, orig_sizes: np.ndarray) -> Outputs:
            at = index.get(id(images))
            if at is None:
                return runner(images, orig_sizes)
            if at not in self._pytorch_outputs:
                self._pytorch_outputs[at] = runner(images, orig_sizes)
            return self._pytorch_outputs[at]

        return run

    def pytorch_outputs(self, images: int) -> list[tuple[parity.ParityBatch, Outputs]]:
        """The gate batches that hold the first `images` images, each with PyTorch's detections of it
        (those the gates computed, the rest computed now)."""
        run = self._references.get(PYTORCH) or self._remembered(self.runner(PYTORCH))
        chosen, count = [], 0
        for batch in self.batches:
            if count >= images:
                break
            chosen.append((batch, run(batch.images, batch.orig_sizes)))
            count += len(batch.images)
        return chosen

    def keep_references(self, recipes: Sequence[GraphRecipe]) -> None:
        """Drop the reference runners none of `recipes` (those still to run) compares against:
        each session holds a graph's weights."""
        for key in set(self._references) - {r.reference for r in recipes}:
            del self._references[key]

    def gate(
        self,
        reference: parity.Runner,
        candidate: parity.Runner,
        thresholds: parity.GateThresholds,
        names: tuple[str, str],
        *,
        force: bool | None = None,
    ) -> parity.ParityReport:
        """Run one parity gate, log its summary line, and refuse a failure unless `force` (default:
        the export's --force). With `truth`, the candidate's detections are kept for `record`."""
        if self.truth is not None:
            kept = self._detections[names[1]] = []

            def keeping(images: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
                kept.append(candidate(images, sizes))
                return kept[-1]

        report = parity.run_gate(
            reference,
            keeping if self.truth is not None else candidate,
            self.batches,
            thresholds,
            reference_name=names[0],
            candidate_name=names[1],
            dataset_scorer=self.scorer,
            rank_free=self.loaded.random_weights,
        )
        log.info("%s", report.summary())
        parity.enforce(report, force=self.settings.force if force is None else force)
        return report

    def add(self, recipe: GraphRecipe, written: Written) -> None:
        """Put what `recipe` wrote into the records model.json is made of: its graphs, their gates (parity
        key: `parity_key`), the thresholds chosen on each gate's detections, and what it adds to
        the target's record."""
        self.written[recipe.key] = written.key
        for recorded in written.records:
            self._record(recorded)
        self.target.update(written.target)
        self.fp32_islands.update(written.fp32_islands)
        self.unavailable.update(written.unavailable)

    def _record(self, recorded: Recorded) -> None:
        key = recorded.key
        if recorded.graph is not None:
            self.graphs[key] = recorded.graph
        for backend, report in recorded.reports.items():
            self.parity[parity_key(key, backend)] = (
                dict(report) if isinstance(report, Mapping) else report.to_dict()
            )
            # a gate recorded as a dict (the BF16 gate's, with its `run` flag) chose on its detections too
            candidate = report.get("candidate") if isinstance(report, Mapping) else report.candidate
            outputs = self._detections.pop(candidate, None) if candidate else None
            if outputs is not None:
                self.thresholds[parity_key(key, backend)] = self._choose_thresholds(outputs)

    def _choose_thresholds(self, outputs: list) -> dict[str, Any]:
        """Thresholds per class of one gate's detections on the annotated gate images."""
        images = [i for batch in self.batches for i in batch.image_ids]
        detections = [
            (labels[i], boxes[i], scores[i]) for labels, boxes, scores in outputs for i in range(len(labels))
        ]
        names = self.loaded.class_names
        truth = [self.truth[i] for i in images]
        evidence = gather_evidence(detections, truth, len(names))
        halves = tuple(  # chosen on one, judged on the other
            gather_evidence([detections[i] for i in half], [truth[i] for i in half], len(names))
            for half in split_halves(len(images))
        )
        return threshold_record(
            evidence,
            names,
            target_precision=self.settings.threshold_target,
            images=len(images),
            halves=halves,
        )


def _torch_runner(module: Any, postprocess: bool, num_top_queries: int) -> parity.Runner:
    import torch

    def run(images: np.ndarray, orig_sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        with torch.no_grad():
            if postprocess:
                out = module(torch.from_numpy(images), torch.from_numpy(orig_sizes))
                return tuple(t.numpy() for t in out)
            out = module(torch.from_numpy(images))
            return postprocess_numpy(out[0].numpy(), out[1].numpy(), orig_sizes, num_top_queries)

    return run
