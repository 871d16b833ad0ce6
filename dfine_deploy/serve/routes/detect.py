"""POST /v1/detect: one image (raw body with an image content type, or multipart field 'file')."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool

from dfine_deploy.errors import Overloaded
from dfine_deploy.serve.auth import require_api_key
from dfine_deploy.serve.dependencies import PipelineDep
from dfine_deploy.serve.metrics import ServeMetrics
from dfine_deploy.serve.pipeline import StreamPipeline
from dfine_deploy.serve.results import published
from dfine_deploy.serve.schemas import DetectResponse
from dfine_deploy.serve.settings import ServeSettings
from dfine_deploy.serve.uploads import ACCEPTED_TYPES, ImageRejected, decode_upload

log = logging.getLogger("dfine_deploy.serve")

DETECT_PATH = "/v1/detect"
router = APIRouter(tags=["detect"], dependencies=[Depends(require_api_key)])


@router.post(
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
                    "schema": {
                        "type": "object",
                        "properties": {"file": {"type": "string", "format": "binary"}},
                    }
                },
            },
            "required": True,
        }
    },
)
async def detect_image(request: Request, pipeline: PipelineDep) -> dict[str, Any]:
    """Detect objects in one uploaded image; it shares batches with the streams."""
    metrics: ServeMetrics = request.app.state.metrics
    try:
        result = await _detect(request, pipeline)
    except HTTPException as exc:
        metrics.detect_requests.labels(str(exc.status_code)).inc()
        raise
    metrics.detect_requests.labels("200").inc()
    return result


async def _detect(request: Request, pipeline: StreamPipeline) -> dict[str, Any]:
    settings: ServeSettings = request.app.state.settings
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
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE, str(exc), headers={"Retry-After": "1"}
        ) from exc
    try:
        det = await asyncio.wait_for(asyncio.wrap_future(future), settings.upload_timeout_s)
    except asyncio.TimeoutError as exc:
        raise HTTPException(
            status.HTTP_504_GATEWAY_TIMEOUT, f"no result within {settings.upload_timeout_s} s"
        ) from exc
    except Overloaded as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(exc)) from exc
    except Exception as exc:
        log.exception("detection of an uploaded image failed")
        raise HTTPException(status.HTTP_500_INTERNAL_SERVER_ERROR, f"the detector failed: {exc}") from exc
    h, w = image.shape[:2]
    return {"width": w, "height": h, **published(det, raw=settings.raw_detections)}
