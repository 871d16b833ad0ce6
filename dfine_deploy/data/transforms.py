"""The official augmentation pipeline on torchvision transforms v2, and multi-scale batches.

`build_transforms` turns the config's ``transforms.ops`` list (official names and arguments) into a
`Pipeline`. Its ``stop_epoch`` policy skips the listed strong ops once ``epoch >= policy.epoch``,
as the official Compose does. `BatchCollator` stacks items into a batch and, while
``epoch < stop_epoch``, resizes the whole batch to one randomly drawn scale (nearest), as the
official BatchImageCollateFunction.

Sample flowing through the ops: ``(image tv_tensors.Image [3, H, W], target dict)`` whose ``boxes``
are ``tv_tensors.BoundingBoxes``; plain tensors in the target (labels, image_id, ...) pass through.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torchvision import tv_tensors
from torchvision.transforms import v2 as T

from dfine_deploy.errors import ConfigError

Sample = tuple[Any, dict[str, Any]]
Op = Callable[[Any, dict[str, Any]], Sample]


class RandomIoUCrop:
    """Official wrapper: torchvision's RandomIoUCrop, applied with probability `p` (0.8 in the configs)."""

    def __init__(self, p: float = 1.0, **kwargs: Any):
        self.p = float(p)
        self.crop = T.RandomIoUCrop(**kwargs)

    def __call__(self, image: Any, target: dict[str, Any]) -> Sample:
        if torch.rand(1).item() >= self.p:
            return image, target
        return self.crop(image, target)


class ConvertBoxes:
    """Boxes to `fmt` (cxcywh in the configs), divided by the canvas (w, h) when `normalize`.

    Output boxes are a plain float32 tensor [n, 4]: what the criterion takes.
    """

    def __init__(self, fmt: str = "", normalize: bool = False):
        self.fmt = fmt.upper()
        self.normalize = bool(normalize)

    def __call__(self, image: Any, target: dict[str, Any]) -> Sample:
        boxes = target["boxes"]
        height, width = boxes.canvas_size
        if self.fmt:
            boxes = T.ConvertBoundingBoxFormat(self.fmt)(boxes)
        if self.normalize:
            boxes = boxes.as_subclass(torch.Tensor) / torch.tensor(
                [width, height, width, height], dtype=boxes.dtype
            )
            target = {**target, "boxes": boxes.to(torch.float32)}  # [n, 4] normalised
        else:
            target = {**target, "boxes": boxes}
        return image, target


def _convert_image(dtype: str = "float32", scale: bool = True) -> Op:
    """Official ConvertPILImage: image to `dtype`, scaled to [0, 1] when `scale` (no normalisation)."""
    try:
        torch_dtype = getattr(torch, dtype)
    except AttributeError:
        raise ConfigError(f"ConvertPILImage dtype {dtype!r} is not a torch dtype (use float32)") from None
    return T.Compose(
        [T.ToImage(), T.ToDtype({tv_tensors.Image: torch_dtype, "others": None}, scale=bool(scale))]
    )


# name in the YAML -> builder taking its keyword arguments
OPS: dict[str, Callable[..., Op]] = {
    "RandomPhotometricDistort": T.RandomPhotometricDistort,
    "RandomZoomOut": T.RandomZoomOut,
    "RandomIoUCrop": RandomIoUCrop,
    "SanitizeBoundingBoxes": T.SanitizeBoundingBoxes,
    "RandomHorizontalFlip": T.RandomHorizontalFlip,
    "Resize": T.Resize,
    "ConvertPILImage": _convert_image,
    "ConvertBoxes": ConvertBoxes,
}


def _op_fields(op: Any) -> tuple[str, dict[str, Any]]:
    """Accept settings.TransformOp or the raw YAML dict {type: ..., **kwargs}."""
    if isinstance(op, Mapping):
        kwargs = dict(op)
        name = kwargs.pop("type", None)
        return str(name), kwargs
    return op.type, dict(op.kwargs)


def build_op(op: Any) -> tuple[str, Op]:
    name, kwargs = _op_fields(op)
    if name not in OPS:
        near = difflib.get_close_matches(name, OPS, n=1)
        hint = f"; did you mean {near[0]}?" if near else ""
        raise ConfigError(f"transforms.ops: unknown op type {name!r}{hint} Supported: {', '.join(OPS)}")
    try:
        return name, OPS[name](**kwargs)
    except (TypeError, ValueError) as exc:  # torchvision refuses values out of range with ValueError
        raise ConfigError(f"transforms.ops: {name} got bad arguments {kwargs}: {exc}") from None


class Pipeline:
    """Ops applied in order; the ``stop_epoch`` policy skips `stop_ops` from `stop_epoch` on."""

    def __init__(
        self, ops: Sequence[tuple[str, Op]], stop_epoch: int | None = None, stop_ops: Sequence[str] = ()
    ):
        self.ops = list(ops)
        self.stop_epoch = stop_epoch
        self.stop_ops = frozenset(stop_ops)

    def active(self, epoch: int) -> list[str]:
        """Names of the ops that run at `epoch`."""
        stopped = self.stop_epoch is not None and epoch >= self.stop_epoch
        return [name for name, _ in self.ops if not (stopped and name in self.stop_ops)]

    def __call__(self, image: Any, target: dict[str, Any], epoch: int = 0) -> Sample:
        stopped = self.stop_epoch is not None and epoch >= self.stop_epoch
        for name, op in self.ops:
            if stopped and name in self.stop_ops:
                continue
            image, target = op(image, target)
        return image, target

    def __repr__(self) -> str:
        policy = (
            f", stop_epoch={self.stop_epoch} for {sorted(self.stop_ops)}"
            if self.stop_epoch is not None
            else ""
        )
        return f"Pipeline([{', '.join(n for n, _ in self.ops)}]{policy})"


def build_transforms(ops: Sequence[Any], policy: Any = None) -> Pipeline:
    """Config ops list (+ optional policy: settings.TransformPolicy or {name, epoch, ops}) -> Pipeline."""
    if isinstance(policy, Mapping):
        name, epoch, stop_ops = policy.get("name"), policy.get("epoch"), policy.get("ops", ())
    elif policy is not None:
        name, epoch, stop_ops = policy.name, policy.epoch, policy.ops
    else:
        name, epoch, stop_ops = None, None, ()
    if name not in (None, "default", "stop_epoch"):
        raise ConfigError(
            f"transforms.policy.name {name!r} is not supported; use stop_epoch (or omit the policy)"
        )
    if name == "stop_epoch" and epoch is None:
        raise ConfigError(
            "transforms.policy: stop_epoch needs an 'epoch' (first epoch without the strong ops)"
        )
    built = [build_op(op) for op in ops]
    known = {n for n, _ in built}
    missing = [n for n in stop_ops if n not in OPS]
    if missing:
        raise ConfigError(f"transforms.policy.ops names unknown op(s) {missing}; supported: {', '.join(OPS)}")
    return Pipeline(built, epoch if name == "stop_epoch" else None, [n for n in stop_ops if n in known])


def eval_transforms(size: int | Sequence[int]) -> Pipeline:
    """Validation: a plain stretch to (h, w) and float [0, 1], as official."""
    hw = [size, size] if isinstance(size, int) else list(size)
    return Pipeline([build_op({"type": "Resize", "size": hw}), build_op({"type": "ConvertPILImage"})])


# ------------------------------------------------------------------------------- batching


def generate_scales(base_size: int, base_size_repeat: int) -> list[int]:
    """Multi-scale sizes: multiples of 32 from 0.75x to 1.25x of base, base repeated in the middle.

    640, 3 -> [480, 512, 544, 576, 608, 640, 640, 640, 800, 768, 736, 704, 672] (official order).
    """
    low = int(base_size * 0.75 / 32) * 32
    high = int(base_size * 1.25 / 32) * 32
    steps = (base_size - low) // 32
    return (
        [low + 32 * i for i in range(steps)]
        + [base_size] * base_size_repeat
        + [high - 32 * i for i in range(steps)]
    )


class BatchCollator:
    """(image, target) items -> (images [B, 3, H, W], list of targets), multi-scale until stop_epoch.

    The scale is drawn with torch's generator, which the loader seeds per worker and rank. The
    epoch sits in shared memory so persistent workers follow `set_epoch`.
    """

    def __init__(self, scales: Sequence[int] | None = None, stop_epoch: int | None = None):
        self.scales = list(scales) if scales else None
        self.stop_epoch = stop_epoch
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()

    @classmethod
    def from_settings(cls, collate: Any) -> BatchCollator:
        """settings.CollateSettings -> collator; base_size_repeat None means one scale."""
        if collate.base_size_repeat is None:
            return cls(None, collate.stop_epoch)
        return cls(generate_scales(collate.base_size, collate.base_size_repeat), collate.stop_epoch)

    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    def set_epoch(self, epoch: int) -> None:
        self._epoch[0] = int(epoch)

    def multi_scale_active(self) -> bool:
        return self.scales is not None and (self.stop_epoch is None or self.epoch < self.stop_epoch)

    def __call__(self, items: Sequence[Sample]) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        shapes = {tuple(image.shape) for image, _ in items}
        if len(shapes) > 1:
            raise ConfigError(
                f"a batch holds images of different sizes {sorted(shapes)}; the transforms must end "
                "with a Resize to one size (add {type: Resize, size: [H, W]} to transforms.ops)"
            )
        images = torch.stack([image.as_subclass(torch.Tensor) for image, _ in items])  # [B, 3, H, W]
        if self.multi_scale_active():
            size = self.scales[int(torch.randint(len(self.scales), (1,)).item())]
            images = F.interpolate(images, size=size)  # nearest, as official; boxes are normalised
        return images, [target for _, target in items]
