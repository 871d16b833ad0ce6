"""Every option of every console script that takes a fixed set of values lists the table that holds
them, so a row added to a table is a choice at once and a choice is never spelled twice."""

from __future__ import annotations

import argparse
import importlib
import logging

import pytest

from dfine_deploy.backend_names import Precision
from dfine_deploy.data.moving import CODECS, SCENES
from dfine_deploy.data.validation import CHECK_LEVELS
from dfine_deploy.export import deploy_targets
from dfine_deploy.model.spec import SAMPLERS

CLIS = ("bench", "data", "export", "serve", "training", "verify")
TABLES = {
    "--target": deploy_targets.target_names(),  # JetPack names, TensorRT lines, then Rockchip NPUs
    "--check-images": CHECK_LEVELS,
    "--sampler": SAMPLERS,
    "--precision": tuple(Precision),
    "--scene": tuple(SCENES),
    "--codec": CODECS,
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
    assert [c for w, o, c in FOUND if o == "--target"] == [deploy_targets.target_names()]
    assert {"rk3588", "jetpack6", "trt11"} <= set(deploy_targets.target_names())


def test_a_row_added_to_the_table_is_a_choice_at_once(monkeypatch):
    module = importlib.import_module("dfine_deploy.data.cli")
    monkeypatch.setattr(module, "CHECK_LEVELS", (*module.CHECK_LEVELS, "new-row"))
    found = [c for _, o, c in _choices(module.get_args_parser(), "data") if o == "--check-images"]
    assert found and all(c[-1] == "new-row" for c in found)
    # --target: tests/export/test_deploy_targets.py adds and swaps rows of its table
