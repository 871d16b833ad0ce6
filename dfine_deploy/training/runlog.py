"""Everything a training run reports, in one object: console lines, log.jsonl, TensorBoard, curves.png.

Only rank 0 writes; the other ranks get a `RunLog` whose methods do nothing, so the loop never asks
which rank it is on before reporting.
"""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path
from typing import Any, TypedDict

from dfine_deploy.files import atomic_write_bytes
from dfine_deploy.ownership import Claim
from dfine_deploy.training.checkpoint import LAST_NAME
from dfine_deploy.training.runlock import LOCK_NAME

RESOLVED_CONFIG_NAME = "resolved_config.json"  # written first by every run: the folder's marker
EVAL_NAME = "eval.json"  # what --test-only writes there


def _written_by_a_run(path: Path) -> bool:
    if path.name == LAST_NAME:  # a checkpoint to auto-resume (torch.save's zip; its loader checks the rest)
        if not zipfile.is_zipfile(path):
            return False
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("/data.pkl") for name in archive.namelist())
    data = json.loads(path.read_text(encoding="utf-8"))
    keys = {
        RESOLVED_CONFIG_NAME: {"effective", "config"},
        LOCK_NAME: {"host", "pid"},  # a run's lock (a live run's is refused by the lock itself)
    }.get(path.name, {"AP", "data"})
    return isinstance(data, dict) and keys <= data.keys()


# A run adds its own files to its output folder (checkpoints, logs, curves) and touches nothing else
# there, so the folder must be new, empty, or one of a run, an evaluation or a last.pth to resume;
# whatever else it holds stays as it is.
TRAINING_RUN = Claim(
    command="the trainer",
    kind="an output folder",
    markers=(RESOLVED_CONFIG_NAME, EVAL_NAME, LAST_NAME, LOCK_NAME),
    recognise=_written_by_a_run,
)


class EpochRecord(TypedDict, total=False):
    """One line of log.jsonl (and of the checkpoint's `history`): the loss terms under their official
    names (`loss_vfl`, `loss_bbox_aux_0`, ...) are averaged over the epoch's optimizer steps besides
    these keys, and the validation metrics appear as `val_AP`, `val_AP50`, ..."""

    epoch: int
    step: int  # optimizer steps taken when the epoch ended
    time: float  # unix time when the epoch ended
    train_loss: float
    lr: float
    step_losses: list[float]  # one per optimizer step
    skipped_steps: int
    epoch_seconds: float
    images_per_second: float
    resources: dict[str, Any]
    data: dict[str, Any]  # what loading fixed and skipped, per split (first record only)
    alarm: dict[str, Any]  # validation AP near 0 after a share of the run (diagnosis.alarm_record), once


class RunLog:
    """Console lines, the progress bar every step, a loss line every `print_freq` steps, one record per
    epoch (log.jsonl, TensorBoard scalars, console), and curves.png at the end."""

    def __init__(self, *, active: bool, output_dir: Path, print_freq: int, progress: bool):
        self.active = active
        self.output_dir = output_dir
        self.print_freq = max(int(print_freq), 0)
        self.progress = progress and active
        self.writer: Any = None
        self._bar: Any = None

    def log(self, message: str) -> None:
        if self.active:
            print(message, flush=True)

    # -- the start --------------------------------------------------------------------------------
    def start(self, described: dict[str, Any], group_lines: list[str], config: dict[str, Any]) -> None:
        """Print the effective settings; write resolved_config.json; open TensorBoard."""
        if not self.active:
            return
        self.log("effective settings:")
        for key, value in described.items():
            if key != "model":
                self.log(f"  {key}: {value}")
        self.log(
            "optimizer groups (first matching pattern wins; look-ahead alternations read as "
            "'any of', fixing the official precedence slip):"
        )
        for line in group_lines:
            self.log(line)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        stale = sorted(self.output_dir.glob(".*.pth.*tmp"))  # ours, left by a process killed mid-write
        for path in stale:
            path.unlink()
        if stale:
            names = ", ".join(p.name for p in stale)
            self.log(f"removed {len(stale)} partial checkpoint file(s) a killed run left: {names}")
        payload = {"effective": described, "config": config}
        text = json.dumps(payload, indent=2, default=str)
        atomic_write_bytes(self.output_dir / RESOLVED_CONFIG_NAME, text.encode())  # whole, or not at all

    def open_tensorboard(self, summary_dir: str) -> None:
        if not self.active:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            self.log("note: tensorboard is not installed; scalars go to log.jsonl only")
            return
        self.writer = SummaryWriter(summary_dir)

    def rewrite_history(self, history: list[EpochRecord]) -> bool:
        """After a resume, log.jsonl says exactly what the resumed state has seen. Returns whether
        the file had to change (False: it already said so, and is left untouched)."""
        if not self.active:
            return False
        path = self.output_dir / "log.jsonl"
        lines = "".join(json.dumps(r, default=float) + "\n" for r in history).encode()
        if path.is_file() and path.read_bytes() == lines:
            return False
        self.output_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, lines)
        return True

    # -- every step -------------------------------------------------------------------------------
    def start_epoch(self, epoch: int, epochs: int, steps: int) -> None:
        if self.progress:
            from tqdm import tqdm

            self._bar = tqdm(
                total=steps,
                desc=f"epoch {epoch}/{epochs - 1}",
                unit="step",
                file=sys.stdout,
                dynamic_ncols=True,
                mininterval=1.0,
            )

    def step(
        self, epoch: int, index: int, steps: int, loss: float, lr: float, images_per_second: float
    ) -> None:
        """After optimizer step `index` (0-based) of the epoch's `steps`."""
        if not self.active:
            return
        if self._bar is not None:
            self._bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", img_s=f"{images_per_second:.1f}")
            self._bar.update(1)
        elif self.print_freq and (index % self.print_freq == 0 or index == steps - 1):
            self.log(
                f"epoch {epoch} step {index + 1}/{steps}: loss {loss:.4f}, lr {lr:.2e}, "
                f"{images_per_second:.1f} img/s"
            )

    def end_epoch(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    # -- every epoch ------------------------------------------------------------------------------
    def epoch(self, record: EpochRecord) -> None:
        if not self.active:
            return
        with open(self.output_dir / "log.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, default=float) + "\n")
        res = record.get("resources", {})
        self.log(
            f"epoch {record['epoch']}: loss {record['train_loss']:.4f}, lr {record['lr']:.2e}, "
            f"{record['images_per_second']} img/s, "
            + (
                f"AP {record['val_AP']:.4f}, AP50 {record['val_AP50']:.4f}; "
                if "val_AP50" in record
                else "not validated (eval_freq); "
            )
            + f"data {res.get('data_time_share', 0):.0%} "
            f"of step time, peak memory {res.get('peak_memory_mb')} MB ({res.get('memory_kind')})"
            + (
                f", all-reduce {res['allreduce_ms_per_step']} ms/step"
                if "allreduce_ms_per_step" in res
                else ""
            )
            + (f", GPU {res['gpu_util_percent']} %" if res.get("gpu_util_percent") is not None else "")
        )
        if self.writer is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("epoch", "step"):
                    self.writer.add_scalar(key, value, record["epoch"])
            for key, value in res.items():
                if isinstance(value, (int, float)):
                    self.writer.add_scalar(f"resources/{key}", value, record["epoch"])
            self.writer.flush()

    def alarm(self, text: str) -> None:
        """A warning that matters more than a loss line: printed, and a TensorBoard text entry."""
        if not self.active:
            return
        self.log(text)
        if self.writer is not None:
            self.writer.add_text("alarm", text.replace("\n", "  \n"))

    def close(self, history: list[EpochRecord]) -> None:
        """Close TensorBoard and draw curves.png (loss and validation mAP per epoch)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if not (self.active and history):
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        epochs = [r["epoch"] for r in history]
        fig, (ax_loss, ax_ap) = plt.subplots(1, 2, figsize=(10, 4))
        ax_loss.plot(epochs, [r["train_loss"] for r in history], marker="o")
        ax_loss.set(title="training loss", xlabel="epoch", ylabel="loss")
        for key in ("val_AP", "val_AP50"):
            scored = [(r["epoch"], r[key]) for r in history if key in r]  # `eval_freq` may skip epochs
            if scored:
                ax_ap.plot(*zip(*scored), marker="o", label=key[4:])
        ax_ap.set(title="validation mAP (EMA model)", xlabel="epoch", ylabel="mAP")
        ax_ap.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(self.output_dir / "curves.png", dpi=100)
        plt.close(fig)
