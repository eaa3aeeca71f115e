"""The two trackers behind `harness.records.tracking.Tracker`, each through its tool's own
library: TensorBoard (torch.utils.tensorboard.SummaryWriter) and MLflow (MlflowClient, with
explicit run ids and no global state). Imported only when a run asks for one."""

from __future__ import annotations

import http.client
import logging
import os
import re
import shutil
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from harness.core import HarnessError
from harness.records.tracking import (
    EXPERIMENT,
    NO_TRACKING,
    TRACKERS,
    Tracker,
    TrackerConfig,
    first_line,
)

IDENTITY_TAG = "harness.identity"  # the MLflow tag a resumed run is found again by
MAX_PARAM_CHARS = 6000  # MLflow's limit on a parameter's value
# MLflow retries a failed HTTP request 7 times with a growing backoff, each try allowed 120 s:
# a tracking server that is down held the start of a command for six minutes. The harness
# bounds it: before any run, one request of PROBE_SECONDS; during a run, each call to the
# server RUN_RETRIES retries of at most RUN_TIMEOUT s (then the tracker warns and stops).
PROBE_SECONDS = 5
RUN_RETRIES, RUN_TIMEOUT = 2, 10


def _params_table(params: dict[str, Any]) -> str:
    return "\n".join(["| parameter | value |", "|---|---|"] +
                     [f"| {k} | {v} |" for k, v in params.items()])  # fmt: skip


class TensorBoardTracker(Tracker):
    """One log folder per run: <uri>/<protocol>/<run>/seed<k>-<identity> (a tuning trial: a
    subfolder of its study's). A resumed run writes into the same folder; its writer opens at
    the first step it logs with `purge_step` there, so the events an interrupted session
    wrote after its last checkpoint are dropped, never doubled."""

    kind = "tensorboard"

    def __init__(self, config: TrackerConfig) -> None:
        super().__init__(config)
        self.writer: Any = None
        self.folder: Path | None = None
        self.params: dict[str, Any] = {}

    def _start(self, name: str, identity: str, params: dict[str, Any]) -> None:
        self.folder = Path(str(self.config.uri)) / (self.config.parent or "") / f"{name}-{identity}"
        self.params = params

    def _open(self, step: int) -> Any:
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            assert self.folder is not None
            fresh = not any(self.folder.glob("events.out.tfevents.*"))
            self.writer = SummaryWriter(str(self.folder), purge_step=step)
            if fresh:
                self.writer.add_text("params", _params_table(self.params), 0)
        return self.writer

    def _log_epoch(self, step: int, values: dict[str, float]) -> None:
        writer = self._open(step)
        for key, value in values.items():
            writer.add_scalar(key, value, step)
        writer.flush()

    def _log_final(self, step: int, metrics: dict[str, float], artifacts: list[Path]) -> None:
        writer = self._open(step)
        for key, value in metrics.items():
            writer.add_scalar(key, value, step)
        writer.flush()
        for path in artifacts:  # TensorBoard has no artifacts: the files beside the events
            shutil.copyfile(path, Path(writer.log_dir) / path.name)

    def _close(self, status: str) -> None:
        if self.writer is not None:
            self.writer.close()

    def reference(self) -> str | None:
        if self.broken or self.folder is None:
            return None
        return str(self.folder.relative_to(Path(str(self.config.uri))))


def _experiment(client: Any, config: TrackerConfig) -> str:
    """The id of the harness's experiment in the store, created on first use (a local store
    keeps its artifacts beside it, in artifacts/)."""
    found = client.get_experiment_by_name(EXPERIMENT)
    if found is not None:
        return found.experiment_id
    folder = local_folder(config)
    location = (folder / "artifacts").resolve().as_uri() if folder is not None else None
    try:
        return client.create_experiment(EXPERIMENT, artifact_location=location)
    except Exception:  # another process created it meanwhile
        return client.get_experiment_by_name(EXPERIMENT).experiment_id


def is_server(uri: str | None) -> bool:
    """Whether a tracking URI names a server over the network (http:// or https://); a
    local store (sqlite:, file:, a folder) is not probed."""
    return urlsplit(str(uri or "")).scheme.lower() in ("http", "https")


def probe_server(uri: str, option: str, seconds: float = PROBE_SECONDS) -> None:
    """One request to a tracking server, with a timeout of `seconds` and no retries, before
    any run: a server that is down (nothing listening, a host that does not answer, a name
    that does not resolve) is a one-line error in seconds, not after MLflow's minutes of
    retries. Any answer, even an HTTP error status or a TLS complaint, means something listens:
    MLflow's own check (check_mlflow) then judges it."""
    try:
        with urllib.request.urlopen(urllib.request.Request(uri), timeout=seconds):
            return
    except urllib.error.HTTPError:
        return  # an answer (401, 404, 503 ...): the server is there
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ssl.SSLError):
            return  # it answered, over TLS: MLflow's client (its own TLS settings) judges it
        reason: object = exc.reason
    except http.client.HTTPException:
        return  # it answered, though not as HTTP expects: MLflow's check says what is wrong
    except ValueError:
        return  # a URI urllib cannot send (credentials in it, ...): MLflow's check judges it
    except OSError as exc:  # a timeout while reading the answer
        reason = exc
    if isinstance(reason, TimeoutError) or "timed out" in str(reason):
        reason = f"no answer within {seconds:g} s"
    raise HarnessError(
        f"the mlflow tracker cannot reach the server {uri} ({option}): {reason}; start the "
        "tracking server (or fix the URI), or drop --tracker"
    )


@contextmanager
def bounded_http(uri: str | None, retries: int, timeout: int) -> Iterator[None]:
    """MLflow's HTTP retries and per-request timeout bounded while the block runs, for a
    tracking server's URI (nothing changes for a local store). A value the user set in the
    environment (MLFLOW_HTTP_REQUEST_MAX_RETRIES, MLFLOW_HTTP_REQUEST_TIMEOUT) wins; urllib3's
    one warning per retry is held back, since the harness says once what failed."""
    if not is_server(uri):
        yield
        return
    bounds = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(retries),
              "MLFLOW_HTTP_REQUEST_TIMEOUT": str(timeout)}  # fmt: skip
    added = [name for name in bounds if name not in os.environ]
    retry_log = logging.getLogger("urllib3.connectionpool")
    level = retry_log.level
    os.environ.update({name: bounds[name] for name in added})
    retry_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        retry_log.setLevel(level)
        for name in added:
            os.environ.pop(name, None)


def check_mlflow(config: TrackerConfig, option: str) -> None:
    """Open the store once before any training: a bad URI is a one-line error here. A
    tracking server is first probed with one short request (probe_server), and the store is
    opened with MLflow's retries bounded, so a server that is down costs seconds."""
    from mlflow.tracking import MlflowClient

    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)  # "Creating tables"
    if is_server(config.uri):
        probe_server(str(config.uri), option)
    try:
        with bounded_http(config.uri, retries=1, timeout=2 * PROBE_SECONDS):
            _experiment(MlflowClient(tracking_uri=config.uri), config)
    except Exception as exc:
        raise HarnessError(f"the mlflow tracker cannot use {config.uri} ({option}): "
                           f"{first_line(exc)}") from None  # fmt: skip


class MlflowTracker(Tracker):
    """One MLflow run per harness run in the experiment "dml-harness", tagged with the run's
    identity: a resumed run (status RUNNING or KILLED) is found by the tag and logged into,
    skipping the steps it logged already; a finished one is never reopened (a --force rerun
    is a new MLflow run). A tuning trial is a child run (tag mlflow.parentRunId)."""

    kind = "mlflow"

    def __init__(self, config: TrackerConfig) -> None:
        super().__init__(config)
        self.client: Any = None
        self.run_id: str | None = None
        self.last_step = -1  # the last epoch step a resumed run logged before

    def _start(self, name: str, identity: str, params: dict[str, Any]) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.config.uri)
        experiment = _experiment(self.client, self.config)
        runs = self.client.search_runs([experiment], f"tags.`{IDENTITY_TAG}` = '{identity}'")
        unfinished = [r for r in runs if r.info.status in ("RUNNING", "KILLED")]
        if unfinished:
            self.run_id = unfinished[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            history = self.client.get_metric_history(self.run_id, "train/loss")
            self.last_step = max((m.step for m in history), default=-1)
            return
        tags = {IDENTITY_TAG: identity}
        if self.config.parent:
            tags["mlflow.parentRunId"] = self.config.parent
        self.run_id = self.client.create_run(
            experiment, run_name=f"{name}-{identity}", tags=tags
        ).info.run_id
        self._log(params={k: str(v)[:MAX_PARAM_CHARS] for k, v in params.items()})

    def _log(self, step: int = 0, metrics: dict[str, float] | None = None,
             params: dict[str, str] | None = None) -> None:  # fmt: skip
        from mlflow.entities import Metric, Param

        now = int(time.time() * 1000)
        self.client.log_batch(
            str(self.run_id),
            metrics=[Metric(k, float(v), now, step) for k, v in (metrics or {}).items()],
            params=[Param(k, v) for k, v in (params or {}).items()],
        )

    def _log_epoch(self, step: int, values: dict[str, float]) -> None:
        if step > self.last_step:  # a resumed run's epochs logged before its interruption
            self._log(step, values)

    def _log_final(self, step: int, metrics: dict[str, float], artifacts: list[Path]) -> None:
        self._log(step, metrics)
        for path in artifacts:
            self.client.log_artifact(str(self.run_id), str(path))

    def _close(self, status: str) -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status)

    def reference(self) -> str | None:
        return None if self.broken else self.run_id

    def _guard(self, call: Callable[..., None], *args: Any) -> None:
        """Each call with MLflow's HTTP retries bounded (a few seconds, not minutes, when a
        tracking server stops answering), then guarded as every tracker call is."""
        with bounded_http(self.config.uri, RUN_RETRIES, RUN_TIMEOUT):
            super()._guard(call, *args)


def _import(kind: str) -> None:
    """The tool's library, or a one-line error saying which extra installs it."""
    module = {"tensorboard": "torch.utils.tensorboard", "mlflow": "mlflow.tracking"}[kind]
    try:
        __import__(module)
    except ImportError:
        raise HarnessError(f"--tracker {kind} needs the {kind} package: pip install "
                           f"'dml-harness[{kind}]' (in a clone: pip install -e '.[{kind}]')") from None  # fmt: skip


def default_uri(kind: str, results_dir: str | Path) -> str:
    """results/tracking/tensorboard, or an SQLite store at results/tracking/mlflow/mlflow.db
    (MLflow 3 keeps its file store in maintenance mode; SQLite needs no server)."""
    folder = (Path(results_dir) / "tracking" / kind).resolve()
    return str(folder) if kind == "tensorboard" else f"sqlite:///{folder / 'mlflow.db'}"


def local_folder(config: TrackerConfig) -> Path | None:
    """The local folder a tracker writes into (None: a server or another remote store)."""
    uri = str(config.uri)
    if config.kind == "tensorboard" and "://" not in uri:
        return Path(uri)
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///") :]).parent
    if uri.startswith("file:"):
        return Path(re.sub(r"^file:(//)?", "", uri))
    return None


def _check_writable(config: TrackerConfig, option: str) -> None:
    folder = local_folder(config)
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-check-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise HarnessError(f"the {config.kind} tracker cannot write to {folder} ({option}): "
                           f"{exc.strerror or exc}; name a writable folder") from None  # fmt: skip


def tracking_config(
    kind: str, uri: str | None, results_dir: str | Path, option: str = "--tracker-uri"
) -> TrackerConfig:
    """The tracker the options ask for, checked before any training: its library installed,
    its local folder writable and, for MLflow, the store opened (a bad URI fails here)."""
    if kind not in TRACKERS:
        raise HarnessError(f"unknown tracker {kind!r}: choose one of {', '.join(TRACKERS)}")
    if kind == "none":
        return NO_TRACKING
    _import(kind)
    config = TrackerConfig(kind, uri or default_uri(kind, results_dir))
    _check_writable(config, option)
    if kind == "mlflow":
        check_mlflow(config, option)
    return config


def open_tracker(config: TrackerConfig, is_main: bool = True) -> Tracker:
    """The tracker of `config`; a null one when tracking is off or on a rank that does not
    write (under torchrun, rank 0 tracks for all)."""
    if not config.active or not is_main:
        return Tracker()
    cls = TensorBoardTracker if config.kind == "tensorboard" else MlflowTracker
    return cls(config)
