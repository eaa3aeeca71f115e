"""`harness tune`: equal-budget Optuna studies on validation classes, resumable, never
embedding the test split; `run --tuned` applies the overlay."""

import dataclasses
import json
import signal
from pathlib import Path

import pytest
import torch
import yaml

import harness.data.prepare
import harness.evaluate.score
import harness.sweep
import harness.train.fit
import harness.tune.study
import harness.tune.trial
from harness.cli import main
from harness.core import PROTOCOL_DIR, load_protocol
from harness.data import prepare_data
from harness.tune import class_folds, pruner_settings


@pytest.fixture
def learning_val(tmp_path: Path) -> str:
    """The learning protocol with 5 of its 20 training classes held out for validation."""
    data = yaml.safe_load((PROTOCOL_DIR / "learning.yaml").read_text())
    data["name"] = "learning_val"
    data["split"]["validation_fraction"] = 0.25
    path = tmp_path / "learning_val.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_refuses_a_protocol_without_validation_classes(tmp_path, capsys):
    args = ["tune", "--protocol", "learning", "--method", "contrastive", "--trials", "2",
            "--results-dir", str(tmp_path)]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "carves no validation classes" in err
    assert not (tmp_path / "tuning").exists()


def test_folds_are_class_disjoint_and_cover_the_training_classes():
    protocol = load_protocol("tuning")
    data = prepare_data(protocol, None)
    labels = data.data.labels
    folds = class_folds(data.split, labels, 3)
    pool = set(labels[data.split.train]) | set(labels[data.split.validation])
    held = [set(labels[v]) for _, v in folds]
    assert set().union(*held) == pool and sum(map(len, held)) == len(pool)  # a partition
    for train_idx, val_idx in folds:
        assert not set(labels[train_idx]) & set(labels[val_idx])
        assert not set(labels[val_idx]) & set(labels[data.split.test])  # never the test


def test_tune_never_embeds_the_test_split_and_run_tuned_applies_it(learning_val, tmp_path,
                                                                   monkeypatch, capsys):  # fmt: skip
    protocol = load_protocol(learning_val)
    prepared = prepare_data(protocol, None)
    test_images = {bytes(img.numpy()) for img in prepared.data.images[prepared.split.test]}
    embedded: set[bytes] = set()
    real_embed = harness.evaluate.score.embed

    def spy(backbone, method, images, device, batch_size, *args):
        embedded.update(bytes(img.numpy()) for img in images)
        return real_embed(backbone, method, images, device, batch_size, *args)

    monkeypatch.setattr(harness.evaluate.score, "embed", spy)
    results = tmp_path / "results"
    args = ["-q", "tune", "--protocol", learning_val, "--method", "contrastive", "--trials", "3",
            "--max-steps", "30", "--results-dir", str(results)]  # fmt: skip
    assert main(args) == 0
    validation = {bytes(img.numpy()) for img in prepared.data.images[prepared.split.validation]}
    assert validation <= embedded  # the trials were scored on the validation classes ...
    assert not embedded & test_images  # ... and never saw a test image
    overlay = yaml.safe_load(
        (results / "tuning/learning_val/contrastive.max_steps30.yaml").read_text()
    )  # a capped study has its own file: it never replaces the full study's
    study = overlay["study"]
    assert study["trials"] == 3 and study["folds"] == 1
    assert study["paper_default_value"] is not None  # trial 0 is the paper's configuration
    assert 0.25 <= overlay["hyperparameters"]["margin"] <= 2.0
    assert (results / "tuning/learning_val/contrastive.max_steps30.png").is_file()
    assert "contrastive: best" in capsys.readouterr().out

    monkeypatch.setattr(harness.evaluate, "embed", real_embed)
    assert main(["-q", "run", "--protocol", learning_val, "--method", "contrastive",
                 "--tuned", "--max-steps", "10", "--results-dir", str(results)]) == 0  # fmt: skip
    record = json.loads((results / "runs/learning_val/contrastive+tuned/seed0.json").read_text())
    assert record["method"]["hyperparameters"] == overlay["hyperparameters"]
    assert record["tuning"]["trials"] == 3 and record["tuning"]["overlay"].endswith(
        "contrastive.max_steps30.yaml"
    )
    board = (results / "LEADERBOARD.md").read_text()
    assert "| contrastive+tuned" in board
    assert "## Tuning" in board and "(tuning/learning_val/contrastive.max_steps30.png)" in board
    assert "contrastive (trials capped at 30 steps)" in board
    assert f"margin={overlay['hyperparameters']['margin']:.3g}" in board
    assert overlay["study"]["max_steps"] == 30  # a capped study: not for a full run
    assert main(["-q", "run", "--protocol", learning_val, "--method", "contrastive", "--tuned",
                 "--results-dir", str(results)]) == 2  # fmt: skip
    assert "no tuned configuration for contrastive" in capsys.readouterr().err  # only capped
    assert main(["-q", "run", "--protocol", learning_val, "--method", "triplet", "--tuned",
                 "--results-dir", str(results)]) == 2  # fmt: skip
    assert "no tuned configuration for triplet" in capsys.readouterr().err


def test_an_interrupted_study_resumes_to_exactly_n_trials(learning_val, tmp_path, monkeypatch):
    calls = []

    def fake(self, hyper, report):  # a trial: the objective peaks at margin 0.8
        calls.append(hyper["margin"])
        if len(calls) == 3:
            raise KeyboardInterrupt  # the user presses Ctrl-C in the third trial
        report(1, 0.5)
        return [1.0 - abs(hyper["margin"] - 0.8)]

    monkeypatch.setattr(harness.tune.Trainer, "__call__", fake)
    args = ["-q", "tune", "--protocol", learning_val, "--method", "contrastive", "--trials", "5",
            "--results-dir", str(tmp_path)]  # fmt: skip
    assert main(args) == 130
    assert calls[0] == 1.0  # the paper default first
    assert main(args) == 0  # resumed: 2 finished before, 3 more now
    import optuna

    storage = harness.tune.default_storage(tmp_path, "learning_val")
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    states = [t.state.name for t in study.trials]
    assert states.count("COMPLETE") == 5 and states.count("FAIL") == 1
    assert len(calls) == 6
    assert len(set(calls)) == 6  # the resumed sampler does not propose the same trials again
    assert main(args) == 0 and len(calls) == 6  # already complete: no new trial
    overlay = yaml.safe_load((tmp_path / "tuning/learning_val/contrastive.yaml").read_text())
    assert overlay["study"]["trials"] == 5 and overlay["study"]["interrupted"] == 1
    # the record names the SQLite file relative to the results folder, not by this machine's path
    assert overlay["study"]["storage"] == "sqlite:///<results-dir>/tuning/learning_val/studies.db"
    best = max((t for t in study.trials if t.state.name == "COMPLETE"), key=lambda t: t.value)
    assert overlay["hyperparameters"]["margin"] == best.params["margin"]
    assert "max_steps" not in overlay["study"]
    # capped trials are another study: never resumed as, or mistaken for, the full one, and
    # written to their own file (the full study's stays)
    full = (tmp_path / "tuning/learning_val/contrastive.yaml").read_text()
    assert main([*args, "--max-steps", "3"]) == 0 and len(calls) == 11
    assert (tmp_path / "tuning/learning_val/contrastive.yaml").read_text() == full
    overlay = yaml.safe_load(
        (tmp_path / "tuning/learning_val/contrastive.max_steps3.yaml").read_text()
    )
    assert overlay["study"]["max_steps"] == 3 and overlay["study"]["name"].endswith("/max_steps3")
    protocol = load_protocol(learning_val)
    for cap, chosen in ((3, "contrastive.max_steps3.yaml"), (7, "contrastive.yaml"), (None,
                        "contrastive.yaml")):  # fmt: skip
        assert harness.sweep.load_overlay(tmp_path, protocol, "contrastive", cap)["path"].endswith(
            f"/{chosen}"
        )


def test_tune_with_folds_averages_over_them(learning_val, tmp_path, monkeypatch):
    seen = []
    real = harness.train.fit.train

    def spy(ctx, model, data, **kwargs):
        seen.append(len(data.images))
        return real(ctx, model, data, **kwargs)

    monkeypatch.setattr(harness.train.fit, "train", spy)
    assert main(["-q", "tune", "--protocol", learning_val, "--method", "contrastive", "--trials",
                 "1", "--folds", "2", "--max-steps", "5", "--results-dir", str(tmp_path)]) == 0  # fmt: skip
    assert seen == [80, 80]  # 20 pooled classes x 8 images, half trained on in each fold
    overlay = yaml.safe_load(
        (tmp_path / "tuning/learning_val/contrastive.max_steps5.yaml").read_text()
    )
    assert overlay["study"]["folds"] == 2 and "mean over folds" in overlay["study"]["objective"]
    assert torch.get_num_threads() >= 1


@pytest.mark.parametrize(("name", "warmup"), [("tuning", 3), ("cars", 15), ("birds", 3)])
def test_a_trial_is_not_pruned_before_half_its_epochs(name, warmup):
    import optuna

    protocol = load_protocol(name)
    settings = pruner_settings(protocol)
    assert settings == {"n_startup_trials": 3, "n_warmup_steps": warmup}
    epochs = protocol.budget.epochs
    assert warmup == max(3, epochs // 2)
    study = optuna.create_study(direction="maximize",
                                pruner=optuna.pruners.MedianPruner(**settings))  # fmt: skip
    for _ in range(3):  # three good trials, reported every epoch
        trial = study.ask()
        for epoch in range(1, epochs + 1):
            trial.report(0.5, epoch)
        study.tell(trial, 0.5)
    slow = study.ask()  # a slow starter, far below the median from its first epoch
    verdicts = []
    for epoch in range(1, epochs + 1):
        slow.report(0.1, epoch)
        verdicts.append(slow.should_prune())
    # kept until the warm-up's last epoch (optuna prunes from step n_warmup_steps on), then stopped
    assert verdicts == [False] * (warmup - 1) + [True] * (epochs - warmup + 1)


def trial_values(results: Path, protocol: str) -> dict[str, list[float]]:
    """Each study's finished trial values, by method, in trial order."""
    import optuna

    storage = harness.tune.default_storage(results, protocol)
    out = {}
    for summary in optuna.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        out[summary.study_name.split("/")[1]] = [t.value for t in study.trials]
    return out


@pytest.mark.slow
def test_studies_in_processes_find_what_one_process_finds(learning_val, tmp_path, capsys):
    """--processes 2 runs the two studies side by side in spawned processes of one thread
    each: the same trial values, bit for bit, and the same overlays, as one process."""
    found = {}
    for processes in ("1", "2"):
        results = tmp_path / processes
        assert main(["tune", "--protocol", learning_val, "--method", "contrastive,triplet",
                     "--trials", "3", "--max-steps", "4", "--processes", processes,
                     "--results-dir", str(results)]) == 0  # fmt: skip
        found[processes] = trial_values(results, "learning_val")
        for name in ("contrastive", "triplet"):
            overlay = results / "tuning/learning_val" / f"{name}.max_steps4.yaml"
            assert yaml.safe_load(overlay.read_text())["study"]["trials"] == 3
    assert sorted(found["2"]) == ["contrastive@v2", "triplet@v1"], found
    assert found["1"] == found["2"] and all(len(v) == 3 for v in found["2"].values())
    out = capsys.readouterr().out
    assert "contrastive: study done" in out and "triplet: study done" in out
    assert main(["tune", "--protocol", learning_val, "--method", "contrastive,triplet",
                 "--trials", "3", "--processes", "2", "--engine", "ray",
                 "--results-dir", str(tmp_path / "ray")]) == 2  # fmt: skip
    assert "drop --processes" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize(
    "disposition, stop",
    [(signal.SIG_DFL, signal.SIGINT), (signal.SIG_IGN, signal.SIGTERM)],
    ids=["ctrl-c", "sigterm-to-a-background-tune"],
)
def test_ctrl_c_stops_studies_in_processes_at_once(learning_val, tmp_path, disposition, stop):
    """SIGINT (Ctrl-C, or SIGTERM, that only `tune` saw) while two studies run side by side
    stops both at once: exit 130, the running trials recorded as failed, and no study queued
    behind them started (a pool's worker would otherwise take it and run it whole). A `tune`
    started in the background (`nohup ... &`) has SIGINT ignored, and so would the processes
    it spawns: SIGTERM must stop them all the same."""
    import os
    import subprocess
    import sys
    import time

    import optuna

    results = tmp_path / "results"
    db = results / "tuning/learning_val/studies.db"
    command = [sys.executable, "-m", "harness", "tune", "--protocol", learning_val, "--method",
               "contrastive,triplet,margin", "--trials", "200", "--processes", "2",
               "--results-dir", str(results), "-q"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    # SIGINT's disposition set explicitly: a shell that started this suite in the background
    # left it ignored, and a child inherits that (Python then never raises KeyboardInterrupt)
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, disposition))  # fmt: skip

    def finished() -> dict[str, int]:
        storage = f"sqlite:///{db}"
        if not db.is_file():
            return {}
        return {s.study_name.split("/")[1].split("@")[0]: s.n_trials
                for s in optuna.get_all_study_summaries(storage)}  # fmt: skip

    deadline = time.monotonic() + 240
    while len(finished()) < 2 or min(finished().values()) < 2:  # both studies under way
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
        time.sleep(1)
    process.send_signal(stop)
    stopped = time.monotonic()
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130 and "run the same command again to resume" in err
    assert time.monotonic() - stopped < 60  # not the studies' 200 trials
    assert sorted(finished()) == ["contrastive", "triplet"]  # margin never started


def test_tune_and_run_tuned_leave_out_a_method_the_data_cannot_serve(learning_val, tmp_path,
                                                                     monkeypatch, capsys):  # fmt: skip
    """On a dataset without coarse labels (as caltech101's and flowers'), a method that needs
    them gets no study, whose every trial would fail at its first batch, and `run --tuned`
    asks for none: both say why, and the other methods go on."""
    real = harness.data.prepare.check_dataset

    def without_coarse(protocol):
        build = real(protocol)
        return lambda *args, **kwargs: dataclasses.replace(
            build(*args, **kwargs), coarse_labels=None, coarse_names=None
        )

    monkeypatch.setattr(harness.data.prepare, "check_dataset", without_coarse)
    monkeypatch.setattr(harness.data.prepare, "_DATA_CACHE", {})
    monkeypatch.setattr(harness.tune.trial, "_PREPARED", {})
    results = tmp_path / "results"
    both = "quadruplet_method1,contrastive"
    assert main(["-q", "tune", "--protocol", learning_val, "--method", both, "--trials", "1",
                 "--max-steps", "5", "--results-dir", str(results)]) == 0  # fmt: skip
    out = capsys.readouterr().out
    why = "quadruplet_method1 needs coarse labels; glyphs has none: not applicable"
    assert f"{why}, not tuned" in out and "contrastive: best" in out
    studied = sorted(p.name for p in (results / "tuning/learning_val").glob("*.yaml"))
    assert studied == ["contrastive.max_steps5.yaml"]

    assert main(["-q", "run", "--protocol", learning_val, "--method", both, "--tuned",
                 "--max-steps", "5", "--results-dir", str(results)]) == 0  # fmt: skip
    out = capsys.readouterr().out
    why = "quadruplet_method1 needs coarse labels; glyphs has none: not applicable"
    assert f"{why}, no tuned run" in out
    runs = results / "runs/learning_val"
    assert sorted(p.name for p in runs.iterdir()) == ["contrastive+tuned"]
