"""The dashboard's events panel in the real browser: a stream's crossings and zone changes appear as
they happen with their snapshots, the filter asks the API for one kind, and nothing errs."""

from __future__ import annotations

import re

from conftest import wait_for
from test_dashboard import KEY
from test_events import _spec
from test_tracking import _write_paths_video


def test_the_events_panel_shows_live_events_with_snapshots_and_filters(serve, browser, tmp_path):
    server = serve(api_key=KEY, events_dir=tmp_path / "events")
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    page.goto(server.base_url + "/")
    page.fill("#key", KEY)
    page.click("#key-form button")
    page.locator("#events-note", has_text="stored events").wait_for(timeout=10_000)
    assert page.locator("#no-events").is_visible()
    wait_for(lambda: server.pipeline.events.clients == 1, 10, "the panel's event stream")

    video = tmp_path / "paths.mp4"
    _write_paths_video(video)
    spec = _spec(video)
    spec.realtime = True  # three seconds of events arriving one by one
    server.pipeline.add_stream(spec, trusted=True)
    rows = page.locator("#events tbody tr")
    wait_for(lambda: rows.count() == 10, 20, "the ten events of the video on the page")  # test_events
    assert page.locator("#events td", has_text=re.compile(r"^crossed line middle \((in|out)\)$")).count() == 4
    snapshots = page.locator("#events img.snapshot")

    def every_snapshot_loaded() -> bool:
        images = snapshots.element_handles()
        return len(images) == 10 and all(page.evaluate("i => i.naturalWidth > 0", i) for i in images)

    wait_for(every_snapshot_loaded, 10, "every snapshot to load")

    page.select_option("#events-form [name=kind]", "zone_leave")
    page.click("#events-form button")
    wait_for(lambda: rows.count() == 2, 10, "only the two exits")
    assert page.locator("#events td", has_text=re.compile(r"^left zone left$")).count() == 2
    assert not page.locator("#no-events").is_visible()
    assert errors == [], errors
