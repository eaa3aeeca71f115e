"""Experiment trackers (`--tracker tensorboard|mlflow`): a run's numbers as it trains, for a
person to watch, beside (never instead of) its result file.

One tracker run per harness run, named by the run's identity, so that a resumed run goes on
in the same tracker run. A tracker is a side channel: a URI that cannot be written is refused
before any training (`tracking_config`), and a tracker that fails later warns once and stops
tracking; the run and its result never depend on it. The two implementations live in
`harness.records.trackers` (with the checks of a URI and the factory), each through its
tool's own library.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TRACKERS = ("none", "tensorboard", "mlflow")
EXPERIMENT = "dml-harness"  # the MLflow experiment every run and study goes into


@dataclass(frozen=True)
class TrackerConfig:
    """Where a run's tracker writes: plain data, so that it travels with a run spec to a Ray
    worker. kind: "none", "tensorboard" or "mlflow"; uri: the TensorBoard log folder or the
    MLflow tracking URI (resolved by `tracking_config`); parent: the run a child (a tuning
    trial) belongs to (its MLflow run id, or its folder under the TensorBoard log folder)."""

    kind: str = "none"
    uri: str | None = None
    parent: str | None = None

    @property
    def active(self) -> bool:
        return self.kind != "none"


NO_TRACKING = TrackerConfig()


def metric_key(name: str) -> str:
    """A harness metric name as both trackers accept it (MLflow refuses '@'): recall@1 ->
    recall_at_1, map@r -> map_at_r."""
    return re.sub(r"[^\w./\- ]", "_", name.replace("@", "_at_"))


def first_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's first line (its type when it has no message), cut to `limit` chars:
    MLflow's and urllib3's messages run over many lines, and an error or warning is one."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:limit]


class Tracker:
    """The interface, and the tracker that tracks nothing. Every call of a real tracker is
    guarded: the first exception (a server gone, a full disk) is logged as one warning, and
    from then on the tracker does nothing."""

    kind = "none"

    def __init__(self, config: TrackerConfig = NO_TRACKING) -> None:
        self.config, self.broken = config, False

    def start(self, name: str, identity: str, params: dict[str, Any]) -> None:
        """Open (or, for a resumed run, reopen) the tracker run `name`, found again by
        `identity`, with its parameters."""
        self._guard(self._start, name, identity, params)

    def log_epoch(self, step: int, values: dict[str, float]) -> None:
        """One epoch's values at the run's global training step."""
        self._guard(self._log_epoch, step, {metric_key(k): v for k, v in values.items()})

    def log_final(self, step: int, metrics: dict[str, float], artifacts: list[Path]) -> None:
        """The run's final metrics (at the run's last step) and files."""
        self._guard(self._log_final, step, {metric_key(k): v for k, v in metrics.items()},
                    artifacts)  # fmt: skip

    def close(self, status: str = "FINISHED") -> None:
        """End the tracker run: FINISHED, FAILED or KILLED (interrupted, to be resumed)."""
        self._guard(self._close, status)

    def reference(self) -> str | None:
        """What a child run names as its parent (None: no run, or tracking stopped)."""
        return None

    def _guard(self, call: Callable[..., None], *args: Any) -> None:
        if self.broken or not self.config.active:
            return
        try:
            call(*args)
        except Exception as exc:  # a side channel: never the run's failure
            self.broken = True
            log.warning("%s tracking at %s stopped (the run goes on, its result is written "
                        "as always): %s: %s", self.kind, self.config.uri,
                        type(exc).__name__, first_line(exc))  # fmt: skip

    def _start(self, name: str, identity: str, params: dict[str, Any]) -> None: ...

    def _log_epoch(self, step: int, values: dict[str, float]) -> None: ...

    def _log_final(self, step: int, metrics: dict[str, float], artifacts: list[Path]) -> None: ...

    def _close(self, status: str) -> None: ...


def child_config(config: TrackerConfig, parent: Tracker) -> TrackerConfig:
    """The config of a child run (a tuning trial) of the tracker run `parent`."""
    reference = parent.reference()
    if reference is None:  # no parent run (tracking off or stopped): the children neither
        return NO_TRACKING
    return dataclasses.replace(config, parent=reference)
