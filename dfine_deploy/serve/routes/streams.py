"""Managing streams: GET/POST /v1/streams, GET/DELETE /v1/streams/{name}, GET .../latest (header key only)."""

from __future__ import annotations

import asyncio
from typing import Any, List

from fastapi import APIRouter, Depends, HTTPException, Response, status
from fastapi.concurrency import run_in_threadpool

from dfine_deploy.errors import DuplicateStream, ServeError, StreamLimit
from dfine_deploy.serve.auth import require_api_key
from dfine_deploy.serve.dependencies import PipelineDep, StreamDep
from dfine_deploy.serve.schemas import CountingRequest, StreamInfo, StreamRequest, StreamResult
from dfine_deploy.serve.settings import stream_from_dict
from dfine_deploy.serve.sources import ForbiddenSource, StreamState

router = APIRouter(prefix="/v1/streams", tags=["streams"], dependencies=[Depends(require_api_key)])


@router.get("", response_model=List[StreamInfo])  # typing.List: evaluated at import, on 3.8 too
async def list_streams(pipeline: PipelineDep) -> list[dict[str, Any]]:
    return [h.info() for h in pipeline.list()]


@router.post(
    "",
    response_model=StreamInfo,
    status_code=status.HTTP_201_CREATED,
    responses={
        400: {"description": "malformed URL, scheme not allowed, or invalid tracking/counting settings"},
        403: {"description": "local files and cameras cannot be added over the API"},
        409: {"description": "a stream of that name exists"},
        422: {"description": "a field is unknown or of the wrong type"},
        429: {"description": "the server runs its maximum number of streams"},
        504: {"description": "wait_live_s passed before the stream was live (see live_frames)"},
    },
)
async def add_stream(body: StreamRequest, pipeline: PipelineDep) -> dict[str, Any]:  # type: ignore[valid-type]
    """Start reading a network stream; its results appear on .../ws, .../events, .../latest and .../mjpeg."""
    fields = body.model_dump(exclude={"wait_live_s"})
    wait_live_s: float = body.wait_live_s
    try:
        spec = stream_from_dict(fields, "POST /v1/streams", api=True)
        handle = pipeline.add_stream(spec, trusted=False)
    except ForbiddenSource as exc:
        raise HTTPException(status.HTTP_403_FORBIDDEN, str(exc)) from exc
    except StreamLimit as exc:
        raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS, str(exc)) from exc
    except DuplicateStream as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from exc
    except ServeError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
    if wait_live_s:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_live_s
        while handle.reader.state is not StreamState.LIVE and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if handle.reader.state is not StreamState.LIVE:
            reader, spec = handle.reader, handle.spec
            health = f"{reader.frames_in} frame(s); live needs {spec.live_frames} in {spec.live_window_s:g} s"
            error = reader.last_error or health
            await run_in_threadpool(pipeline.remove_stream, handle.name)
            raise HTTPException(
                status.HTTP_504_GATEWAY_TIMEOUT,
                f"stream {handle.name!r} was not live within {wait_live_s} s ({error}); it was not added",
            )
    return handle.info()


@router.get("/{name}", response_model=StreamInfo)
async def get_stream(handle: StreamDep) -> dict[str, Any]:
    return handle.info()


@router.patch(
    "/{name}",
    response_model=StreamInfo,
    responses={
        400: {"description": "invalid tracking/counting settings"},
        422: {"description": "unknown field"},
    },
)
async def change_counting(handle: StreamDep, body: CountingRequest, pipeline: PipelineDep) -> dict[str, Any]:  # type: ignore[valid-type]
    """Turn tracking on or off and redefine the counting lines and zones of a running stream (fields left out
    stay); tracking starts afresh and the counts from zero."""
    changes = {key: value for key, value in body.model_dump().items() if value is not None}
    try:
        return pipeline.set_counting(handle.name, changes).info()
    except KeyError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no stream named {handle.name!r}") from exc
    except ServeError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_stream(name: str, pipeline: PipelineDep) -> Response:
    """Stop the stream, release its capture, finish its recording and end its subscribers."""
    if not await run_in_threadpool(pipeline.remove_stream, name):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no stream named {name!r}")
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get(
    "/{name}/latest", response_model=StreamResult, responses={204: {"description": "no frame processed yet"}}
)
async def latest_result(handle: StreamDep):
    if handle.latest is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    return handle.latest
