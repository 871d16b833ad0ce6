"""Bad input, for every command: one line naming the file, option or value and the fix, exit status 2,
no traceback (docs/bad-input.md). In-process calls of each `main(argv)`: the parsers and the checks
before any model is built, so the whole file runs in a few seconds."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dfine_deploy import cli as shared_cli
from dfine_deploy.class_names import read_names_file
from dfine_deploy.config import load_config
from dfine_deploy.data.box_lists import createml_boxes, csv_boxes
from dfine_deploy.data.coco import load_coco
from dfine_deploy.data.yolo import read_data_yaml
from dfine_deploy.errors import DfineError, OwnershipError
from dfine_deploy.ownership import check_writable_place
from dfine_deploy.serve.settings import load_streams_file
from tests.cli.test_console_scripts import CONFIG, ROOT, SCRIPTS

# A place nobody may write, root included (the kernel's own file system), and a file as a parent folder.
UNWRITABLE = "/proc/dfine-deploy-test/out"


def _main(name: str):
    module, function = SCRIPTS[name].split(":")
    return getattr(importlib.import_module(module), function)


def _parsers(name: str) -> dict[str, argparse.ArgumentParser]:
    """The parser `name` builds (and each sub-command's): caught as `main(["--help"])` starts parsing."""
    seen: list[argparse.ArgumentParser] = []

    def catch(self, args=None, namespace=None):
        seen.append(self)
        raise SystemExit(0)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(shared_cli.ArgumentParser, "parse_args", catch)
        with pytest.raises(SystemExit):
            _main(name)(["--help"])
    assert seen, f"{name} does not parse with dfine_deploy.cli.ArgumentParser"
    parser = seen[0]
    found = {"": parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def _value_options() -> list[tuple[str, str, str | None, int]]:
    """(command, sub-command, option, values) for every option of every console script that takes a
    value; option None is the first positional argument."""
    cases = []
    for name in SCRIPTS:
        for sub, parser in _parsers(name).items():
            for action in parser._actions:
                if action.nargs == 0 or isinstance(action, argparse._SubParsersAction):
                    continue
                count = action.nargs if isinstance(action.nargs, int) else 1
                if action.option_strings:
                    cases.append((name, sub, action.option_strings[-1], count))
                elif action is next(a for a in parser._actions if not a.option_strings):
                    cases.append((name, sub, None, count))
    return cases


VALUE_OPTIONS = _value_options()


def test_the_walk_sees_every_command_and_many_options():
    assert {case[0] for case in VALUE_OPTIONS} == set(SCRIPTS)
    assert len(VALUE_OPTIONS) > 80


@pytest.mark.parametrize(
    ("name", "sub", "option", "count"),
    VALUE_OPTIONS,
    ids=[f"{n} {s} {o or '<arg>'}" for n, s, o, _ in VALUE_OPTIONS],
)
def test_an_empty_value_is_refused_by_the_parser(name, sub, option, count, capsys):
    """`--out ""` was the current folder (dfine-data synth wrote train/ and val/ there) and
    `--img-folder ""` the default: an empty value is never meant."""
    argv = ([sub] if sub else []) + ([option] if option else []) + [""] * count
    with pytest.raises(SystemExit) as exited:
        _main(name)(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "the value is empty" in err[-1] and "Traceback" not in "\n".join(err), err


def _bad_files(tmp_path: Path) -> dict[str, Path]:
    files = {
        "missing": tmp_path / "absent" / "x.yml",
        "a folder": tmp_path / "folder.yml",
        "not UTF-8": tmp_path / "latin1.yml",
        "a tab indent": tmp_path / "tab.yml",
        "a duplicate key": tmp_path / "dup.yml",
        "bad JSON": tmp_path / "bad.json",
    }
    files["a folder"].mkdir()
    files["not UTF-8"].write_bytes(b"names: [caf\xe9]\n")
    files["a tab indent"].write_text("names:\n\t- a\n")
    files["a duplicate key"].write_text("names: [a]\nnames: [b]\n")
    files["bad JSON"].write_text('{"images": [')
    return files


def _read_head_map(path: Path) -> object:
    from dfine_deploy.training.heads import SourceClasses, read_head_map

    return read_head_map(path, ["a"], SourceClasses(("a",), "test", True))


READERS = {
    "config": load_config,
    "YOLO data.yaml": read_data_yaml,
    "COCO annotations": lambda path: load_coco(path, ROOT),  # an image folder that exists
    "--names": read_names_file,
    "--head-map": _read_head_map,
    "stream list": load_streams_file,
    "Tensorflow CSV": csv_boxes,
    "CreateML json": createml_boxes,
}


@pytest.mark.parametrize("reader", list(READERS))
def test_every_text_file_reader_refuses_a_bad_file_in_one_line(reader, tmp_path):
    """Non-UTF-8 bytes were a UnicodeDecodeError traceback, a tab PyYAML's five-line quote, and a key
    given twice silently the last one in --names, --head-map and the stream list."""
    for what, path in _bad_files(tmp_path).items():
        if what == "bad JSON" and reader not in (
            "COCO annotations",
            "--names",
            "--head-map",
            "CreateML json",
        ):
            continue  # read as YAML, where it is a YAML error (the tab case covers those)
        with pytest.raises(DfineError) as refused:
            READERS[reader](path)
        message = str(refused.value)
        assert "\n" not in message and str(path) in message, (what, message)
        if what == "not UTF-8":
            assert "not UTF-8 text (byte 0xe9 at offset 11)" in message
        if reader in ("COCO annotations", "Tensorflow CSV", "CreateML json"):
            continue  # not YAML: a tab or a key given twice is bad JSON, a header that is no CSV's
        if what == "a tab indent":
            assert "line 2, column 1" in message and "never tabs" in message
        if what == "a duplicate key":
            assert "set twice" in message


@pytest.mark.parametrize(
    ("name", "argv", "words"),
    [
        (
            "dfine-data",
            ["synth", "--out", "{tmp}/s", "--images", "2", "--seed", "-1"],
            "--seed: -1 is below 0",
        ),
        ("dfine-data", ["synth", "--out", "{tmp}/s", "--images", str(10**12)], "GiB of memory"),
        ("dfine-data", ["synth", "--out", "{tmp}/s", "--images", "2", "--size", str(10**9)], "GiB of memory"),
        ("dfine-data", ["synth", "--out", UNWRITABLE, "--images", "2"], "cannot write in /proc"),
        ("dfine-data", ["synth", "--out", "{tmp}/file/s", "--images", "2"], "file is a file, not a folder"),
        (
            "dfine-data",
            ["synth", "--out", "{tmp}/s", "--images", "1", "--dense-size", "8", "24"],
            "sizes the objects of --dense scenes; add --dense",
        ),
        (
            "dfine-data",
            ["synth", "--out", "{tmp}/s", "--images", "1", "--dense", "--dense-size", "30", "nan"],
            "--dense-size 30 nan: give MIN MAX pixels",
        ),
        (
            "dfine-data",
            ["synth", "--out", "{tmp}/s", "--images", "1", "--dense", "--size", "320"],
            "--dense scenes are 1920x1080 whatever --size says; leave --size out",
        ),
        ("dfine-data", ["validate", "{coco}", "--split", "train"], "leave --split out"),
        (
            "dfine-data",
            ["convert-yolo", "{coco}", "--out", "{tmp}/s"],
            "a COCO dataset, which every command reads as it is",
        ),
        ("dfine-data", ["video", "--out", "{tmp}/s/a.mp4", "--seconds", "0.5"], "a video has at least 10"),
        ("dfine-data", ["video", "--out", "{tmp}/s/a.mp4", "--scale", "0"], "keeps them 4 px or more"),
        (
            "dfine-data",
            ["video", "--out", "{tmp}/s/a.mp4", "--seconds", "2", "--stop", "100"],
            "--stop 100: the shortest time an object is in view holds a stop of at most 0.8 s",
        ),
        ("dfine-data", ["video", "--out", "{tmp}/s/a.mp4", "--scale", "10"], "576 px in a 360 px high frame"),
        ("dfine-data", ["validate", "{tmp}/data.yaml", "--img-folder", "{tmp}"], "leave --img-folder out"),
        ("dfine-info", ["dfine-n", "--imgsz", str(2**40), str(2**40)], "at most 10240 pixels"),
        (
            "dfine-export",
            ["dfine-n", "--imgsz", "320", "320", "32"],
            "give S (a square) or H W, not 3 values",
        ),
        ("dfine-info", ["dfine-n", "-c", "x.yml"], "not both"),
        ("dfine-info", ["--imgsz", "320", "dfine-n"], "'dfine-n' is not a size in pixels"),
        ("dfine-export", ["--imgsz", "320", "dfine-n"], "write it before --imgsz"),
        ("dfine-train", ["-u", "epochs=2", "oops", "-c", "{config}"], "override 'oops' is not of the form"),
        ("dfine-export", ["dfine-n", "--calibration-images", "32"], "--calibration-images belongs to --int8"),
        ("dfine-export", ["dfine-n", "--gate-images", "100"], "--gate-images belongs to --data"),
        (
            "dfine-export",
            ["dfine-n", "--target", "trt10.3", "--no-cpu-graph"],
            "--no-cpu-graph: --target trt10.3 writes the graphs of its device and no CPU graph",
        ),
        ("dfine-export", ["dfine-n", "--no-postprocess", "--no-cpu-graph"], "--no-postprocess writes no CPU"),
        ("dfine-export", ["dfine-n", "--int8", "--data", "{tmp}", "--no-cpu-graph"], "which it keeps; leave"),
        (
            "dfine-export",
            ["dfine-n", "--data", "{tmp}/nowhere"],
            "nowhere: no such file or folder; give validation",
        ),
        (
            "dfine-export",
            ["dfine-n", "--hf", "{tmp}/s", "--no-fp16", "--target", "trt10.3"],
            "--hf writes a transformers folder, and --target and --no-fp16 are options of an artifact",
        ),
        ("dfine-export", ["dfine-n", "--hf", "{tmp}/s", "-o", "{tmp}/s"], "and --output is an option of"),
        ("dfine-info", [], "give a model"),
        ("dfine-bench", ["--model", "m.onnx", "--precision", "best"], "(choose from 'auto', 'fp32'"),
        ("dfine-bench", ["--model", "m.onnx", "--stream-seconds", "nan"], "--stream-seconds must be"),
        ("dfine-bench", ["--model", "m.onnx", "--frame-size", str(10**9), str(10**9)], "GiB of memory"),
        ("dfine-bench", ["--model", "m.onnx", "--json", UNWRITABLE], "cannot write in /proc"),
        ("dfine-bench", ["--model", "m.onnx", "--plot", "{tmp}/file/p.png"], "file is a file, not a folder"),
        ("dfine-train", ["-c", "{config}", "-d", "gpu0"], "-d 'gpu0': not a device"),
        ("dfine-train", ["-c", "{config}", "--head-map", "m.yml"], "no -t was given"),
        ("dfine-train", ["-c", "{config}", "--no-obj365-remap"], "--no-obj365-remap belongs to --tuning"),
        (
            "dfine-train",
            ["-c", "{config}", "--test-only", "-r", "x.pth", "--no-smoke", "--ap-alarm-after", "0.25"],
            "--test-only evaluates and trains nothing, so --no-smoke and --ap-alarm-after would be ignored",
        ),
        ("dfine-train", ["-c", "{config}", "--test-only", "-r", "x.pth", "--smoke"], "so --smoke would be"),
        (
            "dfine-train",
            ["-c", "{config}", "-d", "cpu", "--output-dir", "{tmp}/run", "--summary-dir", UNWRITABLE],
            "cannot write in /proc",
        ),
        ("dfine-serve", ["m.onnx", "--host", "no such host"], "--host 'no such host': no address"),
        (
            "dfine-serve",
            ["m.onnx", "--source", "a.mp4", "b.mp4"],
            "unrecognized arguments: b.mp4; --source takes one value each time: repeat it for each",
        ),
        ("dfine-serve", ["m.onnx", "--events", UNWRITABLE], "cannot write in /proc"),
        (
            "dfine-serve",
            ["m.onnx", "--max-streams", "-1"],
            "--max-streams must be a finite number >= 1; found -1",
        ),
        ("dfine-serve", ["m.onnx", "--record", UNWRITABLE], "cannot write in /proc"),
        ("dfine-serve", ["m.onnx", "--output-json", "{tmp}/file/r.jsonl"], "file is a file, not a folder"),
        ("dfine-serve", ["m.onnx", "--streams", "{tmp}/latin1.yml"], "not UTF-8 text"),
        (
            "dfine-serve",
            ["m.onnx", "--streams", "{tmp}/spaced.yml"],
            "stream name 'front door': use 1-64 letters, digits, '_', '-' or '.'",
        ),
        (
            "dfine-serve",
            ["m.onnx", "--class-threshold", "car=0.5", "--class-threshold", "car=0.6"],
            "--class-threshold 'car=0.6': class 'car' is already given ('car=0.5'); give each class once",
        ),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_a_bad_value_is_one_line_before_any_work(name, argv, words, tmp_path, capsys):
    (tmp_path / "file").write_text("a file, not a folder\n")
    (tmp_path / "latin1.yml").write_bytes(b"streams: [caf\xe9]\n")
    (tmp_path / "spaced.yml").write_text("streams:\n  - {url: rtsp://cam.local/x, name: front door}\n")
    (tmp_path / "data.yaml").write_text("names: [a]\nval: images\n")
    coco = tmp_path / "annotations.json"
    coco.write_text('{"images": [], "annotations": [], "categories": []}')
    argv = [a.format(tmp=tmp_path, coco=coco, config=ROOT / CONFIG) for a in argv]
    try:
        code = _main(name)(argv)
    except SystemExit as exited:  # the parser's refusals
        code = exited.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert words in last, err
    assert not (tmp_path / "s").exists() and not (tmp_path / "run").exists()


def test_a_garbage_torchrun_variable_is_one_line(monkeypatch):
    """RANK=abc was int()'s ValueError traceback."""
    from dfine_deploy.errors import TrainingError
    from dfine_deploy.training.distributed import init_distributed

    for name, value in (("WORLD_SIZE", "two"), ("RANK", "-1"), ("LOCAL_RANK", "0.5")):
        with monkeypatch.context() as env:
            env.setenv(name, value)
            with pytest.raises(TrainingError, match=rf"environment variable {name}='{value}' .*unset {name}"):
                init_distributed("cpu")


def test_a_writable_place_check_leaves_nothing_behind(tmp_path):
    check_writable_place(tmp_path / "new" / "deeper", "--out")
    assert os.listdir(tmp_path) == []
    (tmp_path / "f").write_text("")
    with pytest.raises(OwnershipError, match=r"^--out: .*/f is a file, not a folder"):
        check_writable_place(tmp_path / "f" / "x", "--out")
    with pytest.raises(OwnershipError, match=r"cannot write in /proc \("):
        check_writable_place(Path(UNWRITABLE), "--out")


def test_the_torchrun_entry_uses_the_shared_parser_and_checks(monkeypatch, capsys):
    """train/main.py (torchrun's entry) parses with dfine-train's parser and refuses what it refuses,
    so what holds for one holds for both."""
    from dfine_deploy.training import cli as training_cli

    entry = _entry(ROOT / "train" / "main.py", monkeypatch)
    module = sys.modules[entry.__module__]
    assert module.get_args_parser is training_cli.get_args_parser
    argv = ["-c", str(ROOT / CONFIG), "--no-obj365-remap"]
    for main in (entry, _main("dfine-train")):
        assert main(argv) == 2
        assert "--no-obj365-remap belongs to --tuning" in capsys.readouterr().err


SCRIPT_FILES = sorted([*(ROOT / "scripts").glob("*.py"), *(ROOT / "benchmarks").glob("*.py")])


def _entry(path: Path, monkeypatch: pytest.MonkeyPatch):
    """The function a script file's `if __name__ == "__main__"` calls (`cli` where there is one)."""
    name = f"entry_{path.parent.name}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return getattr(module, "cli", None) or module.main


@pytest.mark.parametrize("path", SCRIPT_FILES, ids=[f"{p.parent.name}/{p.name}" for p in SCRIPT_FILES])
def test_every_script_and_benchmark_loads(path, monkeypatch):
    """Every entry point of scripts/ and benchmarks/ loads (its command line runs under
    `if __name__ == "__main__"`): benchmarks/parity_all_sizes.py imported a helper the tests no
    longer have, and ended in an ImportError traceback before printing its --help."""
    assert callable(_entry(path, monkeypatch)), f"{path.name} has no main()"


# Every command line a user can ask for --help: the console scripts, the `python -m` tools the docs
# name, the torchrun entry, and the scripts and benchmarks that parse their arguments.
HELP_ENTRIES = {
    **SCRIPTS,
    "python -m dfine_deploy.export.tensorrt": "dfine_deploy.export.tensorrt:main",
    "python -m dfine_deploy.export.tensorrt_record": "dfine_deploy.export.tensorrt_record:main",
    "train/main.py": ROOT / "train" / "main.py",
    **{
        f"{path.parent.name}/{path.name}": path
        for path in SCRIPT_FILES
        if "ArgumentParser(" in path.read_text(encoding="utf-8")
    },
}


@pytest.mark.parametrize("entry", list(HELP_ENTRIES))
def test_every_command_line_and_sub_command_writes_its_help(entry, monkeypatch):
    """argparse formats each help text with `%`: a literal '20 %' in one made `dfine-data video --help`
    end in a ValueError traceback. Each parser is caught as it starts parsing, before any work."""
    target = HELP_ENTRIES[entry]
    if isinstance(target, Path):
        function = _entry(target, monkeypatch)
    else:
        module, name = target.split(":")
        function = getattr(importlib.import_module(module), name)
    seen: list[argparse.ArgumentParser] = []

    def catch(self, args=None, namespace=None):
        seen.append(self)
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", catch)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", catch)
    monkeypatch.setattr(sys, "argv", [entry, "--help"])
    with pytest.raises(SystemExit):
        function(["--help"]) if inspect.signature(function).parameters else function()
    assert seen, f"{entry} parsed no command line"
    parsers = [seen[0]] + [
        sub
        for action in seen[0]._actions
        if isinstance(action, argparse._SubParsersAction)
        for sub in action.choices.values()
    ]
    for parser in parsers:
        assert parser.format_help().startswith("usage:"), parser.prog


def test_trt_surface_answers_help_and_a_wrong_folder_in_one_line(tmp_path, capsys):
    """scripts/trt_surface.py took any first word as the clone: --help was git's CalledProcessError."""
    spec = importlib.util.spec_from_file_location("entry_trt_surface", ROOT / "scripts" / "trt_surface.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(SystemExit) as exited:
        module.main(["--help"])
    assert exited.value.code == 0 and "trt_repo" in capsys.readouterr().out
    assert module.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{tmp_path} is not a git clone" in err[0]


BUILD_ENGINE = ROOT / "export" / "jetson" / "build_engine.sh"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ([], "give the artifact folder"),
        (["{art}", "--batch", "1"], "--batch needs 3 value(s)"),
        (["{art}", "--workspace"], "--workspace needs 1 value(s)"),
        (["{art}", "--workspace", "abc"], "--workspace abc: give the builder's memory in MB"),
        (["{art}", "--batch", "8", "1", "a"], "--batch 8 1 a: need whole numbers 1 <= MIN <= OPT <= MAX"),
        (["{art}", "--batch", "0", "0", "0"], "--batch 0 0 0: need whole numbers"),
        (["{art}", "--bogus"], "unknown option --bogus"),
        (["{art}", "{art}"], "one artifact folder only"),
        (["{tmp}/absent"], "absent: no such folder; give the artifact folder made by dfine-export"),
        (["{tmp}"], "model.json not found; copy the whole artifact folder here"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_build_engine_refuses_bad_arguments_in_one_line(args, words, tmp_path):
    """build_engine.sh ended `--batch 1` with bash's '$3: unbound variable' (status 1), put `--batch 8 1 a`
    and `--workspace abc` into the trtexec line, and printed a line of its code with the usage."""
    art = tmp_path / "art"
    art.mkdir()
    (art / "model.json").write_text("{}")
    argv = [a.format(art=art, tmp=tmp_path) for a in args]
    done = subprocess.run(["bash", str(BUILD_ENGINE), *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], done.stderr


def test_build_engine_help_is_the_comment_block_only():
    done = subprocess.run(["bash", str(BUILD_ENGINE), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("Build a TensorRT engine")
    assert "set -euo" not in done.stdout and "DFINE_TRT_GPU" in done.stdout


def test_a_byte_order_mark_is_read_past_by_every_text_file_reader(tmp_path):
    """Windows tools start UTF-8 files with a byte-order mark; it is no content of the file."""
    from dfine_deploy.text_files import load_json, load_yaml

    (tmp_path / "a.yml").write_bytes(b"\xef\xbb\xbfnames: [a]\n")
    (tmp_path / "a.json").write_bytes(b'\xef\xbb\xbf{"names": ["a"]}')
    assert load_yaml(tmp_path / "a.yml", "test", DfineError) == {"names": ["a"]}
    assert load_json(tmp_path / "a.json", "test", DfineError) == {"names": ["a"]}


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("DFINE_HOME", "{tmp}/file", "DFINE_HOME='{tmp}/file': {tmp}/file is a file, not a folder"),
        ("DFINE_WEIGHTS_URL", "not a url", "DFINE_WEIGHTS_URL='not a url' is not a URL to download weights"),
    ],
)
def test_a_bad_weights_variable_is_one_line(variable, value, words, tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("a file, not a folder\n")
    monkeypatch.setenv("DFINE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(variable, value.format(tmp=tmp_path))
    assert _main("dfine-info")(["dfine-s-coco"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert words.format(tmp=tmp_path) in err, err


def test_backend_rknn_on_an_artifact_without_an_rknn_build_is_one_line(trained_export):
    """An artifact exported without --target rk*, opened by the rknn row where rknn-toolkit2 is there
    (a board, or .venv-rknn): no model.rknn to run, said with the export that makes one (it used to
    end in KeyError: 'build')."""
    from dfine_deploy.artifact import read_artifact
    from dfine_deploy.errors import BackendError
    from dfine_deploy.runtime.backends import BACKENDS

    row = next(b for b in BACKENDS if b.name == "rknn")
    with pytest.raises(BackendError) as refused:
        row.build(object, trained_export / "model.fp16.onnx", None, read_artifact(trained_export))
    message = str(refused.value)
    assert "\n" not in message and "--target rk3588" in message, message


@pytest.mark.parametrize(
    ("name", "argv"),
    [
        ("dfine-export", ["{run}"]),
        ("dfine-info", ["{run}"]),
        ("dfine-verify", ["{run}"]),
        ("dfine-bench", ["--model", "{run}"]),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_a_training_runs_folder_given_as_the_model_names_its_checkpoints(name, argv, tmp_path, capsys):
    """A training run's folder (best.pth, last.pth, no model.json) is the model a user reaches for after
    training; it was called "an artifact folder (from dfine-export)" by the PyTorch commands."""
    run = tmp_path / "train"
    run.mkdir()
    for file in ("last.pth", "best.pth", "log.jsonl"):
        (run / file).write_bytes(b"")
    try:
        code = _main(name)([a.format(run=run) for a in argv])
    except SystemExit as exited:
        code = exited.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert f"it holds best.pth, last.pth: give one of those files (e.g. {run / 'best.pth'})" in last, err
    assert "is an artifact folder" not in last, err


def test_a_folder_that_is_no_model_is_not_called_an_artifact_folder(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("nothing to load\n")
    assert _main("dfine-export")([str(tmp_path)]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "without model.json or config.json, so neither an artifact folder nor a transformers" in last
    assert "this command takes a size name" in last and "it holds" not in last


def _folder_readers():
    from dfine_deploy.evaluation import CocoEvaluator
    from dfine_deploy.export.onnx import load as load_onnx
    from dfine_deploy.runtime.onnxruntime_backend import OnnxRuntimeBackend
    from dfine_deploy.runtime.openvino_backend import OpenVinoBackend

    return {
        "ground truth": CocoEvaluator,
        "onnx.load": load_onnx,
        "onnxruntime": OnnxRuntimeBackend,
        "openvino": OpenVinoBackend,
        "dfine-bench --tracking": lambda folder: _main("dfine-bench")(
            ["--model", "m.onnx", "--tracking", str(folder), "--truth", str(folder)]
        ),
    }


@pytest.mark.parametrize(
    "reader", ["ground truth", "onnx.load", "onnxruntime", "openvino", "dfine-bench --tracking"]
)
def test_a_folder_where_a_file_is_read_is_called_a_folder(reader, tmp_path, capsys):
    """A folder is no missing file: it was "no such file" or "does not exist" to these readers."""
    folder = tmp_path / "model.onnx"
    folder.mkdir()
    try:
        code = _folder_readers()[reader](folder)
        said = capsys.readouterr().err
    except DfineError as exc:
        code, said = 2, str(exc)
    assert code == 2 and f"{folder}: is a folder, not a file" in said, said


@pytest.mark.parametrize("name", ["dfine-export", "dfine-info", "dfine-bench"])
def test_every_imgsz_takes_a_square_or_height_and_width(name):
    """`--imgsz 640`, as Ultralytics and dfine-bench took it, was refused by dfine-export and dfine-info
    ("expected 2 arguments"): one option, one meaning, in every command."""
    parser = _parsers(name)[""]
    model = ["--model", "dfine-n"] if name == "dfine-bench" else ["dfine-n"]
    assert parser.parse_args([*model, "--imgsz", "320"]).imgsz == (320, 320)
    assert parser.parse_args([*model, "--imgsz", "320", "480"]).imgsz == (320, 480)


@pytest.mark.parametrize(
    ("name", "before"),
    [("dfine-export", []), ("dfine-info", []), ("dfine-verify", []), ("dfine-bench", ["--model"])],
)
@pytest.mark.parametrize(
    ("ref", "said"),
    [
        ("{tmp}/runs/best.pth", ("no such file or folder", "checkpoint not found")),
        ("{tmp}/gone/", ("no such file or folder",)),
        ("dfine-q", ("no model has this name",)),
    ],
    ids=["missing-file", "missing-folder", "unknown-name"],
)
def test_a_model_that_names_nothing_is_refused_alike_by_every_command(
    name, before, ref, said, tmp_path, capsys
):
    """The same reference was 'not found', 'no such file or folder' or 'unknown model' by command; and
    dfine-bench refused official weights by name as 'no such file or folder'."""
    ref = ref.format(tmp=tmp_path)
    try:
        code = _main(name)([*before, ref])
    except SystemExit as exited:
        code = exited.code
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and ref in last and any(words in last for words in said), last


WARNS = """
import sys, warnings
import dfine_deploy.cli as cli
def main(argv):
    warnings.warn_explicit("dfine-n: no weights given", UserWarning, cli.__file__, 1)
    warnings.warn_explicit("a library's", UserWarning, "/elsewhere/lib.py", 7)
sys.exit(cli.friendly_errors(main)([]))
"""


def test_our_warnings_print_as_one_line_and_other_librarys_as_python_prints_them():
    """`dfine-serve dfine-n` printed 'dfine_deploy/runtime/torch_backend.py:57: UserWarning: ...' and a
    line of our code under it; a warning of another library keeps Python's form (it names its file)."""
    done = subprocess.run([sys.executable, "-c", WARNS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == "warning: dfine-n: no weights given", lines
    assert lines[1] == "/elsewhere/lib.py:7: UserWarning: a library's", lines


LOGS = """
import logging, sys
from dfine_deploy.cli import configure_logging
configure_logging(sys.argv[1], server=sys.argv[2] == "server")
log = logging.getLogger("dfine_deploy.test")
log.info("info line")
log.warning("%s opened unverified", "model.onnx")
log.error("the shutdown did not end")
"""


def test_log_lines_carry_their_level_word_once():
    """A tool's log warnings printed bare (export's 'Frigate cannot run this artifact', dfine-bench's
    CPU-fit advice), four carried 'warning:' in their text, and dfine-serve then printed
    'WARNING dfine_deploy.serve: warning: ...'."""

    def lines(level: str, form: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", LOGS, level, form], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        return done.stderr.splitlines()

    assert lines("INFO", "tool") == [
        "info line",
        "warning: model.onnx opened unverified",
        "error: the shutdown did not end",
    ]
    assert lines("WARNING", "tool") == [
        "warning: model.onnx opened unverified",
        "error: the shutdown did not end",
    ]
    served = lines("info", "server")
    assert served[1].endswith(" WARNING dfine_deploy.test: model.onnx opened unverified"), served
    assert not any("warning: " in line for line in served), served
