"""The trainer as users launch it: torchrun with 2 processes, 2 "nodes" on 127.0.0.1, SIGKILL + resume.

Every launch is a real subprocess (`python train/main.py` or `python -m torch.distributed.run`), on
D-FINE-N at 128 x 128 with a few generated images. Multi-process launches get a timeout, and are
launched again only when the rendezvous port was taken meanwhile (reported as a warning).
"""

from __future__ import annotations

import random
import signal
import subprocess
import time

import pytest
import torch
from trainer_helpers import (
    MAIN,
    PYTHON,
    REPO,
    child_env,
    free_port,
    load_weights,
    make_dataset,
    read_log,
    retry_if_port_taken,
    torchrun,
    write_config,
)

from dfine_deploy.training.checkpoint import load_training_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# Two ranks with 2 images each against one process with 4 images: the same samples per global
# step (DistributedSampler interleaves one shuffled order), the criterion normalises by the box
# count averaged over ranks, and DDP averages gradients, so the losses agree up to float
# reduction order. Two things would make them differ for real, and the test turns them off:
# BatchNorm batch statistics over 2 vs 4 images (--freeze-bn: running statistics), and denoising
# queries, whose group count follows each rank's largest object count and whose noise is drawn
# per rank (num_denoising 0).
LOSS_RTOL = 1e-5  # measured: 2e-7 relative over 3 steps


def _single(cfg, out, *extra, timeout=240):
    return subprocess.run(
        [PYTHON, str(MAIN), "-c", str(cfg), "--output-dir", str(out), "--no-progress", *extra],
        cwd=REPO,
        env=child_env(threads=2),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _ok(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_two_processes_match_one_process_and_write_outputs(tmp_path):
    data = make_dataset(tmp_path / "data", images=12, val_images=2)
    cfg = write_config(tmp_path, data, epochs=1, batch=4)
    one, two = tmp_path / "one", tmp_path / "two"
    _ok(_single(cfg, one, "--freeze-bn"))
    proc = torchrun(
        ["-c", str(cfg), "--output-dir", str(two), "--no-progress", "--freeze-bn"],
        nproc=2,
        timeout=240,
        fresh=two,
    )
    _ok(proc)
    assert "backend: gloo" in proc.stdout and "world_size: 2" in proc.stdout
    assert "threads_per_rank: 1" in proc.stdout  # 2 cores shared by 2 local ranks
    assert "sync_bn: False" in proc.stdout  # SyncBatchNorm only on CUDA

    single, double = read_log(one)[0], read_log(two)[0]
    assert len(single["step_losses"]) == len(double["step_losses"]) == 3
    assert double["step_losses"] == pytest.approx(single["step_losses"], rel=LOSS_RTOL)
    assert "allreduce_ms_per_step" in double["resources"]
    assert "val_AP" in double
    for name in ("last.pth", "best.pth", "checkpoint0000.pth", "curves.png"):
        assert (two / name).is_file()
    assert load_training_checkpoint(two / "last.pth")["step"] == 3


def test_two_nodes_on_loopback_train_together(tmp_path):
    data = make_dataset(tmp_path / "data", images=4, val_images=1)
    cfg = write_config(tmp_path, data, epochs=1, batch=2)
    out = tmp_path / "out"

    def launch_both_nodes():
        port = free_port()
        launches = [
            subprocess.Popen(
                [
                    PYTHON,
                    "-m",
                    "torch.distributed.run",
                    "--nnodes=2",
                    f"--node_rank={node}",
                    "--nproc_per_node=1",
                    "--master_addr=127.0.0.1",
                    f"--master_port={port}",
                    str(MAIN),
                    "-c",
                    str(cfg),
                    "--output-dir",
                    str(out),
                    "--no-progress",
                ],
                cwd=REPO,
                env=child_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for node in (0, 1)
        ]
        outputs = [p.communicate(timeout=240)[0] for p in launches]
        code = 0 if all(p.returncode == 0 for p in launches) else 1
        return subprocess.CompletedProcess([], code, outputs[0] + outputs[1], "")

    proc = retry_if_port_taken(launch_both_nodes)
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert "world_size: 2" in proc.stdout
    log = read_log(out)
    assert len(log[0]["step_losses"]) == 2  # 4 images, global batch 2 = 2 ranks x 1 image
    ckpt = load_training_checkpoint(out / "last.pth")
    assert ckpt["step"] == 2 and torch.isfinite(next(iter(ckpt["model"].values()))).all()


# Same threads, same device, same seed: a resumed run replays the remaining epochs bit for bit
# (per-epoch RNG reseeding + the sampler's seed/epoch order); the tolerance only absorbs
# nothing-but-rounding differences should a kernel pick another reduction order.
RESUME_ATOL = 1e-6


def _epochs_on_disk(out) -> int:
    try:
        return load_training_checkpoint(out / "last.pth")["last_epoch"] + 1
    except Exception:  # absent (or, were atomicity broken, half written: the asserts below catch that)
        return 0


@pytest.mark.timeout(900)
def test_sigkill_three_times_then_resume_matches_uninterrupted(tmp_path):
    """Each attempt is killed at a random moment in the epoch after the first one it finished
    (so every kill lands after real progress, at any point of train / evaluate / save)."""
    data = make_dataset(tmp_path / "data", images=2, val_images=1)
    # 6 epochs of 1 step; denoising and flips on, so resuming must restore the RNG streams too. Six, not
    # four: each kill waits a share of the straight run's epoch, which one CI run measured while the
    # other worker loaded the machine, and a faster attempt then finished its last epochs unkilled.
    cfg = write_config(tmp_path, data, epochs=6, batch=2, denoising=8, flip=True)

    _ok(_single(cfg, tmp_path / "straight"))
    reference = load_weights(tmp_path / "straight" / "last.pth")
    stamps = [r["time"] for r in read_log(tmp_path / "straight")]
    epoch_wall = min(b - a for a, b in zip(stamps, stamps[1:]))  # train + evaluate + save

    out = tmp_path / "killed"
    chooser = random.Random(1234)
    kills = 0
    for _ in range(3):
        before = _epochs_on_disk(out)
        proc = subprocess.Popen(
            [PYTHON, str(MAIN), "-c", str(cfg), "--output-dir", str(out), "--no-progress"],
            cwd=REPO,
            env=child_env(threads=2),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        while proc.poll() is None and _epochs_on_disk(out) <= before:
            time.sleep(0.2)
        time.sleep(chooser.uniform(0.0, 0.6) * epoch_wall)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait(timeout=60)
        for ckpt in out.glob("*.pth"):  # never a half-written checkpoint
            load_training_checkpoint(ckpt)
    assert kills >= 2
    proc = _single(cfg, out)
    _ok(proc)
    assert "auto-resume: found" in proc.stdout
    resumed = load_weights(out / "last.pth")
    assert resumed.keys() == reference.keys()
    worst = max((resumed[k].float() - reference[k].float()).abs().max().item() for k in reference)
    assert worst <= RESUME_ATOL
    assert [r["epoch"] for r in read_log(out)] == list(range(6))  # rewritten from the checkpoint


class _Done:
    def __init__(self, returncode, stdout="", stderr=""):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def test_launches_are_retried_only_when_the_port_was_taken():
    """A launch bug that fails now and then must fail the test, not pass on the second try."""
    calls = []

    def flaky_launch_bug():
        calls.append(1)
        return _Done(1, stderr="RuntimeError: some launch bug" if len(calls) == 1 else "")

    assert retry_if_port_taken(flaky_launch_bug).returncode == 1 and len(calls) == 1

    calls.clear()

    def port_race():
        calls.append(1)
        if len(calls) == 1:
            return _Done(
                1,
                stderr="The server socket has failed to bind ... (errno: 98 - Address already in use)."
                " code: -98, name: EADDRINUSE",
            )
        return _Done(0)

    with pytest.warns(UserWarning, match="port already in use"):
        assert retry_if_port_taken(port_race).returncode == 0
    assert len(calls) == 2


def test_a_finished_run_killed_before_its_last_log_line_gets_the_line_back(tmp_path):
    """A kill after the last checkpoint was saved and before its epoch was logged: the same command
    again trains nothing, and log.jsonl is brought back to the checkpoint's records, said in a line
    (it stayed an epoch short before)."""
    data = make_dataset(tmp_path / "data", images=2, val_images=1)
    cfg = write_config(tmp_path, data, epochs=2, batch=2)
    out = tmp_path / "run"
    _ok(_single(cfg, out))
    logged = (out / "log.jsonl").read_text().splitlines()
    assert len(logged) == 2
    (out / "log.jsonl").write_text(logged[0] + "\n")  # as the kill left it
    again = _single(cfg, out)
    _ok(again)
    assert "has finished all 2 epochs" in again.stdout and "written again from it" in again.stdout
    assert (out / "log.jsonl").read_text().splitlines() == logged
    third = _single(cfg, out)  # nothing to repair: nothing said, nothing written
    _ok(third)
    assert "written again" not in third.stdout
