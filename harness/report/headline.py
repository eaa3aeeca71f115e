"""The README's opening verdict in three plain sentences, from the committed real-photo
results: who leads each dataset once every method is tuned, whether tuning shrank the gaps
(the Reality Check's finding), and what the datasets together can and cannot say. The README
quotes it word for word, and tests/test_docs_numbers.py checks that it does, so a new result
changes it or fails the tests. Its terms link to the pages that define them."""

from __future__ import annotations

from harness.records import RunResult
from harness.report.tuned_verdict import ProtocolVerdict, protocol_verdict
from harness.stats import PRETRAINED, protocol_blocks, rank_test

MAP_R = "[MAP@R](docs/metrics.md#retrieval-metrics)"
REALITY_CHECK = "[the Reality Check](https://arxiv.org/abs/2003.08505)"
AVERAGE_RANK = "[average rank](docs/verdicts.md#at-a-glance-the-figures)"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def headline(groups: dict[str, list[RunResult]]) -> str:
    """Three sentences (empty without a tuned real-photo protocol)."""
    verdicts = [v for name, g in sorted(groups.items()) if (v := protocol_verdict(name, g))]
    if not verdicts:
        return ""
    return " ".join([_leaders(verdicts), _gaps(verdicts), _together(groups, len(verdicts))])


def _leaders(verdicts: list[ProtocolVerdict]) -> str:
    by = {v.best: [w.name for w in verdicts if w.best == v.best] for v in verdicts}  # its datasets
    where = _and([f"{best}{' leads' if i == 0 else ''} on {_and(names)}"
                  for i, (best, names) in enumerate(by.items())])  # fmt: skip
    lead = (f"no loss is best everywhere: {where}" if len(by) > 1
            else f"{verdicts[0].best} leads on all {len(verdicts)}")  # fmt: skip
    return (f"On {len(verdicts)} real-photo datasets with an ImageNet-pretrained network, each "
            f"loss tuned with the same budget, {lead}.")  # fmt: skip


def _gaps(verdicts: list[ProtocolVerdict]) -> str:
    shrink = sum(v.gap_tuned < v.gap_default for v in verdicts)
    how = ("Tuning narrows the gaps, as " if shrink == len(verdicts)
           else f"Tuning narrows the gaps on only {shrink} of {len(verdicts)} datasets, "
           "against what ")  # fmt: skip
    tuned = _and([f"{v.gap_tuned:.1f}" for v in verdicts])
    default = _and([f"{v.gap_default:.1f}" for v in verdicts])
    names = _and([v.name for v in verdicts])
    return (f"{how}{REALITY_CHECK} found: the leader is {tuned} {MAP_R} points ahead of the "
            f"median loss on {names}, against {default} at the papers' defaults.")  # fmt: skip


def _together(groups: dict[str, list[RunResult]], n: int) -> str:
    runs = [r for g in groups.values() for r in g]
    test = rank_test([b for b in protocol_blocks(runs) if b.setting == PRETRAINED])
    if test is None:
        return ""
    k = len(test.ranks)
    told = len(test.resolved())
    pairs = k * (k - 1) // 2
    few = ("too few to name one best loss" if told == 0
           else "enough to order only those")  # fmt: skip
    count = "none" if told == 0 else f"{told}"
    return (f"By {AVERAGE_RANK} over the {len(test.blocks)} datasets, {count} of the {pairs} "
            f"pairs of methods can be told apart: each dataset's own ranking is sharp, but {n} "
            f"datasets are {few}.")  # fmt: skip
