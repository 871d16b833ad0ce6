"""Run exported detectors: `Detector.open(path).predict(frames)` on onnxruntime, OpenVINO, TensorRT, torch.

Importing this package imports no torch; only the torch backend (and TensorRT buffers, when torch
is installed) does.
"""

from dfine_deploy.runtime.adapters import ADAPTERS, Adapter
from dfine_deploy.runtime.detections import Detections
from dfine_deploy.runtime.detector import Detector

__all__ = ["ADAPTERS", "Adapter", "Detections", "Detector"]
