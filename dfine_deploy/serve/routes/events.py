"""Events (dfine_deploy/serve/events.py): GET /v1/events (stored ones, filtered, newest first),
GET /v1/events/live (server-sent events as they happen), GET /v1/events/{id} and .../snapshot (JPEG).

The stored routes need a server started with `--events DIR`; the live one works on every server.
Only /v1/events/live takes the key as `?api_key=` too (EventSource cannot set headers).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, status
from fastapi.responses import FileResponse, StreamingResponse

from dfine_deploy.serve.auth import require_api_key, require_api_key_or_query
from dfine_deploy.serve.dependencies import PipelineDep
from dfine_deploy.serve.events import EVENT_ID, KINDS, EventStore
from dfine_deploy.serve.metrics import EVENTS_SUBSCRIBERS
from dfine_deploy.serve.pipeline import StreamPipeline
from dfine_deploy.serve.results import End

router = APIRouter(prefix="/v1/events", tags=["events"])
NO_STORE = "this server keeps no events; start it with --events DIR (GET /v1/events/live works without)"


def _store(pipeline: StreamPipeline) -> EventStore:
    if pipeline.events.store is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, NO_STORE)
    return pipeline.events.store


@router.get("", dependencies=[Depends(require_api_key)])
async def list_events(
    pipeline: PipelineDep,
    stream: str | None = None,
    kind: str | None = Query(None, description=f"one of {', '.join(KINDS)}"),
    class_name: str | None = Query(None, alias="class", description="class name, e.g. person"),
    where: str | None = Query(None, description="a line's or a zone's name"),
    since: float | None = Query(None, allow_inf_nan=False, description="Unix time: events at or after it"),
    until: float | None = Query(None, allow_inf_nan=False, description="Unix time: events at or before it"),
    limit: int = Query(100, ge=1, le=1000),
) -> list[dict[str, Any]]:
    """Stored events, newest first."""
    if kind is not None and kind not in KINDS:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f"kind {kind!r}: use one of {', '.join(KINDS)}")
    return _store(pipeline).query(
        stream=stream, kind=kind, class_name=class_name, where=where, since=since, until=until, limit=limit
    )


@router.get(
    "/live",
    dependencies=[Depends(require_api_key_or_query)],
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def live_events(
    pipeline: PipelineDep, request: Request, stream: str | None = None
) -> StreamingResponse:
    """Server-sent events: `event: detection-event`, `data: <event JSON>` for each event as it happens
    (of one stream with ?stream=), comments as keep-alive."""
    settings = request.app.state.settings
    sub = pipeline.events.subscribe(
        asyncio.get_running_loop(),
        settings.subscriber_queue,
        lambda: pipeline.metrics.subscriber_dropped.labels(EVENTS_SUBSCRIBERS).inc(),
    )

    async def messages() -> AsyncIterator[str]:
        try:
            while not await request.is_disconnected():
                try:
                    item = await sub.get(timeout=1.0)
                except asyncio.TimeoutError:
                    yield ": keep-alive\n\n"
                    continue
                if isinstance(item, End):
                    yield f"event: end\ndata: {json.dumps({'reason': item.reason})}\n\n"
                    return
                if stream is None or item["stream"] == stream:
                    yield f"event: detection-event\ndata: {json.dumps(item)}\n\n"
        finally:
            pipeline.events.unsubscribe(sub)

    return StreamingResponse(
        messages(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


def _event(pipeline: StreamPipeline, event_id: str) -> tuple[EventStore, dict[str, Any]]:
    store = _store(pipeline)
    event = store.get(event_id) if EVENT_ID.match(event_id) else None
    if event is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, f"no event {event_id!r} (retention may have removed it)"
        )
    return store, event


@router.get("/{event_id}", dependencies=[Depends(require_api_key)])
async def get_event(event_id: str, pipeline: PipelineDep) -> dict[str, Any]:
    return _event(pipeline, event_id)[1]


@router.get(
    "/{event_id}/snapshot",
    dependencies=[Depends(require_api_key)],
    response_class=FileResponse,
    responses={200: {"content": {"image/jpeg": {}}}},
)
async def event_snapshot(event_id: str, pipeline: PipelineDep) -> FileResponse:
    """The object's picture at the moment of the event (its box with a margin, as decoded)."""
    store, _ = _event(pipeline, event_id)
    path = store.snapshot(event_id)
    if path is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"event {event_id!r} has no snapshot file")
    return FileResponse(path, media_type="image/jpeg", headers={"Cache-Control": "private, max-age=3600"})
