"""Where stream results go besides the API's replies: the `ResultSink` protocol and the JSON Lines file.

Every result of every stream passes through the pipeline's one output thread
(dfine_deploy/serve/pipeline.py), which hands it to each sink added with
`StreamPipeline.add_sink`. The API's own clients (`serve/results.py` `Subscriber`) and the MQTT and
Redis publishers (`serve/bus.py` `Publisher`) are sinks too.
A new output (a message bus, a database) is one class with the two methods below.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Protocol

from dfine_deploy.ownership import claim_file


class ResultSink(Protocol):
    """A receiver of stream results.

    `write` runs in the pipeline's output thread, once per result of every stream, so it must not
    block: a sink that waits (a network round trip, a full disk) delays every stream's results and,
    once the output queue is full, the inference thread. Slow work belongs on the sink's own thread
    behind a bounded queue that drops (and counts) what it cannot keep. An exception is logged and the
    next result still comes. `result` is the dict the API publishes (`stream`, `frame_index`,
    `timestamp`, `detections`, ...); treat it as read-only, other sinks get the same object.

    `close` is called once, at shutdown, after the output thread has stopped; a `write` that still
    comes after it must be dropped, not raise.
    """

    def write(self, result: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def _is_results_file(path: Path) -> bool:
    with open(path, encoding="utf-8") as fh:
        first = json.loads(fh.readline())
    return isinstance(first, dict) and {"stream", "timestamp", "detections"} <= first.keys()


def check_results_file(path: Path) -> None:
    """Refuse an --output-json that exists and is not a results file of ours (appending to it would
    change someone else's file)."""
    kind = "a JSON Lines results file"
    claim_file(path, command="dfine-serve", kind=kind, recognise=_is_results_file, option="--output-json")


class JsonLinesWriter:
    """The `--output-json` sink: appends every result as one JSON line, flushed per line so a killed
    server loses at most one (a local append: short enough for the output thread).

    The file is created with the first result, so a run that detected nothing (a source that failed)
    leaves no empty file behind that could pass for a run without objects. An existing file is
    appended to, never truncated, and only when it is ours (`check_results_file`).
    """

    def __init__(self, path: Path):
        check_results_file(path)
        self.path = path
        self._file: Any = None
        self._closed = False
        self._lock = threading.Lock()

    def write(self, result: dict[str, Any]) -> None:
        with self._lock:
            if self._closed:
                return
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (open across calls; close() shuts it)
            self._file.write(json.dumps(result) + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._file is not None:
                self._file.close()
