"""The HTTP API: `create_app(settings, detector=None)` → FastAPI, one router per concern.

    health   GET /healthz (alive), GET /readyz (model loaded, pipeline running)     never needs a key
    streams  GET/POST /v1/streams, GET/DELETE /v1/streams/{name}, .../latest, .../ws (WebSocket),
             .../events (server-sent events), .../mjpeg (annotated multipart/x-mixed-replace)
    detect   POST /v1/detect (one image: raw body with an image content type, or multipart field 'file')
    metrics  GET /metrics (Prometheus text format)

The model is loaded once, in the lifespan, in a worker thread; /readyz turns 200 when it is in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, AsyncIterator

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, Response, WebSocket, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field
from starlette.websockets import WebSocketDisconnect

from dfine_deploy.errors import DfineError, ServeError
from dfine_deploy.serve.auth import require_api_key
from dfine_deploy.serve.metrics import CONTENT_TYPE_LATEST, ServeMetrics
from dfine_deploy.serve.pipeline import (
    Detector,
    DuplicateStream,
    JsonLinesWriter,
    Overloaded,
    Pipeline,
    StreamLimit,
    detections_to_json,
)
from dfine_deploy.serve.settings import ServeSettings, StreamSpec
from dfine_deploy.serve.sources import ForbiddenSource, StreamState
from dfine_deploy.serve.uploads import ACCEPTED_TYPES, ImageRejected, decode_upload

log = logging.getLogger("dfine_deploy.serve")

DETECT_PATH = "/v1/detect"


# -- typed request and response models (they document the OpenAPI page) -------------------------------
class DetectionOut(BaseModel):
    box: list[float] = Field(description="x1, y1, x2, y2 in pixels of the frame")
    score: float
    label: int = Field(description="contiguous class index")
    name: str = Field(description="class name")


class DetectResponse(BaseModel):
    width: int
    height: int
    detections: list[DetectionOut]


class StreamResult(DetectResponse):
    stream: str
    frame_index: int = Field(description="position of the frame in its source")
    timestamp: float = Field(description="Unix time when the frame was decoded")
    decode_ms: float
    inference_ms: float = Field(description="time of the batched Detector.predict call that saw this frame")


class StreamRequest(BaseModel):
    url: str = Field(description="rtsp://, rtsps://, http:// or https:// (MJPEG or progressive video)")
    name: str | None = Field(None, description="letters, digits, '_', '-', '.'; generated when left out")
    every_frame: bool = Field(False, description="detect every frame instead of only the newest")
    vid_stride: int = Field(1, ge=1, le=1000, description="keep one frame in vid_stride")
    max_fps: float = Field(0.0, ge=0, le=1000, description="at most this many frames per second (0: no limit)")
    read_timeout_s: float = Field(5.0, gt=0, le=120, description="a stream without frames this long reconnects")
    wait_live_s: float = Field(
        0.0,
        ge=0,
        le=60,
        description="wait up to this long for the first frame; if none comes answer 504 and drop the stream",
    )


class StreamInfo(BaseModel):
    name: str
    url: str = Field(description="credentials are redacted")
    kind: str
    state: str = Field(description="connecting, live, retrying or stopped")
    last_error: str | None
    frames_in: int
    frames_processed: int
    frames_dropped: int
    reconnects: int
    source_fps: float
    every_frame: bool
    recording: str | None


class Health(BaseModel):
    status: str = Field(description="ok (alive), loading, ready or failed")
    backend: str | None = None
    streams: int | None = None
    detail: str | None = Field(None, description="why the model or the start-up streams failed")


# -- helpers ---------------------------------------------------------------------------------------
def load_detector(settings: ServeSettings) -> Detector:
    """Open the model through the runtime (imported here: serving a fake detector needs no runtime)."""
    from dfine_deploy.runtime import Detector as RuntimeDetector

    return RuntimeDetector.open(
        settings.model, backend=settings.backend, device=settings.device, score_threshold=settings.score_threshold
    )


def _pipeline(request: Request | WebSocket) -> Pipeline:
    pipeline = getattr(request.app.state, "pipeline", None)
    if pipeline is None:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE, "the model is still loading; retry when /readyz says ready"
        )
    return pipeline


def _stream_or_404(pipeline: Pipeline, name: str):
    handle = pipeline.get(name)
    if handle is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no stream named {name!r}; GET /v1/streams lists them")
    return handle


class BodyLimit:
    """ASGI middleware: request bodies over the limit get 413, counted as they arrive.

    The upload route may carry `upload_bytes`; every other route (JSON requests) `other_bytes`. A
    declared Content-Length over the limit is refused before any byte is read; a chunked body is cut
    off as soon as it passes the limit, so no request can fill memory.
    """

    def __init__(self, app, upload_bytes: int, other_bytes: int = 64 * 1024):
        self.app = app
        self.upload_bytes = upload_bytes
        self.other_bytes = other_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        is_upload = scope["path"] == DETECT_PATH
        limit = self.upload_bytes if is_upload else self.other_bytes
        too_large = HTTPException(
            413,
            f"the request body is larger than this server's limit of {limit} bytes"
            + (" (--max-upload-mb)" if is_upload else ""),
        )
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            if is_upload:
                scope["app"].state.metrics.detect_requests.labels("413").inc()
            response = JSONResponse({"detail": too_large.detail}, status_code=too_large.status_code)
            return await response(scope, receive, send)
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise too_large
            return message

        await self.app(scope, limited_receive, send)


# -- routers ---------------------------------------------------------------------------------------
health = APIRouter(tags=["health"])
streams = APIRouter(prefix="/v1/streams", tags=["streams"], dependencies=[Depends(require_api_key)])
detect = APIRouter(tags=["detect"], dependencies=[Depends(require_api_key)])
metrics = APIRouter(tags=["metrics"], dependencies=[Depends(require_api_key)])


@health.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """Liveness: the process answers."""
    return Health(status="ok")


@health.get("/readyz", response_model=Health, responses={503: {"model": Health}})
async def readyz(request: Request, response: Response) -> Health:
    """Readiness: the model is loaded and the pipeline runs."""
    pipeline = getattr(request.app.state, "pipeline", None)
    if pipeline is None:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
        error = request.app.state.load_error
        return Health(status="failed", detail=error) if error else Health(status="loading")
    return Health(
        status="ready", backend=getattr(pipeline.detector, "backend_name", None), streams=len(pipeline.list())
    )


@streams.get("", response_model=list[StreamInfo])
async def list_streams(request: Request) -> list[dict[str, Any]]:
    return [h.info() for h in _pipeline(request).list()]


@streams.post(
    "",
    response_model=StreamInfo,
    status_code=status.HTTP_201_CREATED,
    responses={
        400: {"description": "malformed URL or scheme not allowed"},
        403: {"description": "local files and cameras cannot be added over the API"},
        409: {"description": "a stream of that name exists"},
        429: {"description": "the server runs its maximum number of streams"},
        504: {"description": "wait_live_s passed without a frame"},
    },
)
async def add_stream(body: StreamRequest, request: Request) -> dict[str, Any]:
    """Start reading a network stream; its results appear on .../ws, .../events, .../latest and .../mjpeg."""
    pipeline = _pipeline(request)
    try:
        spec = StreamSpec(
            url=body.url,
            name=body.name or "",
            every_frame=body.every_frame,
            vid_stride=body.vid_stride,
            max_fps=body.max_fps,
            read_timeout_s=body.read_timeout_s,
        )
        handle = pipeline.add_stream(spec, trusted=False)
    except ForbiddenSource as exc:
        raise HTTPException(status.HTTP_403_FORBIDDEN, str(exc)) from exc
    except StreamLimit as exc:
        raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS, str(exc)) from exc
    except DuplicateStream as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from exc
    except ServeError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
    if body.wait_live_s:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + body.wait_live_s
        while handle.reader.state is not StreamState.LIVE and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if handle.reader.state is not StreamState.LIVE:
            error = handle.reader.last_error or "no frame yet"
            await run_in_threadpool(pipeline.remove_stream, handle.name)
            raise HTTPException(
                status.HTTP_504_GATEWAY_TIMEOUT,
                f"stream {handle.name!r} sent no frame within {body.wait_live_s} s ({error}); it was not added",
            )
    return handle.info()


@streams.get("/{name}", response_model=StreamInfo)
async def get_stream(name: str, request: Request) -> dict[str, Any]:
    return _stream_or_404(_pipeline(request), name).info()


@streams.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_stream(name: str, request: Request) -> Response:
    """Stop the stream, release its capture, finish its recording and end its subscribers."""
    pipeline = _pipeline(request)
    if not await run_in_threadpool(pipeline.remove_stream, name):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no stream named {name!r}")
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@streams.get("/{name}/latest", response_model=StreamResult, responses={204: {"description": "no frame processed yet"}})
async def latest_result(name: str, request: Request):
    handle = _stream_or_404(_pipeline(request), name)
    if handle.latest is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    return handle.latest


@streams.websocket("/{name}/ws")
async def stream_websocket(websocket: WebSocket, name: str) -> None:
    """One JSON message (a StreamResult) per processed frame; the server closes with 1000 when the stream is removed."""
    pipeline = getattr(websocket.app.state, "pipeline", None)
    if pipeline is None or pipeline.get(name) is None:
        await websocket.close(code=status.WS_1008_POLICY_VIOLATION, reason=f"no stream named {name!r}")
        return
    await websocket.accept()
    try:
        sub = pipeline.subscribe(name, asyncio.get_running_loop())
    except KeyError:
        await websocket.close(code=1000, reason="stream removed")
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
            if item is None:
                await websocket.close(code=1000, reason="stream removed")
                return
            await websocket.send_text(json.dumps(item))
    except (WebSocketDisconnect, asyncio.TimeoutError, RuntimeError):
        return
    finally:
        receiver.cancel()
        pipeline.unsubscribe(name, sub)


async def _subscription(request: Request, name: str, *, jpeg: bool) -> AsyncIterator[Any]:
    """Items for one client until it leaves or the stream is removed; None now and then as a heartbeat."""
    pipeline = _pipeline(request)
    try:
        sub = pipeline.subscribe(name, asyncio.get_running_loop(), jpeg=jpeg)
    except KeyError:  # removed between the 404 check and now: an empty stream, then the end
        return
    try:
        while not await request.is_disconnected():
            try:
                item = await sub.get(timeout=1.0)
            except asyncio.TimeoutError:
                yield None
                continue
            if item is None:
                return
            yield item
    finally:
        pipeline.unsubscribe(name, sub)


@streams.get(
    "/{name}/events", response_class=StreamingResponse, responses={200: {"content": {"text/event-stream": {}}}}
)
async def stream_events(name: str, request: Request) -> StreamingResponse:
    """Server-sent events: `data: <StreamResult JSON>` per processed frame, comments as keep-alive."""
    _stream_or_404(_pipeline(request), name)

    async def events() -> AsyncIterator[str]:
        async for item in _subscription(request, name, jpeg=False):
            yield ": keep-alive\n\n" if item is None else f"data: {json.dumps(item)}\n\n"
        yield "event: end\ndata: {}\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@streams.get(
    "/{name}/mjpeg", response_class=StreamingResponse, responses={200: {"content": {"multipart/x-mixed-replace": {}}}}
)
async def stream_mjpeg(name: str, request: Request) -> StreamingResponse:
    """Annotated frames for a browser: <img src=".../mjpeg"> (frames are encoded only while someone watches)."""
    _stream_or_404(_pipeline(request), name)

    async def parts() -> AsyncIterator[bytes]:
        async for jpeg in _subscription(request, name, jpeg=True):
            if jpeg is not None:
                yield b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n%s\r\n" % (len(jpeg), jpeg)

    return StreamingResponse(parts(), media_type="multipart/x-mixed-replace; boundary=frame")


@detect.post(
    DETECT_PATH,
    response_model=DetectResponse,
    responses={
        400: {"description": "not a decodable image"},
        413: {"description": "upload or pixel count over the limit"},
        415: {"description": "content type not accepted"},
        503: {"description": "too many requests waiting for the detector"},
        504: {"description": "no result within the upload timeout"},
    },
    openapi_extra={
        "requestBody": {
            "content": {
                **{t: {"schema": {"type": "string", "format": "binary"}} for t in ACCEPTED_TYPES},
                "multipart/form-data": {
                    "schema": {"type": "object", "properties": {"file": {"type": "string", "format": "binary"}}}
                },
            },
            "required": True,
        }
    },
)
async def detect_image(request: Request) -> dict[str, Any]:
    """Detect objects in one uploaded image; it shares batches with the streams."""
    metrics: ServeMetrics = request.app.state.metrics
    try:
        result = await _detect(request)
    except HTTPException as exc:
        metrics.detect_requests.labels(str(exc.status_code)).inc()
        raise
    metrics.detect_requests.labels("200").inc()
    return result


async def _detect(request: Request) -> dict[str, Any]:
    settings: ServeSettings = request.app.state.settings
    pipeline = _pipeline(request)
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        form = await request.form(max_files=1, max_fields=4)
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            raise HTTPException(status.HTTP_400_BAD_REQUEST, "multipart upload without a 'file' part")
        data, content_type = await upload.read(), upload.content_type or "application/octet-stream"
    else:
        data = await request.body()
    try:
        image = await run_in_threadpool(decode_upload, data, content_type, settings.max_image_pixels)
    except ImageRejected as exc:
        raise HTTPException(exc.status, str(exc)) from exc
    try:
        future = pipeline.submit_image(image)
    except Overloaded as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(exc), headers={"Retry-After": "1"}) from exc
    try:
        det = await asyncio.wait_for(asyncio.wrap_future(future), settings.upload_timeout_s)
    except asyncio.TimeoutError as exc:
        raise HTTPException(status.HTTP_504_GATEWAY_TIMEOUT, f"no result within {settings.upload_timeout_s} s") from exc
    except Overloaded as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(exc)) from exc
    except Exception as exc:
        log.exception("detection of an uploaded image failed")
        raise HTTPException(status.HTTP_500_INTERNAL_SERVER_ERROR, f"the detector failed: {exc}") from exc
    h, w = image.shape[:2]
    return {"width": w, "height": h, "detections": detections_to_json(det)}


@metrics.get("/metrics", response_class=Response)
async def prometheus_metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


# -- the app ---------------------------------------------------------------------------------------
def _add_protected_docs(app: FastAPI) -> None:
    """OpenAPI schema and Swagger UI behind the API key (the UI passes the key on to the schema URL)."""
    from urllib.parse import quote

    from fastapi.openapi.docs import get_swagger_ui_html

    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(require_api_key)])
    async def openapi_schema() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False, dependencies=[Depends(require_api_key)])
    async def swagger(request: Request):
        key = request.headers.get("X-API-Key") or request.query_params.get("api_key", "")
        return get_swagger_ui_html(openapi_url=f"/openapi.json?api_key={quote(key)}", title="dfine-serve")


def create_app(settings: ServeSettings, detector: Detector | None = None) -> FastAPI:
    """Build the server. With `detector` given (tests, embedding) nothing is loaded from disk."""

    started: list[Pipeline | JsonLinesWriter] = []  # what shutdown must close, in start order

    async def start(app: FastAPI) -> None:
        model = detector or await run_in_threadpool(load_detector, settings)
        pipeline = Pipeline(model, settings, app.state.metrics)
        started.append(pipeline)
        if settings.output_json:
            writer = JsonLinesWriter(settings.output_json)
            started.append(writer)
            pipeline.add_listener(writer)
        pipeline.start()
        for spec in settings.streams:
            pipeline.add_stream(spec, trusted=True)
        app.state.pipeline = pipeline
        log.info("ready: backend %s, %d stream(s)", getattr(model, "backend_name", "?"), len(settings.streams))

    async def start_in_background(app: FastAPI) -> None:
        try:
            await start(app)
        except Exception as exc:  # /readyz reports it; /healthz stays up so the operator can look
            app.state.load_error = f"{type(exc).__name__}: {exc}"
            log.exception("the server could not start its model or streams")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        # A given detector starts at once and errors propagate; a model to load (which can take minutes
        # for a TensorRT engine) loads while the server already answers /healthz, and /readyz says when.
        loading = None
        if detector is not None:
            await start(app)
        else:
            loading = asyncio.create_task(start_in_background(app))
        try:
            yield
        finally:
            if loading is not None:
                await loading
            app.state.pipeline = None
            for item in reversed(started):
                await run_in_threadpool(item.close)

    protected = bool(settings.api_key)  # then the docs need the key too (as ?api_key= in a browser)
    app = FastAPI(
        title="dfine-serve",
        summary="D-FINE detections for video streams and images",
        version="1",
        lifespan=lifespan,
        openapi_url=None if protected else "/openapi.json",
        docs_url=None if protected else "/docs",
        redoc_url=None if protected else "/redoc",
    )
    if protected:
        _add_protected_docs(app)
    app.state.settings = settings
    app.state.metrics = ServeMetrics()
    app.state.pipeline = None
    app.state.load_error = None
    app.add_middleware(BodyLimit, upload_bytes=settings.max_upload_bytes)
    for router in (health, streams, detect, metrics):
        app.include_router(router)

    @app.exception_handler(DfineError)
    async def user_error(request: Request, exc: DfineError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_400_BAD_REQUEST)

    return app
