"""`python -m harness cost`: the exponent fit, the work counts of real miners, the cost file,
the input checks and the figures. Small batch sizes and one repeat: seconds, not minutes."""

import argparse
import json
from pathlib import Path
from typing import Any

import harness.methods  # noqa: F401
import numpy as np
import pytest
import torch
from PIL import Image

from harness.cli.cost import cmd_cost
from harness.cli.program import build_parser
from harness.core import METHODS, HarnessError, MethodContext, load_protocol
from harness.cost import (
    cost_context,
    fit_power_law,
    measure_scaling,
    overhead_method,
    parse_batch_sizes,
)
from harness.evaluate import distance_histogram
from harness.report import by_family, cost_figure, cost_section, distance_histograms, training_curve

SIZES = [32, 64, 128, 256, 512, 1024]
PNG = b"\x89PNG\r\n\x1a\n"


def cost_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["cost", *argv])


def test_fit_recovers_the_exponent_and_names_the_class():
    m = np.array(SIZES, dtype=float)
    quadratic = fit_power_law(SIZES, 3e-4 * m**2)
    assert quadratic.exponent == pytest.approx(2.0, abs=1e-9)
    assert quadratic.coefficient == pytest.approx(3e-4)
    assert quadratic.r2 == pytest.approx(1.0)
    assert quadratic.complexity == "O(m^2)"
    linear = fit_power_law(SIZES, 7.0 * m)
    assert linear.exponent == pytest.approx(1.0, abs=1e-9)
    assert linear.complexity == "O(m)"
    assert fit_power_law(SIZES, m * np.log2(m)).complexity == "O(m log m)"
    assert fit_power_law(SIZES, [5.0] * len(SIZES)).complexity == "O(1)"
    # a few percent of noise on a quadratic still fits
    noisy = 2.0 * m**2 * np.random.default_rng(0).uniform(0.95, 1.05, len(m))
    assert fit_power_law(SIZES, noisy).complexity == "O(m^2)"


def test_fit_refuses_what_it_cannot_support():
    m = np.array(SIZES, dtype=float)
    between = fit_power_law(SIZES, m**1.5)  # a clean power law, but no class of the list
    assert between.exponent == pytest.approx(1.5) and between.complexity == "unclear"
    # m^1.1 lies between m and m log m: neither is named
    assert fit_power_law(SIZES, m**1.1).complexity == "unclear"
    scatter = np.random.default_rng(1).lognormal(0.0, 1.5, len(m)) * m
    assert fit_power_law(SIZES, scatter).complexity.startswith("unclear")
    bent = np.where(m < 200, 1.0, m**2 / 200**2)  # flat, then quadratic: a poor straight line
    assert fit_power_law(SIZES, bent).complexity.startswith("unclear")
    assert fit_power_law([32, 64], [1.0, 4.0]).complexity.startswith("unclear")
    assert fit_power_law(SIZES, [0.0] * 6).complexity == "none"
    assert fit_power_law(SIZES, [0, 1, 2, 3, 4, 5]).complexity.startswith("unclear")


def _scaling(name: str, sizes: list[int]) -> list[dict]:
    context = MethodContext((16,), 8, 64, 4)
    method = METHODS.get(name).build(context)
    ctx = cost_context(load_protocol("smoke"), torch.device("cpu"))  # K = 4, seed 0
    return measure_scaling(ctx, method, context, sizes, repeats=1)


def test_contrastive_counts_all_pairs_so_its_count_exponent_is_two():
    sizes = [8, 16, 32, 64, 128]
    cells = _scaling("contrastive", sizes)
    assert [c["evaluated"] for c in cells] == [m * (m - 1) // 2 for m in sizes]
    assert [c["tuples"] for c in cells] == [m * (m - 1) // 2 for m in sizes]
    fit = fit_power_law(sizes, [c["evaluated"] for c in cells])
    assert fit.exponent == pytest.approx(2.0, abs=0.06)  # m(m-1)/2: a touch above 2 at small m
    assert fit.complexity == "O(m^2)"
    assert all(c["mining_ms"] > 0 and c["loss_ms"] > 0 and c["repeats"] >= 1 for c in cells)


def test_triplet_evaluates_m_squared_distances():
    sizes = [8, 16, 32, 64]
    cells = _scaling("triplet", sizes)
    assert [c["evaluated"] for c in cells] == [m * m for m in sizes]
    fit = fit_power_law(sizes, [c["evaluated"] for c in cells])
    assert fit.exponent == pytest.approx(2.0, abs=1e-9) and fit.complexity == "O(m^2)"


def test_pddm_counts_the_graph_its_loss_scores_and_the_euclidean_variant_its_search():
    """The unit's loss scores the whole graph once and mines from it (its miner only counts):
    m(m-1)/2 scores. quadruplet_euclidean's miner reads m(K-1)/2 + 2m distances (n = 1)."""
    sizes = [8, 16, 32, 64]
    unit = _scaling("pddm_quadruplet", sizes)
    assert [c["evaluated"] for c in unit] == [m * (m - 1) // 2 for m in sizes]
    assert [c["tuples"] for c in unit] == [1] * len(sizes)
    euclidean = _scaling("quadruplet_euclidean", sizes)
    assert [c["evaluated"] for c in euclidean] == [m * 3 // 2 + 2 * m for m in sizes]


def test_batch_sizes_must_be_multiples_of_k():
    assert parse_batch_sizes("64,32,32", 4) == [32, 64]
    with pytest.raises(HarnessError, match="not a multiple of .*K=4"):
        parse_batch_sizes("32,30", 4)
    with pytest.raises(HarnessError, match="at least 2 classes"):
        parse_batch_sizes("4", 4)
    with pytest.raises(HarnessError, match="integers"):
        parse_batch_sizes("32,x", 4)
    with pytest.raises(HarnessError, match="not a multiple"):  # smoke: K = 4
        cmd_cost(cost_args("--protocol", "smoke", "--batch-sizes", "8,30"))
    with pytest.raises(HarnessError, match="unknown method"):
        cmd_cost(cost_args("--protocol", "smoke", "--methods", "contrastiv"))


def test_device_counts_include_the_one_process_baseline_and_divide_the_batch():
    from harness.cost import parse_counts

    assert parse_counts("4,2,2", 64) == [1, 2, 4]  # 1 added: efficiency is against it
    with pytest.raises(HarnessError, match="3 processes do not split .* 64"):
        parse_counts("3", 64)
    with pytest.raises(HarnessError, match="at least 1"):
        parse_counts("0,2", 64)
    with pytest.raises(HarnessError, match="integers"):
        parse_counts("two", 64)
    with pytest.raises(HarnessError, match="one method"):
        cmd_cost(
            cost_args("--protocol", "smoke", "--devices", "2", "--methods", "contrastive,triplet")
        )


def test_cost_command_writes_the_json_table_and_figure(tmp_path: Path, capsys):
    args = cost_args(
        "--protocol", "smoke", "--methods", "contrastive,triplet,untrained",
        "--batch-sizes", "8,16,32", "--repeats", "1", "--steps", "2", "--device", "cpu",
        "--results-dir", str(tmp_path), "--json",
    )  # fmt: skip
    assert cmd_cost(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [e["method"] for e in printed] == ["contrastive", "triplet", "untrained"]
    contrastive, triplet, untrained = printed
    for entry in (contrastive, triplet):
        assert entry["status"] == "ok"
        for key in ("count_exponent", "time_exponent", "loss_time_exponent", "count_complexity"):
            assert key in entry
        assert [c["batch_size"] for c in entry["measurements"]] == [8, 16, 32]
        for cell in entry["measurements"]:
            assert {"mining_ms", "loss_ms", "evaluated", "tuples", "repeats"} <= set(cell)
        assert entry["throughput"]["images_per_second"] > 0
        assert 0 < entry["throughput"]["mining_loss_share"] < 1
    assert triplet["count_exponent"] == pytest.approx(2.0)
    assert untrained["status"] == "not_applicable" and untrained["count_exponent"] is None

    record = json.loads((tmp_path / "cost" / "smoke.json").read_text())
    assert record["kind"] == "cost" and record["protocol"]["name"] == "smoke"
    assert record["methods"] == printed
    assert record["environment"]["hardware"]["device"] == "cpu"
    assert record["overhead"]["method"] == "contrastive" and record["overhead"]["ratio"] > 0
    figure = tmp_path / "figures" / "cost_smoke.png"
    assert figure.read_bytes().startswith(PNG)

    section = cost_section(tmp_path)
    assert "## Cost: smoke" in section and "| contrastive" in section
    assert "not applicable" in section and "(figures/cost_smoke.png)" in section
    assert cost_section(tmp_path / "nothing") == ""


def test_the_overhead_method_is_an_option(tmp_path: Path):
    """No method is named in the harness: the overhead runs on --overhead-method, else on the
    first method whose throughput was measured."""
    assert overhead_method(["triplet", "contrastive"]) == "triplet"
    assert overhead_method(["triplet", "contrastive"], "contrastive") == "contrastive"
    assert overhead_method([]) is None
    with pytest.raises(HarnessError, match="not among the methods measured"):
        cmd_cost(cost_args("--protocol", "smoke", "--methods", "triplet",
                           "--overhead-method", "contrastive"))  # fmt: skip
    with pytest.raises(HarnessError, match="did you mean 'contrastive'"):
        cmd_cost(cost_args("--protocol", "smoke", "--methods", "triplet",
                           "--overhead-method", "contrastiv"))  # fmt: skip
    args = cost_args(
        "--protocol", "smoke", "--methods", "untrained,triplet,contrastive",
        "--batch-sizes", "8,16", "--repeats", "1", "--steps", "2", "--device", "cpu",
        "--results-dir", str(tmp_path), "--overhead-method", "contrastive", "--json",
    )  # fmt: skip
    assert cmd_cost(args) == 0
    record = json.loads((tmp_path / "cost" / "smoke.json").read_text())
    assert record["overhead"]["method"] == "contrastive" and record["overhead"]["ratio"] > 0


COMMITTED_RESULT = (
    Path(__file__).resolve().parents[3]
    / "results"
    / "reference"
    / "runs"
    / "default"
    / "contrastive"
    / "seed0.json"
)


def test_figures_are_written(tmp_path: Path):
    runs = []
    for method, seeds in (("contrastive", (0, 1)), ("triplet", (0,))):
        for seed in seeds:
            path = tmp_path / "runs" / method / f"seed{seed}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            loss = [1.0 / (e + 1 + seed) for e in range(5)]
            result = json.loads(COMMITTED_RESULT.read_text())  # a real result, then edited
            result["method"]["name"], result["seed"] = method, seed
            result["training"]["epoch_loss"] = loss
            path.write_text(json.dumps(result))
            runs.append(path)
    curve = training_curve(runs, tmp_path / "figs" / "curve.png")
    assert curve.read_bytes().startswith(PNG) and curve.stat().st_size > 5000
    # runs that selected on a validation split get the selection metric's panel too
    with_selection = []
    for path in runs:
        result = json.loads(path.read_text())
        result["selection"] = {"metric": "map@r", "split": "validation", "best_epoch": 3,
                               "per_epoch": [0.1, 0.2, 0.3, 0.25, 0.2], "seconds": 1.0}  # fmt: skip
        path.write_text(json.dumps(result))
        with_selection.append(path)
    both = training_curve(with_selection, tmp_path / "figs" / "curve_val.png")
    assert both.stat().st_size > curve.stat().st_size  # two panels

    gen = torch.Generator().manual_seed(0)
    labels = torch.arange(10).repeat_interleave(8)
    emb = torch.nn.functional.normalize(torch.randn(10, 16, generator=gen)[labels]
                                        + 0.3 * torch.randn(80, 16, generator=gen), dim=1)  # fmt: skip
    counts = distance_histogram(emb, labels, bins=20)
    assert sum(counts["positive"]) == 10 * 8 * 7 // 2  # every unordered pair, once
    assert sum(counts["negative"]) == 80 * 79 // 2 - 10 * 8 * 7 // 2
    one = tmp_path / "runs" / "t" / "m" / "seed0.json"
    one.parent.mkdir(parents=True)
    result = json.loads(COMMITTED_RESULT.read_text())
    result["method"]["name"], result["distances"] = "m", counts
    one.write_text(json.dumps(result))
    hist = distance_histograms([one], tmp_path / "hist.png", "random clusters")
    assert hist.read_bytes().startswith(PNG) and hist.stat().st_size > 5000

    record = {
        "protocol": {"name": "t", "version": 1},
        "settings": {"batch_sizes": [8, 16, 32], "images_per_class": 4, "repeats": 1},
        "methods": [
            {"method": "a", "status": "ok", "measurements": [
                {"batch_size": m, "mining_ms": 0.01 * m, "loss_ms": 1e-3 * m * m,
                 "evaluated": m * m} for m in (8, 16, 32)]},
            {"method": "b", "status": "ok", "measurements": [
                {"batch_size": m, "mining_ms": 0.0, "loss_ms": 0.5, "evaluated": 0}
                for m in (8, 16, 32)]},
        ],
    }  # fmt: skip
    cost = cost_figure(record, tmp_path / "cost.png")
    assert cost.read_bytes().startswith(PNG) and cost.stat().st_size > 5000


def test_figures_draw_one_row_per_family(tmp_path: Path):
    """Methods are grouped by family (the record's, else the registry's; "other" for a name no
    longer registered), so the cost figure grows a row per family, not a line per colour."""
    families = by_family(["triplet", "contrastive", "gone", "npairs", "x"], {"x": "quadruplets"})
    assert families == {"pairs": ["contrastive", "npairs"], "triplets": ["triplet"],
                        "quadruplets": ["x"], "other": ["gone"]}  # fmt: skip
    cells = [{"batch_size": m, "mining_ms": 0.01 * m, "loss_ms": 1e-3 * m * m, "evaluated": m * m}
             for m in (8, 16, 32)]  # fmt: skip
    heights = []
    for names in (["contrastive", "npairs"], ["contrastive", "triplet", "pddm_quadruplet"]):
        record = {
            "protocol": {"name": "t", "version": 1},
            "settings": {"batch_sizes": [8, 16, 32], "images_per_class": 4, "repeats": 1},
            "methods": [{"method": n, "status": "ok", "measurements": cells} for n in names],
        }
        with Image.open(cost_figure(record, tmp_path / f"{len(names)}.png")) as image:
            heights.append(image.height)
    assert heights[1] > 2.5 * heights[0]  # three rows against one


def test_protocols_used_here_have_k_four():
    """The sizes above assume the smoke protocol's K = 4."""
    assert load_protocol("smoke").sampler.images_per_class == 4


def test_a_method_without_a_miner_says_what_its_loss_scores_instead():
    from harness.cost import CostOptions, measure_cost

    ctx = cost_context(load_protocol("smoke"), torch.device("cpu"))
    options = CostOptions([8, 16], repeats=1, steps=1, overhead=False)
    record = measure_cost(ctx, ["proxy_anchor", "contrastive"], options)
    notes = {e["method"]: e["reason"] for e in record["methods"]}
    assert notes["proxy_anchor"].startswith("no miner") and "O(m C)" in notes["proxy_anchor"]
    assert notes["contrastive"] is None
    assert {e["method"]: e["family"] for e in record["methods"]} == {
        "proxy_anchor": "proxies", "contrastive": "pairs"}  # fmt: skip


def test_the_bare_loop_trains_as_the_harness_does_in_bf16_on_augmented_batches(tmp_path: Path):
    """The overhead's reference: batches prepared once up front (the augmented images the
    harness's pipeline makes for the same steps), the model under autocast in the protocol's
    precision; three steps of each give the same weights, bit for bit, on the CPU."""
    import copy
    import dataclasses

    from tiny_training import fresh_contrastive

    from harness.core import AugmentationSpec, OpSpec
    from harness.cost.overhead import _bare_loop, _Loops
    from harness.cost.throughput import training_set
    from harness.data import prepare_data
    from harness.train import Model, train

    spec = AugmentationSpec(
        load_size=20,
        train=[OpSpec("random_crop", size=16), OpSpec("horizontal_flip")],
        test=[OpSpec("center_crop", size=16)],
    )
    protocol = dataclasses.replace(load_protocol("smoke"), augmentation=spec, precision="bf16")
    backbone, method = fresh_contrastive(protocol)
    cpu = torch.device("cpu")
    ctx = cost_context(protocol, cpu)
    data = training_set(prepare_data(protocol, None))
    loops = _Loops(ctx, Model(backbone, method), data, tmp_path / "c.pt")
    staged = loops.inputs.images
    assert len(staged) == loops.steps and staged[0].shape == (16, 1, 16, 16)
    first3 = dataclasses.replace(loops.inputs, batches=loops.inputs.batches[:3])
    bare_bb, bare_m = copy.deepcopy(backbone), copy.deepcopy(method)
    _bare_loop(bare_bb, bare_m, first3)
    train(ctx.replace(max_steps=3, workers=0), Model(backbone, method), data)
    ours, bare = backbone.state_dict(), bare_bb.state_dict()
    assert all(torch.equal(ours[k], bare[k]) for k in ours)
    fp32 = dataclasses.replace(protocol, precision="fp32")
    fp32_bb, fp32_m = fresh_contrastive(fp32)
    _bare_loop(fp32_bb, fp32_m, dataclasses.replace(first3, protocol=fp32))
    assert not all(torch.equal(fp32_bb.state_dict()[k], bare[k]) for k in bare)  # autocast acts


class _SlowFeeder:
    """Batches that take at least `seconds` each to arrive (as harness.data.Feeder)."""

    def __init__(self, images, seconds: float) -> None:
        self.images, self.seconds, self.wait, self.workers = images, seconds, 0.0, 0

    def batches(self, keys):
        import time

        for n, idx in keys:
            time.sleep(self.seconds)
            self.wait += self.seconds
            yield n, torch.as_tensor(idx), self.images[idx]

    def close(self) -> None:
        pass


class _SlowLoading:
    """Images on a slow "disk": each batch takes `seconds` to load (as LazyImages)."""

    def __init__(self, images: torch.Tensor, seconds: float) -> None:
        self.images, self.seconds = images, seconds
        self.dtype, self.ndim, self.shape = images.dtype, images.ndim, images.shape

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, idx):
        return _SlowLoading(self.images[idx], self.seconds)

    def load(self) -> torch.Tensor:
        import time

        time.sleep(self.seconds)
        return self.images


def test_throughput_windows_hold_every_steps_data_wait_and_no_data_preparation(monkeypatch):
    """Fed batches: the timed window holds `steps` steps and all their waits, so images/s can
    never exceed what the data delivers. Unfed: batches are loaded before the clock starts (a
    run's workers prepare them beside the step), so slow loading is not step time."""
    import dataclasses

    from tiny_training import fresh_contrastive

    import harness.train.loop
    from harness.cost import measure_throughput
    from harness.cost.throughput import training_set
    from harness.data import prepare_data
    from harness.train import Model

    protocol = load_protocol("smoke")
    prepared = prepare_data(protocol, None)
    data = training_set(prepared)
    ctx, batch = cost_context(protocol, torch.device("cpu")), protocol.sampler.batch_size
    with monkeypatch.context() as patch:  # the loop's feeder, slowed down
        patch.setattr(harness.train.loop, "run_feeder",
                      lambda ctx, images, augment: _SlowFeeder(images, 0.2))  # fmt: skip
        fed = measure_throughput(ctx, Model(*fresh_contrastive(protocol)), data, steps=3,
                                 warmup=1, fed=True)  # fmt: skip
    assert fed["images_per_second"] <= batch / 0.2
    window = fed["step_ms"] * 3 / 1000  # seconds; the stub's 3 waits of 0.2 s are inside it
    assert fed["data_wait_share"] * window == pytest.approx(0.6, abs=0.01)
    slow = _SlowLoading(prepared.data.images, 1.0)
    on_disk = dataclasses.replace(prepared, data=dataclasses.replace(prepared.data, images=slow))
    unfed = measure_throughput(ctx, Model(*fresh_contrastive(protocol)), training_set(on_disk),
                               steps=2, warmup=1)  # fmt: skip
    assert unfed["step_ms"] < 1000  # a 1 s load per step would be in every step's time


def test_cost_times_the_harness_own_step_optimizer_and_feeder(monkeypatch):
    """No second training setup in cost/: every step that throughput, the pipeline's
    data-wait share and the overhead's harness side time is harness.train's TrainingStep,
    holding the optimizer and scaler of the TrainingState that harness.train made for it,
    fed by the loop's Feeder; the overhead's harness side is `harness.train.train` itself."""
    from harness.cost import measure_overhead, measure_throughput
    from harness.cost.pipeline import WARMUP_BATCHES, _data_wait
    from harness.cost.throughput import training_set
    from harness.data import Feeder, prepare_data
    from harness.train import TrainingState, TrainingStep, build_model

    states, calls, fed = [], [], []
    init, call, batches = TrainingState.__init__, TrainingStep.__call__, Feeder.batches

    def spy_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        states.append(self)

    def spy_call(self, idx, check_indices=False, images=None, step=0):
        calls.append((self, images))
        return call(self, idx, check_indices, images, step)

    def spy_batches(self, keys):
        for item in batches(self, keys):
            fed.append(item[2])
            yield item

    monkeypatch.setattr(TrainingState, "__init__", spy_init)
    monkeypatch.setattr(TrainingStep, "__call__", spy_call)
    monkeypatch.setattr(Feeder, "batches", spy_batches)
    protocol = load_protocol("smoke")
    ctx = cost_context(protocol, torch.device("cpu"))
    data = training_set(prepare_data(protocol, None))

    def model() -> Any:
        return build_model(ctx, "contrastive", {}, in_channels=1,
                           num_classes=len(np.unique(data.labels)), num_coarse_classes=None)  # fmt: skip

    def check_and_clear(steps: int, made: Any) -> None:
        """`steps` calls of the harness's step on `made`, with its state's optimizer."""
        assert len(calls) == steps and len(states) == 1
        for step, images in calls:
            assert step.optimizer is states[0].optimizer and step.scaler is states[0].scaler
            assert step.backbone is made.backbone and step.method is made.method
            assert any(images is x for x in fed)  # the loop's feeder prepared it
        calls.clear()
        states.clear()
        fed.clear()

    made = model()
    assert measure_throughput(ctx, made, data, steps=3, warmup=1)["images_per_second"] > 0
    check_and_clear(1 + 3, made)
    made = model()
    monkeypatch.setattr("harness.cost.pipeline.build_model", lambda *args, **kwargs: made)
    assert 0 <= _data_wait(ctx.replace(workers=0), data, 2, "contrastive")["data_wait_share"] < 1
    check_and_clear(WARMUP_BATCHES + 2, made)
    overhead = measure_overhead(ctx.replace(workers=0), model(), data, rounds=1)
    assert overhead["ratio"] > 0 and len(states) == 2  # the bare loop's batches, then `train`
    assert len(calls) == overhead["steps"]  # the harness's steps only: the bare loop is by hand
    assert all(step.optimizer is states[1].optimizer for step, _ in calls)
    assert all(any(images is x for x in fed) for _, images in calls)


def test_a_failed_devices_run_shows_the_ranks_own_error():
    from harness.cost.devices import _rank_error

    stderr = """[rank0]: Traceback (most recent call last):
[rank0]:   File "/x/harness/cost/devices.py", line 150, in _rank
[rank0]: harness.errors.HarnessError: weights file /w.pth does not exist (from --weights or weights_file)
E1123 22:10:01 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 1)
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
"""
    assert (
        _rank_error(stderr) == "weights file /w.pth does not exist (from --weights or weights_file)"
    )
    assert _rank_error("RuntimeError: gloo timed out\n=====\n") == "RuntimeError: gloo timed out"
    assert _rank_error("") == "no output"
