"""Export: verified ONNX, typed FP16 ONNX, TensorRT engines, Triton and DeepStream recipes.

    pipeline.export_artifact(ExportSettings)  the whole of `dfine-export`: checks, staging, steps
    settings    `ExportSettings`, the options of one export
    graphs      each graph of the artifact written, checked and gated
    gate_inputs the gate's images, its dataset scorer, INT8 calibration feeds
    sidecar     the model.json record of an export
    onnx        torch -> ONNX, interface checks, onnxruntime sessions
    parity      the gate: IoU-matched boxes, labels, (pseudo-)mAP against a reference
    fp16        typed FP16 graph with FP32 islands;  int8: INT8 QDQ graph for CPU runtimes
    targets     TensorRT target profiles (`--target`) and their ONNX-parser checks
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
    "fp16",
    "gate_inputs",
    "graphs",
    "int8",
    "onnx",
    "parity",
    "pipeline",
    "settings",
    "sidecar",
    "targets",
    "tensorrt",
    "tensorrt_record",
    "tensorrt_verify",
    "triton",
]
