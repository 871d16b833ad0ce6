"""EdgeCrafter's ECDet as built here (dfine_deploy/model/ecdet.py) against facts recorded from the
official code by benchmarks/ecdet_vs_official.py (tests/data/ecdet/official.json): tensor names, shapes
and order, parameter counts, GFLOPs, and ECDet-S's eval outputs on the parity weights; and the family's
input contract (model/contracts.py). Neither EdgeCrafter's code nor its weights are needed here; its
own inference is compared with ours in tests/export/test_export_ecdet.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from benchmarks.ecdet_vs_official import RECORD, fill_ecdet, listing, listing_sha256
from benchmarks.official_parity import deterministic_images, match_eval_slices
from dfine_deploy.errors import ModelError
from dfine_deploy.hub.cli import main as info_main
from dfine_deploy.model.contracts import INPUT_CONTRACTS, input_contract
from dfine_deploy.model.dfine import DeployModel
from dfine_deploy.model.ecdet import build_ecdet
from dfine_deploy.model.ecdet_spec import ECDET_SIZE_NAMES, ECDET_SIZES
from dfine_deploy.model.postprocess import PostProcessor

REPO = Path(__file__).resolve().parents[2]
OFFICIAL = json.loads(RECORD.read_text())["sizes"]


@pytest.mark.parametrize("size", ECDET_SIZE_NAMES)
def test_ecdet_has_the_official_tensors_and_parameter_count(size):
    model = build_ecdet(ECDET_SIZES[size])
    state = model.state_dict()
    recorded = OFFICIAL[size]
    assert sum(p.numel() for p in model.parameters()) == recorded["params"]
    assert len(state) == recorded["tensors"]
    if size == "s":
        assert listing(state) == recorded["listing"]
    assert listing_sha256(state) == recorded["listing_sha256"]


def _merged(path: Path) -> dict:
    """An official-layout file with its __include__ chain merged (later files override)."""
    data = yaml.safe_load(path.read_text())
    merged: dict = {}
    for include in data.pop("__include__", []):
        _merge(merged, _merged((path.parent / include).resolve()))
    _merge(merged, data)
    return merged


def _merge(into: dict, new: dict) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


@pytest.mark.parametrize("size", ECDET_SIZE_NAMES)
def test_ecdet_configs_state_the_sizes_table(size):
    cfg = _merged(REPO / "configs" / "ecdet" / f"ecdet_{size}.yml")
    spec = ECDET_SIZES[size]
    vit, enc, dec = spec.backbone, spec.encoder, spec.decoder
    adapter = cfg["ViTAdapter"]
    assert (adapter["name"], adapter["embed_dim"], adapter["num_heads"]) == (
        vit.name,
        vit.embed_dim,
        vit.num_heads,
    )
    assert adapter.get("proj_dim") == vit.proj_dim and adapter.get("ffn_ratio", 4) == vit.ffn_ratio
    assert tuple(adapter["interaction_indexes"]) == vit.interaction_indexes
    encoder = cfg["HybridEncoder"]
    for key in ("hidden_dim", "dim_feedforward", "expansion", "depth_mult", "nhead", "num_encoder_layers"):
        assert encoder[key] == getattr(enc, key), key
    assert tuple(encoder["in_channels"]) == enc.in_channels and encoder["act"] == enc.enc_act
    assert (encoder["csp_type"], encoder["fuse_op"]) == ("csp2", "sum")  # what ECHybridEncoder builds
    decoder = cfg["ECTransformer"]
    for key in (
        "hidden_dim",
        "dim_feedforward",
        "num_layers",
        "num_queries",
        "reg_max",
        "reg_scale",
        "num_levels",
    ):
        assert decoder[key] == getattr(dec, key), key
    assert (
        tuple(decoder["num_points"]) == dec.num_points
        and tuple(decoder["feat_channels"]) == dec.feat_channels
    )
    assert decoder["activation"] == dec.activation == dec.mlp_act
    assert tuple(cfg["eval_spatial_size"]) == spec.eval_spatial_size


def test_ecdet_s_eval_outputs_match_the_official_code():
    """Filled by the parity rule, ECDet-S gives the official code's recorded eval outputs within 1e-5."""
    recorded = OFFICIAL["s"]
    model = build_ecdet(ECDET_SIZES["s"])
    assert fill_ecdet(model) == recorded["filled_tensors"]
    with torch.no_grad():
        out = model.eval()(deterministic_images())
    result = match_eval_slices(
        recorded["eval"], out["pred_logits"], out["pred_boxes"], atol=1e-5, rtol_sums=1e-5
    )
    assert result.ok, result.report()


def test_dfine_info_reads_an_official_ecdet_checkpoint(tmp_path, capsys):
    """EdgeCrafter's released files hold `model` (the official training form): recognised by its tensor
    shapes, named ecdet-s, with the official parameter count and GFLOPs (README: 10 M, 26 GFLOPs)."""
    torch.manual_seed(0)
    path = tmp_path / "ecdet_s.pth"
    torch.save({"model": build_ecdet(ECDET_SIZES["s"]).state_dict()}, path)
    assert info_main([str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["model"] == "ecdet-s" and shown["params"] == OFFICIAL["s"]["params"]
    assert shown["gflops"] == pytest.approx(OFFICIAL["s"]["gflops"], abs=0.01)
    assert round(shown["params"] / 1e6) == 10 and round(shown["gflops"]) == 26


def test_a_family_without_an_input_contract_is_refused(monkeypatch):
    """The graph wrapper takes the family's normalisation from its contract; without one it refuses
    in one line instead of feeding D-FINE's pixels."""
    monkeypatch.delitem(INPUT_CONTRACTS, "ecdet")
    model = build_ecdet(ECDET_SIZES["s"])
    with pytest.raises(ModelError, match="model family 'ecdet' has no input contract") as refused:
        DeployModel(model, PostProcessor(80))
    assert "\n" not in str(refused.value)


def test_ecdets_input_contract_comes_from_the_recorded_edgecrafter_commit():
    """The contract's source is the commit the inference facts were recorded from, and its
    mean/std are the ones EdgeCrafter's own preprocessing applied there."""
    record = json.loads(RECORD.read_text())
    contract = input_contract("ecdet")
    assert any(f"EdgeCrafter@{record['commit'][:7]} " in source for source in contract.sources)
    assert contract.network.normalises and not input_contract("dfine").network.normalises
