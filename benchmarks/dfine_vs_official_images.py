"""The official D-FINE's own image inference, its preprocessing included, recorded as facts.

`tests/data/parity_*.json` compare networks fed the same tensor, so they cannot see how pixels
become that tensor. This script runs the official inference script itself
(`tools/inference/torch_inf.py` of github.com/Peterande/D-FINE: PIL `convert("RGB")`,
`T.Resize((640, 640))`, `T.ToTensor()`, the deploy model and postprocessor) on PNG files of
`contract_images()`, with D-FINE-N's COCO model holding the parity fill and scaled box heads
(`scale_box_heads`, so the best boxes spread over the image). Its `draw` is the only thing replaced:
it receives the detections the script computed, and this script keeps them instead of drawing.

The suite compares our Detector, our exported graph and dfine-serve with the record
(tests/export/test_dfine_contract.py). D-FINE's checkout is imported from the path given, never
copied here; it needs the packages of our training extra (`UNUSED_IMPORTS` get stand-ins).

    python benchmarks/dfine_vs_official_images.py /path/to/D-FINE [--write]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.official_parity import (  # noqa: E402
    BOX_HEAD_SCALE,
    TOP_DETECTIONS,
    checkout_commit,
    contract_images,
    fill_deterministic,
    inference_record,
    scale_box_heads,
    stand_in_unused_imports,
)
from dfine_deploy.model import SIZES, build_model  # noqa: E402

RECORD = REPO / "tests" / "data" / "dfine" / "official_images.json"
SIZE = "n"
OFFICIAL_CONFIG = f"configs/dfine/dfine_hgnetv2_{SIZE}_coco.yml"
INFERENCE_SCRIPT = "tools/inference/torch_inf.py"


def detecting_model() -> torch.nn.Module:
    """D-FINE-N (COCO, 80 classes) with the record's weights: the parity fill, box heads scaled."""
    model = build_model(SIZES[SIZE])  # its denoising embedding too: the official model loads strictly
    fill_deterministic(model)
    scale_box_heads(model)
    return model


def official_inference(checkout: Path, state: dict[str, torch.Tensor]) -> list[dict]:
    """Run the official torch_inf.py's `main` on each contract image (written as a PNG, which it
    opens itself); returns each image's record."""
    stand_in_unused_imports()
    sys.path.insert(0, str(checkout))
    found = importlib.util.spec_from_file_location("dfine_torch_inf", checkout / INFERENCE_SCRIPT)
    torch_inf = importlib.util.module_from_spec(found)
    found.loader.exec_module(torch_inf)
    caught: list[tuple] = []
    torch_inf.draw = lambda images, labels, boxes, scores, **_: caught.append((labels, boxes, scores))
    records = []
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = Path(folder) / "dfine_n_filled.pth"
        torch.save({"model": state}, checkpoint)
        for index, pixels in enumerate(contract_images()):
            image = Path(folder) / f"contract_{index}.png"
            torch_inf.Image.fromarray(pixels).save(image)
            args = SimpleNamespace(
                config=str(checkout / OFFICIAL_CONFIG), resume=str(checkpoint), input=str(image), device="cpu"
            )
            with torch.no_grad():
                torch_inf.main(args)
            labels, boxes, scores = (t[0].numpy() for t in caught.pop())
            records.append(inference_record(pixels, labels, boxes, scores))
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a checkout of Peterande/D-FINE")
    parser.add_argument(
        "--write", action="store_true", help=f"record the facts in {RECORD.relative_to(REPO)}"
    )
    args = parser.parse_args(argv)
    checkout = args.checkout.resolve()
    if not (checkout / INFERENCE_SCRIPT).is_file():
        print(f"{checkout}: not a D-FINE checkout (no {INFERENCE_SCRIPT})", file=sys.stderr)
        return 2
    commit = checkout_commit(checkout)
    if commit is None:
        return 2
    torch.manual_seed(0)
    model = detecting_model()
    images = official_inference(checkout, model.state_dict())
    for image in images:
        top = np.array(image["scores"])
        print(
            f"{image['width']}x{image['height']}: {len(top)} detections, "
            f"scores {top.max():.3f}..{top.min():.3f}, labels {sorted(set(image['labels']))[:8]}"
        )
    record = {
        "source": f"github.com/Peterande/D-FINE {INFERENCE_SCRIPT} (main, process_image), {OFFICIAL_CONFIG}",
        "commit": commit,
        "torch": torch.__version__,
        "torchvision": importlib.metadata.version("torchvision"),
        "pillow": importlib.metadata.version("pillow"),
        "model": f"dfine-{SIZE}",
        "weights": f"fill_deterministic, box-head weights x {BOX_HEAD_SCALE}",
        "top": TOP_DETECTIONS,
        "images": images,
    }
    if args.write:
        RECORD.parent.mkdir(parents=True, exist_ok=True)
        RECORD.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {RECORD.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
