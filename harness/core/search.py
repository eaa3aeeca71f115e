"""Search spaces for equal-budget tuning: each method file declares, next to its paper
defaults, the ranges `harness tune` may try for its hyperparameters.

A space maps hyperparameter names (keyword arguments of the method's build function) to a
Float, Int or Choice. Every method gets the same number of trials; a method with an empty
space is tuned over nothing (its one configuration is its paper default)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from harness.core.errors import HarnessError


class Suggests(Protocol):  # optuna.Trial's part that a space uses
    def suggest_float(self, name: str, low: float, high: float, *, log: bool = ...) -> float: ...
    def suggest_int(self, name: str, low: int, high: int, *, log: bool = ...) -> int: ...
    def suggest_categorical(self, name: str, choices: Any) -> Any: ...


@dataclass(frozen=True)
class Float:
    low: float
    high: float
    log: bool = False

    def suggest(self, trial: Suggests, name: str) -> float:
        return trial.suggest_float(name, self.low, self.high, log=self.log)

    def contains(self, value: Any) -> bool:
        return isinstance(value, (int, float)) and self.low <= value <= self.high


@dataclass(frozen=True)
class Int:
    low: int
    high: int
    log: bool = False

    def suggest(self, trial: Suggests, name: str) -> int:
        return trial.suggest_int(name, self.low, self.high, log=self.log)

    def contains(self, value: Any) -> bool:
        return isinstance(value, int) and self.low <= value <= self.high


@dataclass(frozen=True)
class Choice:
    values: tuple[Any, ...]

    def suggest(self, trial: Suggests, name: str) -> Any:
        return trial.suggest_categorical(name, list(self.values))

    def contains(self, value: Any) -> bool:
        return value in self.values


Range = Float | Int | Choice
SearchSpace = dict[str, Range]


def check_space(method: str, space: SearchSpace, defaults: dict[str, Any]) -> SearchSpace:
    """A space names only the method's hyperparameters, and contains each paper default (so
    that tuning can always find the paper's configuration again)."""
    for name, rng in space.items():
        if name not in defaults:
            raise HarnessError(
                f"method {method}: search space names {name!r}, which is not one of its "
                f"hyperparameters ({', '.join(defaults) or 'none'})"
            )
        if not isinstance(rng, (Float, Int, Choice)):
            raise HarnessError(
                f"method {method}: search range for {name!r} must be Float, Int or Choice"
            )
        if not rng.contains(defaults[name]):
            raise HarnessError(
                f"method {method}: the paper default {name}={defaults[name]!r} lies outside its "
                f"search range {rng}"
            )
    return space


# The learning-rate multiplier of a loss's own parameters (proxies, class weights, centres):
# from the protocol's rate to three orders of magnitude above it (Proxy-Anchor uses 100).
LR_MULTIPLIER = Float(1.0, 1000.0, log=True)
