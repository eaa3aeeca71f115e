"""Which machine made the check's runs, and whether their data is the published bytes: on the
baseline's own machine (same fingerprint, same data) training is deterministic and the check
is exact; anywhere else it compares statistically (harness/records/fingerprint.py says what
decides float rounding).
"""

from __future__ import annotations

import json
from typing import Any

from harness.core import HarnessError
from harness.records import RunResult


def run_fingerprint(runs: dict[str, list[RunResult]]) -> dict[str, Any]:
    """The one fingerprint all runs were made under (they share a process setup)."""
    found = {json.dumps(r.environment.fingerprint, sort_keys=True)
             for rs in runs.values() for r in rs if r.environment is not None}  # fmt: skip
    if len(found) != 1:
        prints = [json.loads(f) for f in found]
        differ = sorted({k for fp in prints for k in fp if fp.get(k) != prints[0].get(k)})
        raise HarnessError(
            f"the check's runs report {len(found)} machine fingerprints, not one (they differ "
            f"in {', '.join(differ)}); report this as a bug"
        )
    return json.loads(found.pop())


def rebuilt_data(runs: dict[str, list[RunResult]]) -> str:
    """Why the runs' data is not the published bytes ('' when it is): a real-photo dataset
    rebuilt with another Pillow compares statistically, as another processor's runs do."""
    for group in runs.values():
        for r in group:
            p = (r.dataset.provenance if r.dataset else None) or {}
            if p and not p.get("exact", True):
                return (f"data rebuilt with Pillow {p.get('pillow')}: {len(p.get('differing', {}))}"
                        " derived files differ from the published bytes")  # fmt: skip
    return ""
