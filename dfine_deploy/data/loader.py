"""Builders from typed settings: dataset, collator, and a seeded (distributed) loader.

Seeding: the sampler order depends on (seed, epoch) only, the same on every rank, as
DistributedSampler needs. Augmentation randomness comes from the loader's generator, seeded with
(seed, rank, epoch); torch derives each worker's seed from it, and `seed_worker` passes that seed
on to `random` and numpy. A run resumed at epoch k therefore sees the same data as an unbroken one.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
from typing import Any

import numpy as np
import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
)

from dfine_deploy import cores
from dfine_deploy.data.cache import build_cache
from dfine_deploy.data.classmap import ClassMap, meet_by_name, rename_categories
from dfine_deploy.data.coco import AnnotationSet, DetectionDataset
from dfine_deploy.data.transforms import BatchCollator, build_transforms
from dfine_deploy.data.validation import ValidationPolicy
from dfine_deploy.errors import ConfigError, DatasetError

log = logging.getLogger(__name__)


def load_annotations(settings: Any, *, policy: ValidationPolicy | None = None) -> AnnotationSet:
    """settings.DataSettings -> validated annotations of that split, read by whichever layout of
    data/formats.py recognises ann_file (else img_folder): a plain COCO json with its img_folder, or a
    labelling tool's export (its root folder or its annotation file), whose split is the loader's."""
    from dfine_deploy.data.formats import open_dataset

    kind = settings.dataset_type
    if kind == "YOLODetection":  # official layout: ann_file the data.yaml, img_folder a split or folder
        if not settings.ann_file or not settings.img_folder:
            raise ConfigError(
                f"{kind}: the dataset needs ann_file (the data.yaml) and img_folder (a split name or "
                f"images folder); got {settings.img_folder!r}, {settings.ann_file!r}"
            )
        return open_dataset(settings.ann_file).load(settings.img_folder, policy=policy)
    if kind == "VOCDetection" or not settings.ann_file:  # VOC's `root`, or an export's folder
        if not settings.img_folder:
            raise ConfigError(
                f"{kind}: the dataset needs ann_file or img_folder (a dataset folder or annotation file); "
                "got neither"
            )
        return open_dataset(settings.img_folder).load(settings.split, policy=policy)
    return open_dataset(settings.ann_file, img_folder=settings.img_folder).load(settings.split, policy=policy)


def build_class_map(settings: Any, annotations: AnnotationSet) -> ClassMap:
    """Class map from the dataset categories, `remap_mscoco_category`, `num_classes`, `class_names`
    (names in category-id order for a json without them; where the json names the same classes, in
    whatever order, its own names are kept, so that a val set numbered otherwise meets them by name)."""
    class_map = annotations.class_map(remap=settings.remap_mscoco_category, num_classes=settings.num_classes)
    if settings.class_names:
        names = tuple(settings.class_names)
        if sorted(names) == sorted(class_map.names):  # the json's own names: they decide, by name
            return class_map
        if len(names) != len(class_map.names):
            raise ConfigError(
                f"class_names lists {len(names)} names but {annotations.source} has "
                f"{len(class_map.names)} categories {list(class_map.names)}; list one name per category "
                "in category-id order, or drop class_names to use the json's names"
            )
        class_map = ClassMap(class_map.category_ids, names, class_map.remap, class_map.num_classes)
    return class_map


def unused_class_heads(class_map: ClassMap, source: str) -> list[str]:
    """One line when num_classes exceeds the labels the categories need (a template's 777 left for 4
    categories): those class heads never see a box, and the model's class list fills with class_<i>."""
    needed = max((class_map.label_of(c) for c in class_map.category_ids), default=-1) + 1
    surplus = class_map.num_classes - needed
    if surplus <= 0:
        return []
    return [
        f"num_classes is {class_map.num_classes}, and the {len(class_map.category_ids)} categories of "
        f"{source} need {needed} labels: {surplus} class heads will never see a box; set num_classes: "
        f"{needed} in the dataset config"
    ]


def classes_missing_from_train(train: AnnotationSet, val: AnnotationSet) -> list[str]:
    """One line naming the classes that have boxes in val and none in train: the model cannot learn
    them, so their AP is 0 and pulls the mean down."""
    from collections import Counter

    def boxes_per_name(annotations: AnnotationSet) -> Counter:
        names = {c["id"]: c["name"] for c in annotations.categories}
        return Counter(names[int(c)] for r in annotations.records for c in r.category_ids.tolist())

    trained, scored = boxes_per_name(train), boxes_per_name(val)
    missing = [f"{name!r} ({count} boxes)" for name, count in scored.items() if name not in trained]
    if not missing:
        return []
    return [
        f"{val.source}: {len(missing)} of its classes have boxes here and none in the train split "
        f"{train.source}: {', '.join(missing[:8])}{', ...' if len(missing) > 8 else ''}; the model cannot "
        "learn them and their AP will be 0: add training images of them, or leave them out of val"
    ]


def build_dataset(
    settings: Any,
    *,
    policy: ValidationPolicy | None = None,
    class_map: ClassMap | None = None,
    annotations: AnnotationSet | None = None,
    renames: Any = None,
) -> DetectionDataset:
    """settings.DataSettings -> DetectionDataset with its transforms and cache.

    Pass the train split's `class_map` when building the val split so both share one mapping, and
    `annotations` when they were loaded already (with these settings). `renames` (--class-map): a
    (file, {category name: model class name}) that the val split's categories are read with.
    """
    if annotations is None:
        if policy is None:
            policy = ValidationPolicy.from_mapping(dict(settings.validation))
        annotations = load_annotations(settings, policy=policy)
    if class_map is None:
        class_map = build_class_map(settings, annotations)
        annotations.notes += unused_class_heads(class_map, annotations.source)
    else:  # the val split meets the train split's labels by name, whatever its ids
        if renames:
            path, mapping = renames
            option = f"--class-map {path}"
            annotations.notes += rename_categories(
                annotations.categories, mapping, annotations.source, option
            )
        contiguous = dataclasses.replace(
            settings, remap_mscoco_category=True, num_classes=len(annotations.categories)
        )
        own = build_class_map(contiguous, annotations)  # its ids and names only: no label rule here
        shared = (
            dict(zip(own.category_ids, own.names)).items()
            <= dict(zip(class_map.category_ids, class_map.names)).items()
        )
        if not shared:
            named = [{"id": c, "name": n} for c, n in zip(own.category_ids, own.names)]
            fix = (
                "rename the categories, list the train split's names in class_names, or map them with "
                "--class-map FILE ({category: class})"
            )
            class_map, lines = meet_by_name(named, class_map.class_names, annotations.source, fix)
            annotations.notes += lines
    transforms = (
        build_transforms(settings.transforms.ops, settings.transforms.policy)
        if settings.transforms.ops
        else None
    )
    cache = build_cache(settings.cache, [(r.width, r.height) for r in annotations.records])
    return DetectionDataset(annotations, class_map, transforms=transforms, cache=cache)


def seed_worker(worker_id: int) -> None:
    """worker_init_fn: give `random` and numpy the seed torch chose for this worker."""
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)


def _as_raised_in_worker(exc: Exception) -> Exception:
    """Our error as a loader worker raised it (a damaged or replaced image, say), instead of torch's
    copy, whose message is the worker's whole traceback (and a RuntimeError for an ImageError); any
    other error is left as torch raised it."""
    lines = str(exc).splitlines()
    if not lines or "Original Traceback" not in str(exc):
        return exc
    ours = [i for i, line in enumerate(lines) if line.startswith("dfine_deploy.errors.")]
    if not ours:
        return exc
    message = "\n".join(lines[ours[-1] :]).split(": ", 1)[-1]
    return DatasetError(message)


class DetectionLoader(DataLoader):
    """A DataLoader whose `set_epoch` reaches the sampler, the dataset, the collator and the seed."""

    def __init__(self, dataset: Dataset, *, seed: int, rank: int, **kwargs: Any):
        self.seed = int(seed)
        self.rank = int(rank)
        generator = torch.Generator()
        generator.manual_seed(self._generator_seed(0))
        super().__init__(dataset, generator=generator, worker_init_fn=seed_worker, **kwargs)

    def _generator_seed(self, epoch: int) -> int:
        return (self.seed * 1_000_003 + self.rank * 10_007 + epoch) % 2**63

    def __iter__(self):
        """With workers, torch seeds each from `generator`. Without, every batch runs under its own
        seed drawn from `generator`, inside fork_rng so the trainer's global RNG is left alone."""
        if self.num_workers > 0:
            try:
                yield from super().__iter__()
            except Exception as exc:
                raise _as_raised_in_worker(exc) from None
            return
        base = int(torch.randint(2**62, (1,), generator=self.generator))
        batches = super().__iter__()
        for step in range(len(self)):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(base + step)
                batch = next(batches)
            yield batch

    def set_epoch(self, epoch: int) -> None:
        if isinstance(self.sampler, DistributedSampler):
            self.sampler.set_epoch(epoch)
        elif isinstance(self.sampler, RandomSampler):
            self.sampler.generator.manual_seed(self.seed + epoch)
        self.generator.manual_seed(self._generator_seed(epoch))
        for part in (self.dataset, self.collate_fn):
            if hasattr(part, "set_epoch"):
                part.set_epoch(epoch)


def _world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def loader_workers(configured: int, processes_on_host: int | None = None) -> int:
    """`num_workers` lowered to this rank's share of the usable cores (`dfine_deploy.cores`): workers
    decode and augment on the CPU, so more of them than cores only queue, and in a container with a
    CPU quota they are throttled together. Never raised; the lowering is logged.
    `processes_on_host`: the ranks sharing those cores (default: torchrun's LOCAL_WORLD_SIZE)."""
    if processes_on_host is None:
        processes_on_host = int(os.environ.get("LOCAL_WORLD_SIZE") or 1)
    limits = cores.read_limits()
    share = max(1, limits.usable // max(1, processes_on_host))
    if configured <= share:
        return configured
    log.warning(
        "num_workers %d lowered to %d: this process may use %s, shared by %d process(es) on this host",
        configured,
        share,
        limits.describe(),
        processes_on_host,
    )
    return share


def per_rank_batch_size(total_batch_size: int, world_size: int) -> int:
    if total_batch_size % world_size:
        raise ConfigError(
            f"total_batch_size {total_batch_size} does not divide over {world_size} processes; "
            f"use a multiple of {world_size} "
            f"(for example {max(world_size, total_batch_size // world_size * world_size)})"
        )
    return total_batch_size // world_size


def build_dataloader(
    settings: Any,
    dataset: Dataset,
    *,
    seed: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
    collate_fn: Any = None,
) -> DetectionLoader:
    """settings.DataSettings + dataset -> loader of `(images [B, 3, H, W], list of targets)`.

    `rank` / `world_size` default to torch.distributed's (0 / 1 when not initialised).
    """
    if rank is None or world_size is None:
        rank, world_size = _world()
    batch_size = per_rank_batch_size(settings.total_batch_size, world_size)
    if world_size > 1:
        sampler = DistributedSampler(
            dataset,
            num_replicas=world_size,
            rank=rank,
            shuffle=settings.shuffle,
            seed=seed,
            drop_last=settings.drop_last,
        )
    elif settings.shuffle:
        sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    else:
        sampler = SequentialSampler(dataset)
    workers = loader_workers(settings.num_workers)
    if workers == 0 and (settings.prefetch_factor is not None or settings.persistent_workers):
        raise ConfigError(
            "prefetch_factor and persistent_workers need num_workers > 0; set num_workers or drop them"
        )
    extra = {"prefetch_factor": settings.prefetch_factor} if settings.prefetch_factor is not None else {}
    return DetectionLoader(
        dataset,
        seed=seed,
        rank=rank,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=settings.drop_last,
        num_workers=workers,
        pin_memory=settings.pin_memory,
        persistent_workers=settings.persistent_workers and workers > 0,
        collate_fn=collate_fn if collate_fn is not None else BatchCollator.from_settings(settings.collate),
        **extra,
    )
