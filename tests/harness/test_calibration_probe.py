"""A calibration's sweep estimate counts every registered method at its own cost, timed by a
probe at the candidate's settings (harness.tune.probe), not at the reference methods' mean."""

from __future__ import annotations

import harness.methods  # noqa: F401  (registers the methods)
import pytest

from harness.tune import calibrate as cal
from harness.tune.probe import probe_id, run_seconds, scales

REFERENCE = ["a", "b"]
RUNS = {"untrained": {"map@r": 0.3, "seconds": 2.0}, "a": {"map@r": 0.4, "seconds": 10.0},
        "b": {"map@r": 0.5, "seconds": 14.0}}  # fmt: skip
PROBE = {
    "a": {"step_seconds": 0.1, "select_seconds": 1.0, "eval_seconds": 2.0},
    "b": {"step_seconds": 0.1, "select_seconds": 1.0, "eval_seconds": 2.0},
    "scorer": {"step_seconds": 1.0, "select_seconds": 2.0, "eval_seconds": 3.0},  # 10x a step
    "untrained": {"step_seconds": 0.0, "select_seconds": 0.2, "eval_seconds": 0.5},
    "hierarchy": {"not_applicable": "needs coarse labels"},
    "broken": {"failure": "loss is nan"},
}


def test_each_method_costs_its_step_time_ratio_of_the_reference_training_plus_its_evaluation():
    seconds = run_seconds(RUNS, PROBE, REFERENCE, {"train": 2.0, "eval": 3.0})
    # the reference methods train (10 - 1 + 14 - 1) / 2 = 11 s a run, at 0.1 s a step
    assert seconds == pytest.approx({
        "a": 11 * 1 * 2 + 2 * 3,  # 28
        "b": 11 * 1 * 2 + 2 * 3,
        "scorer": 11 * 10 * 2 + 3 * 3,  # 229: ten times the reference step
        "untrained": 0 + 0.5 * 3,  # trains nothing: its evaluation alone
        "hierarchy": 0.0,  # the sweep skips it at once
        "broken": 11 * 1 * 2 + 2 * 3,  # its probe failed: the reference methods' mean
    })  # fmt: skip
    # a reference method missing from the probe leaves nothing to compare with
    assert run_seconds(RUNS, {k: v for k, v in PROBE.items() if k != "b"}, REFERENCE,
                       {"train": 1, "eval": 1}) is None  # fmt: skip


def test_the_sweep_estimate_sums_the_probed_methods_and_counts_the_rest_at_the_mean():
    # the protocol: twice the calibration's training images; test images 1.5 times its
    # validation images, so 2.25 times the pairs to rank
    sizes = {"train": 200, "images": 350, "calibration_train": 100, "calibration_images": 200,
             "seeds": 5, "methods": 7}  # fmt: skip
    assert scales(sizes) == {"train": 2.0, "eval": 2.25}
    minutes = cal.estimate_minutes(RUNS, 60.0, 1, sizes, "untrained", PROBE, REFERENCE)
    probed = 3 * (11 * 2 + 2 * 2.25) + (11 * 10 * 2 + 3 * 2.25) + 0.5 * 2.25 + 0
    missing = 12 * 2  # the seventh method: the reference methods' mean run, x 2
    cache = 60.0 * (200 + 350) / (100 + 200)
    assert minutes == pytest.approx(((probed + missing) * 5 + cache) / 60)
    # without a probe: every method at the reference mean, as before probes existed
    assert cal.estimate_minutes(RUNS, 60.0, 1, sizes, "untrained") == pytest.approx(
        (24 * 7 * 5 + cache) / 60
    )


def test_budget_and_optimizer_share_a_probe_and_the_embedding_does_not():
    base = {"features.engine": "onnxruntime", "budget.epochs": 30, "optimizer.lr": 1e-4,
            "embedding_dim": 512}  # fmt: skip
    other = {**base, "budget.epochs": 120, "optimizer.lr": 3e-5}
    assert probe_id(base) == probe_id(other) == "features.engine=onnxruntime, embedding_dim=512"
    assert probe_id({**base, "embedding_dim": 4096}) != probe_id(base)


def test_a_method_too_costly_at_the_wider_embedding_moves_the_choice_inside_the_budget():
    spec = cal.Calibration("c", "p", 0.3, 0, REFERENCE, {"embedding_dim": [512, 4096]}, 90,
                           zero_shot="untrained")  # fmt: skip
    sizes = {"train": 100, "images": 200, "calibration_train": 100, "calibration_images": 200,
             "seeds": 5, "methods": 6}  # fmt: skip
    wide = {m: {**r, "map@r": r["map@r"] + 0.1} for m, r in RUNS.items()}  # better, same time
    record = {"runs": {"embedding_dim=512": RUNS, "embedding_dim=4096": wide},
              "caches": {"-": 0.0}, "skipped": {}}  # fmt: skip
    # the reference methods' mean: 12 s x 6 methods x 5 seeds = 6 minutes for either
    assert cal.choose(record, spec, sizes)["chosen"] == "embedding_dim=4096"
    cheap = {m: p for m, p in PROBE.items() if m != "scorer"} | {
        "scorer": {**PROBE["a"]}, "extra": {**PROBE["a"]}}  # fmt: skip
    costly = {**cheap, "scorer": {**PROBE["scorer"], "step_seconds": 100.0}}  # 1,000x a step
    record["probes"] = {"embedding_dim=512": cheap, "embedding_dim=4096": costly}
    choice = cal.choose(record, spec, sizes)
    rows = {r["candidate"]: r for r in choice["candidates"]}
    assert rows["embedding_dim=4096"]["sweep_minutes"] > 90 >= rows["embedding_dim=512"][
        "sweep_minutes"]  # fmt: skip
    assert all(r["methods_timed"] for r in rows.values())
    assert choice["chosen"] == "embedding_dim=512"


def test_a_finished_candidate_over_the_budget_untimed_is_not_probed(tmp_path, monkeypatch):
    spec = cal.Calibration("c", "p", 0.3, 0, REFERENCE, {"embedding_dim": [512, 8192]}, 90,
                           zero_shot="untrained")  # fmt: skip
    sizes = {"train": 100, "images": 200, "calibration_train": 100, "calibration_images": 200,
             "seeds": 5, "methods": 29}  # fmt: skip
    slow = {m: {**r, "seconds": 60.0} for m, r in RUNS.items()}  # 60 s x 29 x 5: 145 minutes
    record = {"runs": {"embedding_dim=512": RUNS, "embedding_dim=8192": slow}, "caches": {},
              "skipped": {}, "probes": {}}  # fmt: skip
    probed = []
    walk = cal._Walk(record, spec, sizes, tmp_path / "c.json", 2, "cpu", None, None, False)
    monkeypatch.setattr(walk, "probe", lambda ctx, candidate: probed.append(candidate))
    monkeypatch.setattr(cal, "RunContext", lambda *a, **k: None)
    walk.step({"embedding_dim": 8192}, None, 2)
    walk.step({"embedding_dim": 512}, None, 1)
    assert probed == [{"embedding_dim": 512}]  # 12 s x 29 x 5 = 29 minutes: timed
