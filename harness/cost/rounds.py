"""Interleaved rounds: how the cost commands compare things timed on a shared machine.

Timing A fully and then B lets the machine's load change between them (on a shared VM its
speed drifts by 2x within minutes), and the difference lands on the comparison. Instead every
subject is timed once per round, for several rounds, and each keeps its fastest round: the
one least disturbed by the rest of the machine (timeit's rule). A slow spell then hits one
round of every subject, not all rounds of one. `cost --pipeline` alternates its worker
counts this way and `cost` its methods' throughput.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TypeVar

Key = TypeVar("Key", bound=Hashable)
Value = TypeVar("Value")


def round_order(keys: Sequence[Key], round_index: int) -> list[Key]:
    """The order of round `round_index` (0-based): every key once, starting at the
    round_index-th and wrapping around, so no subject is always first (right after a slow
    set-up) or always last."""
    if not keys:
        return []
    start = round_index % len(keys)
    return [*keys[start:], *keys[:start]]


def interleaved(
    timed: Mapping[Key, Callable[[], Value | None]],
    rounds: int,
    report: Callable[[int, Key, Value], None] | None = None,
) -> dict[Key, list[Value]]:
    """Call every subject of `timed` once per round for `rounds` rounds (round_order), and
    return each subject's results in round order. A subject whose call returns None failed:
    it is left out of the later rounds and keeps the results it had. `report(round, key,
    value)` is called after each successful call (the progress log)."""
    results: dict[Key, list[Value]] = {key: [] for key in timed}
    alive = list(timed)
    for r in range(rounds):
        for key in round_order(alive, r):
            value = timed[key]()
            if value is None:
                alive.remove(key)
                continue
            results[key].append(value)
            if report is not None:
                report(r, key, value)
    return results


def fastest(values: Sequence[Value], key: Callable[[Value], float]) -> int:
    """The index of the fastest round: the one with the largest `key` (a rate such as
    images per second); the first of equals."""
    if not values:
        raise ValueError("no rounds to choose from")
    return max(range(len(values)), key=lambda i: (key(values[i]), -i))
