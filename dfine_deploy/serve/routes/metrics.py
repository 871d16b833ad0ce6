"""GET /metrics: Prometheus text format (per-stream counters, latencies, line crossings, zone occupancy)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from dfine_deploy.serve.auth import require_api_key
from dfine_deploy.serve.metrics import CONTENT_TYPE_LATEST

router = APIRouter(tags=["metrics"], dependencies=[Depends(require_api_key)])


@router.get("/metrics", response_class=Response)
async def prometheus_metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
