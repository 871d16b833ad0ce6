"""The dashboard in a real headless browser: Debian's Chromium driven by Playwright.

The page is loaded from a live server with an API key, a stream is added through the form (an HTTP
camera serving generated frames), the live view must show real frames and track ids and the counts
must appear, then the stream is removed; any console error fails the test. The screenshot in docs/serve.md
comes from here: set DFINE_DASHBOARD_SCREENSHOT=docs/dashboard.png to write it.
"""

from __future__ import annotations

import os
import re
import shutil

import cv2
import numpy as np
from conftest import wait_for
from fake_detector import RedSquareDetector

from dfine_deploy.thresholds import resolve_thresholds

KEY = "dashboard-key"
SCREENSHOT_LIMIT = 100_000  # bytes: docs/dashboard.png is committed


def _image_of(element) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(element.screenshot(), np.uint8), cv2.IMREAD_COLOR)


class _ThresholdedDetector(RedSquareDetector):
    """The fake detector with per-class thresholds in force, as a loaded model has them."""

    class_names = ["red-square", "blue-square"]
    thresholds = resolve_thresholds(class_names, {0: 0.4375}, {"blue-square": 0.123456})


def test_dashboard_adds_watches_counts_and_removes_a_stream(serve, mjpeg_camera, browser, tmp_path):
    server = serve(detector=_ThresholdedDetector(), api_key=KEY)
    page = browser.new_page(viewport={"width": 980, "height": 760})
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)

    page.goto(server.base_url + "/")
    # shown once the page has read /dashboard/config.json (a fetch after load), not at once
    page.locator("#key-form").wait_for(state="visible", timeout=10_000)
    page.fill("#key", KEY)  # asked for once, kept in sessionStorage
    page.click("#key-form button")
    assert page.evaluate("sessionStorage.getItem('dfine-serve-api-key')") == KEY
    assert not page.locator("#key-form").is_visible()
    page.fill("#add-form [name=url]", mjpeg_camera.url)  # 20 fps, a red square moving right
    page.fill("#add-form [name=name]", "street")
    page.fill(
        "#add-form [name=counting]", '{"lines": [{"name": "gate", "start": [60, 0], "end": [60, 120]}]}'
    )
    page.click("#add-form button")

    row = page.locator("#streams tr[data-stream=street]")
    row.locator(".state-live").wait_for(timeout=20_000)
    # the thresholds in force, unrounded, with where each came from
    thresholds = row.locator(".thresholds").inner_text().splitlines()
    assert thresholds == ["red-square ≥ 0.4375 (chosen)", "blue-square ≥ 0.123456 (yours)"], thresholds
    view = page.locator(".view[data-stream=street]")
    image = view.locator("img")

    def shows_a_frame() -> bool:  # the annotated frame: grey background, a red square, not a blank box
        pixels = _image_of(image)
        red = (pixels[..., 2] > 180) & (pixels[..., 1] < 90)
        return pixels.std() > 10 and red.sum() > 50

    wait_for(shows_a_frame, 20, "the live view to show annotated frames")
    view.locator(".tracks", has_text=re.compile(r"#\d+ red-square")).wait_for(timeout=20_000)
    page.locator("#recent td", has_text=re.compile(r"^#\d+$")).first.wait_for(timeout=10_000)
    counted = re.compile(r"gate: in: red-square [1-9]")  # x=60 crossed, per class
    row.locator(".counts", has_text=counted).wait_for(timeout=20_000)

    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size < SCREENSHOT_LIMIT, f"screenshot is {shot.stat().st_size} bytes"
    if os.environ.get("DFINE_DASHBOARD_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["DFINE_DASHBOARD_SCREENSHOT"])

    row.locator("button", has_text="Remove").click()
    row.wait_for(state="detached", timeout=10_000)
    view.wait_for(state="detached", timeout=10_000)
    assert server.client.get("/v1/streams", headers={"X-API-Key": KEY}).json() == []
    page.wait_for_timeout(1500)  # a refresh or two after the removal: still no error
    assert errors == [], errors


def test_the_dashboard_ships_in_the_package_and_loads_nothing_from_elsewhere(serve):
    from dfine_deploy.serve.routes.dashboard import FOLDER

    for path in FOLDER.iterdir():
        text = path.read_text()
        assert not re.search(
            r"(src|href)\s*=\s*[\"']?(https?:)?//|url\(\s*[\"']?(https?:)?//|import\s", text
        ), path
        # data reaches the page as text only: no HTML parsing from scripts
        assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write", text), path
    http = serve().client
    assert http.get("/").headers["content-type"].startswith("text/html")
    for script in ("text.js", "counting.js", "dashboard.js"):
        assert http.get(f"/dashboard/{script}").status_code == 200
    assert http.get("/dashboard/../settings.py").status_code == 404
    config = {"api_key_required": False, "events_stored": False, "unverified_engine": False}
    assert http.get("/dashboard/config.json").json() == config


def test_the_api_docs_render_offline_under_the_servers_csp(serve, browser):
    """/docs with every request off this server refused (no network): Swagger UI must still draw
    every route, with no console error (a CSP violation is one) and nothing asked from elsewhere."""
    server = serve()
    page = browser.new_page()
    errors: list[str] = []
    outside: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))

    def local_only(route) -> None:
        if route.request.url.startswith(server.base_url + "/"):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", local_only)
    page.goto(server.base_url + "/docs")
    page.locator(".opblock-summary-path", has_text="/v1/detect").first.wait_for(timeout=20_000)
    paths = set(page.locator(".opblock-summary-path").all_inner_texts())
    assert {"/v1/streams", "/v1/streams/{name}/events", "/metrics"} <= {
        p.replace("\u200b", "") for p in paths
    }
    page.wait_for_timeout(500)
    assert errors == [] and outside == [], (errors, outside)
