"""Whether a method can run on a protocol's data at all. A method that needs coarse labels
(the quadruplet methods) cannot learn on a dataset that has none (caltech101, flowers). One
rule for every command: `run` records such a run `not_applicable` at once, `run --all-classes`
refuses it, and `tune` and `run --tuned` leave the method out, saying why, instead of running
trials that fail at their first batch or asking for a study that cannot exist.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from harness.core import METHODS, Protocol
from harness.data import prepare_data


def why_not_applicable(method: str, data: Any, dataset: str) -> str | None:
    """Why `method` cannot run on `data` (a LabelledImages of `dataset`), or None when it can."""
    if METHODS.get(method).needs_coarse_labels and not data.has_coarse:
        return f"{method} needs coarse labels; {dataset} has none"
    return None


def not_applicable_on(
    protocol: Protocol, methods: Iterable[str], data_root: str | None
) -> dict[str, str]:
    """The methods of `methods` that cannot run on the protocol's data, each with why. The
    data is read (its labels; no image is decoded and nothing is trained) only when one of
    them needs something a dataset may lack."""
    methods = list(methods)
    if not any(METHODS.get(m).needs_coarse_labels for m in methods):
        return {}
    data = prepare_data(protocol, data_root).data
    return {m: why for m in methods if (why := why_not_applicable(m, data, protocol.dataset.name))}
