"""The HTTP API: `create_app(settings, detector=None)` → FastAPI, one router per concern (`routes/`).

    dashboard  GET / (the live dashboard page; static, its calls need the key)
    docs       GET /docs (the OpenAPI page, its Swagger UI files served from the package's dependency)
    health     GET /healthz (alive), GET /readyz (model loaded, pipeline running)     never needs a key
    streams    GET/POST /v1/streams, GET/DELETE /v1/streams/{name}, .../latest
    live       .../ws (WebSocket), .../events (server-sent events), .../mjpeg (annotated video)
    events     GET /v1/events (stored, filtered), /v1/events/live (SSE), /v1/events/{id}[/snapshot]
    detect     POST /v1/detect (one image: raw body with an image content type, or multipart field 'file')
    metrics    GET /metrics (Prometheus text format)

The model is loaded once, in the lifespan, in a worker thread; /readyz turns 200 when it is in.
Every request passes `security.BrowserGuard` first (Host and Origin rules, CSP and framing headers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
from typing import Any

from fastapi import FastAPI, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from dfine_deploy.errors import DfineError
from dfine_deploy.serve.metrics import ServeMetrics
from dfine_deploy.serve.outputs import JsonLinesWriter
from dfine_deploy.serve.pipeline import DetectorLike, StreamPipeline, batch_limit
from dfine_deploy.serve.routes import dashboard, detect, docs, events, health, live, metrics, streams
from dfine_deploy.serve.routes.detect import DETECT_PATH
from dfine_deploy.serve.security import BrowserGuard, allowed_host_names
from dfine_deploy.serve.settings import ServeSettings

log = logging.getLogger("dfine_deploy.serve")


def load_detector(settings: ServeSettings) -> DetectorLike:
    """Open the model through the runtime (imported here: serving a fake detector needs no runtime),
    made ready for a server: CPU threads that sleep between frames (onnxruntime's spin-waiting burns a
    core per stream waiting for the camera), and every batch size the pipeline can form compiled
    before the first frame (OpenVINO compiles per size)."""
    from dfine_deploy.runtime import Detector

    detector = Detector.open(
        settings.model,
        backend=settings.backend,
        device=settings.device,
        precision=settings.precision,
        threads=settings.threads,
        score_threshold=settings.score_threshold,
        class_thresholds=settings.class_thresholds,
        names=settings.names,
        spin_wait=False,
        unverified=settings.unverified,
    )
    detector.backend.prepare_batches(batch_limit(detector, settings))
    log.info("score thresholds: %s", thresholds_line(detector.thresholds.table(detector.class_names)))
    if detector.class_names_note:
        log.info("class names: %s (--names FILE gives your own)", detector.class_names_note)
    return detector


def thresholds_line(table: list[dict]) -> str:
    """Each class's threshold and where it came from, the chosen one beside yours: 'person 0.50 (yours;
    chosen 0.41), car 0.38 (chosen), dog 0.25 (default)'."""
    rows = []
    for row in table:
        beside = f"; chosen {row['chosen']:.2f}" if row["source"] != "chosen" and row["chosen"] else ""
        rows.append(f"{row['class']} {row['threshold']:.2f} ({row['source']}{beside})")
    return ", ".join(rows)


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


def bus_publishers(settings: ServeSettings, metrics: ServeMetrics) -> list[Any]:
    """The message bus publishers the settings ask for (imported here: paho and redis load only then)."""
    if not (settings.mqtt_url or settings.redis_url):
        return []
    from dfine_deploy.serve.bus import MqttPublisher, RedisPublisher

    index, count = settings.shard
    client_id = f"dfine-serve-{socket.gethostname()}-{index}of{count}-{os.getpid()}"
    publishers: list[Any] = []
    if settings.mqtt_url:
        publishers.append(
            MqttPublisher(
                settings.mqtt_url,
                settings.mqtt_prefix,
                settings.bus_buffer,
                metrics,
                settings.bus_detections,
                client_id,
            )
        )
    if settings.redis_url:
        publishers.append(
            RedisPublisher(
                settings.redis_url,
                settings.redis_prefix,
                settings.redis_maxlen,
                settings.bus_buffer,
                metrics,
                settings.bus_detections,
            )
        )
    return publishers


def served_unverified(app: FastAPI, detector: DetectorLike) -> None:
    """An engine served without a passing dfine-verify result (--unverified) says so in /metrics and
    on the dashboard (`Detector.verified` False; None: not an engine)."""
    unverified = getattr(detector, "verified", None) is False
    app.state.unverified_engine = unverified
    app.state.metrics.unverified_engine.set(int(unverified))


def create_app(settings: ServeSettings, detector: DetectorLike | None = None) -> FastAPI:
    """Build the server. With `detector` given (tests, embedding) nothing is loaded from disk."""

    started: list[StreamPipeline] = []  # what shutdown must close (each closes its sinks)

    async def start(app: FastAPI) -> None:
        model = detector or await run_in_threadpool(load_detector, settings)
        served_unverified(app, model)
        pipeline = StreamPipeline(model, settings, app.state.metrics)
        if settings.output_json:
            # the pipeline closes its sinks after its close drained the output thread into them
            pipeline.add_sink(JsonLinesWriter(settings.output_json))
        for publisher in bus_publishers(settings, app.state.metrics):
            pipeline.events.add_sink(publisher.offer_event)
            pipeline.add_sink(publisher)  # closed by the pipeline after its last result and event
            publisher.start()
        started.append(pipeline)
        pipeline.start()
        for spec in settings.streams:
            pipeline.add_stream(spec, trusted=True)
        app.state.pipeline = pipeline
        log.info(
            "ready: backend %s, %d stream(s)", getattr(model, "backend_name", "?"), len(settings.streams)
        )

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

    app = FastAPI(
        title="dfine-serve",
        summary="D-FINE detections for video streams and images, with tracking and counting",
        version="1",
        lifespan=lifespan,
        docs_url=None,  # routes/docs.py serves the page with local assets (FastAPI's loads a CDN)
        redoc_url=None,
        swagger_ui_oauth2_redirect_url=None,
    )
    app.state.settings = settings
    app.state.metrics = ServeMetrics()
    app.state.pipeline = None
    app.state.load_error = None
    app.state.unverified_engine = False
    app.add_middleware(BodyLimit, upload_bytes=settings.max_upload_bytes)
    hosts = allowed_host_names(settings.host, settings.allowed_hosts)
    app.add_middleware(BrowserGuard, host_names=hosts, origins=settings.allowed_origins)  # outermost
    index, count = settings.shard
    app.state.metrics.shard.labels(str(index), str(count)).set(1)
    for module in (dashboard, docs, health, streams, live, events, detect, metrics):
        app.include_router(module.router)

    @app.exception_handler(DfineError)
    async def user_error(request: Request, exc: DfineError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_400_BAD_REQUEST)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        """FastAPI's own answer repeats each refused value, and a NaN or Infinity (which Python's
        JSON reader takes) cannot be written back as JSON: the request ended in a server error.
        Where, what and why are kept, and the value where JSON can carry it (the dashboard shows it)."""
        detail = []
        for error in exc.errors():
            item = {"loc": list(error["loc"]), "msg": error["msg"], "type": error["type"]}
            value = error.get("input")
            if isinstance(value, (str, bool, int)) or (isinstance(value, float) and math.isfinite(value)):
                item["input"] = value
            detail.append(item)
        return JSONResponse({"detail": detail}, status_code=422)  # the constant was renamed in Starlette

    return app
