"""FastAPI dependencies shared by the routers: the running pipeline and one of its streams.

Routes declare `pipeline: PipelineDep` instead of reading `app.state`, so a test can swap the pipeline
with `app.dependency_overrides[get_pipeline] = ...`.
"""

from __future__ import annotations

from fastapi import Depends, HTTPException, WebSocketException, status
from starlette.requests import HTTPConnection
from typing_extensions import Annotated  # typing.Annotated is 3.9; serve runs on 3.8

from dfine_deploy.serve.pipeline import StreamPipeline
from dfine_deploy.serve.stream_handle import StreamHandle


def get_pipeline(conn: HTTPConnection) -> StreamPipeline:
    """The app's pipeline; 503 (WebSocket: close 1013, try again later) while the model is loading."""
    pipeline = getattr(conn.app.state, "pipeline", None)
    if pipeline is None:
        reason = "the model is still loading; retry when /readyz says ready"
        if conn.scope["type"] == "websocket":
            raise WebSocketException(code=status.WS_1013_TRY_AGAIN_LATER, reason=reason)
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, reason)
    return pipeline


PipelineDep = Annotated[StreamPipeline, Depends(get_pipeline)]


def get_stream(name: str, pipeline: PipelineDep, conn: HTTPConnection) -> StreamHandle:
    """The stream named in the path; 404 (WebSocket: close 1008) when there is none."""
    handle = pipeline.get(name)
    if handle is None:
        reason = f"no stream named {name!r}; GET /v1/streams lists them"
        if conn.scope["type"] == "websocket":
            raise WebSocketException(code=status.WS_1008_POLICY_VIOLATION, reason=reason)
        raise HTTPException(status.HTTP_404_NOT_FOUND, reason)
    return handle


StreamDep = Annotated[StreamHandle, Depends(get_stream)]
