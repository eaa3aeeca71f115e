"""`run --compile`: the training step's backbone through torch.compile, recorded in each
result; the module's own weights and checkpoints unchanged; a missing compiler is a one-line
error before any step."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import harness.methods  # noqa: F401
import numpy as np
import pytest
import torch
from tiny_training import crash_after_epoch_2, fresh_contrastive, tiny_images

from harness.cli import main
from harness.core import HarnessError, RunContext, load_protocol
from harness.train import Checkpoint, EpochHooks, Model, TrainingSet, check_compile, train

CPU = torch.device("cpu")


def test_compile_is_plumbed_to_the_step_and_recorded(tmp_path, monkeypatch):
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)  # nothing compiles: torch.compile
    compiled = []

    def spy(module, *args, **kwargs):
        compiled.append(type(module).__name__)
        return module

    monkeypatch.setattr(torch, "compile", spy)
    args = ["-q", "run", "--protocol", "smoke", "--method", "contrastive", "--compile",
            "--results-dir", str(tmp_path)]  # fmt: skip
    assert main(args) == 0 and len(compiled) == 1
    result = json.loads((tmp_path / "runs/smoke/contrastive/seed0.json").read_text())
    assert result["timings"]["compiled"] is True
    args[6:7] = []  # without --compile
    assert main([*args, "--results-dir", str(tmp_path / "eager")]) == 0 and len(compiled) == 1


NO_COMPILER = "--compile needs a C++ compiler (g++) on the CPU: install one or drop --compile"


def test_no_compiler_is_one_line_before_any_data_is_prepared(tmp_path, monkeypatch, capsys):
    """The CLI checks up front: even a missing data root is not reached."""
    monkeypatch.setattr(shutil, "which", lambda name: None)
    args = ["run", "--protocol", "omniglot", "--method", "contrastive", "--compile",
            "--device", "cpu", "--data-root", str(tmp_path / "absent"),
            "--results-dir", str(tmp_path)]  # fmt: skip
    assert main(args) == 2
    assert capsys.readouterr().err.strip() == f"error: {NO_COMPILER}"


def test_no_compiler_stops_train_before_any_step(monkeypatch):
    """What a Ray task or a torchrun rank meets: train() checks its own machine too."""
    monkeypatch.setattr(shutil, "which", lambda name: None)
    protocol = load_protocol("smoke")
    backbone, method = fresh_contrastive(protocol)
    before = {k: v.clone() for k, v in backbone.state_dict().items()}
    with pytest.raises(HarnessError) as error:
        train(RunContext(protocol, 0, CPU, workers=0, compile=True), Model(backbone, method),
              TrainingSet(*tiny_images()))  # fmt: skip
    assert str(error.value) == NO_COMPILER
    assert all(torch.equal(before[k], v) for k, v in backbone.state_dict().items())


def test_the_processor_stand_in_is_refused_on_the_cpu(monkeypatch):
    """Inductor's CPU code computes garbage under ATEN_CPU_CAPABILITY (see check_compile)."""
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    with pytest.raises(HarnessError, match="ATEN_CPU_CAPABILITY set .* unset it or drop --compile"):
        check_compile(CPU)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    if shutil.which("g++") or shutil.which("c++"):
        check_compile(CPU)  # the same machine without the stand-in: no error


def test_cuda_without_triton_is_a_one_line_error(monkeypatch):
    import torch.utils._triton as triton_check

    monkeypatch.setattr(triton_check, "has_triton", lambda: False)
    with pytest.raises(HarnessError, match="--compile on CUDA needs Triton"):
        check_compile(torch.device("cuda"))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="inductor needs a C++ compiler")
@pytest.mark.skipif(bool(os.environ.get("ATEN_CPU_CAPABILITY")),
                    reason="--compile refuses the processor stand-in (see check_compile)")  # fmt: skip
def test_a_compiled_run_trains_as_eager_within_rounding_and_resumes_eagerly(tmp_path):
    """Inductor for real: the same losses as eager within float rounding; the checkpoint a
    compiled run writes holds the module's own keys, and an eager run resumes from it."""
    protocol = load_protocol("smoke")
    protocol = dataclasses.replace(protocol, budget=dataclasses.replace(protocol.budget, steps=9))
    images, labels = tiny_images()
    runs = {}
    for compile_ in (False, True):
        backbone, method = fresh_contrastive(protocol)
        stats = train(
            RunContext(protocol, 0, CPU, workers=0, compile=compile_),
            Model(backbone, method),
            TrainingSet(images, labels),
        )
        runs[compile_] = (stats, backbone.state_dict())
        assert stats.compiled is compile_
    (eager, w_eager), (comp, w_comp) = runs[False], runs[True]
    assert np.allclose(comp.epoch_loss, eager.epoch_loss, rtol=1e-3, atol=1e-4)
    assert all(torch.allclose(w_comp[k].float(), w_eager[k].float(), atol=1e-3) for k in w_eager)
    assert not any("_orig_mod" in k for k in w_comp)

    backbone, method = fresh_contrastive(protocol)
    with pytest.raises(KeyboardInterrupt):
        train(
            RunContext(protocol, 0, CPU, workers=0, compile=True),
            Model(backbone, method),
            TrainingSet(images, labels),
            checkpoint=Checkpoint(tmp_path / "c.pt", "a"),
            hooks=EpochHooks(on_epoch_end=crash_after_epoch_2),
        )
    saved = torch.load(tmp_path / "c.pt", weights_only=False)
    assert not any("_orig_mod" in k for k in _keys(saved))
    backbone, method = fresh_contrastive(protocol)
    resumed = train(
        RunContext(protocol, 0, CPU, workers=0),
        Model(backbone, method),
        TrainingSet(images, labels),
        checkpoint=Checkpoint(tmp_path / "c.pt", "a"),
    )
    assert resumed.resumed_from_step == 6 and len(resumed.epoch_loss) == 3


def _keys(state, prefix=""):
    """Every key of a nested checkpoint dict."""
    for key, value in state.items() if isinstance(state, dict) else ():
        yield f"{prefix}{key}"
        yield from _keys(value, f"{prefix}{key}.")
