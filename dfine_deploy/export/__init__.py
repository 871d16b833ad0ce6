"""Export: verified ONNX, typed FP16 ONNX, TensorRT engines, Triton and DeepStream recipes.

    pipeline.export_artifact(ExportSettings)  the whole of `dfine-export`
    onnx        torch -> ONNX, interface checks, onnxruntime sessions
    parity      the gate: IoU-matched boxes, labels, (pseudo-)mAP against a reference
    fp16        typed FP16 graph with FP32 islands
    tensorrt    version-gated engine build + verification (`python -m dfine_deploy.export.tensorrt`)
    triton      Triton model repository;  deepstream: nvinfer config

Submodules are imported on use: the runtime imports `export.tensorrt` without torch.
"""

__all__ = ["cli", "deepstream", "fp16", "onnx", "parity", "pipeline", "tensorrt", "triton"]
