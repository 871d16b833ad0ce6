"""GET /docs: the OpenAPI page, with Swagger UI's files from the `fastapi-offline` package.

FastAPI's own page loads Swagger UI from a CDN: offline, or where a proxy blocks it, /docs was a
blank page. Here the page (dashboard/docs.html), its start-up script and Swagger UI's script, style
and icon are all served by this server; nothing is fetched from elsewhere. The page needs no key;
its calls do (its Authorize button takes the X-API-Key).
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, HTTPException, status
from fastapi.responses import FileResponse

from dfine_deploy.serve.routes.dashboard import FOLDER

DOCS_PATH = "/docs"
ASSETS = Path(fastapi_offline.__file__).resolve().parent / "static"
FILES = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css", "favicon.png": "image/png"}

router = APIRouter(tags=["docs"], include_in_schema=False)


@router.get(DOCS_PATH)
async def docs_page() -> FileResponse:
    return FileResponse(FOLDER / "docs.html", media_type="text/html", headers={"Cache-Control": "no-cache"})


@router.get(f"{DOCS_PATH}/assets/{{file}}")
async def docs_asset(file: str) -> FileResponse:
    if file not in FILES or not (ASSETS / file).is_file():
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no docs file {file!r}")
    return FileResponse(ASSETS / file, media_type=FILES[file], headers={"Cache-Control": "max-age=86400"})
