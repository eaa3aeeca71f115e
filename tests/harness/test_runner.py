"""The runner: unknown methods refused before any run, interrupted runs resume bit-identical,
the same seed gives the same metrics, a method's diagnostics reach its result."""

from __future__ import annotations

import json
from pathlib import Path

import harness.methods  # noqa: F401
import pytest

from harness.core import HarnessError, load_protocol
from harness.sweep import RunSpec, execute, plan


def test_plan_rejects_unknown_methods_before_running():
    with pytest.raises(HarnessError, match="did you mean 'triplet'"):
        plan(load_protocol("smoke"), ["tripplet"])


def test_interrupted_run_resumes_from_its_checkpoint_with_identical_results(tmp_path: Path):
    protocol = tmp_path / "three_epochs.yaml"
    text = (Path(__file__).resolve().parents[2] / "protocols" / "smoke.yaml").read_text()
    protocol.write_text(text.replace("budget: {steps: 4}", "budget: {epochs: 3}"))
    whole = RunSpec(
        protocol=str(protocol), method="triplet", seed=0, results_dir=str(tmp_path / "a")
    )
    status, path = execute(whole, progress=False)
    assert status == "ok"
    expected = json.loads(path.read_text())

    def crash_after_first_epoch(epoch: int) -> None:
        if epoch == 1:
            raise KeyboardInterrupt

    broken = RunSpec(
        protocol=str(protocol), method="triplet", seed=0, results_dir=str(tmp_path / "b")
    )
    with pytest.raises(KeyboardInterrupt):
        execute(broken, progress=False, on_epoch_end=crash_after_first_epoch)
    ckpt = tmp_path / "b" / "checkpoints" / "smoke" / "triplet" / "seed0.pt"
    assert (
        ckpt.exists()
        and not (tmp_path / "b" / "runs" / "smoke" / "triplet" / "seed0.json").exists()
    )
    status, path = execute(broken, progress=False)
    resumed = json.loads(path.read_text())
    assert status == "ok" and not ckpt.exists()
    assert resumed["training"]["resumed_from_step"] == expected["training"]["steps"] // 3
    assert resumed["metrics"] == expected["metrics"]
    assert resumed["training"]["epoch_loss"] == expected["training"]["epoch_loss"]


def test_same_seed_gives_identical_metrics(tmp_path: Path):
    runs = [
        execute(
            RunSpec(protocol="smoke", method="contrastive", seed=3, results_dir=str(tmp_path / d)),
            progress=False,
        )  # fmt: skip
        for d in ("a", "b")
    ]
    a, b = (json.loads(path.read_text()) for _, path in runs)
    assert (
        a["metrics"] == b["metrics"] and a["training"]["epoch_loss"] == b["training"]["epoch_loss"]
    )
    assert "diagnostics" not in a  # a method without diagnostics records none


def test_a_methods_diagnostics_are_recorded_from_the_test_embeddings(tmp_path: Path):
    spec = RunSpec(protocol="smoke", method="pddm_quadruplet", seed=0, results_dir=str(tmp_path))
    status, path = execute(spec, progress=False)
    found = json.loads(path.read_text())["diagnostics"]
    assert status == "ok" and set(found) == {"unit_auc", "euclidean_auc"}
    assert 0 <= found["unit_auc"] <= 1 and 0 < found["euclidean_auc"] <= 1


def test_a_run_records_its_protocols_k_means_convention(tmp_path: Path):
    protocol = tmp_path / "smoke_faiss.yaml"
    text = (Path(__file__).resolve().parents[2] / "protocols" / "smoke.yaml").read_text()
    protocol.write_text(text.replace("evaluation: {recall_ks: [1, 2]}",
                                     "evaluation: {recall_ks: [1, 2], clustering: faiss}"))  # fmt: skip
    assert load_protocol(str(protocol)).evaluation.clustering == "faiss"
    spec = RunSpec(protocol=str(protocol), method="contrastive", seed=0, results_dir=str(tmp_path))
    status, path = execute(spec, progress=False)
    record = json.loads(path.read_text())
    assert status == "ok" and {"nmi", "f1"} <= set(record["metrics"])
    assert record["clustering_convention"] == "faiss"
    assert record["protocol"]["content"]["evaluation"]["clustering"] == "faiss"


def test_a_changed_weights_file_is_another_run_and_another_checkpoint(tmp_path, monkeypatch):
    """--weights FILE: the file's sha256 is part of what makes a run "the same": a result or
    a checkpoint made from other weights is neither skipped over nor resumed from."""
    import dataclasses

    import harness.sweep.runner as runner
    from harness.core import TrainingFailed

    weights = tmp_path / "imagenet.pth"
    weights.write_bytes(b"weights A")
    spec = RunSpec(protocol="smoke", method="contrastive", seed=0, results_dir=str(tmp_path))
    status, path = execute(spec, progress=False)  # a finished result (conv4 takes no weights)
    record = json.loads(path.read_text())
    record["backbone_weights"] = {"file": str(weights), "sha256": sha256(b"weights A")}
    path.write_text(json.dumps(record))  # as if made from file A
    with_a = dataclasses.replace(spec, weights=str(weights))
    assert execute(with_a, progress=False)[0] == "skipped"
    identities = []

    def record_identity(*args, checkpoint, **kwargs):
        identities.append(checkpoint.identity)
        raise TrainingFailed("stopped by the test")

    monkeypatch.setattr(runner, "train_model", record_identity)
    weights.write_bytes(b"weights B, same name")
    assert execute(with_a, progress=False)[0] == "failed"  # not skipped: trained (stand-in)
    assert json.loads(path.read_text())["backbone_weights"]["sha256"] == sha256(
        b"weights B, same name"
    )
    assert len(list((tmp_path / "archive").rglob("seed0-*.json"))) == 1  # A's result kept
    weights.write_bytes(b"weights A")
    execute(dataclasses.replace(with_a, force=True), progress=False)
    assert len(identities) == 2 and identities[0] != identities[1]  # B's checkpoint is not A's


def sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def test_a_smoke_run_does_not_replace_a_full_result_without_force(tmp_path: Path, capsys):
    """--max-steps (or another protocol hash) over a finished full result: one line, before
    any training, naming the way out; --force archives it; a full run may replace a capped one."""
    from harness.cli import main

    results = tmp_path / "results"
    args = ["-q", "run", "--protocol", "smoke", "--method", "untrained,contrastive",
            "--results-dir", str(results)]  # fmt: skip
    assert main(args) == 0
    path = results / "runs" / "smoke" / "contrastive" / "seed0.json"
    full = path.read_text()
    capsys.readouterr()
    assert main([*args, "--max-steps", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "step cap none -> 2" in err
    assert "--results-dir" in err and "--force" in err
    assert path.read_text() == full and not (results / "archive").exists()
    assert not (results / "checkpoints").exists()  # refused before any run started
    edited = tmp_path / "smoke.yaml"  # same name, so the same result paths; another hash
    edited.write_text((Path(__file__).resolve().parents[2] / "protocols" / "smoke.yaml")
                      .read_text().replace("lr: 0.001", "lr: 0.002"))  # fmt: skip
    assert main([*args[:3], str(edited), *args[4:]]) == 2
    assert "protocol hash" in capsys.readouterr().err and path.read_text() == full
    # --force replaces it (archived), and a full run may then replace the capped result
    assert main([*args, "--max-steps", "2", "--force"]) == 0
    assert json.loads(path.read_text())["training"]["max_steps"] == 2
    assert main(args) == 0
    assert json.loads(path.read_text())["training"]["max_steps"] is None
    assert len(list((results / "archive").rglob("contrastive/seed0-*.json"))) == 2


def test_a_checkpoint_of_the_other_decoder_is_not_resumed():
    """torch's decoded pixels differ from PIL's by rounding: a run resumed with the other
    --decoder would mix two inputs, so the decoder is part of the checkpoint's identity (the
    default, pil, adds nothing: checkpoints written before it was recorded still resume)."""
    from types import SimpleNamespace

    from harness.sweep import checkpoint_identity

    record = SimpleNamespace(protocol=SimpleNamespace(hash="abc"), backbone_weights=None,
                             method=SimpleNamespace(to_json=lambda: {"name": "contrastive"}))  # fmt: skip
    pil = checkpoint_identity(record, 0, None)
    assert pil == json.dumps(["abc", {"name": "contrastive"}, 0, None], sort_keys=True)
    assert checkpoint_identity(record, 0, None, "pil") == pil
    assert checkpoint_identity(record, 0, None, "torch") != pil
