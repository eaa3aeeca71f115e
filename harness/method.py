"""The method contract: what a loss, miner, head or learned similarity plugs into.

A method is built from a MethodContext (what the protocol fixed) and its hyperparameters,
and returns a Method. The runner owns the backbone, data, sampler, optimizer, budget and
evaluation; the method owns only what its paper adds:

- head: backbone stage features -> Embedded (the retrieval embedding plus named extras such
  as per-head embeddings or classification logits). It may read any stage (cascades).
- miner: (Embedded, Batch) -> Pairs | Triplets | Quadruplets, run under no_grad.
- loss: an nn.Module (Embedded, Batch, mined) -> scalar tensor; its parameters (a PDDM unit,
  classifier layers) are trained with the backbone under the protocol's optimizer.
- scorer: optional learned similarity (query [q, D], gallery [G, D]) -> [q, G], higher = more
  similar; evaluation then ranks by it instead of the Euclidean distance.
- diagnostics: optional (test embeddings [N, D], labels [N]) -> {name: number}, recorded in
  the result beside the metrics (not ranked by the leaderboard).
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from harness.errors import HarnessError
from harness.registry import Registry, closest
from harness.search import Choice, Float, Int, SearchSpace, check_space

if TYPE_CHECKING:
    from harness.protocol import Protocol


@dataclass(frozen=True)
class MethodContext:
    """What the protocol fixed and a method may read."""

    stage_dims: tuple[int, ...]
    embedding_dim: int
    num_classes: int
    num_coarse_classes: int | None = None

    @property
    def feature_dim(self) -> int:
        return self.stage_dims[-1]


@dataclass
class Batch:
    """Labels of one training batch, on the training device: fine labels are contiguous
    training-class ids (0 .. num_classes - 1); coarse labels are the dataset's own ids."""

    labels: torch.Tensor
    coarse_labels: torch.Tensor | None = None


@dataclass
class Embedded:
    embedding: torch.Tensor
    extras: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class Mined:
    """Base of the typed tuples a miner returns; `evaluated` counts the pair scores or
    distances the miner computed, the work that the cost measurements compare."""

    evaluated: int
    family: ClassVar[str] = ""  # the method family whose miners return this type

    def count(self) -> int:
        return len(self.indices()[0])

    def indices(self) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def check(self, batch_size: int, indices: bool = True) -> None:
        """The runner's shape check: equal-length 1-D index tensors inside the batch. The
        range check (`indices`) reads the tensors back, a synchronisation on a GPU, so the
        training loop asks for it only every few steps."""
        idx = self.indices()
        n = len(idx[0])
        for t in idx:
            if t.ndim != 1 or len(t) != n:
                raise RuntimeError(f"{type(self).__name__}: malformed indices from the miner")
            if indices and n and (t.min() < 0 or t.max() >= batch_size):
                raise RuntimeError(f"{type(self).__name__}: miner indices outside the batch")


@dataclass
class Pairs(Mined):
    family: ClassVar[str] = "pairs"
    first: torch.Tensor
    second: torch.Tensor
    positive: torch.Tensor  # bool: same class

    def indices(self) -> tuple[torch.Tensor, ...]:
        return self.first, self.second


@dataclass
class Triplets(Mined):
    family: ClassVar[str] = "triplets"
    anchor: torch.Tensor
    positive: torch.Tensor
    negative: torch.Tensor

    def indices(self) -> tuple[torch.Tensor, ...]:
        return self.anchor, self.positive, self.negative


@dataclass
class Quadruplets(Mined):
    """(i, j) a positive pair, k a negative of i, l a negative of j (PDDM's hard quadruplet);
    hierarchical methods read them as (reference, same fine, same coarse, other coarse)."""

    family: ClassVar[str] = "quadruplets"

    i: torch.Tensor
    j: torch.Tensor
    k: torch.Tensor
    l: torch.Tensor  # noqa: E741 (the paper's name)

    def indices(self) -> tuple[torch.Tensor, ...]:
        return self.i, self.j, self.k, self.l


Miner = Callable[[Embedded, Batch], Mined]
Scorer = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Diagnostics = Callable[[torch.Tensor, torch.Tensor], dict[str, float]]


@dataclass
class Method:
    head: nn.Module
    loss: nn.Module | None = None
    miner: Miner | None = None
    scorer: Scorer | None = None
    # Extras of the head's Embedded that evaluation also scores alone (a cascade's heads);
    # the result records them under metrics_by_part, ranked by Euclidean distance.
    sub_embeddings: tuple[str, ...] = ()
    # The loss's own parameters (proxies, class weights, learned margins) train at this
    # multiple of the protocol's learning rate (Proxy-Anchor: 100); declare it as a
    # hyperparameter so that results record it.
    loss_lr_multiplier: float = 1.0
    # Named numbers of the method's own, from the test embeddings and labels (e.g. how well a
    # learned similarity tells positive from negative test pairs); the result records them.
    diagnostics: Diagnostics | None = None

    @property
    def trains(self) -> bool:
        return self.loss is not None


class EmbeddingHead(nn.Module):
    """Linear map of the last stage's pooled features to the embedding, L2-normalised."""

    def __init__(self, in_dim: int, embedding_dim: int, normalize: bool = True) -> None:
        super().__init__()
        self.fc = nn.Linear(in_dim, embedding_dim)
        self.normalize = normalize

    def forward(self, features: list[torch.Tensor]) -> Embedded:
        x = self.fc(features[-1])
        return Embedded(F.normalize(x, dim=1) if self.normalize else x)


def all_pairs(labels: torch.Tensor) -> Pairs:
    """Every unordered pair of the batch (i < j), with its same-class flag: m(m-1)/2 pairs."""
    m = len(labels)
    first, second = torch.triu_indices(m, m, offset=1, device=labels.device)
    return Pairs(m * (m - 1) // 2, first, second, labels[first] == labels[second])


# What a method's miner hands its loss; figures draw one panel per family, so that methods
# of one kind are compared with each other. A Mined type names its family (Pairs: "pairs").
FAMILIES = {
    "pairs": "losses over pairs (and pair-based whole-batch losses)",
    "triplets": "losses over triplets",
    "quadruplets": "losses over quadruplets",
    "proxies": "proxy or class-weight losses: no tuples mined from the batch",
    "batch": "whole-batch losses (listwise, NCA-like) that mine no tuples",
    "none": "no training",
}


def check_family(family: str) -> str:
    if family not in FAMILIES:
        raise HarnessError(
            f"unknown method family {family!r}{closest(family, list(FAMILIES))}; "
            f"known: {', '.join(FAMILIES)}"
        )
    return family


@dataclass(frozen=True)
class MethodSpec:
    name: str
    version: int
    build: Callable[..., Method]
    family: str
    paper: str = ""
    needs_coarse_labels: bool = False
    summary: str = ""
    # What `harness tune` may try (harness.search): hyperparameter name -> Float/Int/Choice.
    search: dict[str, Any] = field(default_factory=dict)

    def defaults(self) -> dict[str, Any]:
        """The paper's hyperparameters: the build function's keyword defaults."""
        params = inspect.signature(self.build).parameters.values()
        return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}

    def hyperparameters(self, overrides: dict[str, Any], where: str = "") -> dict[str, Any]:
        """Defaults with the overrides (from `where`: a protocol's methods.<name>, a tuning
        overlay); an unknown name or a value of the wrong type is an error here, before any
        training, not a TypeError deep in a loss. Tuples become lists, as in the YAML and the
        result JSON, so a rerun compares equal."""
        prefix = f"{where}: " if where else ""
        if not isinstance(overrides, dict):
            raise HarnessError(f"{prefix}expected a mapping of {self.name}'s hyperparameters, "
                               f"got {overrides!r}")  # fmt: skip
        defaults = self.defaults()
        kinds = self.kinds()
        for key, value in overrides.items():
            if key not in defaults:
                known = ", ".join(defaults) or "none"
                raise HarnessError(
                    f"{prefix}method {self.name} has no hyperparameter {key!r}"
                    f"{closest(key, list(defaults))}; it takes: {known}"
                )
            if not _fits(value, kinds[key]):
                at = f"{where}.{key}" if where else key
                raise HarnessError(
                    f"{at}: method {self.name} takes {_describe(kinds[key])} for {key}, got "
                    f"{type(value).__name__} {value!r} (its default: {_plain(defaults[key])!r})"
                )
        merged = {**defaults, **overrides}
        return {k: _plain(v) for k, v in merged.items()}

    def kinds(self) -> dict[str, Any]:
        """What each hyperparameter takes (see _kind): from its annotation where the build
        function declares a plain one, else from its default."""
        try:
            params = inspect.signature(self.build, eval_str=True).parameters.values()
        except Exception:  # an annotation that does not evaluate here: go by the defaults
            params = inspect.signature(self.build).parameters.values()
        return {p.name: _kind(p.annotation, p.default) for p in params
                if p.kind is inspect.Parameter.KEYWORD_ONLY}  # fmt: skip


def _plain(value: Any) -> Any:
    """A tuple as the list the YAML writes."""
    return list(value) if isinstance(value, tuple) else value


# A hyperparameter's kind: float (a number: int or float), int, bool, str, ("list", item
# kind), ("optional", kind) or None (anything). bool is neither an int nor a number here.
_PLAIN = (bool, int, float, str)


def _kind(annotation: Any, default: Any) -> Any:
    """The kind of a keyword argument: its annotation's, where it is declared (and is a plain
    type, a list or tuple of one, or one of those or None); else its default's. An undeclared
    int default takes any number: third-party signatures write 1 where they mean 1.0."""
    if annotation is not inspect.Parameter.empty and not isinstance(annotation, str):
        return _annotated_kind(annotation)
    if default is None or isinstance(default, (bool, str)):
        return None if default is None else type(default)
    if isinstance(default, (int, float)):
        return float
    if isinstance(default, (list, tuple)):
        items = {_kind(inspect.Parameter.empty, v) for v in default}
        return ("list", items.pop() if len(items) == 1 else None)
    return None


def _annotated_kind(tp: Any) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp in _PLAIN:
        return tp
    if origin in (list, tuple):
        return ("list", _annotated_kind(args[0]) if args else None)
    if origin in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        inner = _annotated_kind(next(a for a in args if a is not type(None)))
        return None if inner is None else ("optional", inner)
    return None


def _fits(value: Any, kind: Any) -> bool:
    if kind is None:
        return True
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind in (bool, str):
        return isinstance(value, kind)
    if kind[0] == "optional":
        return value is None or _fits(value, kind[1])
    return isinstance(value, (list, tuple)) and all(_fits(v, kind[1]) for v in value)


_NAMES = {float: ("a number", "numbers"), int: ("an integer", "integers"),
          bool: ("true or false", "booleans"), str: ("a string", "strings")}  # fmt: skip


def _describe(kind: Any) -> str:
    if kind in _NAMES:
        return _NAMES[kind][0]
    if kind[0] == "optional":
        return f"{_describe(kind[1])} or null"
    return f"a list of {_NAMES[kind[1]][1]}" if kind[1] in _NAMES else "a list"


METHODS: Registry[MethodSpec] = Registry("method")


def protocol_hyperparameters(protocol: Protocol, name: str) -> dict[str, Any]:
    """The method's hyperparameters under a protocol: its defaults with the protocol's
    overrides (an unknown override or one of the wrong type is an error). The one place runs,
    tuning and cost resolve them."""
    where = f"{protocol.path}: methods.{name}" if protocol.path else f"methods.{name}"
    return METHODS.get(name).hyperparameters(protocol.method_overrides(name), where)


def family_of(name: str) -> str:
    """The family of a registered method; "other" for a name no longer registered (an old
    result), so that figures still draw it."""
    return METHODS.get(name).family if name in METHODS else "other"


def register_method(
    name: str,
    *,
    version: int,
    family: str,
    paper: str = "",
    needs_coarse_labels: bool = False,
    search: SearchSpace | None = None,
) -> Callable[[Callable[..., Method]], Callable[..., Method]]:
    """Register `build(ctx, **hyperparameters) -> Method`; bump `version` when results change.
    `family` is one of FAMILIES: the kind of tuples its miner returns; `search` the ranges
    `harness tune` may try (harness.search), each holding the paper default."""
    check_family(family)

    def decorate(build: Callable[..., Method]) -> Callable[..., Method]:
        doc = (build.__doc__ or inspect.getmodule(build).__doc__ or "").strip()
        summary = doc.splitlines()[0] if doc else ""
        spec = MethodSpec(name, version, build, family, paper, needs_coarse_labels, summary)
        space = check_space(name, dict(search or {}), spec.defaults())
        for key, rng in space.items():  # what tuning may suggest must fit the build function
            ends = rng.values if isinstance(rng, Choice) else (rng.low, rng.high)
            cast = float if isinstance(rng, Float) else int if isinstance(rng, Int) else None
            for value in ends:
                spec.hyperparameters({key: cast(value) if cast else value},
                                     f"method {name}: search")  # fmt: skip
        METHODS.add(name, dataclasses.replace(spec, search=space))
        return build

    return decorate
