"""Which re-ranking an evaluation applies, as text: `NAME[:key=value,...]`, parsed and checked
here (in core, so that a protocol's `evaluation.rerank` is checked when the protocol loads);
the re-rankings themselves are computed in harness.evaluate.reranking.

    none                                   no re-ranking (parse_rerank returns None)
    k_reciprocal[:k1=20,k2=6,lambda=0.3]   Zhong et al., CVPR 2017
    aqe_dba[:alpha=3,n=2]                  Radenovic et al., TPAMI 2018 (alpha-QE with DBA)

Left-out parameters take their defaults, fixed in advance and never tuned on test classes
(k_reciprocal's are its paper's; aqe_dba's: see harness.evaluate.reranking). A Rerank's text
names every parameter, so a record says exactly what ran and the text parses back to the
same Rerank.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from harness.core.errors import HarnessError
from harness.core.registry import closest

NONE = "none"


@dataclass(frozen=True)
class Param:
    """One parameter of a re-ranking: its type, its default, and the rule its value obeys."""

    kind: type  # int or float
    default: int | float
    rule: str  # said in the error when the value breaks it
    ok: Callable[[int | float, dict[str, int | float]], bool]
    needs: tuple[str, ...] = ()  # the earlier parameters its rule names (said in the error)


def _finite(value: float) -> bool:
    return math.isfinite(value)


#: each re-ranking's parameters, in the order its text names them
RERANKINGS: dict[str, dict[str, Param]] = {
    "k_reciprocal": {
        "k1": Param(int, 20, "an integer >= 1", lambda v, p: v >= 1),
        "k2": Param(
            int, 6, "an integer with 1 <= k2 <= k1", lambda v, p: 1 <= v <= p["k1"], needs=("k1",)
        ),
        "lambda": Param(float, 0.3, "a number with 0 <= lambda <= 1", lambda v, p: 0 <= v <= 1),
    },
    "aqe_dba": {
        "alpha": Param(float, 3.0, "a finite number >= 0", lambda v, p: _finite(v) and v >= 0),
        "n": Param(int, 2, "an integer >= 0", lambda v, p: v >= 0),
    },
}
NAMES = (NONE, *RERANKINGS)


def _format(value: int | float) -> str:
    """A number as the canonical text writes it: 20, 0.3, 3 (not 3.0), 1e-05."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


@dataclass(frozen=True)
class Rerank:
    """A re-ranking and all its parameters (defaults filled in, in canonical order, checked
    when made). `text` (also `str()`) is the canonical `NAME:key=value,...` that parse_rerank
    reads back to an equal Rerank; records and protocols hold it."""

    name: str
    params: tuple[tuple[str, int | float], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", _checked(self.name, dict(self.params)))

    @property
    def text(self) -> str:
        return f"{self.name}:" + ",".join(f"{key}={_format(v)}" for key, v in self.params)

    def __str__(self) -> str:
        return self.text

    def __getitem__(self, key: str) -> int | float:
        return dict(self.params)[key]


def _checked(name: str, given: dict[str, int | float]) -> tuple[tuple[str, int | float], ...]:
    """The parameters of `name` in canonical order, defaults filled in, each checked."""
    if name not in RERANKINGS:
        raise _unknown_name(name)
    spec = RERANKINGS[name]
    for key in given:
        if key not in spec:
            raise _unknown_parameter(name, key)
    values: dict[str, int | float] = {}
    for key, param in spec.items():
        value = given.get(key, param.default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise HarnessError(f"{name}: {key} must be {param.rule}, got {value!r}")
        if param.kind is int and (isinstance(value, float) and not value.is_integer()):
            raise HarnessError(f"{name}: {key} must be {param.rule}, got {value!r}")
        values[key] = param.kind(value)
        if not param.ok(values[key], values):
            default = "" if key in given else f" (its default; give {key}=...)"
            others = "".join(f" with {o}={_format(values[o])}" for o in param.needs)
            raise HarnessError(f"{name}: {key} must be {param.rule}, got {_format(value)}"
                               f"{others}{default}")  # fmt: skip
    return tuple(values.items())


def _unknown_name(name: str) -> HarnessError:
    return HarnessError(f"unknown re-ranking {name!r}{closest(name, NAMES, ignore_case=True)};"
                        f" choose one of {', '.join(NAMES)}")  # fmt: skip


def _unknown_parameter(name: str, key: str) -> HarnessError:
    spec = RERANKINGS[name]
    return HarnessError(f"re-ranking {name} has no parameter {key!r}"
                        f"{closest(key, spec, ignore_case=True)}; it takes "
                        f"{', '.join(spec)}")  # fmt: skip


def parse_rerank(text: str) -> Rerank | None:
    """The re-ranking `text` names (`NAME[:key=value,...]`), or None for `none`. Every
    error is one HarnessError line saying what is wrong and how to write it."""
    if not isinstance(text, str):
        raise HarnessError(f"a re-ranking is text (NAME[:key=value,...]), got {text!r}")
    name, colon, rest = text.strip().partition(":")
    name = name.strip()
    if not name:
        raise HarnessError(f"empty re-ranking {text!r}: write one of {', '.join(NAMES)}, "
                           "with key=value parameters after a colon")  # fmt: skip
    if name == NONE:
        if colon:
            raise HarnessError(f"re-ranking none takes no parameters, got {text!r}; write none")
        return None
    if name not in RERANKINGS:
        raise _unknown_name(name)
    given: dict[str, int | float] = {}
    for item in rest.split(",") if rest.strip() else []:
        key, equals, value = (part.strip() for part in item.partition("="))
        if not equals or not key:
            raise HarnessError(f"{name}: {item.strip()!r} is not key=value; write e.g. "
                               f"{Rerank(name).text}")  # fmt: skip
        if key in given:
            raise HarnessError(f"{name}: {key} is given twice in {text!r}; give it once")
        given[key] = _number(name, key, value)
    return Rerank(name, tuple(given.items()))


def _number(name: str, key: str, value: str) -> int | float:
    """A parameter's value: an int where it is written as one, else a float."""
    param = RERANKINGS[name].get(key)
    if param is None:
        raise _unknown_parameter(name, key)
    try:
        return int(value)
    except ValueError:
        pass
    try:
        number = float(value)
    except ValueError:
        raise HarnessError(f"{name}: {key}={value!r} is not a number; {key} must be "
                           f"{param.rule}") from None  # fmt: skip
    if param.kind is int:
        raise HarnessError(f"{name}: {key} must be {param.rule}, got {value}")
    return number
