"""Which methods are practically equivalent across protocols: each method against the
reference (the best average rank over the blocks, as the critical-difference diagram takes
them) by the hierarchical model over every seed of every protocol (harness.stats.hierarchical,
its posteriors kept by harness.stats.posteriors), with the Bayesian signed-rank test over the
protocols' means beside it (harness.stats.bayes), at the protocols' ROPE and at each of ROPES
for the sensitivity of the verdicts. The leaderboard's section, the report's stacked-bar
figure and the README's sentence (harness.report.equivalence) all show this one computation.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from harness.stats import hierarchical
from harness.stats.bayes import DEFAULT_ROPE, ROPES, SCALE, Probs, signed_rank_probs
from harness.stats.blocks import by_setting, main_blocks
from harness.stats.hierarchical import NotConverged, Posterior, check_rope
from harness.stats.posteriors import PosteriorCache
from harness.stats.ranks import MIN_METHODS, Block, average_ranks, missing_from, shared_blocks

log = logging.getLogger(__name__)

ALL = "all protocols"
Verdict = Probs | NotConverged  # a hierarchical cell: probabilities, or words


@dataclass(frozen=True)
class Across:
    """One across-protocol comparison: which protocols (`blocks`, each a mean over up to
    `seeds` seeds), the reference method, the ROPE in points, and each other method's
    probabilities against the reference by the hierarchical model at that ROPE (`probs`) and
    at each of ROPES (`sensitivity`), its posterior (`posteriors`: shrunk means, diagnostics,
    protocols left out), the signed-rank test's probabilities at the ROPE beside them, and
    each method's mean difference from the reference on each protocol it ran (`gaps`, points)."""

    label: str
    blocks: list[str]
    seeds: tuple[int, int]
    reference: str
    rope: float
    probs: dict[str, Verdict]
    sensitivity: dict[float, dict[str, Verdict]]
    signed_rank: dict[str, Probs] = field(default_factory=dict)
    posteriors: dict[str, Posterior] = field(default_factory=dict)
    gaps: dict[str, dict[str, float]] = field(default_factory=dict)
    # methods not on every block, with the blocks that lack them: compared over the others
    unranked: dict[str, list[str]] = field(default_factory=dict)

    def equivalent(self) -> list[str]:
        """The methods practically equivalent to the reference with P >= DECISIVE."""
        return sorted(m for m, p in self.probs.items() if p.verdict() == "equivalent")

    def order(self) -> list[str]:
        """The methods best first: least likely worse, then most likely better; the
        comparisons that did not converge last."""

        def rank(m: str) -> tuple[int, float, float, str]:
            p = self.probs[m]
            if isinstance(p, NotConverged):
                return 1, 0.0, 0.0, m
            return 0, p.worse, -p.better, m

        return sorted(self.probs, key=rank)

    def fragile(self, method: str) -> bool:
        """Whether the method has a verdict (P >= DECISIVE) at the ROPE and another one, or
        none, at some ROPE of the sensitivity table."""
        verdict = self.probs[method].verdict()
        return verdict not in ("undecided", "not converged") and any(
            self.sensitivity[r][method].verdict() != verdict for r in self.sensitivity)  # fmt: skip

    def newly_decided(self) -> list[str]:
        """The methods with a verdict by the hierarchical model that the signed-rank test left
        undecided, at the ROPE."""
        return sorted(m for m, p in self.signed_rank.items() if p.verdict() == "undecided"
                      and self.probs[m].verdict() not in ("undecided", "not converged"))  # fmt: skip

    def newly_undecided(self) -> list[str]:
        """The methods the signed-rank test decided and the hierarchical model does not."""
        return sorted(m for m, p in self.signed_rank.items() if p.verdict() != "undecided"
                      and self.probs[m].verdict() in ("undecided", "not converged"))  # fmt: skip

    def left_out(self) -> dict[str, list[str]]:
        """Method -> the protocols left out of its comparison (fewer than 2 shared seeds)."""
        return {m: p.left_out for m, p in sorted(self.posteriors.items()) if p.left_out}

    def one_sided(self) -> dict[str, str]:
        """Method -> `worse`, `equivalent` or `better`, for each compared method whose mean
        difference from the reference lies in that region of the ROPE on every protocol: the
        comparisons the model is expected to decide. A method whose differences straddle the
        ROPE is left out: the protocols disagree, so the next one may fall either way."""
        out = {}
        for m, by_protocol in self.gaps.items():
            regions = {region(d, self.rope) for d in by_protocol.values()}
            if m in self.probs and len(regions) == 1:
                out[m] = regions.pop()
        return out

    def still_open(self) -> list[str]:
        """The one-sided methods (see one_sided) without that verdict at P >= DECISIVE:
        undecided, not converged, or (rarely) the other verdict."""
        return sorted(m for m, r in self.one_sided().items() if self.probs[m].verdict() != r)

    def converged(self) -> tuple[int, int]:
        """(comparisons that converged or needed no sampling, comparisons)."""
        return sum(p.diagnostics.converged for p in self.posteriors.values()), len(self.posteriors)


def region(difference: float, rope: float) -> str:
    """Where a mean difference (points, method minus reference) lies against the ROPE."""
    if difference < -rope:
        return "worse"
    return "better" if difference > rope else "equivalent"


_WARNED: set[str] = set()  # a leaderboard draws each comparison twice (figure, section)


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning(message)


def across(blocks: list[Block], label: str = ALL, cache: PosteriorCache | None = None
           ) -> Across | None:  # fmt: skip
    """The comparison over the blocks' shared methods (as the critical-difference diagram
    takes them; the reference is the best of them), and of each method that some blocks
    lack over the blocks it ran on, at least two; None with fewer than two blocks or
    MIN_METHODS shared methods. The ROPE is the protocols' own when they all have one, else
    DEFAULT_ROPE. Each method's posterior comes from `cache` (the results folder's file; by
    default this process's memory and the committed reference's file) or is sampled."""
    import pandas as pd

    kept, shared, _ = shared_blocks(blocks)
    if len(kept) < 2 or len(shared) < MIN_METHODS:
        return None
    table = pd.DataFrame([[SCALE * b.means[m] for m in shared] for b in kept],
                         index=[b.name for b in kept], columns=shared)  # fmt: skip
    ranks, means = average_ranks(table), table.mean(axis=0)
    reference = min(shared, key=lambda m: (ranks[m], -means[m], m))
    ropes = {b.rope for b in kept}
    rope = ropes.pop() if len(ropes) == 1 else DEFAULT_ROPE
    check_rope(rope)
    all_ropes = sorted({*ROPES, rope})
    cache = cache if cache is not None else PosteriorCache(None)

    def seeds_of(method: str, on: list[Block]) -> dict[str, dict[int, float]]:
        # a block that holds its means only (no seed values) enters with its mean as one
        # seed: the model then sees the protocols' means, as the signed-rank test does
        return {b.name: {s: SCALE * v for s, v in b.values[method].items()}
                if b.values.get(method) else {0: SCALE * b.means[method]} for b in on}  # fmt: skip

    # a method some protocol lacks (one that cannot run on its data) is compared over the
    # protocols it ran on, at least 2: the model's pairs need no complete blocks
    ran = {m: [b for b in kept if m in b.means] for m in sorted({m for b in kept for m in b.means})}
    signed, posteriors, gaps = {}, {}, {}
    for m, on in ran.items():
        if m == reference or len(on) < 2:
            continue
        ours, theirs = (np.array([SCALE * b.means[r] for b in on]) for r in (reference, m))
        signed[m] = signed_rank_probs(ours, theirs, rope)
        gaps[m] = {b.name: float(t - o) for b, o, t in zip(on, ours, theirs, strict=True)}
        a, b = seeds_of(m, on), seeds_of(reference, on)
        posterior = cache.get(f"{label}: {m} vs {reference}", a, b, all_ropes,
                              lambda a=a, b=b: hierarchical.compare(a, b, all_ropes))  # fmt: skip
        if posterior is not None:
            posteriors[m] = posterior
            for protocol in posterior.left_out:
                _warn_once(f"{label}: {m} and {reference} share fewer than 2 seeds on "
                           f"{protocol}: that protocol is left out of their hierarchical "
                           "comparison; run more seeds of the two there")  # fmt: skip
    sensitivity = {r: {m: p.at(r) for m, p in posteriors.items()} for r in all_ropes}
    seeds = (min(b.seeds for b in kept), max(b.seeds for b in kept))
    return Across(label, [b.name for b in kept], seeds, reference, rope, sensitivity[rope],
                  sensitivity, signed, posteriors, gaps, missing_from(kept, shared))  # fmt: skip


def comparisons(blocks: list[Block], cache: PosteriorCache | None = None) -> list[Across]:
    """Over every protocol, then per setting (pretrained on real photos, from scratch) when
    the protocols hold both."""
    out = [across(main_blocks(blocks), ALL, cache)]
    out += [across(group, setting, cache) for setting, group in by_setting(blocks).items()]
    return [a for a in out if a is not None]
