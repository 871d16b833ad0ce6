"""-t carries class heads over by name: matching rules, the --head-map file, and the rows every
class-dependent tensor of a real D-FINE-N takes."""

from __future__ import annotations

import json
import re

import pytest
import torch

from dfine_deploy.class_names import coco_names, objects365_names
from dfine_deploy.errors import ConfigError
from dfine_deploy.model.spec import size_spec
from dfine_deploy.model.weights import CLASS_HEAD_PATTERN, DENOISING_EMBED
from dfine_deploy.training.heads import (
    OBJ365_IDS,
    SourceClasses,
    heads_table,
    load_tuning_weights,
    match_heads,
    read_head_map,
    source_classes,
)

SPEC = size_spec("n").with_input_size(128, 128)


def _model(classes: int, seed: int):
    from dfine_deploy.model.families import build_model

    torch.manual_seed(seed)
    return build_model(SPEC.with_classes(classes))


def _save(tmp_path, model, names=None, name="source.pth"):
    path = tmp_path / name
    state = {"model": model.state_dict()}
    if names is not None:
        state["meta"] = {"class_names": list(names)}
    torch.save(state, path)
    return path


def _class_keys(state):
    return [k for k in state if CLASS_HEAD_PATTERN.match(k)]


def test_the_obj365_table_and_the_objects365_names_agree():
    """OBJ365_IDS[i] is the Objects365 index of COCO class i: the names say the same for most pairs."""
    same = [
        c for c, row in zip(coco_names(), OBJ365_IDS) if c.casefold() == objects365_names()[row].casefold()
    ]
    assert len(same) >= 60 and "person" in same and "car" in same


def test_source_names_come_from_meta_or_the_official_class_counts():
    assert source_classes(
        {"class_names": ["a", "b"]}, {"decoder.enc_score_head.weight": torch.zeros(2, 4)}
    ) == (SourceClasses(("a", "b"), "the checkpoint's class names", True))
    coco = source_classes({}, {"decoder.enc_score_head.weight": torch.zeros(80, 4)})
    assert coco.named and coco.names[0] == "person" and "COCO" in coco.origin
    obj365 = source_classes({}, {"decoder.enc_score_head.weight": torch.zeros(366, 4)})
    assert obj365.named and obj365.names[1] == "Person" and "Objects365" in obj365.origin
    custom = source_classes({}, {"decoder.enc_score_head.weight": torch.zeros(5, 4)})
    assert not custom.named and custom.names == tuple(f"class_{i}" for i in range(5))
    assert source_classes({}, {}) is None


def test_matching_order_exact_then_loose_then_synonyms():
    source = source_classes({}, {"decoder.enc_score_head.weight": torch.zeros(80, 4)})
    target = list(
        enumerate(["person", "Potted_Plant", "motorbike", "aeroplane", "sofa", "tvmonitor", "star"])
    )
    got = {m.name: (m.source_name, m.how) for m in match_heads(target, source)}
    assert got == {
        "person": ("person", "exact"),
        "Potted_Plant": ("potted plant", "case/space"),
        "motorbike": ("motorcycle", "synonym"),
        "aeroplane": ("airplane", "synonym"),
        "sofa": ("couch", "synonym"),
        "tvmonitor": ("tv", "synonym"),
        "star": (None, "new"),
    }


def test_coco_names_find_their_objects365_rows_through_the_official_table():
    source = source_classes({}, {"decoder.enc_score_head.weight": torch.zeros(366, 4)})
    target = list(enumerate(["person", "tv", "teddy bear", "car"]))
    rows = {m.name: m.source_row for m in match_heads(target, source)}
    coco = coco_names()
    assert rows == {name: OBJ365_IDS[coco.index(name)] + 1 for name in rows}
    off = {m.name: m.source_row for m in match_heads(target, source, obj365_table=False)}
    assert off["tv"] is None and off["teddy bear"] is None and off["person"] == rows["person"]


def test_a_source_without_names_is_taken_by_position_only_at_the_same_count():
    source = SourceClasses(tuple(f"class_{i}" for i in range(3)), "no names", False)
    same = match_heads(list(enumerate("abc")), source)
    assert [(m.source_row, m.how) for m in same] == [(0, "position"), (1, "position"), (2, "position")]
    assert all(m.source_row is None for m in match_heads(list(enumerate("ab")), source))


def test_head_map_overrides_and_names_its_errors(tmp_path):
    source = SourceClasses(("cat", "dog", "bird"), "the checkpoint's class names", True)
    path = tmp_path / "map.yaml"
    path.write_text("puppy: dog\ncat: null\n")
    chosen = read_head_map(path, ["cat", "puppy", "bird"], source)
    got = {
        m.name: (m.source_name, m.how)
        for m in match_heads(list(enumerate(["cat", "puppy", "bird"])), source, head_map=chosen)
    }
    assert got == {"cat": (None, "new"), "puppy": ("dog", "head-map"), "bird": ("bird", "exact")}

    def refused(text: str, suffix: str = ".yaml") -> str:
        bad = tmp_path / f"bad{suffix}"
        bad.write_text(text)
        with pytest.raises(ConfigError) as info:
            read_head_map(bad, ["cat", "puppy", "bird"], source)
        message = str(info.value)
        assert "\n" not in message and str(bad) in message
        return message

    assert "'kitten' is not a class of the dataset" in refused("kitten: cat\n")
    assert "'dgo' is not a class of the source checkpoint" in refused("puppy: dgo\n") and "'dog'" in refused(
        "puppy: dgo\n"
    )
    assert "expected a mapping" in refused("- cat\n- dog\n")
    assert "not valid JSON" in refused("{puppy: dog", ".json")
    assert "give a source class name or null" in refused(json.dumps({"puppy": 3}), ".json")
    with pytest.raises(ConfigError, match="--head-map not found: .*absent.yaml"):
        read_head_map(tmp_path / "absent.yaml", ["cat"], source)


def test_every_class_tensor_takes_the_named_rows_of_a_real_objects365_model(tmp_path):
    """A 366-class D-FINE-N into a 4-class one: person, bicycle and tv (as 'tvmonitor') start from their
    Objects365 rows in every class-dependent tensor, 'star' and the padding row stay as built."""
    source = _model(366, seed=1)
    path = _save(tmp_path, source)
    target = _model(4, seed=2)
    fresh = {k: v.clone() for k, v in target.state_dict().items()}
    names = ["person", "bicycle", "star", "tvmonitor"]
    transfer = load_tuning_weights(target, path, list(enumerate(names)))

    theirs, mine = source.state_dict(), target.state_dict()
    rows = [objects365_names().index(n) + 1 for n in ("Person", "Bicycle", "Monitor/TV")]
    keys = _class_keys(mine)
    assert len(keys) == 2 + 2 * SPEC.decoder.num_layers + 1  # encoder head, each layer's head, denoising
    for key in keys:
        for label, row in zip((0, 1, 3), rows):
            assert torch.equal(mine[key][label], theirs[key][row]), (key, label)
        assert torch.equal(mine[key][2], fresh[key][2]), key  # 'star': fresh
    assert torch.equal(mine[DENOISING_EMBED][4], theirs[DENOISING_EMBED][366])  # padding row
    assert torch.equal(mine["backbone.stem.stem1.conv.weight"], theirs["backbone.stem.stem1.conv.weight"])
    assert not transfer.report.reinitialised
    assert [m.how for m in transfer.matches] == ["case/space", "case/space", "new", "synonym"]
    record = transfer.meta()
    assert record["source_classes"] == 366 and record["rows"][3]["source_row"] == rows[2]


def test_our_checkpoint_in_another_order_with_a_new_class(tmp_path):
    source = _model(3, seed=1)
    path = _save(tmp_path, source, names=["circle", "square", "triangle"])
    target = _model(3, seed=2)
    fresh = {k: v.clone() for k, v in target.state_dict().items()}
    transfer = load_tuning_weights(target, path, list(enumerate(["triangle", "hexagon", "circle"])))
    theirs, mine = source.state_dict(), target.state_dict()
    for key in _class_keys(mine):
        assert torch.equal(mine[key][0], theirs[key][2]) and torch.equal(mine[key][2], theirs[key][0]), key
        assert torch.equal(mine[key][1], fresh[key][1]), key
    table = heads_table(transfer.matches, transfer.source, str(path))
    assert re.search(r"\n +0  triangle +<- triangle \(2\)  \[exact\]\n +1  hexagon +new\n", table), table
    assert "2 of 3 classes start from the source's rows, 1 new" in table


def test_head_map_of_a_checkpoint_without_heads_is_refused(tmp_path):
    source = _model(3, seed=1)
    state = {k: v for k, v in source.state_dict().items() if not CLASS_HEAD_PATTERN.match(k)}
    path = tmp_path / "headless.pth"
    torch.save({"model": state}, path)
    (tmp_path / "map.yaml").write_text("a: b\n")
    with pytest.raises(ConfigError, match="has no class heads to map from"):
        load_tuning_weights(_model(2, seed=2), path, [(0, "a"), (1, "b")], head_map=tmp_path / "map.yaml")
    transfer = load_tuning_weights(_model(2, seed=2), path, [(0, "a"), (1, "b")])
    assert transfer.source is None and transfer.report.reinitialised
