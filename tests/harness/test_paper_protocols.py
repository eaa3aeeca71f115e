"""The papers' and the fair protocols: each trains two steps on its miniature archive; local
ImageNet weights files; no silent fallback to random weights; the paper comparison table."""

from __future__ import annotations

import json
import re
import urllib.error
from pathlib import Path

import miniature_archives as mini
import pytest
import torch
import yaml

from harness.backbones import build_backbone
from harness.cli import main
from harness.core import PROTOCOL_DIR, BackboneSpec, HarnessError, load_protocol
from harness.records import MethodInfo, ProtocolInfo, RunResult
from harness.report.leaderboard import paper_comparison

PAPER_PROTOCOLS = sorted(
    p.stem for p in PROTOCOL_DIR.glob("*.yaml") if p.stem.split("_")[0] in
    ("pddm", "hdc", "lifted", "quadruplet", "fair", "modern")
)  # fmt: skip


def test_the_issue_protocols_are_shipped():
    expected = {"pddm_cub200", "pddm_cars196", "hdc_cars196", "hdc_cub200", "hdc_sop",
                "hdc_inshop", "lifted_cub200", "lifted_cars196", "lifted_sop",
                "quadruplet_cars196"} | {f"fair_{d}" for d in mini.BUILDERS}  # fmt: skip
    assert expected <= set(PAPER_PROTOCOLS)
    for name in PAPER_PROTOCOLS:
        p = load_protocol(name)
        assert p.backbone.pretrained == "imagenet" and p.split.official, name
        # NMI and F1 as the published tables compute them (version 2 made it so)
        assert p.evaluation.clustering == "faiss", name
        assert p.version >= 2 or name.startswith("modern_"), name
        if name.startswith("fair_"):
            assert (p.backbone.name, p.embedding_dim, p.sampler.batch_size, p.seeds) == (
                "resnet50", 128, 112, [0, 1, 2]) and p.backbone.frozen_batchnorm  # fmt: skip
            assert p.split.validation_fraction > 0
            # torchvision's standard pipeline (v4): random resized crop + flip from the
            # original image; the shorter side resized to 256 and the center crop at test
            assert [o.op for o in p.augmentation.train] == [
                "random_resized_crop",
                "horizontal_flip",
            ]
            assert [(o.op, o.size) for o in p.augmentation.test] == [
                ("resize_shorter", 256),
                ("center_crop", 224),
            ]
            assert p.augmentation.load == "original" and p.version >= 4
            assert p.backbone.channels_last  # the fast layout of CNNs on CUDA


def test_the_modern_protocols_are_the_two_modern_settings():
    """ResNet-50 at 512-d (Proxy-Anchor's setting) and ViT-S/16 DINO at 384-d (Hyp-ViT's) on
    CUB, CARS and SOP: bf16, the standard crops, published Recall@1 where recorded."""
    for data in ("cub200", "cars196", "sop"):
        r50, vit = load_protocol(f"modern_r50_{data}"), load_protocol(f"modern_vit_{data}")
        assert (r50.backbone.name, r50.embedding_dim) == ("resnet50", 512)
        assert (vit.backbone.params["model"], vit.embedding_dim) == (
            "vit_small_patch16_224.dino",
            384,
        )
        for p in (r50, vit):
            assert p.precision == "bf16" and p.augmentation.train[0].op == "random_resized_crop"
            assert p.augmentation.load == "original"  # crops from the original image (v2)
        assert vit.augmentation.train[0].interpolation == "bicubic"  # as the authors' code
        assert vit.paper.reference == "hyp_vit_cvpr2022"
        assert r50.paper.reference == ("" if data == "sop" else "proxy_anchor_cvpr2020")
    for name in PAPER_PROTOCOLS:
        if name.startswith("fair_"):
            assert load_protocol(name).precision == "bf16", name


def test_older_protocols_keep_their_hashes():
    """New protocol fields (official splits, weights files, paper references, select_by,
    evaluation.clustering, backbone.channels_last) are left out of the hash at their defaults.
    Pinned at version 2 of smoke (the LDA score joined the default metric list), version 3 of
    regression (75 steps, 4 seeds) and of default (3 seeds in about 10 minutes); learning and
    omniglot as they were before clustering came."""
    assert load_protocol("default").hash == "f32425b568bbdd7f"
    assert load_protocol("smoke").hash == "8e0660117b43d4e7"
    assert load_protocol("regression").hash == "c0a372a16735bd53"
    assert load_protocol("learning").hash == "a23be857de690a7d"
    assert load_protocol("omniglot").hash == "dbf1b2b5312a24d6"
    for name in ("default", "smoke", "regression", "learning", "omniglot"):
        assert load_protocol(name).evaluation.clustering == "harness"


@pytest.fixture(scope="module")
def archives(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("paper-protocols")
    for name, build in mini.BUILDERS.items():
        build(root / name)
    return root


def _cpu_copy(name: str, folder: Path, pretrained: str = "none") -> Path:
    """The protocol at 32 px and 2 x 2 batches (the miniature archives have 3 images of 5
    training classes), said explicitly: a test copy, never a silent fallback."""
    data = yaml.safe_load((PROTOCOL_DIR / f"{name}.yaml").read_text())
    data["backbone"].update(input_size=32, pretrained=pretrained)
    if data["backbone"]["name"] == "timm":  # a ViT at 32 px: its position embedding too
        data["backbone"]["params"]["img_size"] = 32
    if "augmentation" in data:  # the 256 -> 224 px pipelines, at 36 -> 32 px
        aug = data["augmentation"]
        if aug.get("load") != "original":
            aug["load_size"] = 36
        for op in aug["train"] + aug["test"]:
            if "size" in op:
                op["size"] = 36 if op["op"] == "resize_shorter" and op["size"] > 224 else 32
    data["sampler"] = {"classes_per_batch": 2, "images_per_class": 2}
    if data["split"].get("validation_fraction"):  # 2 of the 5 classes: a part needs 2
        data["split"]["validation_fraction"] = 0.4
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("name", PAPER_PROTOCOLS)
def test_protocol_runs_two_steps_on_its_miniature_archive(name, archives, tmp_path):
    protocol = load_protocol(name)
    path = _cpu_copy(name, tmp_path)
    results = tmp_path / "results"
    # --workers 0: in-process loading (worker processes cost ~15 s to start here; they are
    # tested in test_augment.py and cost/test_pipeline.py)
    code = main(["-q", "run", "--protocol", str(path), "--method", "contrastive",
                 "--data-root", str(archives / protocol.dataset.name), "--max-steps", "2",
                 "--device", "cpu", "--workers", "0", "--results-dir", str(results)])  # fmt: skip
    assert code == 0
    record = json.loads((results / "runs" / name / "contrastive" / "seed0.json").read_text())
    assert record["status"] == "ok" and record["training"]["steps"] == 2
    assert record["split"]["test_classes"] == 4
    assert set(record["metrics"]) >= {f"recall@{k}" for k in protocol.evaluation.recall_ks}
    if protocol.dataset.name == "inshop":  # queries ranked against the gallery
        assert (record["split"]["query_images"], record["split"]["gallery_images"]) == (4, 8)
    board = " ".join((results / "LEADERBOARD.md").read_text().split())  # table padding aside
    if protocol.paper.reference == "pddm_nips2016":  # contrastive has published values there
        assert "Against the published values" in board and "| contrastive | recall@1 |" in board
        assert "**Differs from the paper:**" in board


def _save(net: torch.nn.Module, path: Path) -> Path:
    torch.save(net.state_dict(), path)
    return path


def test_local_weights_file_loads_exactly_and_is_recorded(tmp_path, archives):
    import torchvision

    torch.manual_seed(1)
    file = _save(torchvision.models.resnet18(), tmp_path / "resnet18.pth")
    spec = BackboneSpec(name="resnet18", input_size=32, pretrained="imagenet",
                        weights_file=str(file))  # fmt: skip
    backbone = build_backbone(spec, 3)
    saved = torch.load(file)
    assert torch.equal(backbone.stages[0][0].weight, saved["conv1.weight"])
    assert torch.equal(backbone.stages[3][1].conv2.weight, saved["layer4.1.conv2.weight"])
    # GoogLeNet: torchvision's ImageNet file carries the aux classifiers, which are dropped
    goog = torchvision.models.googlenet(weights=None, aux_logits=True, init_weights=False)
    gfile = _save(goog, tmp_path / "googlenet.pth")
    gspec = BackboneSpec(name="googlenet", input_size=32, pretrained="imagenet",
                         weights_file=str(gfile))  # fmt: skip
    gnet = build_backbone(gspec, 3)
    assert torch.equal(gnet.stages[0][0].conv.weight, goog.conv1.conv.weight)
    assert gnet.mean.flatten().tolist() == [0.5] * 3  # the [-1, 1] input these weights expect
    # a run under a pretrained protocol with --weights records the file's sha256
    path = _cpu_copy("lifted_cub200", tmp_path, pretrained="imagenet")
    results = tmp_path / "results"
    assert main(["-q", "run", "--protocol", str(path), "--method", "contrastive", "--data-root",
                 str(archives / "cub200"), "--max-steps", "1", "--device", "cpu",
                 "--results-dir", str(results), "--weights", str(gfile)]) == 0  # fmt: skip
    record = json.loads((results / "runs/lifted_cub200/contrastive/seed0.json").read_text())
    assert record["backbone_weights"]["file"] == str(gfile)
    assert len(record["backbone_weights"]["sha256"]) == 64


def test_weights_file_errors(tmp_path, capsys):
    import torchvision

    file = _save(torchvision.models.resnet18(), tmp_path / "resnet18.pth")
    spec = BackboneSpec(name="resnet50", input_size=32, pretrained="imagenet",
                        weights_file=str(file))  # fmt: skip
    with pytest.raises(HarnessError, match="does not hold resnet50 weights"):
        build_backbone(spec, 3)
    spec = BackboneSpec(name="resnet18", input_size=32, pretrained="imagenet",
                        weights_file=str(tmp_path / "nope.pth"))  # fmt: skip
    with pytest.raises(HarnessError, match="nope.pth does not exist"):
        build_backbone(spec, 3)
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    spec = BackboneSpec(name="resnet18", input_size=32, pretrained="imagenet",
                        weights_file=str(tmp_path / "junk.pth"))  # fmt: skip
    with pytest.raises(HarnessError, match="cannot read weights file"):
        build_backbone(spec, 3)
    with pytest.raises(ValueError, match="weights_file goes with pretrained: imagenet"):
        BackboneSpec(name="resnet18", input_size=32, weights_file=str(file))
    # from the command line: one line before any run, not the ValueError above
    for protocol, weights, message in [
        ("smoke", file, "protocol smoke trains its conv4 from random weights .*drop --weights"),
        ("lifted_cub200", tmp_path / "nope.pth", "nope.pth does not exist"),
    ]:
        assert main(["-q", "run", "--protocol", protocol, "--method", "contrastive", "--weights",
                     str(weights), "--results-dir", str(tmp_path / "r")]) == 2  # fmt: skip
        err = capsys.readouterr().err
        assert re.search(message, err) and err.count("\n") == 1


def test_no_network_and_no_file_stops_instead_of_training_from_random(tmp_path, monkeypatch):
    import torchvision.models._api as api

    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # no cached weights
    monkeypatch.setattr(api, "load_state_dict_from_url", offline)
    spec = BackboneSpec(name="resnet18", input_size=32, pretrained="imagenet")
    with pytest.raises(HarnessError, match="will not train from random weights.*--weights FILE"):
        build_backbone(spec, 3)


def test_googlenet_gets_its_downloaded_imagenet_weights(tmp_path, monkeypatch):
    """The paper protocols' path online: torchvision's weights API (the download stubbed with
    a file of GoogLeNet's ImageNet layout, aux classifiers included) loads into the stages."""
    import torchvision
    import torchvision.models._api as api

    torch.manual_seed(2)
    goog = torchvision.models.googlenet(weights=None, aux_logits=True, init_weights=True)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr(api, "load_state_dict_from_url", lambda *a, **k: goog.state_dict())
    spec = BackboneSpec(name="googlenet", input_size=32, pretrained="imagenet")
    net = build_backbone(spec, 3)
    assert torch.equal(net.stages[0][0].conv.weight, goog.conv1.conv.weight)
    assert torch.equal(net.stages[2][-1].branch1.conv.weight, goog.inception5b.branch1.conv.weight)
    assert net.mean.flatten().tolist() == [0.5] * 3


def _run(method: str, seed: int, recall1: float, **extra) -> RunResult:
    content = load_protocol("pddm_cars196").content()
    return RunResult(protocol=ProtocolInfo("pddm_cars196", 1, "h", content=content),
                     method=MethodInfo(method, 1), seed=seed, status="ok",
                     metrics={"recall@1": recall1, "recall@2": 0.5}, **extra)  # fmt: skip


def test_paper_comparison_shows_ours_the_papers_and_the_difference():
    runs = [_run("contrastive", 0, 0.25), _run("contrastive", 1, 0.27), _run("untrained", 0, 0.1)]
    text = " ".join("\n".join(paper_comparison(runs)).split())  # table padding aside
    assert text.startswith("**Differs from the paper:** Images are resized to 224 x 224")
    # CARS196 contrastive in PDDM's Table 1: recall@1 21.7, recall@2 32.3; ours 26.0 and 50.0
    assert "| contrastive | recall@1 | 26.0 | 21.7 | +4.3 |" in text
    assert "| contrastive | recall@2 | 50.0 | 32.3 | +17.7 |" in text
    assert "| contrastive | recall@4 | - | 46.1 | - |" in text  # not measured here
    assert "untrained" not in text  # no published value
    # a sweep asked for 3 seeds and 2 finished: the mean is marked, never passed off as full
    partial = [_run("contrastive", s, 0.25, sweep_seeds=[0, 1, 2]) for s in (0, 1)]
    text = " ".join("\n".join(paper_comparison(partial)).split())
    assert "| contrastive (2/3 seeds, incomplete) | recall@1 | 25.0 | 21.7 | +3.3 |" in text
    runs[0].protocol.content.pop("paper")
    assert paper_comparison(runs) == []
