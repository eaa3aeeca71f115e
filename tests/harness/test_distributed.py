"""One run on several processes: the gradients of a step with the batch split over 2 ranks
(gloo, CPU) equal the one-process gradients, for every registered method.

Both sides run under torchrun, as a user would launch it (tests/distributed_worker.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import harness.methods  # noqa: F401
import pytest
import torch

from harness.core import METHODS, Dist, HarnessError, MethodContext
from harness.train import convert_batchnorm

pytestmark = pytest.mark.slow  # minutes: run by the README's test command, not by a bare pytest
REPO = Path(__file__).resolve().parents[2]
TRAINED = [n for n in METHODS.names() if METHODS.get(n).build(MethodContext((16,), 8, 4, 2)).trains]


def torchrun(*args: str, nproc: int = 2) -> None:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}",
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
           "--standalone", *args]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:  # a hung rendezvous: take the workers down too
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
    assert proc.returncode == 0, output[-5000:]


@pytest.fixture(scope="module")
def grads(tmp_path_factory) -> dict[str, dict[str, dict]]:
    """float64 (the algebra, without float32 rounding) and float32 (what trains), from one
    torchrun."""
    folder = tmp_path_factory.mktemp("ddp")
    torchrun("tests/distributed_worker.py", "grads", str(folder), ",".join(TRAINED))
    return {dtype: torch.load(folder / f"{dtype}.pt") for dtype in ("float64", "float32")}


# the tests of the grads fixture run on one xdist worker, which computes it once
GRADS = pytest.mark.xdist_group("ddp_grads")


@GRADS
@pytest.mark.parametrize("name", TRAINED)
def test_two_process_gradients_equal_one_process_gradients(grads, name):
    """Every parameter (backbone, head, proxies, PDDM unit): in float64 equal to 1e-6 (they
    agree to ~1e-13), in float32 to float rounding (1e-4 of the largest gradient)."""
    for dtype, atol in (("float64", 1e-6), ("float32", None)):
        split, whole = grads[dtype][name]["distributed"], grads[dtype][name]["single"]
        assert split.keys() == whole.keys() and whole
        assert {g.dtype for g in whole.values()} == {getattr(torch, dtype)}  # as asked
        scale = max(g.abs().max().item() for g in whole.values())
        assert scale > 0  # a step that trains nothing proves nothing
        for key, g in whole.items():
            torch.testing.assert_close(
                split[key], g, rtol=0, atol=atol or 1e-4 * scale, msg=f"{dtype} {key}"
            )


@GRADS
def test_per_shard_batchnorm_is_caught(grads):
    """The control: with BatchNorm statistics per shard (plain DDP without SyncBatchNorm) the
    gradients differ, so the equality above is not vacuous."""
    case = grads["float32"]["contrastive"]
    worst = max((case["unsynced_batchnorm"][k] - g).abs().max().item()
                for k, g in case["single"].items())  # fmt: skip
    assert worst > 1e-3


def test_twenty_steps_on_two_processes_follow_the_one_process_curve(tmp_path):
    path = tmp_path / "curve.pt"
    torchrun("tests/distributed_worker.py", "curve", str(path), "proxy_anchor", "20")
    runs = torch.load(path)
    assert runs["distributed"]["world"] == 2 and runs["single"]["world"] == 1
    split, whole = runs["distributed"]["losses"], runs["single"]["losses"]
    assert len(split) == len(whole) == 7  # 20 steps of 3 batches per epoch
    torch.testing.assert_close(torch.tensor(split), torch.tensor(whole), rtol=1e-4, atol=1e-5)
    for key, value in runs["single"]["state"].items():
        torch.testing.assert_close(runs["distributed"]["state"][key], value, rtol=1e-3,
                                   atol=1e-4, msg=key)  # fmt: skip


def test_an_interrupted_two_process_run_resumes_bit_identically(tmp_path):
    """Interrupted after epoch 2 of 4 and resumed from the checkpoint rank 0 wrote, a
    2-process run ends with exactly the losses and weights of an uninterrupted one."""
    path = tmp_path / "resume.pt"
    torchrun("tests/distributed_worker.py", "resume", str(path), "proxy_anchor", "12")
    saved = torch.load(path)
    (whole_loss, whole_state), (loss, state) = saved["whole"], saved["resumed"]
    assert saved["from"] == 6 and len(whole_loss) == 4 and loss == whole_loss
    assert all(torch.equal(state[k], v) for k, v in whole_state.items())


def test_synchronised_batchnorm_keeps_timm_activations_and_survives_fp16(tmp_path):
    """timm's BatchNormAct2d (a BatchNorm2d subclass with its activation inside) keeps its
    activation when synchronised: 2 ranks on halves of a batch give the one-process outputs;
    under CPU fp16 autocast the statistics are summed in float32, so they stay finite."""
    path = tmp_path / "bn.pt"
    torchrun("tests/distributed_worker.py", "batchnorm", str(path))
    saved = torch.load(path)
    assert saved["types"] == ["Conv2d", "SyncBatchNormAct", "Conv2d", "SyncBatchNorm"]
    torch.testing.assert_close(saved["split"], saved["whole"], rtol=1e-4, atol=1e-4)
    assert torch.isfinite(saved["fp16"]).all()
    torch.testing.assert_close(saved["fp16"], saved["whole"], rtol=0.05, atol=0.05)


def test_a_batchnorm_it_cannot_synchronise_is_a_clear_error():
    class OwnNorm(torch.nn.BatchNorm2d):
        pass

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), OwnNorm(4))
    with pytest.raises(HarnessError, match="OwnNorm is a BatchNorm the harness"):
        convert_batchnorm(net)


def test_ranks_that_resume_at_different_steps_stop_with_a_clear_error(tmp_path):
    """A node without rank 0's checkpoint (no shared --results-dir) would start at step 0
    while rank 0 resumes: every rank stops with the same one-line error instead."""
    path = tmp_path / "mismatch.pt"
    torchrun("tests/distributed_worker.py", "mismatch", str(path), "proxy_anchor")
    errors = torch.load(path)
    assert errors[0] == errors[1]
    assert "resumed at different steps (0 and 3)" in errors[0]  # after epoch 1 of 3 steps


def test_a_batch_that_does_not_split_is_a_clear_error():
    with pytest.raises(HarnessError, match="does not split over 3 processes"):
        Dist(rank=0, world_size=3, backend="gloo").shard(64)
    assert Dist(rank=1, world_size=2, backend="gloo").shard(64) == slice(32, 64)


def test_torchrun_harness_run_writes_one_result_like_one_process(tmp_path):
    """`torchrun --nproc_per_node 2 -m harness run ...`: rank 0 writes the result (with its
    world size and per-rank throughput); metrics equal a one-process run's to float rounding;
    the same command again skips the finished run on every rank."""
    import json

    from harness.cli import main

    command = ["-m", "harness", "run", "--protocol", "smoke", "--method", "proxy_anchor"]
    torchrun(*command, "--results-dir", str(tmp_path / "two"))
    assert main(["-q", *command[2:], "--results-dir", str(tmp_path / "one")]) == 0
    two, one = (
        json.loads((tmp_path / d / "runs/smoke/proxy_anchor/seed0.json").read_text())
        for d in ("two", "one")
    )
    assert two["distributed"]["world_size"] == 2 and two["distributed"]["backend"] == "gloo"
    assert two["distributed"]["images_per_second_per_rank"] > 0 and "distributed" not in one
    # the run's throughput counts whole batches: each of the 2 ranks embedded half of them
    per_rank, total = two["distributed"]["images_per_second_per_rank"], two["timings"]
    assert per_rank == pytest.approx(total["images_per_second"] / 2, abs=0.06)
    assert two["training"]["steps"] == one["training"]["steps"] == 4
    for name, value in one["metrics"].items():
        assert abs(two["metrics"][name] - value) < 1e-3, name
    before = (tmp_path / "two/runs/smoke/proxy_anchor/seed0.json").read_text()
    torchrun(*command, "--results-dir", str(tmp_path / "two"))
    assert (tmp_path / "two/runs/smoke/proxy_anchor/seed0.json").read_text() == before


def test_cost_devices_measures_the_step_on_1_and_2_processes(tmp_path, capsys):
    """`cost --devices 2`: torchrun on 1 (added: the baseline) and 2 processes; speedup and
    efficiency follow from the measured img/s, and the leaderboard's Cost section shows them."""
    import json

    from harness.cli import main
    from harness.report import cost_section

    args = ["cost", "--devices", "2", "--protocol", "smoke", "--methods", "proxy_anchor",
            "--steps", "3", "--results-dir", str(tmp_path), "--json"]  # fmt: skip
    assert main(["-q", *args]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["processes"] for r in rows] == [1, 2]
    one, two = rows
    assert {r["backend"] for r in rows} == {"gloo"}
    assert two["images_per_second_per_rank"] == pytest.approx(two["images_per_second"] / 2, 0.01)
    assert two["speedup"] == pytest.approx(
        two["images_per_second"] / one["images_per_second"], 1e-2
    )
    assert two["efficiency"] == pytest.approx(two["speedup"] / 2, abs=1e-3)
    record = json.loads((tmp_path / "cost/devices/smoke.json").read_text())
    assert record["settings"]["threads_per_rank"] == max(1, (os.cpu_count() or 1) // 2)
    section = cost_section(tmp_path)
    assert "Scaling across devices: smoke" in section and "| 2 " in section


def test_torchrun_ranks_load_the_plugin_and_rank_0_saves_the_embeddings(tmp_path, capsys):
    """Every rank parses the same `--plugin` (its method exists on both, else the run would
    fail on rank 1); rank 0 alone writes the result with the plugin's source and the saved
    embeddings, whose rescoring gives the run's metrics."""
    import json

    from harness.cli import main
    from tests.harness.test_plugins import plugin_file

    plugin = plugin_file(tmp_path)
    results = tmp_path / "two"
    torchrun("-m", "harness", "run", "--protocol", "smoke", "--method", "plug_margin",
             "--plugin", str(plugin), "--save-embeddings", "--results-dir", str(results))  # fmt: skip
    record = json.loads((results / "runs/smoke/plug_margin/seed0.json").read_text())
    assert record["distributed"]["world_size"] == 2
    assert record["method"]["source"]["path"] == str(plugin.resolve())
    saved = results / "runs/smoke/plug_margin/seed0.embeddings"
    assert main(["evaluate", str(saved), "--json"]) == 0
    scored = json.loads(capsys.readouterr().out)
    for name, value in record["metrics"].items():
        assert abs(scored[name] - value) < 1e-9, name
