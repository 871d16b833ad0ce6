"""`--target` is one table (`export/deploy_targets.py` `TARGETS`): its choices, help, option refusals,
tool check and the recipes that apply all come from the rows, so a row swapped or added here changes
what the CLI takes and refuses with no other edit. The rows of today's targets keep what the TensorRT
profiles and the Rockchip chips fixed and refused before the table."""

from __future__ import annotations

import dataclasses
import re

import pytest

from dfine_deploy.backend_names import BackendName
from dfine_deploy.errors import ExportError
from dfine_deploy.export import deploy_targets
from dfine_deploy.export.cli import get_args_parser
from dfine_deploy.export.cli import main as export_main
from dfine_deploy.export.deploy_targets import DeployTarget, Refusal, get_target
from dfine_deploy.export.pipeline import _check_options
from dfine_deploy.export.recipes import RECIPES
from dfine_deploy.export.settings import ExportSettings
from dfine_deploy.runtime import rknn_backend
from dfine_deploy.runtime.tensorrt_plan import INT8_GRAPH, PROFILES

NO_FP16 = Refusal(lambda s: None if s.fp16 else "--no-fp16", "the test chip runs FP16 only", "drop --no-fp16")


def _target_choices() -> tuple[str, ...]:
    action = next(a for a in get_args_parser()._actions if "--target" in a.option_strings)
    return tuple(action.choices)


def _target_help() -> str:
    action = next(a for a in get_args_parser()._actions if "--target" in a.option_strings)
    return action.help


def _settings(tmp_path, target: str | None, **change) -> ExportSettings:
    return ExportSettings(model="dfine-n", output=tmp_path / "out", target=target, **change)


def _applying(tmp_path, target: str | None, **change) -> list[str]:
    opts = _settings(tmp_path, target, **change)
    row = get_target(target) if target else None
    return [recipe.key for recipe in RECIPES if recipe.applies(opts, row)]


def test_the_choices_are_the_jetpack_names_the_tensorrt_lines_then_the_rockchip_chips():
    aliases = [alias for profile in PROFILES.values() for alias in profile.aliases]
    assert _target_choices() == (*aliases, *PROFILES, *rknn_backend.PLATFORMS)
    assert aliases[:4] == ["jetpack5", "jetpack6.0", "jetpack6", "jetpack7"]


def test_a_row_added_is_a_choice_with_its_help_and_its_refusals(tmp_path, monkeypatch, capsys):
    chip = dataclasses.replace(
        get_target("rk3588"), name="npu-test", help="a test NPU row", refuses=(NO_FP16,), tool_check=None
    )
    monkeypatch.setattr(deploy_targets, "TARGETS", (*deploy_targets.TARGETS, chip))
    assert _target_choices()[-1] == "npu-test"
    assert _target_help().endswith("npu-test: a test NPU row")
    code = export_main(["dfine-n", "--target", "npu-test", "--no-fp16", "-o", str(tmp_path / "a")])
    assert code == 2
    err = capsys.readouterr().err
    assert "--no-fp16 with --target npu-test: the test chip runs FP16 only; drop --no-fp16" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    # the recipes follow its backend: the Rockchip rows apply, the CPU graphs do not
    assert _applying(tmp_path, "npu-test") == ["fp32", "fp16", "rknn-fp16"]


def test_a_swapped_row_changes_what_the_cli_refuses(tmp_path, monkeypatch, capsys):
    """rk3588 takes --sampler grid and any --opset today; a row that fixes both refuses them."""
    before = get_target("rk3588")
    assert before.opset is None and before.sampler is None
    swapped = dataclasses.replace(
        before, opset=18, sampler="gather", sampler_why="the test NPU has no GridSample"
    )
    rows = tuple(swapped if row.name == "rk3588" else row for row in deploy_targets.TARGETS)
    monkeypatch.setattr(deploy_targets, "TARGETS", rows)
    assert _target_choices() == tuple(row.name for row in rows)
    assert export_main(["dfine-n", "--target", "rk3588", "--opset", "17", "-o", str(tmp_path / "a")]) == 2
    assert (
        "--opset 17 with --target rk3588: the target fixes opset 18; drop --opset" in capsys.readouterr().err
    )
    assert export_main(["dfine-n", "--target", "rk3588", "--sampler", "grid", "-o", str(tmp_path / "b")]) == 2
    assert (
        "--sampler grid with --target rk3588: the test NPU has no GridSample; drop --sampler"
        in capsys.readouterr().err
    )


def test_a_row_without_a_tool_check_asks_for_no_tool(tmp_path, monkeypatch):
    """The RKNN rows check the tool venv; the same row without its check goes on to the next option."""
    monkeypatch.setenv("DFINE_RKNN_PYTHON", str(tmp_path / "nope" / "python"))
    with pytest.raises(ExportError, match=r"rknn-toolkit2 runs in its own venv"):
        _check_options(_settings(tmp_path, "rk3576"))
    rows = tuple(
        dataclasses.replace(row, tool_check=None) if row.name == "rk3576" else row
        for row in deploy_targets.TARGETS
    )
    monkeypatch.setattr(deploy_targets, "TARGETS", rows)
    opts = _settings(tmp_path, "rk3576")
    assert _check_options(opts).name == "rk3576" and opts.opset == 17


@pytest.mark.parametrize("name", deploy_targets.target_names())
def test_each_target_fixes_and_refuses_what_it_did_before_the_table(tmp_path, monkeypatch, name):
    monkeypatch.setenv("DFINE_RKNN_PYTHON", str(tmp_path / "nope" / "python"))
    row = get_target(name)
    refused = {
        "--opset": {"opset": 18},
        "--sampler": {"sampler": "grid"},
        "--int8": {"int8": True},
        "--no-postprocess": {"postprocess": False},
        "--trt": {"trt": True},
        "--triton": {"triton": tmp_path / "triton"},
    }
    profile = next((p for p in PROFILES.values() if name == p.name or name in p.aliases), None)
    if profile is not None:  # a TensorRT line: it fixes the profile's graph and takes the NPU options
        assert (row.backend, row.profile, row.opset, row.sampler) == (
            BackendName.TENSORRT,
            profile,
            profile.opset,
            profile.sampler,
        )
        assert dict(row.io_dtypes) == dict(profile.io_dtypes) and row.tool_check is None
        expected = {"--opset", "--sampler"} | ({"--int8"} if profile.tensorrt.startswith("8.") else set())
    else:  # a Rockchip chip: any opset and sampler, no TensorRT or Triton, its tool venv checked
        assert name in rknn_backend.PLATFORMS and row.backend == BackendName.RKNN and row.profile is None
        assert row.opset is None and row.sampler is None and row.io_dtypes is None
        expected = {"--no-postprocess", "--trt", "--triton"}
    for option, change in refused.items():
        problems = [r.problem(_settings(tmp_path, name, **change), name) for r in row.refusals()]
        found = [p for p in problems if p is not None]
        if option in expected:
            assert len(found) == 1 and re.match(
                rf"^{re.escape(option)}( \S+)? with --target {name}: ", found[0]
            )
            with pytest.raises(
                ExportError, match=rf"^{re.escape(option)}( \S+)? with --target {re.escape(name)}: "
            ):
                _check_options(_settings(tmp_path, name, **change))
        else:
            assert found == [], f"--target {name} refuses {option}: {found}"


@pytest.mark.parametrize(
    ("target", "int8", "graphs"),
    [
        (None, False, ["fp32", "fp16", "fp32-grid"]),
        (None, True, ["fp32", "fp16", "fp32-grid", "int8"]),
        ("jetpack6", False, ["fp32", "fp16"]),
        ("trt11", True, ["fp32", "fp16", INT8_GRAPH]),
        ("rk3566", False, ["fp32", "fp16", "rknn-fp16"]),
        ("rk3588", True, ["fp32", "fp16", "rknn-fp16", "rknn-int8"]),
    ],
)
def test_the_graphs_written_per_target_are_those_of_before(tmp_path, target, int8, graphs):
    assert _applying(tmp_path, target, int8=int8) == graphs


def test_the_tensorrt_rows_describe_their_line_and_record_it_in_model_json():
    for row in deploy_targets.TARGETS:
        if row.profile is not None:
            assert row.describe == row.profile.describe()
            assert row.record == "dfine_deploy.export.sidecar:target_record"
        else:
            assert row.describe.startswith(f"--target {row.name}: Rockchip NPU") and row.record is None


def test_an_unknown_target_names_the_choices():
    with pytest.raises(
        ExportError, match=r"^--target jetpack4: unknown target; choose one of jetpack5, .*rk3562$"
    ):
        get_target("jetpack4")
    assert isinstance(get_target("jetpack7"), DeployTarget)
