"""Runs that cannot train, folders another run owns, and inputs that used to end in a traceback.

Every refusal is one line on stderr and exit status 2, before anything is written; the tiny run of
trainer_helpers (`trained`) supplies a finished run and its checkpoints, and is never changed.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import time
import weakref

import pytest
import torch
from trainer_helpers import MAIN, PYTHON, REPO, child_env, finished_run

from dfine_deploy.errors import TrainingError
from dfine_deploy.training import runlock
from dfine_deploy.training.checkpoint import load_training_checkpoint
from dfine_deploy.training.cli import main as train_main
from dfine_deploy.training.runlock import LOCK_NAME, RunLock, exit_if_terminated, exit_on_sigterm

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return finished_run(tmp_path_factory.mktemp("tiny"))


def refused(capsys, *argv: str) -> str:
    """Run dfine-train in this process; it must refuse with one line on stderr and exit 2."""
    code = train_main(["--no-progress", *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def _tiny_data(trained):
    cfg, _, _ = trained
    return cfg.parent / "data"


# -------------------------------------------------------------------------- runs that cannot train
@pytest.mark.parametrize(
    ("updates", "expected"),
    [
        (["train_dataloader.total_batch_size=4"], "2 image(s) give no batch of 4 per process"),
        (["train_dataloader.total_batch_size=3"], "use total_batch_size 2 or less"),
        (["epochs=-1"], "'epochs' (from -u epochs=-1) must be a finite number >= 1; found -1"),
        (["epochs=0"], "must be a finite number >= 1; found 0"),
        (["optimizer.lr=0"], "'optimizer.lr' (from -u optimizer.lr=0) must be a finite number > 0; found 0"),
        (["optimizer.lr=.nan"], "'optimizer.lr' (from -u optimizer.lr=.nan) must be a finite number > 0"),
        (["optimizer.lr=-.inf"], "must be a finite number > 0; found -inf"),
        (["lr_warmup_scheduler.warmup_duration=-5"], "'lr_warmup_scheduler.warmup_duration'"),
    ],
)
def test_a_run_that_cannot_take_a_step_is_refused_before_it_starts(
    trained, tmp_path, capsys, updates, expected
):
    cfg, _, _ = trained
    out = tmp_path / "new" / "run"
    err = refused(capsys, "-c", str(cfg), "--output-dir", str(out), "-u", *updates)
    assert expected in err
    assert not (tmp_path / "new").exists()  # no best.pth, and not even the folders it made


def test_every_group_at_lr_zero_and_an_empty_split_are_refused(trained, tmp_path, capsys):
    cfg, _, _ = trained
    frozen = tmp_path / "frozen.yml"
    frozen.write_text(f"__include__: ['{cfg}']\noptimizer: {{params: [{{params: '.*', lr: 0.0}}]}}\n")
    err = refused(capsys, "-c", str(frozen), "--output-dir", str(tmp_path / "a"))
    assert "every optimizer group has lr 0" in err

    coco = json.loads((_tiny_data(trained) / "train" / "annotations.json").read_text())
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({**coco, "images": [], "annotations": []}))
    for split in ("train_dataloader", "val_dataloader"):
        err = refused(
            capsys,
            "-c",
            str(cfg),
            "--output-dir",
            str(tmp_path / "b"),
            "-u",
            f"{split}.dataset.ann_file={empty}",
        )
        assert f"{split}: no images to load ({empty}: 0/0 images" in err


def test_a_finished_run_is_not_run_again(trained, capsys):
    """A restart after the last checkpoint (torchrun --max-restarts, or the command typed again)
    finds the run complete: it says so and exits 0, writing nothing; an explicit -r of it is refused."""
    cfg, out, _ = trained
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert train_main(["--no-progress", "-c", str(cfg)]) == 0  # the config's output_dir: the finished run
    printed = capsys.readouterr()
    assert "has finished all 2 epochs of its run; nothing is left to train" in printed.out + printed.err
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    err = refused(capsys, "-c", str(cfg), "-r", str(out / "last.pth"), "--output-dir", str(out))
    assert "has finished all 2 epochs" in err and "-u epochs=N" in err


def test_command_line_numbers_out_of_range_are_refused(trained, tmp_path, capsys):
    cfg, _, _ = trained
    for flag in ("--accumulate", "--lr-reference-batch", "--max-nonfinite"):
        for value in ("0", "-2"):
            err = refused(capsys, "-c", str(cfg), "--output-dir", str(tmp_path / "x"), flag, value)
            assert f"{flag} {value}: give a whole number >= 1" in err


# ------------------------------------------------------------------------------ the output folder
def test_an_output_dir_that_is_a_file_or_cannot_be_written_is_one_line(trained, tmp_path, capsys):
    cfg, _, _ = trained
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    for target, words in (
        (a_file, "exists and is not a folder"),
        (a_file / "run", "notes.txt is a file, not a folder"),
        ("/sys/dfine-deploy-test/run", "cannot write in /sys"),  # read-only, even for root
    ):
        err = refused(capsys, "-c", str(cfg), "--output-dir", str(target))
        assert f"--output-dir {target}" in err and words in err
    assert a_file.read_text() == "mine"


def _hold(folder):
    """A process on this host that holds `folder`'s lock until it is killed."""
    holder = subprocess.Popen(
        [
            PYTHON,
            "-c",
            "import sys, time\nfrom dfine_deploy.training.runlock import RunLock\n"
            "RunLock(sys.argv[1]).acquire()\nprint('held', flush=True)\ntime.sleep(300)",
            str(folder),
        ],
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_folder_held_by_a_live_run_is_refused_and_a_dead_runs_lock_is_taken_over(trained, tmp_path, capsys):
    cfg, _, _ = trained
    folder = tmp_path / "shared"
    holder = _hold(folder)
    try:
        err = refused(capsys, "-c", str(cfg), "--output-dir", str(folder))
        assert f"in use by another run (pid {holder.pid} on this host" in err
        assert sorted(p.name for p in folder.iterdir()) == [LOCK_NAME]  # nothing of ours written
        with pytest.raises(TrainingError, match=f"pid {holder.pid}"):
            RunLock(folder).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    assert (folder / LOCK_NAME).is_file()  # SIGKILL: no clean-up ran; the kernel dropped the flock
    notes = []
    lock = RunLock(folder)
    lock.acquire(note=notes.append)
    assert len(notes) == 1 and f"pid {holder.pid}" in notes[0] and "no longer running" in notes[0]
    assert json.loads((folder / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (folder / LOCK_NAME).exists() and folder.is_dir()  # it did not make the folder: kept


def test_a_lock_written_on_another_host_is_never_taken_over(tmp_path):
    folder = tmp_path / "nfs"
    folder.mkdir()
    owner = {"host": f"not-{socket.gethostname()}", "pid": 4242, "started": "2025-01-01 00:00:00"}
    (folder / LOCK_NAME).write_text(json.dumps(owner))
    for _ in range(2):
        with pytest.raises(TrainingError, match=rf"host not-.*pid 4242.*remove {folder / LOCK_NAME}"):
            RunLock(folder).acquire()
    assert json.loads((folder / LOCK_NAME).read_text()) == owner


def test_sigterm_ends_the_run_and_clears_the_lock(trained, tmp_path):
    cfg, _, _ = trained
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [PYTHON, str(MAIN), "-c", str(cfg), "--output-dir", str(out), "--no-progress", "-u", "epochs=50"],
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (out / "resolved_config.json").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (out / LOCK_NAME).is_file()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err
    assert not (out / LOCK_NAME).exists()


# ---------------------------------------------------------------------- resuming another run's file
def _other_run(trained, tmp_path, name: str, mutate) -> str:
    _, out, _ = trained
    state = load_training_checkpoint(out / "last.pth")
    mutate(state)
    path = tmp_path / name
    torch.save(state, path)
    return str(path)


def _more_classes(state):
    """The checkpoint as if its run had 5 classes, not 4: every class-count tensor grows a row."""
    for key, value in list(state["model"].items()):
        if "score_head" in key or "denoising_class_embed" in key:
            state["model"][key] = torch.cat([value, value[:1]])


def _another_size(state):
    from dfine_deploy.model.families import build_model
    from dfine_deploy.model.spec import size_spec

    state["model"] = build_model(size_spec("s")).state_dict()


@pytest.mark.parametrize(
    ("mutate", "words"),
    [
        (_more_classes, "dfine-n, 5 classes vs dfine-n, 4 classes in this config"),
        (_another_size, "dfine-s, 80 classes vs dfine-n, 4 classes in this config"),
    ],
)
def test_resuming_a_checkpoint_of_another_run_is_one_line(trained, tmp_path, capsys, mutate, words):
    cfg, _, _ = trained
    other = _other_run(trained, tmp_path, "other.pth", mutate)
    err = refused(capsys, "-c", str(cfg), "-r", other, "--output-dir", str(tmp_path / "new"))
    assert f"{other} is from another run ({words}" in err and f"use -t {other}" in err

    folder = tmp_path / "auto"  # the same file found by auto-resume in the output folder
    folder.mkdir()
    shutil.copyfile(other, folder / "last.pth")
    err = refused(capsys, "-c", str(cfg), "--output-dir", str(folder))
    assert f"this --output-dir ({folder}) holds another run ({words}" in err
    assert "give another --output-dir" in err


def test_resuming_at_another_input_size_is_one_line(trained, tmp_path, capsys):
    cfg, out, _ = trained
    err = refused(
        capsys,
        "-c",
        str(cfg),
        "-r",
        str(out / "last.pth"),
        "--output-dir",
        str(tmp_path / "n"),
        "-u",
        "eval_spatial_size=[160,160]",
    )
    assert "is from another run" in err and "'decoder.anchors' has shape" in err


def test_resuming_with_other_optimizer_groups_is_one_line(trained, tmp_path, capsys):
    cfg, out, _ = trained
    err = refused(
        capsys,
        *("-c", str(cfg), "-r", str(out / "last.pth"), "--output-dir", str(tmp_path / "g")),
        *("-u", "optimizer.params=[{params: '.*', lr: 0.0001}]"),
    )
    assert "its optimizer state does not fit this config's optimizer groups" in err


# --------------------------------------------------------------------------------- a full disk
def _file_size_limit(limit: int):
    def apply():  # in the child: writes past `limit` bytes fail with EFBIG, as on a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_checkpoint_that_cannot_be_written_keeps_the_last_one(trained, tmp_path):
    cfg, out, _ = trained
    folder = tmp_path / "full"
    shutil.copytree(out, folder)
    before = (folder / "last.pth").read_bytes()
    proc = subprocess.run(
        [PYTHON, str(MAIN), "-c", str(cfg), "--output-dir", str(folder), "--no-progress", "-u", "epochs=3"],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=240,
        preexec_fn=_file_size_limit(4 << 20),  # far below one checkpoint of D-FINE-N with its optimizer
    )
    err = proc.stderr.strip()
    assert proc.returncode == 2 and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert f"could not write {folder / 'last.pth'} after epoch 2 (File too large)" in err
    assert f"{folder / 'last.pth'} keeps the state saved before epoch 2" in err
    assert (folder / "last.pth").read_bytes() == before
    assert load_training_checkpoint(folder / "last.pth")["last_epoch"] == 1
    assert not [p.name for p in folder.iterdir() if p.name.endswith("tmp") or p.name == LOCK_NAME]


def test_the_dataset_file_included_after_the_dataloader_file_is_refused_in_one_line(tmp_path, capsys):
    """The edited dataset file listed after the model and dataloader files in `__include__`: its
    `transforms: {ops: ~}` replaces the dataloader file's ops, and the run used to end in a 72-line
    traceback (expected scalar type Byte but found Float) in its first step."""
    from trainer_helpers import make_dataset

    data = make_dataset(tmp_path / "data", images=4, val_images=2)
    shipped = (REPO / "configs" / "dfine" / "custom" / "dfine_hgnetv2_n_custom.yml").read_text()
    dataset_line = "  '../../dataset/custom_detection.yml',\n"
    assert dataset_line in shipped
    reordered = shipped.replace(dataset_line, "").replace(
        "  '../include/dfine_hgnetv2.yml',\n", "  '../include/dfine_hgnetv2.yml',\n" + dataset_line
    )
    dataset = str(REPO / "configs" / "dataset" / "custom_detection.yml")
    config = tmp_path / "reordered.yml"
    config.write_text(
        reordered.replace("'../../", f"'{REPO}/configs/").replace("'../", f"'{REPO}/configs/dfine/")
    )
    err = refused(
        capsys,
        "-c",
        str(config),
        "--output-dir",
        str(tmp_path / "out"),
        "-u",
        "num_classes=4",
        f"train_dataloader.dataset.img_folder={data / 'train'}",
        f"train_dataloader.dataset.ann_file={data / 'train' / 'annotations.json'}",
        f"val_dataloader.dataset.img_folder={data / 'val'}",
        f"val_dataloader.dataset.ann_file={data / 'val' / 'annotations.json'}",
    )
    assert f"train_dataloader.dataset.transforms.ops is empty (from {dataset})" in err
    assert "in __include__ list the dataset file before the dataloader file" in err


class _Owned:
    """Something a weakref can watch."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_sigterm_whose_exit_python_dropped_still_ends_the_run():
    """SIGTERM's handler can run inside a weakref callback (importlib's module-lock cleanup in a real
    run), where Python prints "Exception ignored" and drops its SystemExit: the run then went on to
    its last epoch and ended with status 0. The loops' next step raises it again."""
    with exit_on_sigterm():
        owned = _Owned()
        watch = weakref.ref(owned, lambda _: runlock._raise_exit(signal.SIGTERM, None))
        del owned  # the callback's SystemExit is dropped here
        assert watch() is None
        with pytest.raises(SystemExit) as ended:
            exit_if_terminated()
        assert ended.value.code == 128 + signal.SIGTERM
    exit_if_terminated()  # a later run in this process starts without it
