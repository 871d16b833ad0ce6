"""GET /: the dashboard, plain HTML/CSS/JS shipped in the package (dfine_deploy/serve/dashboard/).

No build step and nothing fetched from elsewhere. The page itself needs no key; it asks for one when
the API answers 401, keeps it in the tab's sessionStorage, and sends it as the transports allow
(X-API-Key header for fetch; ?api_key= only for EventSource and the MJPEG <img>).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.responses import FileResponse

FOLDER = Path(__file__).resolve().parents[1] / "dashboard"
FILES = {
    "dashboard.js": "text/javascript",
    "counting.js": "text/javascript",
    "text.js": "text/javascript",
    "events.js": "text/javascript",
    "dashboard.css": "text/css",
    "docs.js": "text/javascript",
}

router = APIRouter(tags=["dashboard"], include_in_schema=False)


@router.get("/")
async def dashboard_page() -> FileResponse:
    return FileResponse(FOLDER / "index.html", media_type="text/html", headers={"Cache-Control": "no-cache"})


@router.get("/dashboard/config.json")
async def dashboard_config(request: Request) -> dict[str, bool]:
    """What the page needs before its first call: whether to ask for a key (so it never draws a 401),
    and whether the server keeps events (so the events panel never asks for a list there is not)."""
    settings = request.app.state.settings
    return {
        "api_key_required": bool(settings.api_key),
        "events_stored": settings.events_dir is not None,
        "unverified_engine": bool(request.app.state.unverified_engine),
    }


@router.get("/dashboard/{file}")
async def dashboard_asset(file: str) -> FileResponse:
    if file not in FILES:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no dashboard file {file!r}")
    return FileResponse(FOLDER / file, media_type=FILES[file], headers={"Cache-Control": "no-cache"})
