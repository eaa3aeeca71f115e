"""What a list of seeds must be: at least one, each a 32-bit unsigned integer, none twice."""

from __future__ import annotations

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
