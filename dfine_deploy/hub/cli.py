"""dfine-info: parameters and GFLOPs of a model, or the merged config of a YAML file.

dfine-info dfine-n                       # size name: official architecture
dfine-info --list-weights                # official weights by name: source URL, cached file, its sha256
dfine-info runs/exp/best.pth --imgsz 480 640 --json
dfine-info -c configs/dfine/dfine_hgnetv2_s_coco.yml --print-config -u epochs=12
dfine-info configs/dfine/dfine_hgnetv2_s_coco.yml -u HybridEncoder.expansion=1.0   # a variant's cost
"""

from __future__ import annotations

import argparse
import json
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dfine_deploy.cli import (
    MODEL_HELP,
    ArgumentParser,
    add_input_size,
    check_reads,
    friendly_errors,
    model_argument,
    option_dest,
    path_text,
)
from dfine_deploy.config.tree import add_overrides_option
from dfine_deploy.errors import ConfigError
from dfine_deploy.model.reference import classify_model_ref, model_ref_forms

if TYPE_CHECKING:
    from torch import nn

    from dfine_deploy.hub.loader import LoadedModel

__all__ = ["count_gflops", "count_params", "main"]


def count_params(model: nn.Module) -> int:
    """Parameters of the training-form model (shared tensors once), as the official table counts."""
    return sum(p.numel() for p in model.parameters())


# Matrix products without weights (attention scores and their weighted sums); the official
# figures (calflops) do not count them, and neither do we.
_PARAMETER_FREE_OPS = ("bmm", "baddbmm", "scaled_dot_product")


def count_gflops(loaded: LoadedModel, imgsz: tuple[int, int]) -> float:
    """2 x MACs of the convolutions and linear layers for one image through the deploy model.

    Counted by torch's FlopCounterMode (2 FLOPs per multiply-accumulate) on fake tensors, so no
    arithmetic runs and the figure does not depend on the machine. Gradient mode is on so that
    nn.MultiheadAttention takes its plain path: projections show as mm/addmm, attention products
    as bmm, which are left out as the official table does.
    """
    import copy

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    from dfine_deploy.model.dfine import DeployModel

    deploy = DeployModel(copy.deepcopy(loaded.model).cpu(), copy.deepcopy(loaded.postprocessor)).eval()
    height, width = imgsz
    with FakeTensorMode(allow_non_fake_inputs=True):
        images = torch.rand(1, 3, height, width)
        sizes = torch.tensor([[width, height]])
        with torch.enable_grad(), FlopCounterMode(display=False) as counter:
            deploy(images, sizes)
    per_op = counter.get_flop_counts()["Global"]
    total = sum(n for op, n in per_op.items() if not any(f in str(op) for f in _PARAMETER_FREE_OPS))
    return total / 1e9


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="dfine-info",
        description="Parameters and GFLOPs of a D-FINE model, or a merged config.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("model", nargs="?", type=model_argument, help=f"the model: {MODEL_HELP}")
    add_input_size(parser, None, "input size: S or H W pixels, multiples of 32; default: the model's own")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "-c", "--config", type=path_text, help="a YAML config (for --print-config, or as the model)"
    )
    add_overrides_option(
        parser,
        "config overrides, e.g. -u epochs=12 DFINETransformer.num_layers=4; with a "
        "config as the model, the counts are those of the modified config",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the merged config with the file each value came from",
    )
    parser.add_argument(
        "--allow-pickle",
        action="store_true",
        help="load checkpoints that need full unpickling (only for trusted files)",
    )
    parser.add_argument(
        "--list-weights",
        action="store_true",
        help="list the official weights names with their source URLs, cached files and recorded sha256",
    )
    return parser


def list_weights(as_json: bool) -> None:
    """The official weights table (model/zoo.py) with the cache's state of each file."""
    from dfine_deploy.hub.download import recorded_sha256
    from dfine_deploy.model.zoo import OFFICIAL_WEIGHTS, weights_home

    rows = []
    for entry in OFFICIAL_WEIGHTS.values():
        path = weights_home() / entry.file
        cached = path.is_file()
        rows.append(
            {
                "name": entry.name,
                "trained_on": entry.dataset,
                "ap": entry.ap,
                "classes": entry.num_classes,
                "url": entry.url,
                "cached": str(path) if cached else None,
                "sha256": entry.sha256 or (recorded_sha256(path) if cached else None),
            }
        )
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    print(f"cache: {weights_home()} (licences: docs/models.md, 'Official weights by name')")
    for row in rows:
        state = f"cached, sha256 {row['sha256']}" if row["cached"] else "not downloaded"
        print(f"{row['name']:<20} {row['trained_on']:<24} AP {row['ap']:<5} {row['url']}  [{state}]")


# The options each of dfine-info's other tasks reads (the model too where "MODEL" is named); any other
# option given beside it would be ignored.
MODE_OPTIONS = {
    "--list-weights": ("--json",),
    "--print-config": ("MODEL", "--config", "--update"),
}


@friendly_errors
def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.model is not None and args.config is not None:
        parser.error(
            f"give the model once: {args.model!r} or -c {args.config!r}, not both "
            "(-c names a config, which can be the model itself)"
        )
    for mode, takes in MODE_OPTIONS.items():
        if getattr(args, option_dest(mode)):
            model = [f"a model ('{args.model}')"] if args.model is not None and "MODEL" not in takes else []
            check_reads(parser, argv, mode, takes, ConfigError, also=model)
    if args.list_weights:
        list_weights(args.json)
        return 0
    if args.print_config:
        from dfine_deploy.config import format_config, load_config

        source = args.config or args.model
        if source is None:
            raise ConfigError("--print-config needs a config file: dfine-info -c CONFIG --print-config")
        ref = classify_model_ref(source)
        if ref.kind != "config":
            raise ConfigError(
                f"--print-config prints a config file, and '{source}' is {model_ref_forms((ref.kind,))}: "
                "give the .yml it comes from (e.g. -c configs/dfine/dfine_hgnetv2_n_coco.yml)"
            )
        print(format_config(load_config(source, args.update)))
        return 0
    ref = args.model or args.config
    if ref is None:
        parser.error(f"give a model: {MODEL_HELP}, or -c CONFIG --print-config")
    from dfine_deploy.hub.loader import load_model

    with warnings.catch_warnings():
        # Random weights do not change the counts; say it once in the text output instead.
        warnings.simplefilter("ignore", UserWarning)
        loaded = load_model(
            ref,
            imgsz=args.imgsz,
            allow_pickle=args.allow_pickle,
            overrides=args.update,
        )
    imgsz = tuple(loaded.spec.eval_spatial_size)
    params = count_params(loaded.model)
    gflops = count_gflops(loaded, imgsz)
    if args.json:
        print(
            json.dumps(
                {"model": loaded.name, "imgsz": list(imgsz), "params": params, "gflops": round(gflops, 2)}
            )
        )
        return 0
    spec = loaded.spec
    print(f"model       {loaded.name} ({ref})")
    weights = loaded.weights_file if loaded.weights_file is not None else ref
    print(f"weights     {'random (no checkpoint given)' if loaded.random_weights else weights}")
    print(
        f"backbone    {spec.backbone_label}, {spec.decoder.num_layers} decoder layers, "
        f"{spec.num_classes} classes, {spec.decoder.num_queries} queries"
    )
    print(f"input       {imgsz[0]} x {imgsz[1]} (H x W)")
    print(f"params      {params:,} ({params / 1e6:.2f} M, training form)")
    print(f"GFLOPs      {gflops:.2f} (2 x MACs, batch 1, deploy form)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
