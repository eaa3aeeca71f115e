"""Which machines made a row's runs, so that a table or `compare` says where its tests pair
seeds made on two machine fingerprints. The rule itself (seeds pair whatever the machine) is
harness.core.pairing's; this module only names the machines."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from harness.records import RunResult, describe, row_names

RULE = "docs/verdicts.md#one-rule-for-runs-from-two-machines"


def row_machines(runs: Iterable[RunResult]) -> dict[str, frozenset[str]]:
    """Row name (as the tables name it) -> the machines its runs were made on, described."""
    runs = list(runs)
    names = row_names(runs)
    out: dict[str, set[str]] = {}
    for r in runs:
        out.setdefault(names[id(r)], set()).add(machine(r))
    return {name: frozenset(m) for name, m in out.items()}


def machine(run: RunResult) -> str:
    """The machine a run was made on, in one line (processor, ISA, threads, fingerprint id)."""
    return describe(run.environment.fingerprint if run.environment is not None else None)


def across_line(parts: Mapping[str, frozenset[str]]) -> str:
    """`made on more than one machine fingerprint (the tuned runs on X, the paper-default
    runs on Y): seed k pairs across them ...`, or "" where every part was made on one and
    the same machine."""
    if len({m for machines in parts.values() for m in machines}) < 2:
        return ""
    made = ", ".join(f"{what} on {'; '.join(sorted(m))}" for what, m in parts.items())
    return (f"made on more than one machine fingerprint ({made}): seed k pairs across them as "
            f"everywhere, since it fixes the initial weights and the batch order on any machine "
            f"({RULE})")  # fmt: skip


def tuned_machines_line(runs: Iterable[RunResult]) -> list[str]:
    """The tuned section's bullet when its tuned and paper-default runs come from different
    machine fingerprints (`tuning moved it` and every tuned-against-default test pair them)."""
    runs = list(runs)
    parts = {what: frozenset(machine(r) for r in runs if bool(r.tuning) == tuned)
             for what, tuned in (("the tuned runs", True), ("the paper-default runs", False))}  # fmt: skip
    line = across_line(parts)
    return [f"- **Machines:** the runs were {line}."] if line else []
