"""GET /healthz (alive) and GET /readyz (model loaded, pipeline running); never need a key."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status

from dfine_deploy.serve.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """Liveness: the process answers."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
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
