"""The blocks of the comparisons over protocols (Demšar's data sets), read from result records:
each full-budget protocol with each row's mean main metric over its finished seeds and the
seeds' values (a protocol with `+tuned` runs enters with its tuned ranking, as the tuned
table gives it). Protocols belong to two settings by their backbone's starting weights, from
scratch or pretrained on real photos; each setting is also compared on its own.
"""

from __future__ import annotations

import math

from harness.records import (
    RunResult,
    main_metric,
    per_seed,
    pretrained,
    protocol_groups,
    tuned_values,
)
from harness.stats.bayes import protocol_rope
from harness.stats.ranks import Block

TUNED_BLOCK = " (tuned)"

# the two settings a protocol belongs to, by its backbone's starting weights
SCRATCH, PRETRAINED = "from scratch", "pretrained on real photos"
# once a real-photo protocol has tuned runs, its setting is compared tuned (PRETRAINED) and,
# beside it, every real-photo protocol at the papers' defaults: the Reality Check's question
PRETRAINED_DEFAULT = "pretrained on real photos, at the papers' defaults"


def _mean(values: dict[int, float]) -> float:
    return sum(values.values()) / len(values) if values else math.nan


def protocol_blocks(runs: list[RunResult]) -> list[Block]:
    """Every full-budget protocol (runs of several versions: one block per version, named as
    the agreement table names them) with its rows' means, oldest protocol first; a protocol
    with tuned runs enters with its tuned ranking. When a real-photo protocol is tuned, every
    real-photo protocol also enters at the papers' defaults, under PRETRAINED_DEFAULT (which
    `main_blocks` leaves out of the comparison over every protocol), and a real-photo protocol
    not tuned yet enters there alone: the tuned comparison holds only tuned protocols, so a
    protocol landed at its defaults first never mixes untuned numbers into it."""

    blocks, defaults, waiting = [], [], []
    for name, group in protocol_groups(runs, tuned=True).items():
        metric = main_metric(group)
        setting = PRETRAINED if pretrained(group) else SCRATCH
        untuned = per_seed([r for r in group if not r.tuning], metric)
        if any(r.tuning for r in group):
            _, values, _ = tuned_values(group, metric)
            blocks.append(_block(name + TUNED_BLOCK, metric, values, group, setting))
        elif setting == PRETRAINED:  # in the tuned comparison only while none is tuned
            waiting.append(_block(name, metric, untuned, group, setting))
        else:  # as the agreement table ranks them
            blocks.append(_block(name, metric, untuned, group, setting))
        if setting == PRETRAINED:
            defaults.append(_block(name, metric, untuned, group, PRETRAINED_DEFAULT))
    tuned_photos = any(b.setting == PRETRAINED for b in blocks)
    blocks += defaults if tuned_photos else waiting
    return sorted(blocks, key=lambda b: (b.started, b.name))


def _block(name: str, metric: str, values: dict[str, dict[int, float]], group: list[RunResult],
           setting: str) -> Block:  # fmt: skip
    started = min(r.started_at or r.finished_at or "" for r in group)
    means = {row: _mean(v) for row, v in values.items() if v}
    rope = protocol_rope(group[0].protocol.content)
    seeds = max((len(v) for v in values.values()), default=0)
    kept = {row: dict(v) for row, v in values.items() if v}
    return Block(name, metric, means, started, setting, rope, seeds, kept)


def main_blocks(blocks: list[Block]) -> list[Block]:
    """The blocks of the comparison over every protocol: one per protocol (tuned where it
    is), the real-photo protocols' paper-default twins left out; a real-photo protocol not
    tuned yet enters with its paper-default block, its only one."""
    tuned = {b.name.removesuffix(TUNED_BLOCK) for b in blocks if b.name.endswith(TUNED_BLOCK)}
    return [b for b in blocks if b.setting != PRETRAINED_DEFAULT or b.name not in tuned]


def by_setting(blocks: list[Block]) -> dict[str, list[Block]]:
    """The blocks of each setting (pretrained on real photos first, then at the papers'
    defaults when it is tuned), when both settings have some."""
    out = {s: [b for b in blocks if b.setting == s] for s in (PRETRAINED, SCRATCH)}
    if not all(out.values()):
        return {}
    twins = [b for b in blocks if b.setting == PRETRAINED_DEFAULT]
    return {PRETRAINED: out[PRETRAINED], **({PRETRAINED_DEFAULT: twins} if twins else {}),
            SCRATCH: out[SCRATCH]}  # fmt: skip
