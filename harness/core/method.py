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
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from harness.core.errors import HarnessError
from harness.core.names import NAME_RULE, is_plain_name
from harness.core.registry import Registry, closest
from harness.core.search import Choice, Float, Int, SearchSpace, check_space
from harness.core.tuples import Diagnostics, Embedded, Miner, Scorer

if TYPE_CHECKING:
    from harness.core.protocol import Protocol


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
    # What `harness tune` may try (harness.core.search): hyperparameter name -> Float/Int/Choice.
    search: dict[str, Any] = field(default_factory=dict)
    # Where the method comes from: None for the built-in ones; for a plugin, its file's path
    # and sha256, or its distribution's name and version (harness.core.plugins).
    source: dict[str, str] | None = None

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
    `harness tune` may try (harness.core.search), each holding the paper default. The name
    names the results folder, so it follows the protocols' rule (harness.core.names)."""
    check_method_name(name)
    check_family(family)

    def decorate(build: Callable[..., Method]) -> Callable[..., Method]:
        check_signature(name, build)
        doc = build.__doc__ or inspect.getmodule(build).__doc__ or ""
        spec = MethodSpec(
            name, version, build, family, paper, needs_coarse_labels, docstring_summary(doc)
        )
        space = check_space(name, dict(search or {}), spec.defaults())
        for key, rng in space.items():  # what tuning may suggest must fit the build function
            ends = rng.values if isinstance(rng, Choice) else (rng.low, rng.high)
            cast = float if isinstance(rng, Float) else int if isinstance(rng, Int) else None
            for value in ends:
                spec.hyperparameters({key: cast(value) if cast else value},
                                     f"method {name}: search")  # fmt: skip
        _check_new_name(name)
        METHODS.add(name, dataclasses.replace(spec, search=space, source=_REGISTERING["source"]))
        return build

    return decorate


def check_method_name(name: object) -> None:
    """A registered name is one plain folder name (harness.core.names): `../../escaped` would
    write its results outside --results-dir, `a b` or `x<y` would make an awkward folder, and
    `:` or `+` would read as a `pml:Loss+Miner` name or a tuned run (`contrastive+tuned`). The
    error names where the registration came from (a plugin file, a distribution)."""
    if not is_plain_name(name):
        raise HarnessError(
            f"method name {name!r} from {describe_source(_REGISTERING['source'])} is not "
            f"allowed: a method name must {NAME_RULE} (it names the results folder "
            "runs/<protocol>/<method>/); rename it in register_method(...)"
        )


def check_signature(name: str, build: Callable[..., Method]) -> None:
    """`build(ctx, *, hyperparameter=paper_default, ...)`: the runner passes the context by
    position and each hyperparameter by name, and reads the paper's values from the defaults,
    so any other shape would fail only when the first run starts."""
    params = list(inspect.signature(build).parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    no_default = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    star_args = any(p.kind is p.VAR_POSITIONAL for p in params)
    if len(positional) != 1 or no_default or star_args:
        what = (f"keyword-only hyperparameters without a default: {', '.join(no_default)}"
                if no_default else f"{len(positional)} positional parameters" if not star_args
                else "*args")  # fmt: skip
        raise HarnessError(
            f"method {name}: build{inspect.signature(build)} has {what}; write "
            "build(ctx, *, name=paper_default, ...): the context as its one positional "
            "parameter, each hyperparameter keyword-only with its paper default"
        )


# The source of the methods being registered now: set by harness.core.plugins while it
# imports a plugin; None (the built-in methods) otherwise.
_REGISTERING: dict[str, dict[str, str] | None] = {"source": None}


def describe_source(source: dict[str, str] | None) -> str:
    """A method's source in words: 'built-in', 'plugin file PATH', 'distribution NAME X.Y'."""
    if source is None:
        return "built-in (harness.methods)"
    if "distribution" in source:
        return (
            f"distribution {source['distribution']} {source['version']} ({source['entry_point']})"
        )
    if "module" in source:
        return f"plugin module {source['module']} ({source['path']})"
    return f"plugin file {source['path']}"


def _check_new_name(name: str) -> None:
    """A name registered twice is an error that names both sources."""
    if name in METHODS.names():
        first, second = METHODS.get(name).source, _REGISTERING["source"]
        raise HarnessError(f"method {name!r} from {describe_source(second)} is already registered "
                           f"by {describe_source(first)}: rename one of them")  # fmt: skip


def docstring_summary(doc: str) -> str:
    """A method's summary for `ls` and its JSON: the docstring's first paragraph (up to the
    first blank line) on one line. Not its first physical line: a first sentence wrapped over
    two lines would be cut mid-sentence."""
    paragraph = re.split(r"\n[ \t]*\n", inspect.cleandoc(doc).strip(), maxsplit=1)[0]
    return " ".join(paragraph.split())
