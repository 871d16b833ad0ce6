"""`dfine-train` and `train/main.py`: official-compatible flags -> `dfine_deploy.training.trainer.run`.

Examples:
    # one process (CPU or one GPU); no process group is created
    python train/main.py -c configs/quickstart/dfine_n_synthetic.yml
    # two processes on this machine (gloo on CPU, NCCL on GPUs)
    torchrun --nproc_per_node=2 train/main.py -c configs/dfine/dfine_hgnetv2_n_coco.yml --use-amp --seed 0
    # two nodes
    torchrun --nnodes=2 --node_rank=0 --master_addr=10.0.0.1 --master_port=29500 --nproc_per_node=8 \\
        train/main.py -c CFG
    # evaluate a checkpoint; fine-tune from Objects365 weights; resume
    python train/main.py -c CFG --test-only -r best.pth
    torchrun --nproc_per_node=4 train/main.py -c CFG -t dfine_s_obj365.pth
    torchrun --max-restarts=3 --nproc_per_node=4 train/main.py -c CFG --output-dir out  # auto-resumes
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from dfine_deploy.cli import (
    ArgumentParser,
    check_option_owners,
    configure_logging,
    friendly_errors,
    given_options,
    model_argument,
    path_text,
)
from dfine_deploy.config.tree import add_overrides_option
from dfine_deploy.errors import TrainingError, require
from dfine_deploy.training.settings import SHARE_OF_RUN, SMOKE_STEPS, RunSettings


def get_args_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        description="Train or evaluate D-FINE (one process, or many under torchrun).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("Examples:", 1)[1],
    )
    p.add_argument("-c", "--config", required=True, type=path_text, help="YAML config (official layout)")
    p.add_argument(
        "-r", "--resume", type=path_text, help="full training checkpoint to continue from (last.pth)"
    )
    p.add_argument(
        "-t",
        "--tuning",
        type=model_argument,
        help="checkpoint (or official weights name: dfine-s-obj365) whose weights start a new run; "
        "each class of the dataset whose name matches "
        "a class of the checkpoint starts from its class-head rows (the table is printed)",
    )
    p.add_argument(
        "--head-map",
        type=path_text,
        metavar="FILE",
        help="-t: YAML or JSON {dataset class: checkpoint class, or null to start it fresh} that "
        "overrides the matching by name",
    )
    p.add_argument(
        "--class-map",
        type=path_text,
        metavar="FILE",
        help="YAML or JSON {val category name: class name of the model} for a val set that names its "
        "classes otherwise (training and --test-only match the categories to the model's classes by name)",
    )
    p.add_argument(
        "-d",
        "--device",
        help="cpu | cuda | cuda:N (default: cuda when available); "
        "under torchrun each rank uses cuda:LOCAL_RANK",
    )
    p.add_argument("--seed", type=int, help="base seed (rank r uses seed + r)")
    amp = p.add_mutually_exclusive_group()
    amp.add_argument(
        "--use-amp",
        dest="use_amp",
        action="store_true",
        default=None,
        help="mixed precision (fp16 + GradScaler on CUDA, bf16 on CPU); default: the config's use_amp",
    )
    amp.add_argument(
        "--no-amp", dest="use_amp", action="store_false", help="full precision whatever the config says"
    )
    add_overrides_option(p, "config overrides, e.g. -u epochs=10 train_dataloader.total_batch_size=8")
    p.add_argument("--test-only", action="store_true", help="evaluate the (EMA) weights of -r/-t and exit")
    p.add_argument(
        "--output-dir",
        type=path_text,
        help="where checkpoints and logs go (default: the config's output_dir): a new or empty folder "
        "or one of our runs; a last.pth there is resumed automatically",
    )
    p.add_argument("--summary-dir", type=path_text, help="TensorBoard folder (default <output-dir>/summary)")
    p.add_argument(
        "--auto-batch",
        action="store_true",
        help="largest per-GPU batch that fits in memory (does nothing on CPU); when it is "
        "below total_batch_size / processes, micro-batches are accumulated to keep the batch",
    )
    p.add_argument(
        "--accumulate",
        type=int,
        metavar="N",
        help="micro-batches per optimizer step (gradient accumulation): each rank loads "
        "total_batch_size / (processes x N) images at a time; default: the config's accumulate",
    )
    p.add_argument(
        "--freeze-bn",
        action="store_true",
        help="BatchNorm uses running statistics: for tiny per-rank batches",
    )
    p.add_argument(
        "--lr-reference-batch",
        type=int,
        metavar="B",
        help="scale every lr linearly by global_batch / B (the batch the lr was tuned for)",
    )
    p.add_argument(
        "--max-nonfinite",
        type=int,
        default=5,
        help="stop after this many non-finite losses in a row (default 5)",
    )
    p.add_argument(
        "--no-obj365-remap",
        dest="obj365_remap",
        action="store_false",
        help="-t: do not match COCO and Objects365 names through the official obj365_ids table",
    )
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    smoke = p.add_mutually_exclusive_group()
    smoke.add_argument(
        "--smoke",
        dest="smoke",
        action="store_const",
        const="only",
        default="auto",
        help="only the smoke test: overfit a few training images for a few dozen steps, check that the "
        "loss falls and the boxes move onto the targets, name the likely causes when not, exit "
        f"(by default it runs before every run of {SHARE_OF_RUN * SMOKE_STEPS}+ optimizer steps)",
    )
    smoke.add_argument(
        "--no-smoke", dest="smoke", action="store_const", const="off", help="no smoke test before the run"
    )
    p.add_argument(
        "--no-sizing",
        dest="sizing",
        action="store_false",
        help="use the recipe's schedule as written, whatever the dataset's size (by default the epochs, "
        "warm-up, augmentation stop, backbone lr and EMA warm-up the official configs set are sized "
        "to a small dataset; values you set are always kept)",
    )
    p.add_argument(
        "--ap-alarm-after",
        dest="alarm_after",
        type=float,
        default=0.25,
        metavar="SHARE",
        help="warn once, with the likely causes, when validation AP50 is still about 0 after this share "
        "of the epochs (default 0.25; 0: never)",
    )
    return p


# an option ignored without the option it belongs to (dfine_deploy.cli.check_option_owners)
OPTION_OWNERS = {"--no-obj365-remap": ("--tuning",)}
# what shapes training, which --test-only never starts
TRAINING_ONLY = (
    "--auto-batch",
    "--accumulate",
    "--freeze-bn",
    "--lr-reference-batch",
    "--max-nonfinite",
    "--smoke",
    "--no-smoke",
    "--no-sizing",
    "--ap-alarm-after",
    "--summary-dir",
)


def check_command_line(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, args: argparse.Namespace
) -> None:
    """Refuse an option that this command line would ignore: one without the option it belongs to,
    a training option beside --test-only."""
    check_option_owners(parser, argv, OPTION_OWNERS, TrainingError)
    if args.test_only:
        given = given_options(parser, argv, TRAINING_ONLY)
        if given:
            them = "it" if len(given) == 1 else "them"
            raise TrainingError(
                f"--test-only evaluates and trains nothing, so {' and '.join(given)} would be ignored: "
                f"leave {them} out"
            )


def options_from_args(args: argparse.Namespace) -> RunSettings:
    return RunSettings(
        config=args.config,
        resume=args.resume,
        tuning=args.tuning,
        head_map=args.head_map,
        class_map=args.class_map,
        use_amp=args.use_amp,
        seed=args.seed,
        updates=list(args.update),
        test_only=args.test_only,
        output_dir=args.output_dir,
        summary_dir=args.summary_dir,
        auto_batch=args.auto_batch,
        accumulate=args.accumulate,
        device=args.device,
        freeze_bn=args.freeze_bn,
        lr_reference_batch=args.lr_reference_batch,
        max_nonfinite=args.max_nonfinite,
        obj365_remap=args.obj365_remap,
        progress=args.progress,
        smoke=args.smoke,
        alarm_after=args.alarm_after,
        sizing=args.sizing,
    )


@friendly_errors
def main(argv: Sequence[str] | None = None) -> int:
    """`dfine-train`: the single-process convenience (use torchrun + train/main.py for many)."""
    parser = get_args_parser()
    args = parser.parse_args(argv)
    check_command_line(parser, argv, args)
    options = options_from_args(args)
    configure_logging("WARNING")  # the trainer prints its own progress; the log adds its warnings
    require("torch", "train", "dfine-train")  # `--help` works without it; training does not
    from dfine_deploy.training.trainer import run

    run(options)
    return 0
