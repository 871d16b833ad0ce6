"""Counting drawn on the dashboard, in the real browser: lines and zones are drawn, moved and deleted
with the mouse on the live view of a real server reading a generated video with objects on known paths
(crossing_video.py; the fake detector sees them), and the API's counts must follow, per class and
direction. Also: refused input reads as sentences, data never becomes markup, the recent table does
not churn with the frame rate.
"""

from __future__ import annotations

import re

from conftest import wait_for
from crossing_video import write_crossing_video
from fake_detector import FakeDetections, RedSquareDetector

from dfine_deploy.serve.settings import StreamSpec

EXPECTED_RESOURCE_ERROR = re.compile(r"status of (400|422) ")  # Chromium logs every refused request


def _watch(page) -> list[str]:
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    return errors


class _Frame:
    """Screen positions of frame pixels on a live view's overlay."""

    def __init__(self, page, stream: str):
        self.page = page
        self.view = page.locator(f".view[data-stream={stream}]")
        self.view.locator(".frame-size", has_text="320 × 240 px").wait_for(timeout=20_000)
        self.box = self.view.locator("svg.overlay").bounding_box()

    def at(self, x: float, y: float) -> tuple[float, float]:
        return self.box["x"] + x * self.box["width"] / 320, self.box["y"] + y * self.box["height"] / 240

    def drag(self, start: tuple[float, float], end: tuple[float, float]) -> None:
        mouse = self.page.mouse
        mouse.move(*self.at(*start))
        mouse.down()
        mouse.move(*self.at(*end), steps=8)
        mouse.up()

    def click(self, x: float, y: float) -> None:
        self.page.mouse.click(*self.at(x, y))

    def tool(self, label: str) -> None:
        self.view.locator("button", has_text=label).click()

    def points(self, shape: str) -> str:
        return self.view.locator(f"tr[data-shape='{shape}'] .points").inner_text()


def test_lines_and_zones_drawn_with_the_mouse_count_the_moving_objects(serve, browser, tmp_path):
    video = write_crossing_video(tmp_path / "crossing.mp4")
    server = serve(streams=[StreamSpec(url=str(video), name="yard", loop=True)])  # not tracked yet
    http = server.client
    page = browser.new_page(viewport={"width": 1100, "height": 1000})
    errors = _watch(page)
    page.goto(server.base_url + "/")
    frame = _Frame(page, "yard")

    frame.tool("Draw line")
    frame.drag((160, 5), (160, 235))  # downwards through the middle
    assert frame.points("line-1") == "(160, 5) → (160, 235)"  # the stream's own pixels
    arrow = frame.view.locator("svg .arrow")
    assert float(arrow.get_attribute("x2")) > float(arrow.get_attribute("x1"))  # "in" is to the right
    assert frame.view.locator("input[type=checkbox]").is_checked()  # a line turns tracking on
    frame.view.locator("button", has_text="Apply").click()
    wait_for(lambda: http.get("/v1/streams/yard").json()["lines"], 10, "the line to reach the stream")
    info = http.get("/v1/streams/yard").json()
    assert info["track"] and info["lines"] == [{"name": "line-1", "start": [160, 5], "end": [160, 235]}]

    def crossings() -> dict:
        return http.get("/v1/streams/yard").json()["counts"]["lines"]["line-1"]

    # red moves right (to the arrow's side: in), blue moves left (out); each once per 2 s loop
    wait_for(lambda: crossings()["in"] and crossings()["out"], 15, "crossings both ways")
    counted = crossings()
    assert set(counted["in"]) == {"red-square"} and set(counted["out"]) == {"blue-square"}, counted
    row = page.locator("#streams tr[data-stream=yard] .counts")
    row.filter(has_text=re.compile(r"line-1: in: red-square [1-9].*out: blue-square [1-9]")).wait_for(
        timeout=5000
    )
    shape_counts = frame.view.locator("tr[data-shape='line-1'] .shape-counts")
    shape_counts.filter(has_text=re.compile(r"in: red-square [1-9]")).wait_for(timeout=5000)

    frame.drag((160, 120), (200, 120))  # the line's body, in select mode: moves all of it
    assert frame.points("line-1") == "(200, 5) → (200, 235)"
    frame.view.locator("button", has_text="Apply").click()
    wait_for(lambda: http.get("/v1/streams/yard").json()["lines"][0]["start"] == [200, 5], 10, "the move")

    frame.tool("Draw zone")
    for corner in ((170, 150), (310, 150), (310, 230), (170, 230), (170, 150)):  # back at the first: closed
        frame.click(*corner)
    assert frame.points("zone-1") == "(170, 150) (310, 150) (310, 230) (170, 230)"
    wait_for(lambda: crossings()["in"], 10, "a crossing of the moved line (its counts started again)")
    before = sum(crossings()["in"].values())
    frame.view.locator("button", has_text="Apply").click()

    def blue_in_zone() -> bool:
        zones = http.get("/v1/streams/yard").json()["counts"]["zones"]
        return zones.get("zone-1") == {"blue-square": 1}  # the red square's path is above the zone

    wait_for(blue_in_zone, 10, "the blue square inside the drawn zone")
    assert sum(crossings()["in"].values()) >= before >= 1  # the unchanged line kept counting

    frame.click(200, 60)  # selects the line (on its body, away from its ends)
    page.keyboard.press("Delete")
    assert frame.view.locator("tr[data-shape='line-1']").count() == 0
    frame.view.locator("button", has_text="Apply").click()
    wait_for(lambda: http.get("/v1/streams/yard").json()["lines"] == [], 10, "the line to be deleted")
    assert [z["name"] for z in http.get("/v1/streams/yard").json()["zones"]] == ["zone-1"]
    frame.view.locator("tr[data-shape='zone-1'] button", has_text="Delete").click()
    frame.view.locator("button", has_text="Apply").click()
    wait_for(lambda: http.get("/v1/streams/yard").json()["zones"] == [], 10, "the zone to be deleted")

    # 40 detections a second reach the page; the recent table is redrawn once a second, never per result
    page.evaluate(
        """() => { window.recentRedraws = 0;
        new MutationObserver(() => window.recentRedraws++)
          .observe(document.querySelector('#recent tbody'), { childList: true }); }"""
    )
    page.wait_for_timeout(3000)
    assert page.evaluate("window.recentRedraws") <= 4
    assert 0 < page.locator("#recent tbody tr").count() <= 15
    assert errors == [], errors


class _HostileNames(RedSquareDetector):
    """Class names that would run script if the page ever used them as markup."""

    NAME = '<img src=x onerror="window.pwned=1">'

    def predict(self, frames, *, color: str = "BGR") -> list[FakeDetections]:
        found = super().predict(frames, color=color)
        return [FakeDetections(d.boxes, d.scores, d.labels, [self.NAME] * len(d.names)) for d in found]


def test_refusals_read_as_sentences_and_data_never_becomes_markup(serve, browser, tmp_path):
    video = write_crossing_video(tmp_path / "crossing.mp4")
    zone = {"name": "all", "polygon": [[0, 0], [320, 0], [320, 240], [0, 240]]}
    spec = StreamSpec(url=str(video), name="yard", loop=True, track=True, zones=[zone])
    server = serve(detector=_HostileNames(), streams=[spec])
    page = browser.new_page(viewport={"width": 1100, "height": 1000})
    errors = _watch(page)
    page.goto(server.base_url + "/")

    page.fill("#add-form [name=url]", "http://127.0.0.1:9/video")
    page.fill(
        "#add-form [name=counting]",
        '{"lines": [{"name": "g", "start": [0, "a"], "end": [1, 2, 3]}], "trak": 1}',
    )
    page.click("#add-form button")
    messages = page.locator("#add-error div")
    messages.first.wait_for(timeout=10_000)
    assert messages.all_inner_texts() == [
        'lines[0].start[1]: Input should be a valid number (got "a").',  # strict: a string is no number
        "lines[0].end: Tuple should have at most 2 items after validation, not 3.",
        "trak is not a known field; check its spelling.",
    ]
    page.fill("#add-form [name=counting]", '{"lines": [')
    page.click("#add-form button")
    page.locator("#add-error", has_text="Counting is not valid JSON").wait_for(timeout=5000)

    frame = _Frame(page, "yard")
    frame.tool("Draw line")
    frame.drag((20, 20), (300, 20))
    frame.view.locator("tr[data-shape='line-1'] input").fill("not a name")
    frame.view.locator("tr[data-shape='line-1'] input").press("Enter")
    frame.view.locator("button", has_text="Apply").click()
    refusal = frame.view.locator(".edit-error div")
    refusal.first.wait_for(timeout=10_000)
    assert refusal.all_inner_texts() == [
        "stream 'yard': lines[0].name: use 1-64 letters, digits, '_', '-' or '.', got 'not a name'"
    ]
    assert server.client.get("/v1/streams/yard").json()["lines"] == []  # nothing changed

    hostile = _HostileNames.NAME
    page.locator("#recent td", has_text=hostile).first.wait_for(timeout=10_000)  # shown as text
    page.locator("#streams .counts", has_text=f"all: inside now: {hostile}").wait_for(timeout=10_000)
    frame.view.locator(".tracks", has_text=hostile).wait_for(timeout=10_000)
    assert page.evaluate("window.pwned") is None
    assert page.locator("img").count() == 1  # the live view's own, nothing injected
    assert [e for e in errors if not EXPECTED_RESOURCE_ERROR.search(e)] == [], errors
