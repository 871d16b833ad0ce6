"""Serving D-FINE on video streams and uploaded images: `create_app(settings)` and `dfine-serve`."""

from dfine_deploy.serve.app import create_app
from dfine_deploy.serve.pipeline import Detector, Pipeline
from dfine_deploy.serve.settings import ServeSettings, StreamSpec, load_streams_file
from dfine_deploy.serve.sources import SourceKind, StreamState

__all__ = [
    "Detector",
    "Pipeline",
    "ServeSettings",
    "SourceKind",
    "StreamSpec",
    "StreamState",
    "create_app",
    "load_streams_file",
]
