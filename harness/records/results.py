"""Run results: one JSON file per run, written atomically, with full provenance.

The file is a `RunResult` (typed records below) written by `to_json` and read by
`from_json`. Readers never dig through dictionaries: the runner fills a RunResult, and the
leaderboard, figures, check and the runner's skip-if-finished logic read one.

Schemas: 2 adds the optional `sweep_seeds` (the seeds the run's sweep asked for) to schema 1;
nothing else changed, so schema-1 files load as they are (their `sweep_seeds` is absent and
readers fall back to the protocol's seeds). The optional `clustering_convention` (the k-means
behind nmi and f1) and `diagnostics` (a method's own named numbers) came later within schema
2: files without the first used "harness"; an older reader keeps either as an unknown key.
So did `embeddings` (`run --save-embeddings`: the saved test embeddings' folder and sha256s)
and `model` (`run --save-model`: the kept network's file and sha256s), each written only when
the run saved them: every other result is byte for byte what it was.
A newer or unknown schema is refused with a one-line error saying what to do.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import types
import typing
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from harness.core import HarnessError, safe_folder

RESULT_SCHEMA = 2
READABLE_SCHEMAS = (1, 2)  # 1: schema 2 without `sweep_seeds`; read as is

R = TypeVar("R", bound="Record")


def optional(default: Any = None) -> Any:
    """A field left out of the JSON while it is None (written only once it is known)."""
    return field(default=default, metadata={"omit_none": True})


def _extra() -> Any:
    return field(default_factory=dict, repr=False, compare=False)


class ResultFormatError(ValueError):
    """A result's JSON lacks a required key, or has no mapping where a record goes (the
    message names the key, dotted)."""


class Record:
    """Typed JSON records: fields in file order; `extra` keeps keys this code does not know
    (written by a newer minor change), so reading and writing a file loses nothing."""

    extra: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name == "extra" or (value is None and f.metadata.get("omit_none")):
                continue
            out[f.name] = value.to_json() if isinstance(value, Record) else value
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls: type[R], data: Any, where: str = "") -> R:
        if not isinstance(data, dict):
            raise ResultFormatError(f"{where or 'result'}: expected a mapping, got {data!r:.40}")
        hints = typing.get_type_hints(cls)
        kwargs: dict[str, Any] = {}
        known = set()
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            known.add(f.name)
            if f.name == "extra":
                continue
            name = f"{where}.{f.name}" if where else f.name
            if f.name not in data:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise ResultFormatError(f"missing key {name!r}")
                continue
            value, record = data[f.name], _record_type(hints[f.name])
            if record and value is not None:
                kwargs[f.name] = record.from_json(value, name)
            else:
                _check_type(value, hints[f.name], name)
                kwargs[f.name] = value
        kwargs["extra"] = {k: v for k, v in data.items() if k not in known}
        return cls(**kwargs)


def _check_type(value: Any, annotation: Any, name: str) -> None:
    """Raise ResultFormatError unless a JSON value fits its field's annotation (int, float,
    str, bool, lists and dicts of them, `| None`, Any), so that a hand-edited or damaged
    file is refused by name here instead of failing later in a reader."""
    problem = _problem(value, annotation, name)
    if problem:
        raise ResultFormatError(problem)


_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
          list: "a list", dict: "a mapping"}  # fmt: skip


def _problem(value: Any, annotation: Any, name: str) -> str | None:
    """Where and how `value` does not fit `annotation` (None: it fits)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return None
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        problems = [_problem(value, a, name) for a in args if a is not type(None)]
        return None if None in problems else problems[0]
    expected = origin or annotation
    if isinstance(expected, type) and issubclass(expected, Record):
        expected = dict  # a record's own mapping is read by its from_json
    fits = isinstance(value, expected) and not (isinstance(value, bool) and expected is not bool)
    if expected is float:
        fits = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not fits:
        return f"{name}: expected {_NAMES.get(expected, expected.__name__)}, got {value!r:.40}"
    items = enumerate(value) if origin is list else value.items() if origin is dict else ()
    for key, item in items:
        problem = _problem(item, args[-1], f"{name}[{key!r}]")
        if problem:
            return problem
    return None


def _record_type(annotation: Any) -> type[Record] | None:
    """The Record class in `X` or `X | None`, else None (plain JSON values)."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, Record):
            return candidate
    return None


@dataclass
class ProtocolInfo(Record):
    name: str
    version: int
    hash: str
    path: str | None = optional()
    content: dict[str, Any] | None = optional()  # the whole protocol, as hashed
    extra: dict[str, Any] = _extra()

    @property
    def seeds(self) -> list[int]:
        """The seeds the protocol asks for ([] when the file did not record its content)."""
        return list((self.content or {}).get("seeds") or [])


@dataclass
class MethodInfo(Record):
    name: str
    version: int
    paper: str | None = optional()
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    # a plugin method's source: its file's path and sha256, or its distribution's name and
    # version (absent for the built-in methods)
    source: dict[str, str] | None = optional()
    extra: dict[str, Any] = _extra()

    def source_identity(self) -> dict[str, str] | None:
        """What makes two sources the same method code: a file's content, a distribution's
        version; not where the file lies."""
        if self.source is None:
            return None
        return {k: v for k, v in self.source.items() if k != "path"}


@dataclass
class TrainingRecord(Record):
    max_steps: int | None = None  # the --max-steps cap (None: the protocol's whole budget)
    steps: int | None = optional()
    epochs: float | None = optional()
    epoch_loss: list[float] | None = optional()
    epoch_seconds: list[float] | None = optional()
    resumed_from_step: int | None = optional()
    extra: dict[str, Any] = _extra()


@dataclass
class DatasetInfo(Record):
    name: str
    source: str | None = optional()
    # how the data was built when it is not the published bytes (a real-photo dataset rebuilt
    # with another Pillow): {"exact": false, "pillow": ..., "differing": {file: sha256}}
    provenance: dict[str, Any] | None = optional()
    extra: dict[str, Any] = _extra()


@dataclass
class Hardware(Record):
    device: str | None = optional()
    machine_id: str | None = optional()
    platform: str | None = optional()
    processor: str | None = optional()
    cpu_count: int | None = optional()
    torch_threads: int | None = optional()
    gpu: str | None = optional()
    extra: dict[str, Any] = _extra()


@dataclass
class Environment(Record):
    fingerprint: dict[str, Any] | None = optional()  # absent in the oldest files
    git_commit: str | None = optional()
    git_dirty: bool | None = optional()
    python: str | None = optional()
    packages: dict[str, str] | None = optional()
    hardware: Hardware = field(default_factory=Hardware)
    extra: dict[str, Any] = _extra()


@dataclass
class TupleCounts(Record):
    kind: str | None
    mined: int
    per_step: float
    pair_scores_evaluated: int
    empty_steps: int
    extra: dict[str, Any] = _extra()


@dataclass
class Selection(Record):
    """Model selection on the validation classes: the metric per epoch and the epoch kept."""

    metric: str
    split: str
    best_epoch: int | None
    per_epoch: list[float]
    seconds: float
    extra: dict[str, Any] = _extra()


@dataclass
class RunResult(Record):
    """One run's result file. Fields in the order they are written; those that are None and
    marked optional are left out (a failed run has no metrics, an old file no sweep_seeds)."""

    status: str  # running, ok, failed, not_applicable
    protocol: ProtocolInfo
    method: MethodInfo
    seed: int
    schema: int = RESULT_SCHEMA
    failure: str | None = None
    sweep_seeds: list[int] | None = optional()
    training: TrainingRecord = field(default_factory=TrainingRecord)
    tuning: dict[str, Any] | None = optional()  # the study behind a tuned configuration
    dataset: DatasetInfo | None = optional()
    split: dict[str, Any] | None = optional()  # Split.summary(): hash, class and image counts
    started_at: str | None = optional()
    harness_version: str | None = optional()
    environment: Environment | None = optional()
    # a run on several processes (torchrun): world_size, backend, per-rank throughput
    distributed: dict[str, Any] | None = optional()
    backbone_weights: dict[str, Any] | None = optional()
    # a frozen trunk's cache: the engine that computed it (name, version, threads) and its
    # rate, or the file it was loaded from (harness.train.features)
    feature_cache: dict[str, Any] | None = optional()
    distances: dict[str, Any] | None = optional()  # histogram: edges, positive, negative
    metrics: dict[str, float] | None = optional()
    metrics_by_part: dict[str, dict[str, float]] | None = optional()
    # retrieval metrics' percentile intervals over resampled test queries (harness.stats.frequentist)
    bootstrap: dict[str, Any] | None = optional()
    # k-means convention of nmi and f1 ("harness" or "faiss"); see `kmeans_convention`
    clustering_convention: str | None = optional()
    diagnostics: dict[str, float] | None = optional()  # Method.diagnostics (absent: none)
    timings: dict[str, Any] | None = optional()  # seconds, rates, and the pipeline's settings
    tuples: TupleCounts | None = optional()
    selection: Selection | None = optional()
    retrieval: dict[str, Any] | None = optional()
    # `run --save-embeddings`: the folder beside this file and each of its files' sha256
    embeddings: dict[str, Any] | None = optional()
    # `run --save-model`: the model file beside this file, its sha256 and its weights' sha256
    model: dict[str, Any] | None = optional()
    finished_at: str | None = optional()
    extra: dict[str, Any] = _extra()

    FIRST_KEYS: typing.ClassVar[tuple[str, ...]] = ("schema", "status", "failure")

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        head = {k: data.pop(k) for k in self.FIRST_KEYS}  # as schema 1 wrote them
        return {**head, **data}

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def hardware(self) -> Hardware:
        return self.environment.hardware if self.environment else Hardware()

    @property
    def kmeans_convention(self) -> str | None:
        """The k-means convention behind nmi and f1: recorded since it could be chosen; older
        results with clustering metrics used "harness". None without clustering metrics."""
        clustered = any(name in (self.metrics or {}) for name in ("nmi", "f1"))
        return self.clustering_convention or ("harness" if clustered else None)

    def asked_seeds(self) -> list[int]:
        """The seeds this run's sweep asked for: recorded since schema 2, else the protocol's."""
        return list(self.sweep_seeds) if self.sweep_seeds is not None else self.protocol.seeds


def result_path(results_dir: Path, protocol: str, method: str, seed: int) -> Path:
    """runs/<protocol>/<method>/seed<k>.json under results_dir; a protocol or method (run
    folder) name that is not one plain folder name is a HarnessError, never a path elsewhere."""
    protocol, method = safe_folder(protocol, "protocol"), safe_folder(method, "method")
    return Path(results_dir) / "runs" / protocol / method / f"seed{int(seed)}.json"


def embeddings_dir(result: Path) -> Path:
    """Where `run --save-embeddings` keeps a run's test embeddings: beside its result,
    runs/<protocol>/<method>/seed<k>.embeddings/ for seed<k>.json."""
    return Path(result).with_suffix(EMBEDDINGS_SUFFIX)


EMBEDDINGS_SUFFIX = ".embeddings"
MODEL_SUFFIX = ".model.pt"


def model_path(result: Path) -> Path:
    """Where `run --save-model` keeps a run's embedding network: beside its result,
    runs/<protocol>/<method>/seed<k>.model.pt for seed<k>.json."""
    return Path(result).with_suffix(MODEL_SUFFIX)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write to a unique temporary file in the same folder, then rename: readers see the old
    file or the new one, never half of one, and two writers never share a temporary file."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """`text` to `path` by a unique temporary file and a rename (see write_json_atomic); the
    file gets the mode a plain open() would give it (0o666 less the umask), not mkstemp's 0o600."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """`data` to `path` by a unique temporary file, fsync and a rename, as write_text_atomic."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask (reading it means setting it: set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_result(path: Path, result: RunResult) -> None:
    write_json_atomic(path, result.to_json())


def parse_result(data: Any, source: str) -> RunResult:
    """A result file's JSON -> RunResult, reading every schema in READABLE_SCHEMAS; a newer,
    unknown or malformed one is refused with a one-line HarnessError naming the fix."""
    schema = data.get("schema") if isinstance(data, dict) else None
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise HarnessError(
            f"result file {source} is not a run result (no schema); delete or move it"
        )
    if schema > RESULT_SCHEMA:
        raise HarnessError(
            f"result file {source} has schema {schema}, newer than this harness reads (up to "
            f"{RESULT_SCHEMA}): update the harness (git pull), or move the file out of runs/"
        )
    if schema not in READABLE_SCHEMAS:
        raise HarnessError(
            f"result file {source} has unknown schema {schema} (this harness reads "
            f"{', '.join(map(str, READABLE_SCHEMAS))}); delete or move it"
        )
    try:
        result = RunResult.from_json(data)
        if result.ok and result.metrics is None:
            raise ResultFormatError("status ok without metrics")
        return result
    except ResultFormatError as exc:
        raise HarnessError(
            f"result file {source} is a malformed schema-{schema} run result ({exc}); delete or "
            "move it"
        ) from None


def read_result(path: Path) -> RunResult:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HarnessError(f"unreadable result file {path}: {exc}; delete or restore it") from None
    return parse_result(data, str(path))


def result_paths(results_dir: Path) -> list[Path]:
    """Every run result file under results_dir/runs, sorted."""
    return sorted((Path(results_dir) / "runs").glob("*/*/seed*.json"))


def load_results(results_dir: Path) -> list[RunResult]:
    """Every run result under results_dir/runs, sorted by path."""
    return [read_result(p) for p in result_paths(results_dir)]


# A results folder's committed reference: a results folder of its own inside it, which a
# user's commands never write into. The clone's results/reference holds the committed runs,
# leaderboard, figures, cost records, baselines, studies and tuning; results/ itself is the
# user's (git ignores all of it but reference/).
REFERENCE = "reference"


def reference_dir(results_dir: str | Path) -> Path | None:
    """The committed reference results inside `results_dir` (results/reference), or None when
    there are none (another --results-dir, an installed harness, the reference itself)."""
    path = Path(results_dir) / REFERENCE
    return path if path.is_dir() else None


def archive(path: Path, results_dir: Path) -> Path:
    """Move a result that is about to be replaced under results/archive/, stamped by time: a
    run result from runs/<protocol>/... to archive/<protocol>/..., any other record (a cost
    file, cost/<protocol>.json) to archive/ under its own path (archive/cost/...)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    results_dir, runs = Path(results_dir), Path(results_dir) / "runs"
    under = runs if path.is_relative_to(runs) else results_dir
    target = results_dir / "archive" / path.relative_to(under)
    target = target.with_name(f"{target.stem}-{stamp}.json")
    target.parent.mkdir(parents=True, exist_ok=True)
    path.replace(target)
    if embeddings_dir(path).is_dir():  # its saved embeddings go with it, never left behind
        embeddings_dir(path).replace(embeddings_dir(target))
    if model_path(path).is_file():  # so does its saved model
        model_path(path).replace(model_path(target))
    return target
