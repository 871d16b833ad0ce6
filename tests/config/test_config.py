"""Config loading: includes, overrides, provenance, unknown keys, typed settings, shipped files."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest
import yaml

from dfine_deploy.config import Config, format_config, load_config, parse_override
from dfine_deploy.errors import ConfigError
from dfine_deploy.model.spec import SIZES

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
# configs/ecdet/ describe EdgeCrafter's ECDet, whose checkpoints load by their shapes; those files
# restate ECDET_SIZES and are held to it by tests/model/test_ecdet.py.
ALL_YAML = sorted(p for p in CONFIGS.rglob("*.yml") if p.parent.name != "ecdet")
SIZE_CONFIGS = sorted(p for p in ALL_YAML if p.parent.name != "include" and "dfine_hgnetv2_" in p.name)


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_a_voc_dataset_config_loads_with_its_root_as_the_dataset_folder(tmp_path):
    """VOCDetection's `root` is read as img_folder, where data/formats.py finds the VOC layout."""
    path = write(
        tmp_path,
        "voc.yml",
        """\
        val_dataloader:
          dataset: {type: VOCDetection, root: ./voc, ann_file: test.txt, label_file: label_list.txt}
    """,
    )
    val = load_config(path).val_data
    assert val.dataset_type == "VOCDetection" and Path(val.img_folder).name == "voc" and val.split == "val"


def test_yaml_merge_keys_are_read_as_yaml_reads_them(tmp_path):
    """`<<: *anchor` gives a mapping the anchor's keys, its own keys winning: no key given twice."""
    path = write(
        tmp_path,
        "merge.yml",
        """\
        val_dataloader: &loader
          total_batch_size: 8
          num_workers: 0
          shuffle: false
          dataset: {type: CocoDetection, img_folder: ./data/val, ann_file: ./data/val/annotations.json}
        train_dataloader:
          <<: *loader
          shuffle: true
    """,
    )
    train = load_config(path).train_data
    assert (train.total_batch_size, train.num_workers, train.shuffle) == (8, 0, True)


def test_a_key_set_twice_is_refused_with_file_line_and_key(tmp_path):
    """PyYAML keeps the last of two equal keys without a word; a config refuses them."""
    path = write(
        tmp_path,
        "dup.yml",
        """\
        epochs: 3
        HGNetv2:
          name: B0
          use_lab: true
          name: B2
    """,
    )
    with pytest.raises(
        ConfigError, match=r"dup.yml is not valid YAML: line 5: key 'name' is set twice.*line 3"
    ):
        load_config(path)
    # the same key in two different mappings, or in an include and its includer, is fine
    write(tmp_path, "base.yml", "epochs: 2\nema: {decay: 0.99}\n")
    ok = write(
        tmp_path, "ok.yml", "__include__: [base.yml]\nepochs: 3\noptimizer: {lr: 0.001}\nema: {start: 1}\n"
    )
    assert load_config(ok).raw["epochs"] == 3


# ------------------------------------------------------------------------------ shipped configs


def test_the_official_layout_is_shipped():
    names = {p.relative_to(CONFIGS).as_posix() for p in ALL_YAML}
    for size in "nsmlx":
        assert f"dfine/dfine_hgnetv2_{size}_coco.yml" in names
        assert f"dfine/custom/dfine_hgnetv2_{size}_custom.yml" in names
        assert f"dfine/objects365/dfine_hgnetv2_{size}_obj365.yml" in names
        assert f"dfine/objects365/dfine_hgnetv2_{size}_obj2coco.yml" in names
    for name in (
        "runtime.yml",
        "dfine/include/dataloader.yml",
        "dfine/include/optimizer.yml",
        "dfine/include/dfine_hgnetv2.yml",
        "dataset/coco_detection.yml",
        "dataset/custom_detection.yml",
        "dataset/synthetic_detection.yml",
        "quickstart/dfine_n_synthetic.yml",
    ):
        assert name in names


@pytest.mark.parametrize("path", ALL_YAML, ids=lambda p: p.relative_to(CONFIGS).as_posix())
def test_every_shipped_yaml_loads(path):
    cfg = load_config(path)
    assert cfg.train.epochs > 0
    assert cfg.train_data.total_batch_size > 0
    printed = format_config(cfg)  # the printed form, comments aside, is the merged YAML again
    assert yaml.safe_load("\n".join(x for x in printed.splitlines() if not x.startswith("#"))) == cfg.raw
    if cfg.describes_model and path.parent.name == "deim":  # DEIM's D-FINE: an official size's tensors, SiLU
        spec = cfg.model_spec
        assert spec.size is None and spec.decoder.activation == spec.decoder.mlp_act == "silu"
        assert cfg.train.criterion.losses == ("mal", "boxes", "local") and cfg.train.criterion.gamma == 1.5
    elif cfg.describes_model:
        spec = cfg.model_spec
        assert spec.size in SIZES
    else:  # fragments (dataset/, include/, runtime.yml) say clearly that they are not a network
        with pytest.raises(ConfigError, match="HGNetv2.name"):
            _ = cfg.model_spec


@pytest.mark.parametrize("size", "nsmlx")
def test_coco_configs_give_the_official_size_specs(size):
    """The spec read from the YAML equals the independently written table in model/spec.py."""
    cfg = load_config(CONFIGS / f"dfine/dfine_hgnetv2_{size}_coco.yml")
    assert cfg.model_spec == SIZES[size]


def test_recipe_values_read_from_the_files():
    """Spot checks against the official configs (https://github.com/Peterande/D-FINE, configs/dfine/)."""
    n = load_config(CONFIGS / "dfine/dfine_hgnetv2_n_coco.yml")
    assert n.train.epochs == 160 and n.train.stop_epoch == 148
    assert n.train.optimizer.lr == pytest.approx(8e-4)
    assert [g.lr for g in n.train.optimizer.params] == [4e-4, 4e-4, None]
    assert n.train_data.total_batch_size == 128 and n.val_data.total_batch_size == 256
    assert n.train_data.collate.base_size_repeat is None
    assert n.train.use_amp and n.train.use_ema  # optimizer.yml wins over runtime.yml
    assert n.train_data.remap_mscoco_category and n.model_spec.num_classes == 80
    x = load_config(CONFIGS / "dfine/dfine_hgnetv2_x_coco.yml")
    assert x.train.optimizer.weight_decay == pytest.approx(1.25e-4)
    assert x.train.ema_restart_decay == pytest.approx(0.9998)
    assert len(x.train.optimizer.params) == 2
    o2c = load_config(CONFIGS / "dfine/objects365/dfine_hgnetv2_s_obj2coco.yml")
    assert o2c.train.ema.warmups == 0 and o2c.train.lr_warmup_scheduler.warmup_duration == 0
    assert o2c.train_data.collate.base_size_repeat == 10
    assert load_config(CONFIGS / "dfine/objects365/dfine_hgnetv2_l_obj365.yml").model_spec.num_classes == 366
    ops = [op.type for op in n.train_data.transforms.ops]
    assert ops[:3] == ["RandomPhotometricDistort", "RandomZoomOut", "RandomIoUCrop"]
    assert n.train_data.transforms.policy.ops == tuple(ops[:3])
    assert "HGNetv2.pretrained" in n.ignored and "HGNetv2.local_model_dir" in n.ignored


def test_quickstart_recipe():
    cfg = load_config(CONFIGS / "quickstart/dfine_n_synthetic.yml")
    spec = cfg.model_spec
    # D-FINE-N weights (100 queries and 50 denoising queries change no weight) at 256 x 256
    assert spec.size == "n" and spec.eval_spatial_size == (256, 256) and spec.num_classes == 4
    assert spec.decoder.num_queries == 100 and spec.decoder.num_denoising == 50
    assert cfg.train_data.dataset_type == "SyntheticDetection"
    assert cfg.train_data.class_names == ("rectangle", "ellipse", "triangle", "ring")
    assert cfg.train_data.img_folder == str(Path("runs/synthetic/train").absolute())  # held absolute
    assert cfg.val_data.img_folder == str(Path("runs/synthetic/val").absolute())
    assert cfg.train.lr_scheduler.type == "FlatCosineLR"
    assert cfg.train.lr_warmup_scheduler.warmup_duration == 50
    assert cfg.train.use_ema and not cfg.train.use_amp
    assert cfg.train_data.total_batch_size == 8 and cfg.train_data.num_workers <= 1
    assert cfg.train_data.transforms.policy.epoch == 0 and cfg.train.stop_epoch == 0
    lrs = {g.lr or cfg.train.optimizer.lr for g in cfg.train.optimizer.params}
    assert lrs == {cfg.train.optimizer.lr} == {1e-3}  # backbone at the base lr


@pytest.mark.parametrize("size", ["n", "s"])
def test_coco_config_builds_its_model(size):
    from dfine_deploy.model.families import build_model

    spec = load_config(CONFIGS / f"dfine/dfine_hgnetv2_{size}_coco.yml").model_spec
    model = build_model(dataclasses.replace(spec, eval_spatial_size=(320, 320)))
    expected = {"n": 3_782_693, "s": 10_321_877}[size]  # the official README's model table
    assert sum(p.numel() for p in model.parameters()) == expected


# ------------------------------------------------------------------------------------- includes


def test_includes_relative_nested_and_order(tmp_path):
    write(
        tmp_path,
        "base/common.yml",
        """
        epochs: 10
        print_freq: 5
        optimizer: {lr: 0.1, betas: [0.8, 0.9]}
    """,
    )
    write(
        tmp_path,
        "base/mid.yml",
        """
        __include__: ['common.yml']
        epochs: 20
        optimizer: {weight_decay: 0.5}
    """,
    )
    write(
        tmp_path,
        "other/late.yml",
        """
        print_freq: 7
        optimizer: {betas: [0.7, 0.99]}
    """,
    )
    top = write(
        tmp_path,
        "exp/top.yml",
        """
        __include__: ['../base/mid.yml', '../other/late.yml']
        checkpoint_freq: 3
    """,
    )
    cfg = load_config(top)
    assert cfg.train.epochs == 20  # mid overrides the file it includes
    assert cfg.train.print_freq == 7  # a later include overrides an earlier one
    assert cfg.train.checkpoint_freq == 3
    opt = cfg.train.optimizer
    assert (opt.lr, opt.weight_decay, opt.betas) == (0.1, 0.5, (0.7, 0.99))  # dicts merge deep
    assert "__include__" not in cfg.raw
    # provenance follows each key to the file that set it last
    assert cfg.provenance["epochs"].endswith("mid.yml")
    assert cfg.provenance["optimizer.lr"].endswith("common.yml")
    assert cfg.provenance["optimizer.betas"].endswith("late.yml")
    assert cfg.provenance["checkpoint_freq"].endswith("top.yml")


def test_the_including_file_wins_and_lists_replace(tmp_path):
    write(
        tmp_path,
        "a.yml",
        "eval_spatial_size: [640, 640]\noptimizer: {params: [{params: x, lr: 1}, {params: y}]}\n",
    )
    top = write(tmp_path, "b.yml", "__include__: [a.yml]\noptimizer: {params: [{params: z}]}\n")
    cfg = load_config(top)
    assert [g.pattern for g in cfg.train.optimizer.params] == ["z"]


def test_loading_twice_does_not_leak_keys(tmp_path):
    """The official loader's mutable default dict made a second load inherit the first's keys."""
    first = write(tmp_path, "first.yml", "seed: 3\n")
    second = write(tmp_path, "second.yml", "epochs: 2\n")
    load_config(first)
    assert "seed" not in load_config(second).raw


def test_include_errors(tmp_path):
    top = write(tmp_path, "top.yml", "__include__: ['missing.yml']\n")
    with pytest.raises(ConfigError, match=r"top.yml.*missing.yml.*does not exist"):
        load_config(top)
    write(tmp_path, "x.yml", "__include__: ['y.yml']\n")
    write(tmp_path, "y.yml", "__include__: ['x.yml']\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "x.yml")
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yml")
    bad = write(tmp_path, "bad.yml", "epochs: [1,\n")
    with pytest.raises(ConfigError, match="bad.yml is not valid YAML"):
        load_config(bad)
    scalar = write(tmp_path, "scalar.yml", "- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(scalar)


def test_yaml_is_read_safely(tmp_path):
    evil = write(tmp_path, "evil.yml", "epochs: !!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(evil)


# ------------------------------------------------------------------------------------ overrides


def test_overrides_are_yaml_typed_and_last(tmp_path):
    path = write(tmp_path, "c.yml", "epochs: 10\ntrain_dataloader: {total_batch_size: 4}\n")
    cfg = load_config(
        path,
        [
            "epochs=12",
            "train_dataloader.total_batch_size=16",
            "use_amp=false",
            "optimizer.betas=[0.5, 0.6]",
            "output_dir=runs/x",
            "train_dataloader.collate_fn.base_size_repeat=~",
        ],
    )
    assert cfg.train.epochs == 12 and isinstance(cfg.raw["epochs"], int)
    assert cfg.train_data.total_batch_size == 16
    assert cfg.train.use_amp is False
    assert cfg.train.optimizer.betas == (0.5, 0.6)
    assert cfg.train.output_dir == str(Path("runs/x").absolute())  # held absolute
    assert cfg.train_data.collate.base_size_repeat is None
    assert cfg.provenance["epochs"] == "-u epochs=12"
    assert parse_override("a.b.c= {x: 1}") == (("a", "b", "c"), {"x": 1})


@pytest.mark.parametrize("bad", ["epochs", "=3", "a..b=1", "epochs=[1,"])
def test_malformed_overrides(tmp_path, bad):
    path = write(tmp_path, "c.yml", "epochs: 10\n")
    with pytest.raises(ConfigError, match="override"):
        load_config(path, [bad])


def test_override_below_a_scalar(tmp_path):
    path = write(tmp_path, "c.yml", "epochs: 10\n")
    with pytest.raises(ConfigError, match="'epochs' holds a int"):
        load_config(path, ["epochs.x=1"])


# ---------------------------------------------------------------------------------- bad keys


def test_typo_names_key_file_and_nearest(tmp_path):
    write(tmp_path, "inc/model.yml", "HGNetv2:\n  name: B0\n  retrun_idx: [1, 2, 3]\n")
    top = write(tmp_path, "top.yml", "__include__: ['inc/model.yml']\nepochs: 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(top)
    message = str(info.value)
    assert "HGNetv2.retrun_idx" in message
    assert str(tmp_path / "inc" / "model.yml") in message
    assert "did you mean 'HGNetv2.return_idx'" in message


def test_typo_in_an_override_names_the_override(tmp_path):
    path = write(tmp_path, "c.yml", "epochs: 10\n")
    with pytest.raises(
        ConfigError,
        match=r"train_dataloader.total_batch_szie.*-u train_dataloader.total_batch_szie=8.*total_batch_size",
    ):
        load_config(path, ["train_dataloader.total_batch_szie=8"])


def test_typo_in_a_shipped_file_copy(tmp_path):
    """A user's copy of an official size file with one misspelt top-level key."""
    text = (CONFIGS / "dfine/dfine_hgnetv2_s_coco.yml").read_text()
    text = text.replace("../", str(CONFIGS) + "/").replace("./include", str(CONFIGS / "dfine/include"))
    text = text.replace("epochs:", "epoch:")
    path = write(tmp_path, "mine.yml", text)
    with pytest.raises(ConfigError, match=r"unknown key 'epoch' \(from .*mine.yml\); did you mean 'epochs'"):
        load_config(path)


def test_typo_in_a_list_entry_and_a_transform(tmp_path):
    path = write(tmp_path, "c.yml", "optimizer: {params: [{params: x, weight_decya: 0}]}\n")
    with pytest.raises(ConfigError, match=r"optimizer.params.0.weight_decya.*weight_decay"):
        load_config(path)
    path = write(
        tmp_path,
        "t.yml",
        """
        train_dataloader:
          dataset:
            transforms:
              ops:
                - {type: RandomHorizontalFlp}
    """,
    )
    with pytest.raises(
        ConfigError,
        match=r"ops.0.type.*t.yml.*unknown transform 'RandomHorizontalFlp'"
        r".*did you mean 'RandomHorizontalFlip'",
    ):
        load_config(path)


def test_epoches_spelling_is_accepted(tmp_path):
    assert load_config(write(tmp_path, "e.yml", "epoches: 9\n")).train.epochs == 9
    with pytest.raises(ConfigError, match="epoches"):
        load_config(write(tmp_path, "both.yml", "epoches: 9\nepochs: 10\n"))


def test_wrong_types_and_fixed_values(tmp_path):
    with pytest.raises(ConfigError, match=r"'epochs' \(from .*c.yml\) must be an integer; found 'ten'"):
        load_config(write(tmp_path, "c.yml", "epochs: ten\n"))
    with pytest.raises(ConfigError, match=r"use_amp.*true or false"):
        load_config(write(tmp_path, "d.yml", "use_amp: 1\n"))
    with pytest.raises(ConfigError, match=r"HybridEncoder.act.*'silu'"):
        load_config(write(tmp_path, "e.yml", "HybridEncoder: {act: relu}\n"))
    with pytest.raises(ConfigError, match=r"lr_scheduler.*FlatCosineLR"):
        load_config(write(tmp_path, "f.yml", "lr_scheduler: {type: FlatCosine}\n"))


def test_inconsistent_architecture_is_named(tmp_path):
    text = (CONFIGS / "dfine/dfine_hgnetv2_s_coco.yml").read_text()
    text = text.replace("../", str(CONFIGS) + "/").replace("./include", str(CONFIGS / "dfine/include"))
    path = write(tmp_path, "s.yml", text)
    with pytest.raises(
        ConfigError, match=r"HybridEncoder.in_channels.*B2 stages \[1, 2, 3\] give \[384, 768, 1536\]"
    ):
        load_config(path, ["HGNetv2.name=B2"])
    with pytest.raises(ConfigError, match="eval_spatial_size.*multiples of 32"):
        load_config(path, ["eval_spatial_size=[300, 320]"])
    spec = load_config(path, ["eval_spatial_size=[480, 640]", "num_classes=3"]).model_spec
    assert spec.eval_spatial_size == (480, 640) and spec.num_classes == 3 and spec.size == "s"


# ------------------------------------------------------------------------------- round trip


def test_to_dict_from_dict_round_trip(tmp_path):
    cfg = load_config(CONFIGS / "quickstart/dfine_n_synthetic.yml", ["epochs=2"])
    stored = yaml.safe_load(yaml.safe_dump(cfg.to_dict()))  # what a checkpoint keeps
    again = Config.from_dict(stored)
    assert again.model_spec == cfg.model_spec
    assert again.train == cfg.train
    assert again.train_data == cfg.train_data and again.val_data == cfg.val_data
    stored["HGNetv2"]["nmae"] = "B0"
    with pytest.raises(ConfigError, match=r"HGNetv2.nmae.*<checkpoint>.*HGNetv2.name"):
        Config.from_dict(stored)


def test_format_config_shows_values_origins_and_ignored():
    cfg = load_config(CONFIGS / "dfine/dfine_hgnetv2_n_coco.yml", ["epochs=3"])
    text = format_config(cfg)
    assert "epochs: 3  # -u epochs=3" in text
    assert "dfine_hgnetv2_n_coco.yml" in text and "include/dfine_hgnetv2.yml" in text
    assert "pretrained: true" in text and "(ignored)" in text
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    # without the comments it is the merged YAML again
    assert yaml.safe_load(body) == cfg.raw


def _yolo_dataset(root: Path) -> Path:
    """An Ultralytics layout under root: data.yaml, images/{train,val}/a.png, labels/{train,val}/a.txt."""
    from PIL import Image

    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        Image.new("RGB", (40, 30), (90, 90, 90)).save(root / "images" / split / "a.png")
        (root / "labels" / split / "a.txt").write_text("1 0.5 0.5 0.5 0.5\n")
    (root / "data.yaml").write_text("train: images/train\nval: images/val\nnames: [ring, star]\n")
    return root / "data.yaml"


@pytest.mark.parametrize(
    "train_folder, val_folder",
    [("train", "val"), ("images/train", "images/val"), ("train", "valid")],
    ids=["split-names", "folders-below-the-root", "a-tool-s-split-word"],
)
@pytest.mark.parametrize("working_folder", ["the-config-s", "another"])
def test_a_yolo_config_s_img_folder_is_a_split_name_or_a_folder_from_any_working_folder(
    tmp_path, monkeypatch, train_folder, val_folder, working_folder
):
    """YOLODetection's img_folder names a split of its data.yaml (the official layout) or an images
    folder below its root: held as written for the layout, not as a folder of the working folder,
    so training and --test-only build both loaders wherever they are started."""
    from dfine_deploy.data.loader import build_dataset
    from dfine_deploy.training.build import load_train_annotations

    _yolo_dataset(tmp_path / "yolo")
    write(
        tmp_path,
        "yolo.yml",
        f"""\
        train_dataloader:
          dataset: {{type: YOLODetection, img_folder: {train_folder}, ann_file: ./yolo/data.yaml}}
        val_dataloader:
          dataset: {{type: YOLODetection, img_folder: {val_folder}, ann_file: ./yolo/data.yaml}}
    """,
    )
    monkeypatch.chdir(tmp_path)
    cfg = load_config("yolo.yml")
    if working_folder == "another":
        (tmp_path / "elsewhere").mkdir()
        monkeypatch.chdir(tmp_path / "elsewhere")
    train = load_train_annotations(cfg)
    val = build_dataset(cfg.val_data, policy=None)
    assert [r.file_name for r in train.records] == ["a.png"] and len(val) == 1
    assert val.img_folder == tmp_path / "yolo" / "images" / "val"
    assert val.load_item(0)[1]["labels"].tolist() == [1]


def test_a_yolo_img_folder_that_is_there_is_held_as_the_folder_it_names(tmp_path, monkeypatch):
    """An images folder given from the working folder is that folder, and a COCO img_folder is a path
    whatever it is called."""
    _yolo_dataset(tmp_path / "yolo")
    write(
        tmp_path,
        "yolo.yml",
        """\
        train_dataloader:
          dataset: {type: YOLODetection, img_folder: yolo/images/train, ann_file: yolo/data.yaml}
        val_dataloader:
          dataset: {type: CocoDetection, img_folder: val, ann_file: ./coco/val.json}
    """,
    )
    monkeypatch.chdir(tmp_path)
    cfg = load_config("yolo.yml")
    assert cfg.train_data.img_folder == str(tmp_path / "yolo" / "images" / "train")
    assert cfg.val_data.img_folder == str(tmp_path / "val")
