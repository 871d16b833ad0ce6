"""dfine-serve writes over nothing: --output-json appends to its own results file only (recordings never
reuse a name: tests/serve/test_recording.py)."""

from __future__ import annotations

import json

import pytest

from dfine_deploy.errors import OwnershipError
from dfine_deploy.serve.outputs import JsonLinesWriter
from tests.serve.tiny_model import red_score_model

STRANGERS = {
    "notes": b"call the bank\n",
    "a-json-list": b"[1, 2, 3]\n",
    "other-jsonl": b'{"event": "login", "user": "ann"}\n',
    "binary": b"\x00\x01\x02",
}


@pytest.mark.parametrize("content", STRANGERS.values(), ids=STRANGERS.keys())
def test_output_json_that_is_not_ours_is_refused_in_one_line_before_serving(tmp_path, capsys, content):
    from dfine_deploy.serve.cli import main

    model = red_score_model(tmp_path / "red.onnx")
    target = tmp_path / "results.jsonl"
    target.write_bytes(content)
    assert main([str(model), "--output-json", str(target), "--port", "0", "--duration", "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--output-json {target}: is not a JSON Lines results file" in err
    assert "--force" not in err and target.read_bytes() == content
    with pytest.raises(OwnershipError):  # the writer an embedding application makes checks too
        JsonLinesWriter(target)


def test_output_json_of_ours_is_appended_to_never_truncated(tmp_path):
    target = tmp_path / "results.jsonl"
    for run in range(2):
        writer = JsonLinesWriter(target)
        writer.write({"stream": "cam", "timestamp": float(run), "detections": []})
        writer.close()
    assert [json.loads(line)["timestamp"] for line in target.read_text().splitlines()] == [0.0, 1.0]
