r"""Train D-FINE: the torchrun entry point (official-compatible flags).

    # one process, no process group
    python train/main.py -c configs/quickstart/dfine_n_synthetic.yml
    # N processes on one machine (NCCL on GPUs, gloo on CPU)
    torchrun --nproc_per_node=2 train/main.py -c configs/quickstart/dfine_n_synthetic.yml --seed 0
    # two machines
    torchrun --nnodes=2 --node_rank=0 --master_addr=HOST0 --master_port=29500 --nproc_per_node=8 \
        train/main.py -c CFG
    torchrun --nnodes=2 --node_rank=1 --master_addr=HOST0 --master_port=29500 --nproc_per_node=8 \
        train/main.py -c CFG
    # survive crashes: torchrun restarts the workers, which resume from <output-dir>/last.pth
    torchrun --max-restarts=3 --nproc_per_node=4 train/main.py -c CFG --output-dir runs/n
    # a global batch of 32 on one small GPU: 4 micro-batches of 8 per optimizer step
    python train/main.py -c CFG --accumulate 4
    # fine-tune from Objects365 weights; evaluate only
    torchrun --nproc_per_node=4 train/main.py -c CFG --use-amp -t dfine_n_obj365.pth
    python train/main.py -c CFG --test-only -r runs/n/best.pth

`main` -> `dfine_deploy.training.trainer.run` (builds everything, then per epoch) ->
`train_one_epoch` / `evaluate` (in `dfine_deploy.training.steps`).
"""

import argparse

from dfine_deploy.cli import configure_logging, friendly_errors
from dfine_deploy.training.cli import check_command_line, get_args_parser, options_from_args
from dfine_deploy.training.trainer import run


def main(args: argparse.Namespace) -> None:
    """Join the job (if torchrun started one), load the config, train or evaluate, leave the job."""
    run(options_from_args(args))


@friendly_errors
def cli(argv: list[str] | None = None) -> int:
    """Parse the flags and run `main`; errors become one line and exit status 2."""
    parser = get_args_parser()
    args = parser.parse_args(argv)
    check_command_line(parser, argv, args)
    configure_logging("WARNING")  # the trainer prints its own progress; the log adds its warnings
    main(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(cli())
