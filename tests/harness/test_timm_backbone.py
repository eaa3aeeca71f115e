"""timm backbones: stages at evenly spaced depths of a ViT or a CNN, the model's own pooled
output last, local weights files (state_dict or safetensors), and clear errors."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

pytest.importorskip("timm")
import harness.methods  # noqa: F401, E402
import timm  # noqa: E402

from harness.backbones import build_backbone
from harness.cli import main
from harness.core import PROTOCOL_DIR, BackboneSpec, HarnessError

VIT = {"model": "vit_tiny_patch16_224", "img_size": 32}


def spec(pretrained: str = "none", weights_file: str = "", **params) -> BackboneSpec:
    return BackboneSpec(name="timm", input_size=32, pretrained=pretrained,
                        weights_file=weights_file, params=params)  # fmt: skip


def test_a_vit_gives_intermediate_blocks_then_its_cls_token():
    torch.manual_seed(0)
    backbone = build_backbone(spec(**VIT), 1)
    assert backbone.stage_dims == [192, 192, 192] and backbone.picks == [3, 7]  # of 12 blocks
    x = backbone.prepare(torch.randint(0, 255, (2, 1, 32, 32), dtype=torch.uint8))
    features = backbone(x)
    assert [f.shape for f in features] == [torch.Size([2, 192])] * 3
    net = backbone.stages[0]
    with torch.no_grad():  # the last stage is the model's own pooled output ([CLS], normed)
        assert torch.allclose(features[-1], net.forward_head(net.forward_features(x), True))
        tokens = net.blocks[:4](net._pos_embed(net.patch_embed(x)))  # block 3's output
        assert torch.allclose(features[0], tokens[:, net.num_prefix_tokens :].mean(1), atol=1e-5)


def test_a_cnn_gives_its_stages_and_one_stage_is_the_pooled_output():
    backbone = build_backbone(spec(model="resnet18"), 3)
    assert backbone.stage_dims == [64, 128, 512]  # feature_info: stem 64, layer1 64, layer2 128
    assert build_backbone(spec(model="resnet18", stages=1), 3).stage_dims == [512]


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_a_local_weights_file_is_loaded(tmp_path, suffix):
    torch.manual_seed(1)
    source = timm.create_model("vit_tiny_patch16_224", num_classes=0, img_size=32)
    path = tmp_path / f"w{suffix}"
    if suffix == ".pth":
        torch.save(source.state_dict(), path)
    else:
        from safetensors.torch import save_file

        save_file(source.state_dict(), str(path))
    torch.manual_seed(2)  # a different random init: the file must win
    backbone = build_backbone(spec("imagenet", str(path), **VIT), 3)
    loaded = backbone.stages[0].state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in source.state_dict().items())


def test_a_file_that_does_not_cover_a_classifier_model_is_an_error(tmp_path):
    """timm loads non-strictly when it drops a model's classifier (num_classes 0 here): its
    own file (classifier included) loads exactly, a foreign or empty one is an error."""
    torch.manual_seed(3)
    own = timm.create_model("resnet18")  # with its fc, as timm's pretrained file has it
    torch.save(own.state_dict(), tmp_path / "r18.pth")
    backbone = build_backbone(spec("imagenet", str(tmp_path / "r18.pth"), model="resnet18"), 3)
    loaded = backbone.stages[0].state_dict()
    assert all(torch.equal(v, own.state_dict()[k]) for k, v in loaded.items())
    torch.save({}, tmp_path / "empty.pth")
    torch.save(timm.create_model("vit_tiny_patch16_224").state_dict(), tmp_path / "vit.pth")
    for name in ("empty.pth", "vit.pth"):
        with pytest.raises(HarnessError, match=f"{name} does not fit resnet18: Missing keys"):
            build_backbone(spec("imagenet", str(tmp_path / name), model="resnet18"), 3)


def test_as_many_stages_as_the_model_has_are_distinct():
    backbone = build_backbone(spec(model="resnet18", stages=6), 3)  # feature_info: 5 entries
    assert backbone.picks == [0, 1, 2, 3, 4]
    x = backbone.prepare(torch.randint(0, 255, (2, 3, 32, 32), dtype=torch.uint8))
    features = backbone(x)
    assert [f.shape[1] for f in features] == backbone.stage_dims == [64, 64, 128, 256, 512, 512]


def test_timm_errors_are_one_line(tmp_path):
    with pytest.raises(HarnessError, match="needs params.model"):
        build_backbone(spec(), 3)
    with pytest.raises(HarnessError, match="unknown model 'vit_tiny_patch16_22'"):
        build_backbone(spec(model="vit_tiny_patch16_22"), 3)
    bad = tmp_path / "bad.pth"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(HarnessError, match="cannot load weights file .*state_dict"):
        build_backbone(spec("imagenet", str(bad), **VIT), 3)
    with pytest.raises(HarnessError, match="nope.pth does not exist"):
        build_backbone(spec("imagenet", str(tmp_path / "nope.pth"), **VIT), 3)
    from safetensors.torch import save_file

    cut = tmp_path / "cut.safetensors"
    save_file({"w": torch.zeros(100)}, str(cut))
    cut.write_bytes(cut.read_bytes()[:20])  # truncated: safetensors' own error type
    with pytest.raises(HarnessError, match="cannot load weights file .*cut.safetensors"):
        build_backbone(spec("imagenet", str(cut), **VIT), 3)
    with pytest.raises(HarnessError, match="stages must be 1..13"):
        build_backbone(spec(stages=20, **VIT), 3)


def test_hdc_cascades_over_a_vit(tmp_path):
    """HDC's three heads attach to the ViT's three stages; a short run trains and records."""
    data = yaml.safe_load((PROTOCOL_DIR / "smoke.yaml").read_text())
    data["backbone"] = {"name": "timm", "input_size": 32, "pretrained": "none", "params": VIT}
    path = tmp_path / "vit.yaml"
    path.write_text(yaml.safe_dump(data))
    args = ["-q", "run", "--protocol", str(path), "--method", "hdc_contrastive,contrastive",
            "--results-dir", str(tmp_path)]  # fmt: skip
    assert main(args) == 0
    for name in ("hdc_contrastive", "contrastive"):
        result = json.loads((tmp_path / f"runs/smoke/{name}/seed0.json").read_text())
        assert result["status"] == "ok" and result["training"]["steps"] == 4
        assert result["protocol"]["content"]["backbone"]["params"]["model"] == VIT["model"]
