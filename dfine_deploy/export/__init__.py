"""Export: verified ONNX, typed FP16 ONNX, TensorRT engines, Triton and DeepStream recipes.

    pipeline.export_artifact(ExportSettings)  the whole of `dfine-export`
    onnx        torch -> ONNX, interface checks, onnxruntime sessions
    parity      the gate: IoU-matched boxes, labels, (pseudo-)mAP against a reference
    fp16        typed FP16 graph with FP32 islands
    tensorrt_plan    TensorRT version -> build plan, trtexec line (pure)
    tensorrt_verify  engine precision evidence: network types, inspector JSON, the verdict
    tensorrt    the engine build with the Python API (`python -m dfine_deploy.export.tensorrt`)
    triton      Triton model repository;  deepstream: nvinfer config

Submodules are imported on use: the runtime imports `export.tensorrt_plan` without torch.
"""

__all__ = ["cli", "deepstream", "fp16", "onnx", "parity", "pipeline", "tensorrt", "tensorrt_plan", "tensorrt_verify", "triton"]
