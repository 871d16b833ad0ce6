"""`Config`: a merged official-layout file, checked against the layout, with typed settings."""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from dfine_deploy.config.builders import build_data_settings, build_model_spec, build_train_settings
from dfine_deploy.config.layout import LAYOUT, check_layout
from dfine_deploy.config.tree import ConfigTree, KeyPath, dotted, load_tree
from dfine_deploy.errors import ConfigError
from dfine_deploy.model.spec import ModelSpec
from dfine_deploy.settings import DataSettings, TrainSettings


def load_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> Config:
    """Load an official-layout YAML file with its includes and `-u` overrides, then check it."""
    raw, provenance = load_tree(Path(path), overrides)
    return Config(raw, source=str(path), provenance=provenance)


class Config(ConfigTree):
    """A merged, checked config: `raw` dict, where each key came from, and typed settings."""

    def __init__(self, raw: dict, *, source: str, provenance: Mapping[str, str] | None = None):
        super().__init__(raw, source=source, provenance=provenance)
        ignored: list[str] = []
        check_layout(raw, LAYOUT, (), self, ignored)
        self.ignored: tuple[str, ...] = tuple(ignored)
        # Build the typed settings now so that a wrong value fails at load time, not mid-training.
        for name in ("train", "train_data", "val_data"):
            getattr(self, name)
        if self.describes_model:
            _ = self.model_spec

    @property
    def describes_model(self) -> bool:
        return isinstance(self.raw.get("HGNetv2"), Mapping) and "name" in self.raw["HGNetv2"]

    @functools.cached_property
    def model_spec(self) -> ModelSpec:
        return build_model_spec(self)

    @functools.cached_property
    def train(self) -> TrainSettings:
        return build_train_settings(self)

    @functools.cached_property
    def train_data(self) -> DataSettings:
        return build_data_settings(self, "train_dataloader")

    @functools.cached_property
    def val_data(self) -> DataSettings:
        return build_data_settings(self, "val_dataloader")

    def to_dict(self) -> dict:
        """The merged config as plain YAML-safe data (what checkpoints store as meta['config'])."""
        return copy.deepcopy(self.raw)

    @classmethod
    def from_dict(cls, data: Mapping, *, source: str = "<checkpoint>") -> Config:
        """Rebuild from `to_dict()` output (e.g. a checkpoint's meta['config']), checking it again."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{source}: a stored config must be a mapping, found {type(data).__name__}")
        return cls(copy.deepcopy(dict(data)), source=source)

    def __repr__(self) -> str:
        return f"Config(source={self.source!r})"


def format_config(cfg: Config, *, provenance: bool = True) -> str:
    """The merged config as YAML, each leaf annotated with the file (or -u) that set it."""
    lines = [f"# merged config of {cfg.source}"]

    def emit(node: Mapping, path: KeyPath, indent: int) -> None:
        for key, value in node.items():
            here = path + (str(key),)
            note = f"  # {cfg.provenance.get(dotted(here), '')}" if provenance else ""
            if dotted(here) in cfg.ignored:
                note += "  (ignored)"
            pad = "  " * indent
            if isinstance(value, Mapping) and value:
                lines.append(f"{pad}{key}:")
                emit(value, here, indent + 1)
            elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
                lines.append(f"{pad}{key}:{note}")
                for item in value:
                    flow = yaml.safe_dump(item, default_flow_style=True, sort_keys=False, width=10**6).strip()
                    lines.append(f"{pad}  - {flow}")
            else:
                flow = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10**6).strip()
                flow = flow.removesuffix("\n...").removesuffix("...").strip()
                lines.append(f"{pad}{key}: {flow}{note}")

    emit(cfg.raw, (), 0)
    if cfg.ignored:
        lines.append("# accepted but ignored: " + ", ".join(cfg.ignored))
    return "\n".join(lines)
