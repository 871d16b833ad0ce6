"""Record what one installed transformers wants of a D-FINE folder, into tests/data/hf_config_types.json.

Run it once per transformers version, each in a throwaway environment that has that version and torch:

    python -m venv /tmp/hf457 && /tmp/hf457/bin/pip install torch 'transformers==4.57.*'
    PYTHONPATH=. /tmp/hf457/bin/python scripts/record_hf_config_types.py

It adds (or replaces) that version's entry, read from transformers' own classes:
- for DFineConfig (`d_fine`) and HGNetV2Config (`hgnet_v2`): `known`, the fields a default instance
  holds; `declared`, the types the class declares (transformers 5's later releases are `@strict`
  dataclasses that refuse any other type; 4.57 and 5.0 declare none); `defaults`, each default's type;
- `saved`: the config.json and the tensor names, dtypes and shapes save_pretrained writes for a
  D-FINE-N with 3 classes and transformers' default tying (5.0.0 writes the first decoder layer's
  heads only).
Then it checks our code against that version both ways and prints (and records under `checked`):
`dfine-export --hf`'s folder loaded by from_pretrained, and the folder it saved read by `load_model`,
each compared with the other side's detections. tests/model/test_hub.py reads the file;
the suite needs no transformers for it.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

REPO = Path(__file__).resolve().parents[1]
FACTS = REPO / "tests" / "data" / "hf_config_types.json"
CLASS_NAMES = ["cat", "dog", "bird"]
SIDE = 256  # 320 tokens at strides 16 and 32: enough for N's 300 queries


def _spelled(annotation: Any) -> str:
    """A field's annotation as written in the class: `float`, `int | list[int]`."""
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, type):
        return annotation.__name__
    return re.sub(r"\b(?:[A-Za-z_]\w*\.)+(\w+)", r"\1", str(annotation))


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        inner = sorted({_json_type(v) for v in value})
        return f"list[{' | '.join(inner)}]" if inner else "list"
    return {bool: "bool", int: "int", float: "float", str: "str", dict: "dict"}.get(type(value), "object")


def _fields(config_class: type) -> dict[str, Any]:
    """What a config class knows of its fields: `known` (every attribute a default instance holds, which
    4.57 and 5.0 keep whatever their type), `declared` (the types a dataclass declares; empty for a class
    that declares none) and `defaults` (the JSON type of each default)."""
    known = sorted({name.lstrip("_") for name in vars(config_class())})
    if dataclasses.is_dataclass(config_class):
        declared, defaults = {}, {}
        for field in dataclasses.fields(config_class):
            name = field.name.lstrip("_")
            declared[name] = _spelled(field.type)
            if field.default is not dataclasses.MISSING:
                defaults[name] = _json_type(field.default)
        return {"known": known, "declared": declared, "defaults": defaults}
    parameters = inspect.signature(config_class.__init__).parameters
    defaults = {
        name: _json_type(p.default)
        for name, p in parameters.items()
        if name != "self" and p.kind is p.POSITIONAL_OR_KEYWORD and p.default is not p.empty
    }
    return {"known": known, "declared": {}, "defaults": defaults}


def _noisy(model: torch.nn.Module, seed: int) -> None:
    """Seeded noise on every learned tensor, so that no head is left at its zero init."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.is_floating_point():
                param.add_(torch.randn(param.shape, generator=generator) * 0.02)


def _detections(outputs: dict[str, torch.Tensor], postprocessor: Any) -> dict[str, torch.Tensor]:
    import torch

    return postprocessor(
        {"pred_logits": outputs["pred_logits"].float(), "pred_boxes": outputs["pred_boxes"].float()},
        torch.tensor([[SIDE, SIDE]]),
    )[0]


def _compare(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor], postprocessor: Any) -> dict:
    a, b = _detections(ours, postprocessor), _detections(theirs, postprocessor)
    # matched as sets: random weights give near-tied scores whose order last-bit differences swap
    close = (a["boxes"][:, None] - b["boxes"][None]).abs().amax(dim=2) < 0.01  # pixels
    close &= a["labels"][:, None] == b["labels"][None]
    close &= (a["scores"][:, None] - b["scores"][None]).abs() < 1e-4
    same = close.any(dim=1)
    return {
        "logits_max_abs_diff": float((ours["pred_logits"] - theirs["pred_logits"]).abs().max()),
        "boxes_max_abs_diff": float((ours["pred_boxes"] - theirs["pred_boxes"]).abs().max()),
        "detections_matched": f"{int(same.sum())}/{len(same)}",
    }


def check_both_ways(work: Path) -> tuple[dict, dict]:
    """(`saved` facts, `checked` results) for the installed transformers."""
    import torch
    from safetensors import safe_open
    from transformers import DFineConfig, DFineForObjectDetection

    from dfine_deploy.hub.hf import export_hf, hf_config
    from dfine_deploy.hub.loader import load_model
    from dfine_deploy.model.spec import SIZES

    images = torch.rand(1, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    # (a) our folder, loaded by transformers
    torch.manual_seed(0)
    ours = load_model("dfine-n", num_classes=len(CLASS_NAMES), imgsz=(SIDE, SIDE))
    _noisy(ours.model, seed=0)
    said = export_hf(ours, work / "ours")
    theirs = DFineForObjectDetection.from_pretrained(str(work / "ours")).double().eval()
    with torch.no_grad():
        mine = ours.model.double().eval()(images)
        out = theirs(pixel_values=images)
    ours_loaded = {
        "export_says": said.split("; ", 1)[1],  # without the temporary folder's name
        **_compare(mine, {"pred_logits": out.logits, "pred_boxes": out.pred_boxes}, ours.postprocessor),
    }

    # (b) transformers' folder, read by us: our N's config with transformers' default tying
    config = hf_config(SIZES["n"].with_classes(len(CLASS_NAMES)), CLASS_NAMES)
    config.pop("tie_word_embeddings")
    torch.manual_seed(0)
    model = DFineForObjectDetection(DFineConfig.from_dict(config)).eval()
    _noisy(model, seed=1)
    model.save_pretrained(str(work / "theirs"))
    with safe_open(str(work / "theirs" / "model.safetensors"), "pt") as fh:
        tensors = {
            name: [fh.get_slice(name).get_dtype(), fh.get_slice(name).get_shape()]
            for name in sorted(fh.keys())
        }
    saved = {"config": json.loads((work / "theirs" / "config.json").read_text()), "tensors": tensors}
    loaded = load_model(work / "theirs", imgsz=(SIDE, SIDE))
    with torch.no_grad():
        expected = model.double()(pixel_values=images)
        read = loaded.model.double().eval()(images)
    theirs_read = _compare(
        read, {"pred_logits": expected.logits, "pred_boxes": expected.pred_boxes}, loaded.postprocessor
    )
    return saved, {"our_folder_in_transformers": ours_loaded, "their_folder_in_ours": theirs_read}


def main() -> int:
    import torch
    import transformers
    from transformers import DFineConfig, HGNetV2Config

    with tempfile.TemporaryDirectory() as work:
        saved, checked = check_both_ways(Path(work))
    facts = json.loads(FACTS.read_text()) if FACTS.exists() else {}
    facts["recorded_by"] = "scripts/record_hf_config_types.py"
    facts.setdefault("versions", {})[transformers.__version__] = {
        "torch": torch.__version__.split("+")[0],
        "d_fine": _fields(DFineConfig),
        "hgnet_v2": _fields(HGNetV2Config),
        "saved": saved,
        "checked": checked,
    }
    facts["versions"] = dict(
        sorted(facts["versions"].items(), key=lambda kv: [int(p) for p in kv[0].split(".")])
    )
    FACTS.write_text(json.dumps(facts, indent=1, sort_keys=False) + "\n")
    print(f"transformers {transformers.__version__}: {json.dumps(checked, indent=1)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
