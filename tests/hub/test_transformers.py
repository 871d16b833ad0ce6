"""Hugging Face transformers D-FINE folders, both ways, with transformers' own model as the oracle.

The transformers configs of D-FINE-N and -S below are the values transformers' conversion script
gives them (`get_d_fine_config` in src/transformers/models/d_fine/
convert_d_fine_original_pytorch_checkpoint_to_hf.py), written here, not produced by our code. The
models have random weights (transformers' init, then seeded noise on every learned tensor so that no
head is left at zero); nothing is downloaded. Outputs are compared in float64: in float32 the random
weights give near-tied query scores whose order the two implementations' last-bit differences swap
(measured on N: 123 of 300 rows in other places, every row still within 1e-6 of one of the other's).
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from transformers import DFineConfig, DFineForObjectDetection  # the dev extra installs it

from dfine_deploy.errors import CheckpointError
from dfine_deploy.hub.hf import export_hf
from dfine_deploy.hub.loader import load_model
from dfine_deploy.model.contracts import INPUT_CONTRACTS
from dfine_deploy.model.spec import SIZES

SIDE = 256
_B0 = {
    "hidden_sizes": [128, 256, 512, 1024],
    "stem_channels": [3, 16, 16],
    "stage_in_channels": [16, 64, 256, 512],
    "stage_mid_channels": [16, 32, 64, 128],
    "stage_out_channels": [64, 256, 512, 1024],
    "stage_num_blocks": [1, 1, 2, 1],
    "stage_downsample": [False, True, True, True],
    "stage_light_block": [False, False, True, True],
    "stage_kernel_size": [3, 3, 5, 5],
    "stage_numb_of_layers": [3, 3, 3, 3],
    "use_learnable_affine_block": True,
}
CONFIGS = {
    "n": (
        {**_B0, "out_indices": [3, 4]},
        {
            "num_feature_levels": 2,
            "encoder_ffn_dim": 512,
            "encode_proj_layers": [1],
            "d_model": 128,
            "encoder_hidden_dim": 128,
            "decoder_ffn_dim": 512,
            "encoder_in_channels": [512, 1024],
            "decoder_n_points": [6, 6],
            "decoder_in_channels": [128, 128],
            "feat_strides": [16, 32],
            "depth_mult": 0.5,
            "decoder_layers": 3,
            "hidden_expansion": 0.34,
        },
        ["cat", "dog", "bird"],
    ),
    "s": (
        _B0,
        {
            "decoder_layers": 3,
            "hidden_expansion": 0.5,
            "depth_mult": 0.34,
            "decoder_n_points": [3, 6, 3],
            "encoder_in_channels": [256, 512, 1024],
        },
        ["forklift", "pallet", "person", "helmet", "vest"],
    ),
}


def transformers_model(size: str) -> DFineForObjectDetection:
    backbone, overrides, names = CONFIGS[size]
    config = DFineConfig(
        **overrides,
        id2label=dict(enumerate(names)),
        label2id={n: i for i, n in enumerate(names)},
    )
    for key, value in backbone.items():
        setattr(config.backbone_config, key, value)
    torch.manual_seed(0)
    model = DFineForObjectDetection(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(torch.randn_like(param) * 0.02)
    return model


@pytest.fixture(scope="module", params=["n", "s"])
def folder(request, tmp_path_factory):
    """(size, the transformers folder, transformers' outputs on the images, the images)."""
    model = transformers_model(request.param)
    place = tmp_path_factory.mktemp(f"hf_{request.param}")
    model.save_pretrained(place)
    images = torch.rand(1, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        out = model.double()(pixel_values=images)
    return request.param, place, out, images


def test_a_transformers_folder_is_our_model(folder):
    size, place, out, images = folder
    loaded = load_model(place, imgsz=(SIDE, SIDE))
    assert loaded.spec.size == size
    assert loaded.spec == SIZES[size].with_classes(len(CONFIGS[size][2])).with_input_size(SIDE, SIDE)
    assert loaded.class_names == CONFIGS[size][2]
    with torch.no_grad():
        ours = loaded.model.double()(images)
    torch.testing.assert_close(ours["pred_logits"], out.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours["pred_boxes"], out.pred_boxes, atol=1e-5, rtol=0)


def test_ours_goes_back_to_transformers(folder, tmp_path):
    size, place, out, images = folder
    loaded = load_model(place, imgsz=(SIDE, SIDE))
    said = export_hf(loaded, tmp_path / "back")
    assert "from_pretrained loads it" in said
    again = DFineForObjectDetection.from_pretrained(tmp_path / "back").double().eval()
    assert again.config.id2label == dict(enumerate(CONFIGS[size][2]))
    with torch.no_grad():
        back = again(pixel_values=images)
    torch.testing.assert_close(back.logits, out.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(back.pred_boxes, out.pred_boxes, atol=1e-5, rtol=0)


def test_a_folder_of_another_model_type_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "rt_detr", "id2label": {"0": "a"}}))
    with pytest.raises(CheckpointError, match="model_type is 'rt_detr'; only transformers' 'd_fine'"):
        load_model(tmp_path)


def test_a_folder_saved_by_transformers_4_loads(tmp_path):
    """The Hub's D-FINE folders were saved by transformers 4.x, whose names transformers 5 renames on
    loading (its conversion_mapping.py, "d_fine"): out_proj, fc1/fc2, encoder.encoder.N."""
    from safetensors.torch import save_file

    model = transformers_model("n")
    old_names = [
        (r"\.o_proj\.", ".out_proj."),
        (r"layers\.(\d+)\.mlp\.layers\.0\.", r"layers.\1.fc1."),
        (r"layers\.(\d+)\.mlp\.layers\.1\.", r"layers.\1.fc2."),
        (r"^model\.encoder\.aifi\.(\d+)\.", r"model.encoder.encoder.\1."),
    ]
    state = {}
    for name, value in model.state_dict().items():
        for pattern, replacement in old_names:
            name = re.sub(pattern, replacement, name)
        state[name] = value.contiguous().clone()
    assert any(".fc1." in n for n in state) and any("encoder.encoder.0" in n for n in state)
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(model.config.to_json_string())
    images = torch.rand(1, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with torch.no_grad():
        expected = model.double()(pixel_values=images)
        ours = load_model(tmp_path, imgsz=(SIDE, SIDE)).model.double()(images)
    torch.testing.assert_close(ours["pred_logits"], expected.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours["pred_boxes"], expected.pred_boxes, atol=1e-5, rtol=0)


def test_a_config_naming_more_or_fewer_classes_than_the_weights_have_is_refused(folder, tmp_path):
    """id2label decides the class count of the model built; class heads of another count would be
    dropped on loading and the model would score fresh, untrained heads."""
    import shutil

    size, place, _, _ = folder
    names = CONFIGS[size][2]
    for count in (len(names) + 1, len(names) - 1):
        edited = tmp_path / f"classes_{count}"
        shutil.copytree(place, edited)
        config = json.loads((edited / "config.json").read_text())
        config["id2label"] = {str(i): f"class{i}" for i in range(count)}
        config["label2id"] = {f"class{i}": i for i in range(count)}
        (edited / "config.json").write_text(json.dumps(config))
        with pytest.raises(
            CheckpointError,
            match=rf"id2label names {count} classes, the weights' class heads have {len(names)}; list one",
        ):
            load_model(edited)


# ImageNet's mean and std, from ECDet's contract
IMAGENET = INPUT_CONTRACTS["ecdet"].network
IMAGENET_MEAN, IMAGENET_STD = list(IMAGENET.mean), list(IMAGENET.std)


@pytest.fixture(scope="module")
def detecting_folder(tmp_path_factory):
    """D-FINE-N with the weights of the official inference record (boxes spread over the image,
    decisive scores) written by `--hf`, with the contract images."""
    from benchmarks.dfine_vs_official_images import detecting_model

    place = tmp_path_factory.mktemp("hf_detecting")
    torch.save({"model": detecting_model().state_dict()}, place / "n.pth")
    export_hf(load_model(place / "n.pth"), place / "hf")
    return place / "hf"


def _transformers_detections(folder, processor) -> list:
    """transformers' own pipeline on the contract images: its image processor, its model, its
    post-processing, boxes in image pixels."""
    from benchmarks.official_parity import contract_images
    from dfine_deploy.runtime.detections import Detections

    model = DFineForObjectDetection.from_pretrained(folder).eval()
    found = []
    for pixels in contract_images():
        with torch.no_grad():
            out = model(**processor(images=pixels, return_tensors="pt"))
        (result,) = processor.post_process_object_detection(
            out, threshold=0.0, target_sizes=[pixels.shape[:2]]
        )
        names = [model.config.id2label[i] for i in range(len(model.config.id2label))]
        found.append(
            Detections.build(
                result["boxes"].numpy(), result["scores"].numpy(), result["labels"].numpy(), names
            )
        )
    return found


def _agreement_with_detector(folder, reference):
    from benchmarks.official_parity import TOP_DETECTIONS, contract_images
    from dfine_deploy.runtime.compare import compare_detections
    from dfine_deploy.runtime.detector import Detector

    ours = Detector.open(folder, backend="torch", device="cpu").predict(contract_images(), color="RGB")
    return compare_detections(reference, ours, top_k=TOP_DETECTIONS, iou_threshold=0.99)


def test_transformers_own_processor_and_model_on_our_folder_give_our_detections(detecting_folder):
    """The `--hf` folder's preprocessor_config.json gives transformers' own image processor the
    contract's pixels: its pipeline and our Detector find the same 50 best boxes per image."""
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(detecting_folder)
    assert type(processor).__name__.startswith("RTDetrImageProcessor")
    agreement = _agreement_with_detector(
        detecting_folder, _transformers_detections(detecting_folder, processor)
    )
    assert agreement.matched == agreement.compared == 100, agreement.to_dict()


def test_a_processor_that_normalises_gives_other_detections(detecting_folder):
    """The comparison above can fail: transformers' processor told to add ImageNet mean/std moves
    the boxes away from ours."""
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(
        detecting_folder, do_normalize=True, image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD
    )
    agreement = _agreement_with_detector(
        detecting_folder, _transformers_detections(detecting_folder, processor)
    )
    assert agreement.match_rate < 0.5, agreement.to_dict()


def test_a_folder_whose_processor_normalises_is_refused(detecting_folder, tmp_path):
    """Weights trained on other pixels than the contract's would be served wrongly: one line."""
    import shutil

    edited = tmp_path / "normalised"
    shutil.copytree(detecting_folder, edited)
    processor = json.loads((edited / "preprocessor_config.json").read_text())
    processor.update(do_normalize=True, image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD)
    (edited / "preprocessor_config.json").write_text(json.dumps(processor))
    with pytest.raises(CheckpointError, match="do_normalize True") as refused:
        load_model(edited)
    assert "\n" not in str(refused.value) and "preprocessor_config.json" in str(refused.value)
