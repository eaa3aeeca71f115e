"""Protocols: strict YAML -> frozen dataclasses, with a version and a content hash.

A protocol fixes everything a method may not change (data, split, backbone, sampler,
optimizer, budget, evaluation, seeds). Unknown keys, wrong types and out-of-range values are
errors that name the file, the key and the fix; nothing is silently skipped or defaulted
from a typo.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.core.augmentation import AugmentationSpec
from harness.core.errors import HarnessError
from harness.core.metric_names import (
    KMEANS_CONVENTIONS,
    METRIC_NAMES,
    SINGLE_METRICS,
    is_single_metric,
)
from harness.core.names import NAME_RULE, is_plain_name
from harness.core.paths import PROTOCOL_DIR
from harness.core.reference import check_entry
from harness.core.registry import closest
from harness.core.rerank_spec import parse_rerank
from harness.core.seeds import seed_problem

SCHEMA_VERSION = 1


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SplitSpec:
    """Class-disjoint split of the sorted class list: train classes first, then test classes.

    validation_fraction carves a class-disjoint validation set from the training classes, the
    only data any choice (early stopping, selection) may look at.

    official: true takes train and test (and In-shop's query / gallery) from the dataset's
    official lists instead of train_fraction; validation_fraction still carves the last
    sorted training classes. Only datasets with official lists (cub200, cars196, sop, inshop,
    vehicleid) accept it, and train_fraction may not be given with it.
    """

    train_fraction: float = 0.5
    validation_fraction: float = 0.0
    class_order: str = "sorted"
    official: bool = False

    def __post_init__(self) -> None:
        _check(0 < self.train_fraction < 1, "train_fraction must be in (0, 1)")
        _check(0 <= self.validation_fraction < 1, "validation_fraction must be in [0, 1)")
        _check(self.class_order in ("sorted",), "class_order must be 'sorted'")


@dataclass(frozen=True)
class BackboneSpec:
    name: str
    input_size: int
    pretrained: str = "none"
    frozen_batchnorm: bool = False
    params: dict[str, Any] = field(default_factory=dict)
    # NHWC tensors and weights: the same network, 1.4x faster for small CNNs on a CPU (and the
    # usual choice for CNNs on CUDA); floats round differently from NCHW, hence protocol data
    channels_last: bool = False
    # A local file with the ImageNet weights (a torchvision state_dict), for machines that
    # cannot download them; `run --weights FILE` overrides it. Where to find the weights, not
    # what they are: not part of the protocol's hash (results record the file's sha256).
    weights_file: str = ""

    def __post_init__(self) -> None:
        _check(self.input_size >= 8, "input_size must be at least 8 pixels")
        _check(self.pretrained in ("none", "imagenet"), "pretrained must be 'none' or 'imagenet'")
        _check(
            not self.weights_file or self.pretrained == "imagenet",
            "weights_file goes with pretrained: imagenet (it holds the ImageNet weights)",
        )


FEATURE_ENGINES = ("torch", "onnxruntime")  # harness.backbones.engine.ENGINES


@dataclass(frozen=True)
class FeaturesSpec:
    """A frozen, cached trunk: the backbone's first `frozen_stages` stages never train, so their
    outputs are computed once per image and per view and cached (harness.train.features); each
    run trains the remaining stages and the head on them. Training images get `train_views`
    views drawn by the train augmentation with `view_seed` (the same views for every run and
    seed; a run draws one of them per image and step); every image gets one test view. 0
    frozen stages (the default): no cache, the whole network trains on augmented images.
    `engine` runs the frozen stages on a CPU: torch (the default) or onnxruntime on the same
    network exported to ONNX (harness.backbones.engine; its outputs differ from torch's at
    about 1e-5, so the engine is part of what the cache holds); on a GPU torch runs."""

    frozen_stages: int = 0
    train_views: int = 1
    view_seed: int = 0
    engine: str = "torch"

    def __post_init__(self) -> None:
        _check(self.frozen_stages >= 0, "frozen_stages must be >= 0 (0: nothing frozen)")
        _check(self.train_views >= 1, "train_views must be >= 1")
        _check(self.frozen_stages > 0 or self.train_views == 1,
               "train_views goes with frozen_stages > 0 (the views of the cached trunk)")  # fmt: skip
        _check(0 <= self.view_seed < 2**32, "view_seed must be in [0, 2**32)")
        _check(self.engine in FEATURE_ENGINES,
               f"engine must be one of {', '.join(FEATURE_ENGINES)}, got {self.engine!r}")  # fmt: skip
        _check(self.frozen_stages > 0 or self.engine == "torch",
               "engine goes with frozen_stages > 0 (it runs the frozen trunk)")  # fmt: skip

    @property
    def cached(self) -> bool:
        return self.frozen_stages > 0


@dataclass(frozen=True)
class SamplerSpec:
    """Every batch holds exactly classes_per_batch (P) classes x images_per_class (K) images."""

    classes_per_batch: int
    images_per_class: int

    def __post_init__(self) -> None:
        _check(self.classes_per_batch >= 2, "classes_per_batch (P) must be at least 2")
        _check(self.images_per_class >= 2, "images_per_class (K) must be at least 2")

    @property
    def batch_size(self) -> int:
        return self.classes_per_batch * self.images_per_class


@dataclass(frozen=True)
class OptimizerSpec:
    name: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.9

    def __post_init__(self) -> None:
        _check(self.name in ("adam", "adamw", "sgd"), "optimizer name must be adam, adamw or sgd")
        _check(0 < self.lr < math.inf, "lr must be positive and finite")
        _check(0 <= self.weight_decay < math.inf, "weight_decay must be >= 0 and finite")
        _check(0 <= self.momentum < 1, "momentum must be in [0, 1)")


@dataclass(frozen=True)
class ScheduleSpec:
    name: str = "constant"
    step_epochs: int = 0
    gamma: float = 0.1

    def __post_init__(self) -> None:
        _check(self.name in ("constant", "step", "cosine"), "schedule must be constant/step/cosine")
        _check(self.name != "step" or self.step_epochs > 0, "a step schedule needs step_epochs > 0")
        _check(self.step_epochs >= 0, "step_epochs must be >= 0")
        _check(0 < self.gamma <= 1, "gamma (the step schedule's lr factor) must be in (0, 1]")


@dataclass(frozen=True)
class BudgetSpec:
    """Training length: epochs over the training images (batches of P x K), or fixed steps."""

    epochs: int = 0
    steps: int = 0

    def __post_init__(self) -> None:
        _check(self.epochs >= 0 and self.steps >= 0, "epochs and steps must be >= 0")
        _check((self.epochs > 0) != (self.steps > 0), "set exactly one of epochs or steps")


@dataclass(frozen=True)
class EvaluationSpec:
    recall_ks: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    metrics: list[str] = field(default_factory=lambda: list(METRIC_NAMES))
    batch_size: int = 256
    # How a method with a learned similarity (a scorer) ranks: "exact" scores every
    # query x gallery pair; "rerank" scores only the rerank_top Euclidean candidates.
    scorer_mode: str = "exact"
    rerank_top: int = 100
    # With a validation split, the epoch whose weights score best on it by this metric is the
    # one tested (model selection that never looks at the test split).
    select_by: str = "map@r"
    # The k-means behind nmi and f1 (harness.evaluate.metrics.clustering.kmeans): "harness" (k-means++
    # start, up to 100 iterations) or "faiss" (the published tables' faiss k-means).
    clustering: str = "harness"
    # The region of practical equivalence of the Bayesian comparisons (harness.stats.bayes),
    # in points of the main metric (percentage points for a fraction such as MAP@R): two
    # methods closer than this are practically the same.
    rope: float = 1.0
    # A re-ranking of the test ranking (docs/reranking.md): none, or NAME[:key=value,...],
    # e.g. k_reciprocal or aqe_dba:alpha=3,n=2; kept in its canonical text (every parameter).
    rerank: str = "none"

    def __post_init__(self) -> None:
        _check(self.rope > 0, f"rope must be > 0 points of the main metric, got {self.rope!r}")
        try:  # checked here, not at the test: a typo must not cost a whole run
            reranking = parse_rerank(self.rerank)
        except HarnessError as exc:
            raise ValueError(f"rerank: {exc}") from None
        object.__setattr__(self, "rerank", "none" if reranking is None else reranking.text)
        _check(
            is_single_metric(self.select_by),
            f"select_by must be recall@<k> (e.g. recall@1) or one of {', '.join(SINGLE_METRICS)}, "
            f"got {self.select_by!r}",
        )
        _check(
            self.clustering in KMEANS_CONVENTIONS,
            f"clustering (the k-means convention) must be {' or '.join(KMEANS_CONVENTIONS)}, got"
            f" {self.clustering!r}{closest(self.clustering, KMEANS_CONVENTIONS)}",
        )
        _check(len(self.recall_ks) > 0 and min(self.recall_ks) >= 1, "recall_ks must be >= 1")
        _check(len(set(self.recall_ks)) == len(self.recall_ks), "recall_ks has a repeated k")
        _check(len(self.metrics) > 0, "metrics is empty: name at least one (or leave it out: all)")
        _check(self.batch_size >= 1, "batch_size must be >= 1")
        _check(self.scorer_mode in ("exact", "rerank"), "scorer_mode must be exact or rerank")
        _check(self.rerank_top >= 1, "rerank_top must be >= 1")
        # checked here, not after training: a typo must not cost a whole run
        for name in self.metrics:
            ok = name == "recall@K" or is_single_metric(name)
            _check(ok, f"unknown metric {name!r}{closest(name, list(METRIC_NAMES))}; "
                             f"known: {', '.join(METRIC_NAMES)}")  # fmt: skip


@dataclass(frozen=True)
class TuningSpec:
    """How `harness tune` scores a protocol that carves no validation classes of its own (a
    sweep that trains on every training class): `validation_fraction` of the training classes
    (the last sorted ones, as `split.validation_fraction` carves them) validate each trial,
    and the tuned configuration then trains on all of them under the protocol itself. 0 (the
    default): tune under the protocol's own split, which must carve validation classes. Not
    part of the protocol's hash: it changes no run of the protocol, and a tuned run records
    its study (whose name holds the tuning split's hash)."""

    validation_fraction: float = 0.0

    def __post_init__(self) -> None:
        _check(0 <= self.validation_fraction < 1,
               "tuning.validation_fraction must be in [0, 1) (0: the protocol's own split)")  # fmt: skip


@dataclass(frozen=True)
class PaperSpec:
    """The published results a paper protocol is compared with, in the leaderboard.

    reference and dataset name an entry of protocols/reference/paper_results.yaml;
    differences says where this protocol departs from the paper's (printed above the table);
    methods maps our method names to the reference's where they differ.
    """

    reference: str = ""
    dataset: str = ""
    differences: str = ""
    methods: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check(bool(self.reference) == bool(self.dataset), "paper needs reference and dataset")
        if self.reference:
            check_entry(self.reference, self.dataset)


@dataclass(frozen=True)
class Protocol:
    name: str
    version: int
    dataset: DatasetSpec
    backbone: BackboneSpec
    embedding_dim: int
    sampler: SamplerSpec
    budget: BudgetSpec
    seeds: list[int]
    schema: int = SCHEMA_VERSION
    description: str = ""
    split: SplitSpec = field(default_factory=SplitSpec)
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    schedule: ScheduleSpec = field(default_factory=ScheduleSpec)
    evaluation: EvaluationSpec = field(default_factory=EvaluationSpec)
    methods: dict[str, dict[str, Any]] = field(default_factory=dict)
    paper: PaperSpec = field(default_factory=PaperSpec)
    augmentation: AugmentationSpec = field(default_factory=AugmentationSpec)
    features: FeaturesSpec = field(default_factory=FeaturesSpec)
    tuning: TuningSpec = field(default_factory=TuningSpec)
    # the backbone's and head's arithmetic (harness.core.precision): fp32, bf16 or fp16
    precision: str = "fp32"
    path: str = field(default="", compare=False)

    @property
    def argument(self) -> str:
        """What `--protocol` takes to load this protocol again, for a printed command: a
        shipped protocol's name, else its file's path."""
        shipped = (
            self.path
            and Path(self.path).resolve() == (PROTOCOL_DIR / f"{self.name}.yaml").resolve()
        )
        return self.name if shipped or not self.path else self.path

    def __post_init__(self) -> None:
        _check(self.schema == SCHEMA_VERSION, f"schema must be {SCHEMA_VERSION}")
        # the name is a folder under --results-dir: one plain path component, no '/' or '..'
        _check(is_plain_name(self.name),
               f"name must {NAME_RULE} (it names the results folder), got {self.name!r}")  # fmt: skip
        _check(self.version >= 1, "version must be >= 1")
        _check(self.embedding_dim >= 1, "embedding_dim must be >= 1")
        problem = seed_problem(self.seeds)  # at least one, each in [0, 2**32), none twice
        _check(problem is None, problem or "")
        _check(self.precision in ("fp32", "bf16", "fp16"),
               f"precision must be fp32, bf16 or fp16, got {self.precision!r}")  # fmt: skip
        _check(self.features.engine == "torch" or self.precision == "fp32",
               "features.engine onnxruntime runs fp32: drop precision, or use engine torch")  # fmt: skip
        try:
            self.augmentation.check_sizes(self.backbone.input_size)
        except ValueError as exc:
            raise ValueError(f"augmentation: {exc}") from None

    @property
    def load_size(self) -> int:
        """The side images are loaded at: augmentation.load_size, else the input size; 0 for
        `load: original` (each image at its own size)."""
        if self.augmentation.load == "original":
            return 0
        return self.augmentation.load_size or self.backbone.input_size

    def content(self) -> dict[str, Any]:
        """The protocol as plain data (what the hash covers; the file path is not part of it)."""
        data = dataclasses.asdict(self)
        data.pop("path")
        data.pop("tuning")  # how `tune` validates changes no run of the protocol
        # fields added later are left out at their defaults, so older protocols keep their hash
        data["backbone"].pop("weights_file")  # where the weights are, not what they are
        if not data["backbone"]["channels_last"]:
            data["backbone"].pop("channels_last")
        if not data["split"]["official"]:
            data["split"].pop("official")
        if not self.paper.reference:
            data.pop("paper")
        if self.precision == "fp32":
            data.pop("precision")
        if not self.features.cached:
            data.pop("features")
        elif self.features.engine == "torch":
            data["features"].pop("engine")
        if self.augmentation.empty:
            data.pop("augmentation")
        else:
            data["augmentation"] = self.augmentation.content()
        for key, default in (("select_by", "map@r"), ("clustering", "harness"), ("rope", 1.0),
                             ("rerank", "none")):  # fmt: skip
            if data["evaluation"][key] == default:
                data["evaluation"].pop(key)
        return data

    @property
    def hash(self) -> str:
        """sha256 of the canonical JSON of the content: comments and key order do not change it."""
        canonical = json.dumps(self.content(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def method_overrides(self, method: str) -> dict[str, Any]:
        return dict(self.methods.get(method, {}))


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, where: str) -> Any:
    """Check `value` against the annotation `tp`; recurse into dataclasses, lists and dicts."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise HarnessError(f"{where}: expected a mapping, got {type(value).__name__}")
        return _build(tp, value, where)
    if tp is Any:
        return value
    if origin in (list, tuple):
        (item_tp,) = typing.get_args(tp)[:1]
        if not isinstance(value, list):
            raise HarnessError(f"{where}: expected a list, got {value!r}")
        return [_convert(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        _, value_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise HarnessError(f"{where}: expected a mapping, got {value!r}")
        return {str(k): _convert(v, value_tp, f"{where}.{k}") for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        raise TypeError(f"unsupported annotation {tp}")
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, bool) or not isinstance(value, tp):
        raise HarnessError(f"{where}: expected {_type_name(tp)}, got {value!r}")
    return value


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.name != "path"]
    for key in data:
        if key not in names:
            raise HarnessError(
                f"{where}: unknown key {key!r}{closest(str(key), names)}; allowed: {', '.join(names)}"
            )
    required = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    for key in required:
        if key not in data:
            raise HarnessError(f"{where}: missing required key {key!r}")
    kwargs = {k: _convert(v, hints[k], f"{where}.{k}" if where else k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ValueError as exc:
        raise HarnessError(f"{where}: {exc}") from None


def parse_protocol(data: Any, source: str) -> Protocol:
    """Validate plain data (as loaded from YAML) into a Protocol; errors name `source`."""
    if not isinstance(data, dict):
        raise HarnessError(
            f"{source}: a protocol must be a YAML mapping, got {type(data).__name__}"
        )
    schema = data.get("schema", SCHEMA_VERSION)
    if schema != SCHEMA_VERSION:
        raise HarnessError(
            f"{source}: schema {schema!r} is not supported; this harness reads schema {SCHEMA_VERSION}"
        )
    split = data.get("split")
    if isinstance(split, dict) and split.get("official") is True and "train_fraction" in split:
        raise HarnessError(
            f"{source}: split: train_fraction does not go with official: true (the dataset's "
            "official lists fix train and test); remove one of them"
        )
    protocol = _build(Protocol, data, source)
    return dataclasses.replace(protocol, path=source)


def load_protocol(name_or_path: str) -> Protocol:
    """Load a shipped protocol by name (protocols/NAME.yaml, in the clone or the installed
    package) or any YAML file by path."""
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") or path.exists()):
        path = PROTOCOL_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            known = protocol_names()
            if not known:
                raise HarnessError(
                    f"no shipped protocols in {PROTOCOL_DIR}: the installation is incomplete; "
                    "reinstall the package (pip install --force-reinstall dml-harness) or "
                    "pass a path to a .yaml file"
                )
            raise HarnessError(
                f"unknown protocol {name_or_path!r}{closest(name_or_path, known)}; "
                f"known: {', '.join(known)} (or pass a path to a .yaml file)"
            )
    if path.is_dir():
        raise HarnessError(f"{path} is a directory, not a protocol file: pass a protocol's "
                           ".yaml file (or a shipped protocol's name)")  # fmt: skip
    if not path.is_file():
        raise HarnessError(f"protocol file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HarnessError(f"cannot read protocol file {path}: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise HarnessError(f"{path}{line}: malformed YAML: {problem}") from None
    return parse_protocol(data, str(path))


def protocol_names() -> list[str]:
    return sorted(p.stem for p in PROTOCOL_DIR.glob("*.yaml"))
