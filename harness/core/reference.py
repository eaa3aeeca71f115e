"""The published numbers the harness compares against: protocols/reference/paper_results.yaml,
and the seed papers' claims a protocol can test: protocols/reference/claims.yaml.

A copy (as data) of the seed papers' reported results and the datasets' published counts.
Values are percentages; VehicleID's MAP, printed as a fraction in the HDC paper, is stored in
percent like every other metric.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import yaml

from harness.core.errors import HarnessError
from harness.core.paths import REFERENCE_FILE
from harness.core.registry import closest

CLAIMS_FILE = REFERENCE_FILE.parent / "claims.yaml"


@cache
def load_reference() -> dict[str, Any]:
    try:
        return yaml.safe_load(REFERENCE_FILE.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise HarnessError(f"cannot read the reference file {REFERENCE_FILE} ({exc})") from None


def dataset_counts(dataset: str) -> dict[str, Any]:
    """The published counts of `dataset` (per test set for VehicleID)."""
    counts = load_reference()["datasets"]
    if dataset not in counts:
        raise HarnessError(
            f"no published counts for {dataset!r}{closest(dataset, list(counts))}; "
            f"known: {', '.join(counts)}"
        )
    return counts[dataset]


def check_entry(reference: str, dataset: str) -> None:
    """Raise ValueError (a protocol error) unless reference -> dataset exists."""
    papers = {k: v for k, v in load_reference().items() if k != "datasets"}
    if reference not in papers:
        raise ValueError(
            f"paper.reference {reference!r} is not in {REFERENCE_FILE.name}"
            f"{closest(reference, list(papers))}; known: {', '.join(papers)}"
        )
    entries = [k for k in papers[reference] if k not in ("source", "protocol", "claims", "note")]
    if dataset not in entries:
        raise ValueError(
            f"paper.dataset {dataset!r} is not reported by {reference}"
            f"{closest(dataset, entries)}; known: {', '.join(entries)}"
        )


def paper_results(reference: str, dataset: str) -> tuple[str, dict[str, dict[str, float]]]:
    """(source line, method -> metric -> published value in percent)."""
    entry = load_reference()[reference]
    return entry.get("source", reference), entry[dataset]


@dataclass(frozen=True)
class Claim:
    """`better` retrieves better than `worse` (a row, or `row / part`: one part of a composite
    embedding; `row / *` in the file stands for each part)."""

    better: str
    worse: str
    who: str
    where: str
    numbers: tuple[str, str] | None = None  # (paper, dataset) in paper_results.yaml
    text: str | None = None  # the paper's words, for a claim without numbers


@cache
def load_claims() -> tuple[Claim, ...]:
    """The claims of protocols/reference/claims.yaml, in the file's order."""
    try:
        entries = yaml.safe_load(CLAIMS_FILE.read_text(encoding="utf-8"))["claims"]
        return tuple(_claim(entry) for entry in entries)
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise HarnessError(f"cannot read the claims file {CLAIMS_FILE} ({exc!r})") from None


def _claim(entry: dict[str, Any]) -> Claim:
    numbers = entry.get("numbers")
    return Claim(entry["better"], entry["worse"], entry["who"], entry["where"],
                 (numbers["paper"], numbers["dataset"]) if numbers else None,
                 entry.get("text"))  # fmt: skip
