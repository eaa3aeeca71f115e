"""The engine that runs a frozen network (harness.backbones.engine): onnxruntime's feature
cache matches torch's within the cache's float16 rounding, the parity check refuses an ONNX
file that is not the network's before anything is cached, and the bad inputs are one line."""

from __future__ import annotations

import copy
import sys

import harness.methods  # noqa: F401  (registers the methods)
import pytest
import torch
from test_birds import cached, tiny_protocol

from harness.backbones import engine as eng
from harness.cli import main
from harness.core import HarnessError, load_protocol
from harness.train import features


def engine_protocol(tmp_path, engine: str = "onnxruntime", frozen: int = 6):
    path = tiny_protocol(tmp_path, frozen=frozen)
    text = path.read_text().replace("view_seed: 0}", f"view_seed: 0, engine: {engine}}}")
    assert f"engine: {engine}" in text
    out = path.with_name(f"{path.stem}-{engine}.yaml")
    out.write_text(text)
    return out


def test_onnxruntime_caches_what_torch_does_within_float16_and_says_so(tmp_path, monkeypatch):
    _, _, by_torch = cached(tmp_path, tiny_protocol(tmp_path), monkeypatch)
    features._LOADED.clear()
    protocol = engine_protocol(tmp_path)
    assert load_protocol(str(protocol)).hash != load_protocol(str(tiny_protocol(tmp_path))).hash
    _, _, by_onnx = cached(tmp_path, protocol, monkeypatch)
    assert by_torch.images.made_by["engine"] == "torch"
    made_by = by_onnx.images.made_by
    assert made_by["engine"] == "onnxruntime" and made_by["threads"] >= 1 and made_by["version"]
    for a, b in ((by_torch.images.test, by_onnx.images.test),
                 (by_torch.images.train, by_onnx.images.train)):  # fmt: skip
        assert a.shape == b.shape and a.dtype == b.dtype == torch.float16
        scale = a.float().abs().max()
        assert (a.float() - b.float()).abs().max() <= 2e-3 * scale  # float16's step, no more
    assert len(list((tmp_path / "cache" / "features").glob("*.pt"))) == 2  # two keys


def test_an_onnx_file_that_is_not_the_networks_is_refused_before_anything_is_cached(
    tmp_path, monkeypatch
):
    protocol = engine_protocol(tmp_path)
    monkeypatch.setattr(eng, "_SESSIONS", {})
    real_export = eng._export

    def other_network(network, example, path):  # the same trunk with one weight changed
        other = copy.deepcopy(network)
        with torch.no_grad():
            next(other.parameters()).mul_(1.5)
        real_export(other, example, path)

    monkeypatch.setattr(eng, "_export", other_network)
    with pytest.raises(HarnessError, match="is not this network's export"):
        cached(tmp_path, protocol, monkeypatch)
    assert not list((tmp_path / "cache" / "features").glob("*.pt"))


def test_an_engine_that_is_not_installed_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails
    monkeypatch.setenv("DML_HARNESS_CACHE", str(tmp_path / "cache"))
    code = main(["run", "--protocol", str(engine_protocol(tmp_path)), "--method", "contrastive",
                 "--seeds", "0", "--data-root", str(tmp_path / "data"), "--results-dir",
                 str(tmp_path / "results"), "-q"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "engine onnxruntime is not installed" in err[0], err
    network = torch.nn.Identity()
    with pytest.raises(HarnessError, match="engine onnxruntime is not installed"):
        eng.build_engine(network, torch.zeros(1, 3, 4, 4, dtype=torch.uint8), "onnxruntime",
                         {}, torch.device("cpu"))  # fmt: skip


def test_bad_engine_settings_are_one_line(tmp_path, capsys):
    with pytest.raises(HarnessError, match="thread count must be at least 1, got 0"):
        eng.check_threads(0)
    with pytest.raises(HarnessError, match="unknown engine 'tensorrt'"):
        eng.resolve_engine("tensorrt", torch.device("cpu"))
    assert eng.resolve_engine("onnxruntime", torch.device("cuda")) == "torch"  # a GPU: torch
    for engine, message in (("tensorrt", "engine must be one of torch, onnxruntime"),):
        code = main(["validate", str(engine_protocol(tmp_path, engine))])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and message in err[0], err
    bf16 = engine_protocol(tmp_path)
    bf16.write_text(bf16.read_text() + "precision: bf16\n")
    assert main(["validate", str(bf16)]) == 2
    assert "onnxruntime runs fp32" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["index", str(tmp_path / "m.pt"), "--images", str(tmp_path), "--out",
              str(tmp_path / "i"), "--threads", "0"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1, err
    assert "--threads: expected a positive integer, got '0'" in err[0]
