"""Datasets (COCO, YOLO, synthetic), validation, transforms, loader and image cache.

Names are loaded on first use (PEP 562), so `from dfine_deploy.data import ClassMap` does not
import torch: the class map and validation serve torch-free tools too.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ClassMap": "classmap",
    "ValidationPolicy": "validation",
    "ValidationReport": "validation",
    "ImageRecord": "validation",
    "PROBLEMS": "validation",
    "AnnotationSet": "coco",
    "DetectionDataset": "coco",
    "load_coco": "coco",
    "load_yolo": "yolo",
    "convert_yolo": "yolo",
    "SyntheticSpec": "synthetic",
    "generate": "synthetic",
    "BatchCollator": "transforms",
    "Pipeline": "transforms",
    "build_transforms": "transforms",
    "eval_transforms": "transforms",
    "generate_scales": "transforms",
    "build_cache": "cache",
    "build_class_map": "loader",
    "build_dataset": "loader",
    "build_dataloader": "loader",
    "load_annotations": "loader",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dfine_deploy.data' has no attribute {name!r}")
    module = importlib.import_module(f"dfine_deploy.data.{_EXPORTS[name]}")
    return getattr(module, name)
