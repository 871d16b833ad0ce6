"""YAML read as `yaml.safe_load` reads it, but a key given twice in one mapping is refused instead of
silently keeping the last value: configs (`config.tree`) and dataset files (`data.yolo`) read YAML so.
"""

from __future__ import annotations

from typing import Any

import yaml

MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(yaml.YAMLError):
    """A key given twice in one YAML mapping: plain PyYAML silently keeps the last value."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses a key given twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:  # `<<: *anchor`: its keys are defaults the mapping's own override
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise DuplicateKeyError(
                    f"line {line}: key '{key}' is set twice in the same mapping (first on line "
                    f"{seen[key]}), and YAML would silently keep the last value; remove one of them"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def safe_load_unique(text: str) -> Any:
    """`yaml.safe_load` that raises `DuplicateKeyError` (a `yaml.YAMLError`) on a repeated key."""
    loader = _UniqueKeyLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
