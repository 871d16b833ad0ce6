"""Results as they happen, for browsers too: .../ws (WebSocket), .../events (SSE), .../mjpeg (video).

Browsers cannot set headers on these three, so they, and only they, take the key as `?api_key=`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request, WebSocket
from fastapi.responses import StreamingResponse
from starlette.websockets import WebSocketDisconnect

from dfine_deploy.serve.auth import require_api_key_or_query
from dfine_deploy.serve.dependencies import PipelineDep, StreamDep
from dfine_deploy.serve.pipeline import StreamPipeline
from dfine_deploy.serve.results import STREAM_REMOVED, End

router = APIRouter(prefix="/v1/streams", tags=["streams"], dependencies=[Depends(require_api_key_or_query)])


@router.websocket("/{name}/ws")
async def stream_websocket(websocket: WebSocket, handle: StreamDep, pipeline: PipelineDep) -> None:
    """One JSON message (a StreamResult) per processed frame; closed with 1000 when the stream is removed,
    1001 when the server shuts down."""
    name = handle.name
    await websocket.accept()
    try:
        sub = pipeline.subscribe(name, asyncio.get_running_loop())
    except KeyError:
        await websocket.close(code=STREAM_REMOVED.code, reason=STREAM_REMOVED.reason)
        return
    receiver = asyncio.ensure_future(websocket.receive())
    try:
        while True:
            getter = asyncio.ensure_future(sub.get(timeout=3600))
            done, _ = await asyncio.wait({getter, receiver}, return_when=asyncio.FIRST_COMPLETED)
            if receiver in done:  # the client closed (messages from clients are not part of the protocol)
                getter.cancel()
                if receiver.result()["type"] == "websocket.disconnect":
                    return
                receiver = asyncio.ensure_future(websocket.receive())
                continue
            item = getter.result()
            if isinstance(item, End):
                await websocket.close(code=item.code, reason=item.reason)
                return
            await websocket.send_text(json.dumps(item))
    except (WebSocketDisconnect, asyncio.TimeoutError, RuntimeError):
        return
    finally:
        receiver.cancel()
        pipeline.unsubscribe(name, sub)


async def _subscription(
    request: Request, pipeline: StreamPipeline, name: str, *, jpeg: bool
) -> AsyncIterator[Any]:
    """Items for one client until it leaves or its End (the stream removed, the server shutting down),
    which is the last item; None now and then as a heartbeat."""
    try:
        sub = pipeline.subscribe(name, asyncio.get_running_loop(), jpeg=jpeg)
    except KeyError:  # removed between the 404 check and now: an empty stream, then the end
        yield STREAM_REMOVED
        return
    try:
        while not await request.is_disconnected():
            try:
                item = await sub.get(timeout=1.0)
            except asyncio.TimeoutError:
                yield None
                continue
            yield item
            if isinstance(item, End):
                return
    finally:
        pipeline.unsubscribe(name, sub)


@router.get(
    "/{name}/events",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def stream_events(handle: StreamDep, pipeline: PipelineDep, request: Request) -> StreamingResponse:
    """Server-sent events: `data: <StreamResult JSON>` per processed frame, comments as keep-alive."""

    async def events() -> AsyncIterator[str]:
        async for item in _subscription(request, pipeline, handle.name, jpeg=False):
            if item is None:
                yield ": keep-alive\n\n"
            elif isinstance(item, End):
                yield f"event: end\ndata: {json.dumps({'reason': item.reason})}\n\n"
            else:
                yield f"data: {json.dumps(item)}\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@router.get(
    "/{name}/mjpeg",
    response_class=StreamingResponse,
    responses={200: {"content": {"multipart/x-mixed-replace": {}}}},
)
async def stream_mjpeg(handle: StreamDep, pipeline: PipelineDep, request: Request) -> StreamingResponse:
    """Annotated frames (boxes, track ids, lines, zones) for <img src=".../mjpeg">, encoded while watched."""

    async def parts() -> AsyncIterator[bytes]:
        async for jpeg in _subscription(request, pipeline, handle.name, jpeg=True):
            if isinstance(jpeg, bytes):
                yield b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n%s\r\n" % (
                    len(jpeg),
                    jpeg,
                )

    return StreamingResponse(
        parts(), media_type="multipart/x-mixed-replace; boundary=frame", headers={"Cache-Control": "no-cache"}
    )
