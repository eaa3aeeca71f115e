"""Calibrating a protocol on validation classes: which trunk to freeze, how long to train, at
what learning rate and embedding size, chosen without ever reading the test classes.

A calibration file (protocols/calibration/<name>.yaml) names the protocol it calibrates, the
fraction of its training classes carved as validation classes (the last sorted ones), a
reference set of methods from several families (each at its paper defaults), a grid of
protocol settings, and the budget a full sweep must fit. Every candidate of the grid trains
every reference method once on the remaining training classes and scores the validation
classes by the protocol's selection metric (MAP@R); the pretrained network's own features
(`untrained`) are scored on the same classes.

The test classes are dropped before anything is cached or trained: the data the calibration
works on holds the training and validation classes only, so changing the test images or their
labels cannot change a number of the record. A grid may not set the split, the dataset, the
seeds or the evaluation (that would change which classes are read or how they are scored).

The choice: the candidate with the best mean validation MAP@R over the reference methods
among those whose estimated full sweep (every registered method x the protocol's seeds, and
the feature cache) fits `sweep_budget_minutes`. The estimate counts each registered method at
its own cost, timed by a probe at the candidate's settings (harness.tune.probe: a few steps of
every method and its evaluation), and scales the measured time per run and the cache's time
from the calibration's images to the protocol's.

A candidate whose sweep, projected from a finished candidate on the same trunk (time per run
scales with the budget), would be over the budget is not run: the record says so with the
projection. The record (`<results-dir>/calibration/<name>.json`, and a markdown table beside
it) holds every candidate with each method's validation MAP@R and seconds; it is written after
every run, so an interrupted calibration resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from harness.core import (
    METHODS,
    HarnessError,
    Protocol,
    RunContext,
    TrainingFailed,
    closest,
    load_protocol,
    protocol_hyperparameters,
    resolve_device,
)
from harness.core.paths import PROTOCOL_DIR
from harness.core.protocol import parse_protocol
from harness.sweep import check_protocol
from harness.tune.calibration_table import markdown
from harness.tune.choice import cache_id as cache_id
from harness.tune.choice import candidate_id as candidate_id
from harness.tune.choice import choose as choose
from harness.tune.choice import estimate_minutes as estimate_minutes
from harness.tune.choice import next_neighbours as next_neighbours
from harness.tune.choice import positions as positions
from harness.tune.choice import probe_of
from harness.tune.choice import projected_minutes as projected_minutes
from harness.tune.probe import probe_id, probe_methods
from harness.tune.trial import without_test

log = logging.getLogger(__name__)

CALIBRATION_DIR = PROTOCOL_DIR / "calibration"
KEYS = ("schema", "protocol", "validation_fraction", "seed", "methods", "zero_shot", "grid",
        "sweep_budget_minutes", "description", "limits", "search")  # fmt: skip
SEARCHES = ("grid", "neighbours")
# what a grid may set: what trains after the trunk, and how the trunk is cached
SETTABLE = ("features", "budget", "optimizer", "schedule", "embedding_dim", "sampler",
            "precision")  # fmt: skip
FORBIDDEN = ("split", "dataset", "seeds", "evaluation", "methods", "name", "version")
FORMAT = 1


@dataclasses.dataclass(frozen=True)
class Calibration:
    """One calibration file, checked."""

    name: str
    protocol: str
    validation_fraction: float
    seed: int
    methods: list[str]
    grid: dict[str, list[Any]]
    sweep_budget_minutes: float
    description: str = ""
    zero_shot: str = ""  # the method that trains nothing: the pretrained features' own row
    # setting -> why no value beyond the grid's edge exists (e.g. the network's last stage)
    limits: dict[str, str] = dataclasses.field(default_factory=dict)
    # `grid`: every combination runs; `neighbours`: a walk from the best finished candidate
    # to its untried neighbours (one setting one step along its sorted values) until every
    # neighbour of the best has been tried, so a wide grid costs only the steps around it
    search: str = "grid"

    def candidates(self) -> list[dict[str, Any]]:
        """Every combination of the grid's values, as dotted key -> value."""
        keys = list(self.grid)
        return [
            dict(zip(keys, values, strict=False))
            for values in itertools.product(*self.grid.values())
        ]


def load_calibration(name_or_path: str) -> Calibration:
    """A calibration by name (protocols/calibration/NAME.yaml) or path; a one-line error for
    an unknown name, an unknown key or a setting that would read other classes."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = CALIBRATION_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            known = sorted(p.stem for p in CALIBRATION_DIR.glob("*.yaml"))
            raise HarnessError(f"unknown calibration {name_or_path!r}"
                               f"{closest(name_or_path, known)}; known: {', '.join(known)} "
                               "(or pass a path to a .yaml file)")  # fmt: skip
    if not path.is_file():
        raise HarnessError(f"calibration file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise HarnessError(f"{path}: malformed YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise HarnessError(f"{path}: a calibration must be a YAML mapping")
    for key in data:
        if key not in KEYS:
            raise HarnessError(f"{path}: unknown key {key!r}{closest(str(key), list(KEYS))}; "
                               f"allowed: {', '.join(KEYS)}")  # fmt: skip
    missing = [k for k in ("protocol", "validation_fraction", "methods", "zero_shot", "grid")
               if k not in data]  # fmt: skip
    if missing:
        raise HarnessError(f"{path}: missing required key {missing[0]!r}")
    if data.get("schema", 1) != FORMAT:
        raise HarnessError(f"{path}: schema {data['schema']!r} is not supported (this harness "
                           f"reads schema {FORMAT})")  # fmt: skip
    calibration = Calibration(
        name=path.stem, protocol=str(data["protocol"]),
        validation_fraction=float(data["validation_fraction"]), seed=int(data.get("seed", 0)),
        methods=[str(m) for m in data["methods"]], grid=dict(data["grid"] or {}),
        sweep_budget_minutes=float(data.get("sweep_budget_minutes", 90)),
        description=str(data.get("description", "")), zero_shot=str(data["zero_shot"]),
        limits={str(k): str(v) for k, v in (data.get("limits") or {}).items()},
        search=str(data.get("search", "grid")),
    )  # fmt: skip
    check_calibration(calibration, str(path))
    return calibration


def check_calibration(calibration: Calibration, where: str) -> None:
    """Refuse before any work: no validation classes, a grid that reads test classes or
    changes how they are scored, an unknown method or an empty grid."""
    if not 0 < calibration.validation_fraction < 1:
        raise HarnessError(f"{where}: validation_fraction must be in (0, 1): a calibration "
                           "scores validation classes carved from the training classes, never "
                           "the test classes")  # fmt: skip
    if not calibration.grid or any(not isinstance(v, list) or not v
                                   for v in calibration.grid.values()):  # fmt: skip
        raise HarnessError(f"{where}: grid must map each setting to a non-empty list of values")
    for key in calibration.grid:
        top = key.split(".")[0]
        if top in FORBIDDEN:
            raise HarnessError(f"{where}: grid sets {key!r}: a calibration may not change the "
                               "split, dataset, seeds or evaluation (it would read the test "
                               "classes, or score other classes than the validation ones)")  # fmt: skip
        if top not in SETTABLE:
            raise HarnessError(f"{where}: grid sets unknown setting {key!r}"
                               f"{closest(top, list(SETTABLE))}; settable: {', '.join(SETTABLE)}")  # fmt: skip
    for name in [*calibration.methods, calibration.zero_shot]:
        if name not in METHODS:
            raise HarnessError(f"{where}: unknown method {name!r}"
                               f"{closest(name, METHODS.names())}")  # fmt: skip
    if not calibration.methods:
        raise HarnessError(f"{where}: methods is empty: name the reference methods")
    if calibration.search not in SEARCHES:
        raise HarnessError(f"{where}: search {calibration.search!r} is not one of "
                           f"{', '.join(SEARCHES)}{closest(calibration.search, list(SEARCHES))}")  # fmt: skip
    for key in calibration.limits:
        if key not in calibration.grid:
            raise HarnessError(f"{where}: limits names {key!r}, which the grid does not set"
                               f"{closest(key, list(calibration.grid))}")  # fmt: skip


def _raw(protocol: Protocol) -> dict[str, Any]:
    return yaml.safe_load(Path(protocol.path).read_text(encoding="utf-8"))


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        data = data.setdefault(part, {})
        if not isinstance(data, dict):
            raise HarnessError(f"calibration grid key {dotted!r}: {part} is not a mapping")
    data[last] = value


def variant(base: Protocol, calibration: Calibration, candidate: dict[str, Any]) -> Protocol:
    """The protocol with the candidate's settings, validation classes carved and one seed."""
    data = _raw(base)
    for key, value in candidate.items():
        _set(data, key, value)
    data["split"] = {
        **data.get("split", {}),
        "validation_fraction": calibration.validation_fraction,
    }
    data["seeds"] = [calibration.seed]
    data["name"] = f"{base.name}-calibration"
    return parse_protocol(data, f"{base.path} with {candidate}")


def record_path(results_dir: str | Path, name: str) -> Path:
    return Path(results_dir) / "calibration" / f"{name}.json"


def described(calibration: Calibration) -> dict[str, Any]:
    """The calibration as its record holds it (no `limits` key when it names none, as the
    records made before limits existed)."""
    data = dataclasses.asdict(calibration)
    if not data["limits"]:
        data.pop("limits")
    if data["search"] == "grid":
        data.pop("search")
    return data


def _read(path: Path, calibration: Calibration, base: Protocol) -> dict[str, Any]:
    fresh = {"format": FORMAT, "calibration": described(calibration),
             "protocol": base.name, "protocol_version": base.version, "runs": {},
             "caches": {}}  # fmt: skip
    if not path.is_file():
        return fresh
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        log.warning("calibration record %s cannot be read: starting it again", path)
        return fresh
    if stored.get("format") == FORMAT and _widened(stored.get("calibration"), fresh["calibration"]):
        ids = {candidate_id(c) for c in calibration.candidates()}
        kept = {cid: runs for cid, runs in stored["runs"].items() if cid in ids}
        log.info("calibration record %s: its grid changed; the %d finished candidates still in "
                 "it are kept", path, len(kept))  # fmt: skip
        return {
            **stored,
            "calibration": fresh["calibration"],
            "runs": kept,
            "skipped": {k: v for k, v in stored.get("skipped", {}).items() if k in ids},
        }
    if stored.get("calibration") != fresh["calibration"] or stored.get("format") != FORMAT:
        log.warning("calibration record %s was made by another calibration file: starting "
                    "it again", path)  # fmt: skip
        return fresh
    return stored


def _widened(old: Any, new: dict[str, Any]) -> bool:
    """Whether `new` is `old` with other values in its grid (the same settings, and the same
    protocol, classes, methods, seed and budget): its finished candidates are the same runs,
    and a widened grid need not run them again."""
    if not isinstance(old, dict) or old == new:
        return False
    loose = ("grid", "limits", "description", "search")
    same = {k: v for k, v in old.items() if k not in loose} == {
        k: v for k, v in new.items() if k not in loose
    }
    # the same settings (a record's keys are stored sorted, so not their order)
    return same and sorted(old.get("grid", {})) == sorted(new["grid"])


def _write(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".part")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(record, out, indent=1, sort_keys=True)
        out.write("\n")
    os.replace(tmp, path)


def calibrate(
    name_or_path: str,
    results_dir: str | Path = "results",
    data_root: str | None = None,
    device: str = "auto",
    max_steps: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Run (or resume) a calibration; returns its record with the choice filled in."""
    calibration = load_calibration(name_or_path)
    base = load_protocol(calibration.protocol)
    candidates = calibration.candidates()
    protocols = [variant(base, calibration, c) for c in candidates]  # every setting checked
    for protocol in protocols:
        check_protocol(protocol, [*calibration.methods, calibration.zero_shot])
    path = record_path(results_dir, calibration.name)
    record = _read(path, calibration, base)
    record.setdefault("skipped", {})
    sizes = _sizes(base, protocols[0], data_root)
    by_id = {candidate_id(c): (c, p) for c, p in zip(candidates, protocols, strict=True)}
    walk = _Walk(record, calibration, sizes, path, len(candidates), device, max_steps,
                 data_root, progress)  # fmt: skip
    for cid in [c for c in by_id if c in record["runs"]]:  # earlier runs timed first: the
        walk.step(*by_id[cid], list(by_id).index(cid) + 1)  # walk's choice needs them
    done: set[str] = set()
    while True:
        todo = (candidates if calibration.search == "grid"
                else next_neighbours(record, calibration, sizes))  # fmt: skip
        todo = [c for c in todo if candidate_id(c) not in done]
        if not todo:
            break
        for candidate in todo:
            cid = candidate_id(candidate)
            done.add(cid)
            walk.step(candidate, by_id[cid][1], list(by_id).index(cid) + 1)
        if calibration.search == "grid":
            break
    record["choice"] = choose(record, calibration, sizes)
    _write(path, record)
    path.with_suffix(".md").write_text(markdown(record, calibration), encoding="utf-8")
    return record


@dataclasses.dataclass
class _Walk:
    """What every candidate of one calibration run shares: the record (written after each
    run) and how each candidate's protocol runs."""

    record: dict[str, Any]
    calibration: Calibration
    sizes: dict[str, int]
    path: Path
    total: int
    device: str
    max_steps: int | None
    data_root: str | None
    progress: bool

    def step(self, candidate: dict[str, Any], protocol: Protocol, n: int) -> None:
        """One candidate: every method timed at its settings (once per probe key), then
        skipped when finished, recorded as over the budget when its projected sweep is, else
        run. A candidate over the budget with every method counted at the reference methods'
        cost is not timed: they are the cheap ones, and timing the rest only ever raised an
        estimate (the widest embeddings' probes cost the most: a learned scorer's evaluation)."""
        record, calibration, cid = self.record, self.calibration, candidate_id(candidate)
        runs = record["runs"].get(cid, {})
        finished = all(m in runs for m in [calibration.zero_shot, *calibration.methods])
        if cid in record["skipped"] or (not finished and self.over(candidate)):
            return
        if finished and any(m not in probe_of(record, candidate) for m in METHODS.names()):
            views = int(candidate.get("features.train_views", 1) or 1)
            untimed = estimate_minutes(runs, record["caches"].get(cache_id(candidate), 0.0),
                                       views, self.sizes, calibration.zero_shot)  # fmt: skip
            if untimed > calibration.sweep_budget_minutes:
                return
        ctx = RunContext(protocol, calibration.seed, resolve_device(self.device),
                         max_steps=self.max_steps, data_root=self.data_root,
                         progress=self.progress)  # fmt: skip
        self.probe(ctx, candidate)
        if finished or self.over(candidate):
            return
        log.info("candidate %d of %d: %s", n, self.total, cid)
        _run_candidate(ctx, calibration, candidate, record, self.path)

    def over(self, candidate: dict[str, Any]) -> bool:
        """Whether the candidate's sweep, projected from a finished one, is over the budget;
        then it is recorded as not run."""
        record, cid = self.record, candidate_id(candidate)
        projected = projected_minutes(record, self.calibration, candidate, self.sizes)
        if projected is None or projected[0] <= self.calibration.sweep_budget_minutes:
            return False
        record["skipped"][cid] = {"projected_sweep_minutes": round(projected[0], 1),
                                  "from": projected[1]}  # fmt: skip
        log.info("%s: not run: its sweep would take about %.0f minutes (projected from %s), "
                 "over the budget", cid, projected[0], projected[1])  # fmt: skip
        record["runs"].pop(cid, None)
        _write(self.path, record)
        return True

    def probe(self, ctx: RunContext, candidate: dict[str, Any]) -> None:
        """Time every registered method at the candidate's settings, once per probe key."""
        done = self.record.setdefault("probes", {}).setdefault(probe_id(candidate), {})
        if any(m not in done for m in METHODS.names()):
            log.info("timing every method at %s", probe_id(candidate))
            data, split = _prepared(ctx, candidate, self.record)
            probe_methods(ctx, data, split, done, self.calibration.methods,
                          lambda: _write(self.path, self.record))  # fmt: skip
            _write(self.path, self.record)


def _run_candidate(ctx: RunContext, calibration: Calibration, candidate: dict[str, Any],
                   record: dict[str, Any], path: Path) -> None:  # fmt: skip
    """Train and score every reference method (and the zero-shot row) on one candidate's
    protocol, on the training and validation classes only; the record written after each."""
    from harness.evaluate import selection_score
    from harness.train import train_model

    protocol, cid = ctx.protocol, candidate_id(candidate)
    runs = record["runs"].setdefault(cid, {})
    data, split = _prepared(ctx, candidate, record)
    for method in [calibration.zero_shot, *calibration.methods]:
        if method in runs:
            continue
        started = time.perf_counter()
        try:
            model, _ = train_model(ctx, method, protocol_hyperparameters(protocol, method), data,
                                   split.train)  # fmt: skip
            score = selection_score(ctx, model.backbone, model.method,
                                    data.images[split.validation], data.labels[split.validation])  # fmt: skip
            failure = None
        except TrainingFailed as exc:  # scored 0, as a failed tuning trial is
            score, failure = 0.0, str(exc)
        runs[method] = {"map@r": round(float(score), 6),
                        "seconds": round(time.perf_counter() - started, 2)}  # fmt: skip
        if failure:
            runs[method]["failure"] = failure
        log.info("%s: %s validation %s %.4f in %.1fs", cid, method,
                 protocol.evaluation.select_by, score, runs[method]["seconds"])  # fmt: skip
        _write(path, record)


def _prepared(ctx: RunContext, candidate: dict[str, Any], record: dict[str, Any]) -> Any:
    """The candidate's training and validation classes on its cached features (built once per
    trunk, then loaded), the cache's seconds recorded (the longest: the one that built it)."""
    from harness.data import prepare_data
    from harness.train import with_cached_features

    data, split = without_test(prepare_data(ctx.protocol, ctx.data_root))
    started = time.perf_counter()
    data = with_cached_features(ctx, data, split)
    key = cache_id(candidate)
    record["caches"][key] = max(record["caches"].get(key, 0.0),
                                round(time.perf_counter() - started, 2))  # fmt: skip
    return data, split


def _sizes(base: Protocol, calibrating: Protocol, data_root: str | None) -> dict[str, int]:
    """Training and total images of the protocol and of the calibration's data."""
    from harness.data import prepare_data

    full = prepare_data(base, data_root)
    cal = prepare_data(calibrating, data_root).split
    return {"train": len(full.split.train), "images": len(full.data),
            "calibration_train": len(cal.train),
            "calibration_images": len(cal.train) + len(cal.validation),
            "seeds": len(base.seeds), "methods": len(METHODS.names())}  # fmt: skip
