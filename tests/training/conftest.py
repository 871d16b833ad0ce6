"""The one short training run several test modules read (and must not change)."""

from __future__ import annotations

import contextlib
import io

import pytest
from trainer_helpers import make_dataset, options, write_config


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """(config, output folder, printed text) of `--use-amp --seed 3` over 2 epochs of 1 step each."""
    from dfine_deploy.training.trainer import run

    root = tmp_path_factory.mktemp("tiny")
    data = make_dataset(root / "data", images=2, val_images=1)
    cfg = write_config(root, data, epochs=2, batch=2)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        run(options("-c", str(cfg), "--use-amp", "--no-progress", "--seed", "3"))
    return cfg, root / "out", printed.getvalue()
