"""`--tracker tensorboard|mlflow`: each tool's own reader finds what the result file says; a
resumed run goes on in the same tracker run; a tuning trial is a child of its study's run;
a bad URI, a tracking server that is down or a missing package is a one-line error before any
training, in seconds; a tracker failing mid-run (or mid-sweep) costs the run nothing."""

from __future__ import annotations

import http.server
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

import harness.records.trackers
from harness.cli import main
from harness.core import PROTOCOL_DIR, HarnessError
from harness.records import TrackerConfig, metric_key, open_tracker, tracking_config
from harness.records.trackers import is_server

REPO = Path(__file__).resolve().parents[2]


def three_epochs(tmp: Path) -> str:
    path = tmp / "smoke3.yaml"
    text = (REPO / "protocols" / "smoke.yaml").read_text()
    path.write_text(text.replace("budget: {steps: 4}", "budget: {epochs: 3}"))
    return str(path)


def run(tmp: Path, tracker: str, *extra: str, protocol: str = "smoke") -> int:
    return main(["-q", "run", "--protocol", protocol, "--method", "contrastive", "--results-dir",
                 str(tmp / "results"), "--tracker", tracker, *extra])  # fmt: skip


def result(tmp: Path) -> dict:
    return json.loads((tmp / "results/runs/smoke/contrastive/seed0.json").read_text())


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def mlflow_runs(tmp: Path) -> list:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{(tmp / 'results/tracking/mlflow/mlflow.db').resolve()}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("dml-harness")
    return client, client.search_runs([experiment.experiment_id])


def test_tensorboard_holds_the_results_metrics_and_losses(tmp_path):
    protocol = three_epochs(tmp_path)
    assert run(tmp_path, "tensorboard", protocol=protocol) == 0
    record = result(tmp_path)
    (folder,) = (tmp_path / "results/tracking/tensorboard/smoke/contrastive").iterdir()
    assert folder.name.startswith("seed0-") and (folder / "seed0.json").is_file()
    found = scalars(folder)
    for name, value in record["metrics"].items():
        assert found[f"test/{metric_key(name)}"][-1][1] == pytest.approx(value, rel=1e-6)
    losses = [v for _, v in found["train/loss"]]
    assert losses == pytest.approx(record["training"]["epoch_loss"], rel=1e-5)
    steps = [s for s, _ in found["train/loss"]]
    per_epoch = record["training"]["steps"] // 3
    assert steps == [per_epoch, 2 * per_epoch, 3 * per_epoch]
    assert {"train/lr_group0", "train/images_per_second"} <= set(found)


def test_mlflow_holds_the_results_metrics_params_and_file(tmp_path):
    assert run(tmp_path, "mlflow") == 0
    record = result(tmp_path)
    client, (found,) = mlflow_runs(tmp_path)
    assert found.info.status == "FINISHED"
    assert found.info.run_name.startswith("smoke/contrastive/seed0-")
    metrics = found.data.metrics
    for name, value in record["metrics"].items():
        assert metrics[f"test/{metric_key(name)}"] == pytest.approx(value, rel=1e-6)
    params = found.data.params
    assert params["protocol_hash"] == record["protocol"]["hash"]
    assert params["method"] == "contrastive" and params["seed"] == "0"
    assert params["hp.margin"] == "1.0" and params["precision"] == "fp32"
    artifacts = [a.path for a in client.list_artifacts(found.info.run_id)]
    assert artifacts == ["seed0.json"]


@pytest.mark.slow
def test_a_resumed_run_goes_on_in_the_same_tracker_run(tmp_path, monkeypatch):
    """Interrupted after its first epoch, then run again: one MLflow run, no doubled steps in
    TensorBoard, and the final metrics are the result's."""
    import harness.sweep.runner

    protocol = three_epochs(tmp_path)
    real = harness.sweep.runner.execute_run

    def interrupted(spec, record, path, **kw):
        def crash(epoch: int) -> None:
            if epoch == 1:
                raise KeyboardInterrupt

        return real(spec, record, path, **{**kw, "on_epoch_end": crash})

    for tracker in ("mlflow", "tensorboard"):
        monkeypatch.setattr(harness.sweep.runner, "execute_run", interrupted)
        assert run(tmp_path, tracker, protocol=protocol) == 130
        monkeypatch.setattr(harness.sweep.runner, "execute_run", real)
        assert run(tmp_path, tracker, protocol=protocol) == 0  # the same command again
        record = result(tmp_path)
        per_epoch = record["training"]["steps"] // 3
        epochs = [per_epoch, 2 * per_epoch, 3 * per_epoch]
        assert record["training"]["resumed_from_step"] == per_epoch
        if tracker == "mlflow":
            client, runs = mlflow_runs(tmp_path)
            assert len(runs) == 1 and runs[0].info.status == "FINISHED"
            history = client.get_metric_history(runs[0].info.run_id, "train/loss")
            assert sorted(m.step for m in history) == epochs
            for name, value in record["metrics"].items():
                assert runs[0].data.metrics[f"test/{metric_key(name)}"] == pytest.approx(value)
        else:
            (folder,) = (tmp_path / "results/tracking/tensorboard/smoke/contrastive").iterdir()
            found = scalars(folder)
            assert [s for s, _ in found["train/loss"]] == epochs
            assert [v for _, v in found["train/loss"]] == pytest.approx(
                record["training"]["epoch_loss"], rel=1e-5
            )
            recall = record["metrics"]["recall@1"]
            assert found["test/recall_at_1"] == [(epochs[-1], pytest.approx(recall))]
        (tmp_path / "results/runs/smoke/contrastive/seed0.json").unlink()


def test_a_finished_run_is_skipped_and_logs_nothing(tmp_path):
    assert run(tmp_path, "mlflow") == 0
    assert run(tmp_path, "mlflow") == 0  # skipped: the same finished result
    _, runs = mlflow_runs(tmp_path)
    assert len(runs) == 1


@pytest.mark.slow
def test_each_trial_is_a_child_run_of_the_study(tmp_path):
    data = yaml.safe_load((PROTOCOL_DIR / "learning.yaml").read_text())
    data["name"], data["split"]["validation_fraction"] = "learning_val", 0.25
    protocol = tmp_path / "learning_val.yaml"
    protocol.write_text(yaml.safe_dump(data))
    assert main(["-q", "tune", "--protocol", str(protocol), "--method", "contrastive",
                 "--trials", "2", "--max-steps", "6", "--results-dir", str(tmp_path / "results"),
                 "--tracker", "mlflow"]) == 0  # fmt: skip
    _, runs = mlflow_runs(tmp_path)
    (study,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == study.info.run_id]
    assert len(runs) == 3 and len(trials) == 2
    assert study.info.run_name.startswith("tune/learning_val/contrastive-")
    assert all(t.info.status == "FINISHED" and "objective" in t.data.metrics for t in trials)
    assert "tune/objective" in study.data.metrics


@pytest.mark.parametrize("tracker", ["tensorboard", "mlflow"])
def test_an_unwritable_uri_is_one_line_before_any_training(tmp_path, capsys, tracker):
    (tmp_path / "a_file").write_text("")
    uri = str(tmp_path / "a_file" / "below")
    uri = uri if tracker == "tensorboard" else f"sqlite:///{uri}/mlflow.db"
    assert run(tmp_path, tracker, "--tracker-uri", uri) == 2
    err = capsys.readouterr().err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1
    assert f"the {tracker} tracker cannot" in err and "Traceback" not in err
    assert not (tmp_path / "results/runs").exists()


def test_a_missing_package_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)  # import mlflow.tracking fails
    assert run(tmp_path, "mlflow") == 2
    err = capsys.readouterr().err
    assert (
        "error: --tracker mlflow needs the mlflow package: pip install 'dml-harness[mlflow]'" in err
    )
    assert not (tmp_path / "results/runs").exists()


def test_a_tracker_failing_mid_run_warns_once_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    def broken(self, step, values):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(harness.records.trackers.TensorBoardTracker, "_log_epoch", broken)
    with caplog.at_level(logging.WARNING, logger="harness"):
        assert run(tmp_path, "tensorboard", protocol=three_epochs(tmp_path)) == 0
    assert result(tmp_path)["status"] == "ok"
    warnings = [r for r in caplog.records if "tracking at" in r.getMessage()]
    assert len(warnings) == 1 and "No space left on device" in warnings[0].getMessage()


def free_port() -> int:
    """A local port with nothing listening: bound, then closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def no_proxy(monkeypatch):
    """Requests to 127.0.0.1 go straight there, whatever proxy the machine names."""
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def test_a_tracking_server_that_is_down_is_one_line_in_seconds(tmp_path, no_proxy):
    """Nothing listening at the URI: one line naming it and the fix, exit 2, no run started,
    within seconds (MLflow's own retries held the command for six minutes)."""
    uri = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "harness", "-q", "run", "--protocol", "smoke", "--method",
         "contrastive", "--results-dir", str(tmp_path / "results"), "--tracker", "mlflow",
         "--tracker-uri", uri],
        cwd=REPO, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert time.monotonic() - started < 60
    err = done.stderr.strip()
    assert err.count("\n") == 0 and "Retrying" not in err, err
    assert err.startswith(f"error: the mlflow tracker cannot reach the server {uri} ")
    assert "start the tracking server" in err and "drop --tracker" in err
    assert not (tmp_path / "results/runs").exists()


class _Answers503(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(503)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_a_server_that_answers_with_errors_is_refused_in_seconds(no_proxy):
    """Something listens (the probe passes) but it answers 503, which MLflow retries with a
    growing backoff: the check before any run is bounded to seconds all the same."""
    server = http.server.HTTPServer(("127.0.0.1", 0), _Answers503)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_port}"
    started = time.monotonic()
    try:
        harness.records.trackers.probe_server(uri, "--tracker-uri")  # an answer: it is there
        with pytest.raises(HarnessError, match=f"the mlflow tracker cannot use {uri} "):
            tracking_config("mlflow", uri, "unused")
    finally:
        server.shutdown()
    assert time.monotonic() - started < 30


def test_local_stores_are_not_probed(tmp_path, monkeypatch):
    def probe(*args):
        raise AssertionError("a local store was probed over the network")

    monkeypatch.setattr(harness.records.trackers, "probe_server", probe)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert tracking_config("mlflow", uri, tmp_path).uri == uri
    folder = str(tmp_path / "tb")
    assert tracking_config("tensorboard", folder, tmp_path).uri == folder
    assert [is_server(u) for u in ("http://h:5000", "HTTPS://h", uri, "file:/x", "/x", None)] == [
        True, True, False, False, False, False]  # fmt: skip


def test_a_server_that_stops_answering_mid_sweep_costs_a_run_seconds(caplog, no_proxy):
    """A run's tracker whose server is gone: its first call gives up within seconds (not
    MLflow's minutes of retries), warns once naming the tracker, and tracks nothing more."""
    uri = f"http://127.0.0.1:{free_port()}"
    tracker = open_tracker(TrackerConfig("mlflow", uri))
    caller = threading.Thread(target=tracker.start, args=("smoke/x/seed0", "abc", {}), daemon=True)
    with caplog.at_level(logging.WARNING, logger="harness"):
        caller.start()
        caller.join(timeout=45)
        assert not caller.is_alive(), "the tracker held the run for MLflow's retries"
        tracker.log_epoch(1, {"train/loss": 1.0})
        tracker.close("FINISHED")
    assert tracker.broken
    (warning,) = [r.getMessage() for r in caplog.records if "tracking at" in r.getMessage()]
    assert warning.startswith(f"mlflow tracking at {uri} stopped (the run goes on")
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ  # bounded only while it called


def test_a_sweep_goes_on_when_the_tracker_stops_answering(tmp_path, monkeypatch, caplog):
    """Two runs; the server stops answering in the first: both finish and are written, and
    each warns once, naming the tracker."""

    def gone(self, step, values):
        raise ConnectionError("HTTPConnectionPool(host='mlflow', port=5000): Max retries\nmore")

    monkeypatch.setattr(harness.records.trackers.MlflowTracker, "_log_epoch", gone)
    with caplog.at_level(logging.WARNING, logger="harness"):
        assert run(tmp_path, "mlflow", "--seeds", "0,1") == 0
    for seed in (0, 1):
        path = tmp_path / f"results/runs/smoke/contrastive/seed{seed}.json"
        assert json.loads(path.read_text())["status"] == "ok"
    warnings = [r.getMessage() for r in caplog.records if "tracking at" in r.getMessage()]
    uri = f"sqlite:///{(tmp_path / 'results/tracking/mlflow/mlflow.db').resolve()}"
    assert len(warnings) == 2 and all(w.startswith(f"mlflow tracking at {uri} stopped")
                                      for w in warnings)  # fmt: skip
    assert all(w.endswith("ConnectionError: HTTPConnectionPool(host='mlflow', port=5000): "
                          "Max retries") for w in warnings)  # fmt: skip
