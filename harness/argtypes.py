"""argparse value types shared by the CLI's subcommands (cli.py and cost.py)."""

from __future__ import annotations

import argparse


def int_list(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


SEED_LIMIT = 2**32  # numpy's and torch's seeds are unsigned 32-bit integers


def seed_problem(seeds: list[int]) -> str | None:
    """What is wrong with a list of seeds (None: nothing): each an integer in [0, 2**32),
    at least one, none twice (a seed's run would be trained and written twice)."""
    if not seeds:
        return "at least one seed is needed"
    bad = [s for s in seeds if isinstance(s, bool) or not isinstance(s, int)
           or not 0 <= s < SEED_LIMIT]  # fmt: skip
    if bad:
        return f"seeds must be integers from 0 to {SEED_LIMIT - 1}, got {bad[0]!r}"
    twice = sorted({s for s in seeds if seeds.count(s) > 1})
    if twice:
        return f"seed {twice[0]} is listed twice"
    return None


def seed_list(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2], checked before any run: a bad seed would stop a sweep half-way."""
    seeds = int_list(text)
    problem = seed_problem(seeds)
    if problem:
        raise argparse.ArgumentTypeError(f"{problem} (in {text!r})")
    return seeds


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value
