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
the feature cache) fits `sweep_budget_minutes`. The estimate scales the measured time per run
and the cache's time from the calibration's training images to the protocol's.

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

import numpy as np
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


def candidate_id(candidate: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in candidate.items())


def cache_id(candidate: dict[str, Any]) -> str:
    """The candidate's trunk settings (candidates that share them share a feature cache)."""
    return ", ".join(f"{k}={v}" for k, v in candidate.items() if k.startswith("features.")) or "-"


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
        """One candidate: skipped when finished, recorded as over the budget when its
        projected sweep is, else run."""
        record, calibration, cid = self.record, self.calibration, candidate_id(candidate)
        runs = record["runs"].get(cid, {})
        finished = all(m in runs for m in [calibration.zero_shot, *calibration.methods])
        if finished or cid in record["skipped"]:
            return
        projected = projected_minutes(record, calibration, candidate, self.sizes)
        if projected is not None and projected[0] > calibration.sweep_budget_minutes:
            record["skipped"][cid] = {"projected_sweep_minutes": round(projected[0], 1),
                                      "from": projected[1]}  # fmt: skip
            log.info("%s: not run: its sweep would take about %.0f minutes (projected from "
                     "%s), over the budget", cid, projected[0], projected[1])  # fmt: skip
            record["runs"].pop(cid, None)
            _write(self.path, record)
            return
        log.info("candidate %d of %d: %s", n, self.total, cid)
        ctx = RunContext(protocol, calibration.seed, resolve_device(self.device),
                         max_steps=self.max_steps, data_root=self.data_root,
                         progress=self.progress)  # fmt: skip
        _run_candidate(ctx, calibration, candidate, record, self.path)


def _ordered(values: list[Any]) -> list[Any]:
    return sorted(values) if all(isinstance(v, (int, float)) for v in values) else list(values)


def next_neighbours(record: dict[str, Any], calibration: Calibration,
                    sizes: dict[str, int]) -> list[dict[str, Any]]:  # fmt: skip
    """The neighbour search's next candidates: the best finished candidate's neighbours (each
    setting one step along its sorted values, the others kept) not yet tried; the grid's
    middle candidate when nothing has finished. Empty when every neighbour of the best is
    tried (run, or recorded as over the budget): the search has converged."""
    tried = set(record["runs"]) | set(record.get("skipped", {}))
    best = choose(record, calibration, sizes)["chosen_settings"]
    if best is None:
        middle = {k: _ordered(v)[(len(v) - 1) // 2] for k, v in calibration.grid.items()}
        finished = [cid for cid, runs in record["runs"].items()
                    if all(m in runs for m in [calibration.zero_shot, *calibration.methods])]  # fmt: skip
        return [] if finished else [middle]
    out = []
    for key, values in calibration.grid.items():
        ordered = _ordered(values)
        at = ordered.index(best[key])
        for step in (at - 1, at + 1):
            if 0 <= step < len(ordered):
                neighbour = {**best, key: ordered[step]}
                if candidate_id(neighbour) not in tried:
                    out.append(neighbour)
    return out


def _run_candidate(ctx: RunContext, calibration: Calibration, candidate: dict[str, Any],
                   record: dict[str, Any], path: Path) -> None:  # fmt: skip
    """Train and score every reference method (and the zero-shot row) on one candidate's
    protocol, on the training and validation classes only; the record written after each."""
    from harness.data import prepare_data
    from harness.evaluate import selection_score
    from harness.train import train_model, with_cached_features

    protocol, cid = ctx.protocol, candidate_id(candidate)
    runs = record["runs"].setdefault(cid, {})
    data, split = without_test(prepare_data(protocol, ctx.data_root))
    started = time.perf_counter()
    data = with_cached_features(ctx, data, split)  # built once per trunk, then loaded
    key = cache_id(candidate)
    record["caches"][key] = max(record["caches"].get(key, 0.0),
                                round(time.perf_counter() - started, 2))  # fmt: skip
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


def _sizes(base: Protocol, calibrating: Protocol, data_root: str | None) -> dict[str, int]:
    """Training and total images of the protocol and of the calibration's data."""
    from harness.data import prepare_data

    full = prepare_data(base, data_root)
    cal = prepare_data(calibrating, data_root).split
    return {"train": len(full.split.train), "images": len(full.data),
            "calibration_train": len(cal.train),
            "calibration_images": len(cal.train) + len(cal.validation),
            "seeds": len(base.seeds), "methods": len(METHODS.names())}  # fmt: skip


def _budget(candidate: dict[str, Any]) -> tuple[str, float] | None:
    for key in ("budget.epochs", "budget.steps"):
        if key in candidate:
            return key, float(candidate[key])
    return None


def projected_minutes(record: dict[str, Any], calibration: Calibration,
                      candidate: dict[str, Any], sizes: dict[str, int]) -> tuple[float, str] | None:  # fmt: skip
    """A candidate's full sweep projected from a finished candidate on the same trunk and
    budget unit (time per run scales with the budget), before anything of it runs: a
    candidate far over the budget is not run. None when no such candidate has finished."""
    mine = _budget(candidate)
    if mine is None:
        return None
    for other in calibration.candidates():
        cid, theirs = candidate_id(other), _budget(other)
        runs = record["runs"].get(cid, {})
        if (cache_id(other) != cache_id(candidate) or theirs is None or theirs[0] != mine[0]
                or not all(m in runs for m in [calibration.zero_shot, *calibration.methods])):  # fmt: skip
            continue
        scaled = {m: {**r, "seconds": r["seconds"] * mine[1] / theirs[1]} for m, r in runs.items()}
        views = int(candidate.get("features.train_views", 1) or 1)
        return estimate_minutes(scaled, record["caches"].get(cache_id(candidate), 0.0), views,
                                sizes, calibration.zero_shot), cid  # fmt: skip
    return None


def estimate_minutes(runs: dict[str, Any], cache_seconds: float, views: int,
                     sizes: dict[str, int], zero_shot: str) -> float:  # fmt: skip
    """A full sweep's minutes: every method x seed at the reference methods' mean time per
    run (scaled to the protocol's training images), and the cache (scaled to its rows)."""
    trained = [r["seconds"] for m, r in runs.items() if m != zero_shot]
    per_run = float(np.mean(trained)) * sizes["train"] / max(1, sizes["calibration_train"])
    rows = sizes["train"] * views + sizes["images"]
    cal_rows = sizes["calibration_train"] * views + sizes["calibration_images"]
    cache = cache_seconds * rows / max(1, cal_rows)
    return (per_run * sizes["methods"] * sizes["seeds"] + cache) / 60


def choose(record: dict[str, Any], calibration: Calibration, sizes: dict[str, int]) -> dict:
    """Each candidate's mean reference MAP@R, gain over zero-shot and estimated sweep time;
    the best that fits the budget is the choice."""
    rows = []
    for cid, runs in record["runs"].items():
        if not all(m in runs for m in [calibration.zero_shot, *calibration.methods]):
            continue
        candidate = next(c for c in calibration.candidates() if candidate_id(c) == cid)
        views = int(candidate.get("features.train_views", 1) or 1)
        frozen = cache_id(candidate)
        mean = float(np.mean([runs[m]["map@r"] for m in calibration.methods]))
        rows.append({"candidate": cid, "mean_map@r": round(mean, 6),
                     "gain_over_zero_shot": round(mean - runs[calibration.zero_shot]["map@r"], 6),
                     "sweep_minutes": round(estimate_minutes(runs, record["caches"].get(frozen, 0.0),
                                                             views, sizes, calibration.zero_shot), 1)})  # fmt: skip
    fitting = [r for r in rows if r["sweep_minutes"] <= calibration.sweep_budget_minutes]
    best = max(fitting, key=lambda r: r["mean_map@r"]) if fitting else None
    settings = next((c for c in calibration.candidates()
                     if best and candidate_id(c) == best["candidate"]), None)  # fmt: skip
    return {"candidates": sorted(rows, key=lambda r: -r["mean_map@r"]), "sizes": sizes,
            "chosen": best["candidate"] if best else None, "chosen_settings": settings,
            "learns": bool(best and best["gain_over_zero_shot"] > 0),
            "positions": positions(record, calibration, settings, rows) if settings else {}}  # fmt: skip


def positions(record: dict[str, Any], calibration: Calibration, chosen: dict[str, Any],
              rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:  # fmt: skip
    """For each setting of the choice: whether a candidate that differs in that setting alone
    was tried on each side of the chosen value (`interior`; a neighbour run and found over
    the budget, or not run for it, counts as tried), and, at an edge, the limit that explains
    it: the calibration's own (`limits`), or, for a longer training budget, the sweep budget
    when twice the chosen budget would be over it (time per run scales with the budget)."""
    over = {r["candidate"] for r in rows if r["sweep_minutes"] > calibration.sweep_budget_minutes}
    tried = {r["candidate"] for r in rows} | over | set(record.get("skipped", {}))
    minutes = {r["candidate"]: r["sweep_minutes"] for r in rows}[candidate_id(chosen)]
    out = {}
    for key, values in calibration.grid.items():
        value = chosen[key]
        ordered = _ordered(values)
        at = ordered.index(value)
        sides = {}
        for side, neighbours in (("below", ordered[:at][::-1]), ("above", ordered[at + 1 :])):
            sides[side] = next((v for v in neighbours
                                if candidate_id({**chosen, key: v}) in tried), None)  # fmt: skip
        limit = calibration.limits.get(key)
        if len(values) == 1:
            where = "fixed"
        elif sides["below"] is not None and sides["above"] is not None:
            where, limit = "interior", None
        else:
            where = "edge"
            budget = calibration.sweep_budget_minutes
            if (limit is None and key in ("budget.epochs", "budget.steps")
                    and sides["above"] is None and 2 * minutes > budget):  # fmt: skip
                limit = (f"the sweep budget: twice {value} would take about {2 * minutes:.0f} "
                         f"minutes, over {budget:g}")  # fmt: skip
        out[key] = {"value": value, "position": where, "tried_below": sides["below"],
                    "tried_above": sides["above"], "limit": limit}  # fmt: skip
    return out
