"""Every option of every console script that takes a fixed set of values lists the table that holds
them, so a row added to a table is a choice at once and a choice is never spelled twice."""

from __future__ import annotations

import argparse
import importlib
import logging

import pytest

from dfine_deploy.backend_names import Precision
from dfine_deploy.data.validation import CHECK_LEVELS
from dfine_deploy.export.rknn import PLATFORMS
from dfine_deploy.export.targets import TARGET_NAMES
from dfine_deploy.model.spec import SAMPLERS

CLIS = ("bench", "data", "export", "serve", "training", "verify")
TABLES = {
    "--target": (*TARGET_NAMES, *PLATFORMS),  # TensorRT profiles and their JetPack names, then Rockchip NPUs
    "--check-images": CHECK_LEVELS,
    "--sampler": SAMPLERS,
    "--precision": tuple(Precision),
}


def _choices(parser: argparse.ArgumentParser, where: str):
    """(where, option, choices) for every option with choices, subcommands included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _choices(sub, f"{where} {name}")
        elif action.choices is not None and action.option_strings:
            yield where, action.option_strings[-1], tuple(action.choices)


FOUND = [
    found
    for cli in CLIS
    for found in _choices(importlib.import_module(f"dfine_deploy.{cli}.cli").get_args_parser(), cli)
]


@pytest.mark.parametrize(("where", "option", "choices"), FOUND, ids=[f"{w} {o}" for w, o, _ in FOUND])
def test_each_options_choices_are_its_table(where, option, choices):
    if option == "--log-level":  # the names logging and uvicorn share, in no table of ours
        assert all(isinstance(logging.getLevelName(c.upper()), int) for c in choices)
        return
    assert option in TABLES, (
        f"{where} {option}: its choices {choices} are listed by hand; read them from a table"
    )
    assert choices == TABLES[option]


def test_the_tables_reach_the_options():
    assert {option for _, option, _ in FOUND} >= set(TABLES)
    assert [c for w, o, c in FOUND if o == "--target"] == [(*TARGET_NAMES, *PLATFORMS)]
    assert "rk3588" in PLATFORMS and "jetpack6" in TARGET_NAMES


@pytest.mark.parametrize(
    ("cli", "table", "option"),
    [("data", "CHECK_LEVELS", "--check-images"), ("export", "RKNN_PLATFORMS", "--target")],
)
def test_a_row_added_to_the_table_is_a_choice_at_once(cli, table, option, monkeypatch):
    module = importlib.import_module(f"dfine_deploy.{cli}.cli")
    monkeypatch.setattr(module, table, (*getattr(module, table), "new-row"))
    found = [c for _, o, c in _choices(module.get_args_parser(), cli) if o == option]
    assert found and all(c[-1] == "new-row" for c in found)
