"""Our ECDet against EdgeCrafter's own code: tensors, parameter counts, GFLOPs, eval outputs, and
the detections of EdgeCrafter's own inference path (its preprocessing included) on fixed images.

Needs a checkout of github.com/Intellindust-AI-Lab/EdgeCrafter (its `ecdetseg` folder is imported
from there, never copied here) and the packages its model modules import (torch, torchvision, scipy,
PyYAML; `UNUSED_IMPORTS` of benchmarks/official_parity get stand-ins when absent).

For every size it builds the official model from the official config (backbone download skipped)
and ours from `ECDET_SIZES`, and compares the state_dict listings (names, shapes, dtypes, order) and
parameter counts. For S it fills ours with the parity rule (`benchmarks/official_parity`), loads the
same state_dict into the official model (strict), runs both in eval on the parity images and
reports the largest differences. Then it runs EdgeCrafter's own image inference
(`ecdetseg/tools/inference/torch_inf.py`: its `build_model` from a checkpoint file holding the filled
weights, its `ECInferencer` with its transforms: PIL resize, ToTensor, ImageNet mean/std) on
`contract_images()` and keeps each image's `TOP_DETECTIONS` best detections. `--write` records the
facts the suite checks without the official code (tests/data/ecdet/official.json).

    python benchmarks/ecdet_vs_official.py /path/to/EdgeCrafter [--write]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.official_parity import (  # noqa: E402
    BOX_HEAD_SCALE,
    TOP_DETECTIONS,
    checkout_commit,
    contract_images,
    deterministic_images,
    fill_deterministic,
    inference_record,
    scale_box_heads,
    stand_in_unused_imports,
)
from dfine_deploy.model.ecdet import build_ecdet  # noqa: E402
from dfine_deploy.model.ecdet_spec import ECDET_SIZE_NAMES, ECDET_SIZES  # noqa: E402

RECORD = REPO / "tests" / "data" / "ecdet" / "official.json"
ROPE_PERIODS = "backbone.backbone.rope_embed.periods"  # a fixed buffer: the fill rule leaves it as built
SLICE_QUERIES, SLICE_CLASSES = 8, 8


def listing(state: dict[str, torch.Tensor]) -> list[str]:
    return [f"{k}\t{tuple(v.shape)}\t{v.dtype}" for k, v in state.items()]


def listing_sha256(state: dict[str, torch.Tensor]) -> str:
    return hashlib.sha256("\n".join(listing(state)).encode()).hexdigest()


def fill_ecdet(model: torch.nn.Module) -> int:
    """The parity fill, keeping the RoPE periods (a function of the head width, not a weight)."""
    periods = model.state_dict()[ROPE_PERIODS].clone()
    filled = fill_deterministic(model)
    model.state_dict(keep_vars=True)[ROPE_PERIODS].data.copy_(periods)
    return filled - 1


def fill_ecdet_detecting(model: torch.nn.Module) -> int:
    """The weights of the inference record: `fill_ecdet` with the box heads scaled (`scale_box_heads`)."""
    filled = fill_ecdet(model)
    scale_box_heads(model)
    return filled


def gflops(model: torch.nn.Module, height: int = 640, width: int = 640) -> float:
    """2 x MACs of convolutions and linear layers of the deploy form, as `dfine-info` counts them."""
    import copy

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    from dfine_deploy.hub.cli import _PARAMETER_FREE_OPS

    deploy = copy.deepcopy(model).deploy()
    with FakeTensorMode(allow_non_fake_inputs=True):
        images = torch.rand(1, 3, height, width)
        with torch.enable_grad(), FlopCounterMode(display=False) as counter:
            deploy(images)
    per_op = counter.get_flop_counts()["Global"]
    return sum(n for op, n in per_op.items() if not any(f in str(op) for f in _PARAMETER_FREE_OPS)) / 1e9


def official_builder(checkout: Path):
    """A function size -> the official ECDet model, built by its own YAMLConfig."""
    root = checkout / "ecdetseg"
    if not (root / "engine" / "edgecrafter" / "ecvit.py").is_file():
        raise SystemExit(f"{checkout}: not an EdgeCrafter checkout (no ecdetseg/engine/edgecrafter/ecvit.py)")
    stand_in_unused_imports()
    sys.path.insert(0, str(root))
    from engine.core import YAMLConfig

    def build(size: str) -> torch.nn.Module:
        cfg = YAMLConfig(
            str(root / "configs" / "ecdet" / f"ecdet_{size}.yml"), ViTAdapter={"skip_load_backbone": True}
        )
        return cfg.model

    return build


def official_inference(checkout: Path, state: dict[str, torch.Tensor]) -> list[dict]:
    """EdgeCrafter's own image inference on `contract_images()`: its torch_inf.py builds the model
    from a checkpoint file (`{"model": state}`, as it reads released files) and preprocesses each PIL
    image with its own transforms (PIL's, imported by its module, not here). Returns per image its size
    and the best detections, best first."""
    root = checkout / "ecdetseg"
    found = importlib.util.spec_from_file_location(
        "edgecrafter_torch_inf", root / "tools" / "inference" / "torch_inf.py"
    )
    torch_inf = importlib.util.module_from_spec(found)
    found.loader.exec_module(torch_inf)
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = Path(folder) / "ecdet_s_filled.pth"
        torch.save({"model": state}, checkpoint)
        model, size, task = torch_inf.build_model(
            str(root / "configs" / "ecdet" / "ecdet_s.yml"), str(checkpoint), torch.device("cpu")
        )
    inferencer = torch_inf.ECInferencer(model, task, torch.device("cpu"), size, thresh=float("-inf"))
    records = []
    for pixels in contract_images():
        image = torch_inf.Image.fromarray(pixels)  # the PIL image its own code makes of a frame
        results = inferencer.infer(image)
        records.append(
            inference_record(
                pixels, [r.label for r in results], [r.box for r in results], [r.score for r in results]
            )
        )
    transforms = [type(t).__name__ for t in inferencer.transforms.transforms]
    print(f"EdgeCrafter's own inference ({', '.join(transforms)}) at {list(size)}: {len(records)} images")
    return records


def eval_slices(out: dict[str, torch.Tensor]) -> dict[str, list[float]]:
    """The first queries' first class logits and boxes, in `match_eval_slices`' recorded format."""
    logits = out["pred_logits"][:, :SLICE_QUERIES, :SLICE_CLASSES]
    return {
        "pred_logits_slice": logits.flatten().tolist(),
        "pred_boxes_slice": out["pred_boxes"][:, :SLICE_QUERIES].flatten().tolist(),
        "pred_logits_sum": float(out["pred_logits"].double().sum()),
        "pred_logits_abs_sum": float(out["pred_logits"].double().abs().sum()),
        "pred_boxes_sum": float(out["pred_boxes"].double().sum()),
    }


def float64_diffs(official: torch.nn.Module, ours: torch.nn.Module, images: torch.Tensor) -> dict[str, float]:
    """The eval comparison again in float64 (default dtype too, which the official RoPE reads): what
    is left there is not float32 rounding."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        official, ours = official.double(), ours.double()
        with torch.no_grad():
            a, b = official(images.double()), ours(images.double())
        return {k: float((a[k] - b[k]).abs().max()) for k in ("pred_logits", "pred_boxes")}
    finally:
        torch.set_default_dtype(previous)
        official.float(), ours.float()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a checkout of Intellindust-AI-Lab/EdgeCrafter")
    parser.add_argument(
        "--write", action="store_true", help=f"record the facts in {RECORD.relative_to(REPO)}"
    )
    args = parser.parse_args(argv)
    commit = checkout_commit(args.checkout)
    if commit is None:
        return 2
    build_official = official_builder(args.checkout.resolve())
    torch.manual_seed(0)
    record: dict = {
        "source": "github.com/Intellindust-AI-Lab/EdgeCrafter ecdetseg/configs/ecdet",
        "commit": commit,
        "torch": torch.__version__,
        "torchvision": importlib.metadata.version("torchvision"),
        "pillow": importlib.metadata.version("pillow"),
        "sizes": {},
    }
    ok = True
    for size in ECDET_SIZE_NAMES:
        official, ours = build_official(size), build_ecdet(ECDET_SIZES[size])
        same_listing = listing(official.state_dict()) == listing(ours.state_dict())
        params = [sum(p.numel() for p in m.parameters()) for m in (official, ours)]
        flops = [gflops(m) for m in (official, ours)]
        ok &= same_listing and params[0] == params[1] and abs(flops[0] - flops[1]) < 1e-6
        print(
            f"ECDet-{size.upper()}: state_dict listing {'equal' if same_listing else 'DIFFERS'}; "
            f"params official {params[0]} ours {params[1]}; "
            f"GFLOPs official {flops[0]:.3f} ours {flops[1]:.3f}"
        )
        entry = {
            "params": params[0],
            "gflops": round(flops[0], 3),
            "tensors": len(official.state_dict()),
            "listing_sha256": listing_sha256(official.state_dict()),
        }
        if size == "s":
            entry["listing"] = listing(official.state_dict())
            entry["filled_tensors"] = fill_ecdet(ours)
            official.load_state_dict(ours.state_dict(), strict=True)
            images = deterministic_images()
            with torch.no_grad():
                out_official, out_ours = official.eval()(images), ours.eval()(images)
            diffs = {
                k: float((out_official[k] - out_ours[k]).abs().max()) for k in ("pred_logits", "pred_boxes")
            }
            print(f"ECDet-S eval on the parity images, max |official - ours|: {diffs}")
            entry["eval"] = eval_slices(out_official)
            entry["eval_max_abs_diff"] = diffs
            # The verdict is float64's: float32 rounding, in a different order, is magnified by the
            # parity weights (up to 8.5e-3 on a few logits), while the arithmetic itself is the same.
            entry["eval_max_abs_diff_float64"] = float64_diffs(official, ours, images)
            ok &= max(entry["eval_max_abs_diff_float64"].values()) <= 1e-5
            print(f"the same in float64: {entry['eval_max_abs_diff_float64']}")
            detecting = build_ecdet(ECDET_SIZES[size])
            entry["inference"] = {
                "path": "ecdetseg/tools/inference/torch_inf.py (build_model, ECInferencer)",
                "weights": f"fill_ecdet_detecting: the parity fill, box-head weights x {BOX_HEAD_SCALE}",
                "filled_tensors": fill_ecdet_detecting(detecting),
                "top": TOP_DETECTIONS,
                "images": official_inference(args.checkout.resolve(), detecting.state_dict()),
            }
        record["sizes"][size] = entry
    if args.write:
        RECORD.parent.mkdir(parents=True, exist_ok=True)
        RECORD.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {RECORD.relative_to(REPO)}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
