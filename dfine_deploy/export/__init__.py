"""Export: verified ONNX, typed FP16 ONNX, TensorRT engines, Triton and DeepStream recipes.

    pipeline.export_artifact(ExportSettings)  the whole of `dfine-export`: checks, staging, steps
    settings    `ExportSettings`, the options of one export
    recipes     the table of the graphs an artifact holds (`RECIPES`), run in order by `write_graphs`
    run         `ExportRun` (one export's context, its gate and records), `GraphRecipe` (a row) and
                `Written` (what a row's `write` adds to the records)
    deploy_targets  the table of `--target` names (`TARGETS`): what each fixes, refuses, checks, records
    graphs      each ONNX graph of the artifact written, checked and gated (the rows' `write`)
    gate_inputs the gate's images, its dataset scorer, INT8 calibration feeds
    sidecar     the model.json record of an export
    onnx        torch -> ONNX, interface checks, onnxruntime sessions
    parity      the gate: IoU-matched boxes, labels, (pseudo-)mAP against a reference
    fp16        typed FP16 graph with FP32 islands;  int8: INT8 QDQ graph for CPU runtimes
    targets     TensorRT's profiles by `--target` name (`runtime.tensorrt_plan.PROFILES`) and the
                ONNX-parser checks
    tensorrt_verify  engine precision evidence: network types, inspector JSON, the verdict
    tensorrt    the engine build with the Python API (its per-version plan: `runtime.tensorrt_plan`)
                (`python -m dfine_deploy.export.tensorrt`)
    tensorrt_record  a trtexec-built engine judged and recorded in model.json (build_engine.sh)
    triton      Triton model repository;  deepstream: nvinfer config

Submodules are imported on use; `parity` and the `tensorrt*` modules import without torch.
"""

__all__ = [
    "cli",
    "deepstream",
    "deploy_targets",
    "fp16",
    "gate_inputs",
    "graphs",
    "int8",
    "onnx",
    "parity",
    "pipeline",
    "recipes",
    "run",
    "settings",
    "sidecar",
    "targets",
    "tensorrt",
    "tensorrt_record",
    "tensorrt_verify",
    "triton",
]
