"""`python -m harness data verify`: a dataset on disk against its published counts.

Parses the official lists (the same code the loaders use), compares the counts of classes and
images per part with protocols/reference/paper_results.yaml, and opens every image the lists
name: missing files and files that do not decode (truncated, corrupt) are reported by path.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.core import HarnessError, dataset_counts
from harness.data import cars196, cub200, inshop, sop, vehicleid
from harness.data.lazy import DECODE_THREADS, open_rgb
from harness.data.official import Listing

log = logging.getLogger(__name__)

MODULES = {"cub200": cub200, "cars196": cars196, "sop": sop, "inshop": inshop,
           "vehicleid": vehicleid}  # fmt: skip
SHOWN = 20  # missing or unreadable files listed by name; the rest are counted


def _listings(dataset: str, root: Path) -> dict[str, Listing]:
    """One listing per variant: VehicleID's three test sets, one for every other dataset."""
    module = MODULES[dataset]
    if dataset == "vehicleid":
        return {size: module.listing(root, size) for size in module.TEST_SETS}
    return {"": module.listing(root)}


def _problem(path: str) -> str | None:
    try:
        open_rgb(path)
    except HarnessError as exc:
        return str(exc)
    return None


def verify(dataset: str, root: Path, decode: bool = True) -> tuple[bool, str]:
    """(all good, report). decode=False only checks that every file exists."""
    if dataset not in MODULES:
        raise HarnessError(f"data verify knows {', '.join(MODULES)}, not {dataset!r}")
    lines = [f"{dataset} under {root}"]
    ok = True
    try:
        listings = _listings(dataset, root)
    except HarnessError as exc:
        return False, "\n".join([*lines, f"FAIL {exc}"])
    published = dataset_counts(dataset)
    for variant, listing in listings.items():
        expected = published[variant] if variant else published
        found = listing.counts()
        lines.append(f"counts{f' (test set {variant})' if variant else ''}:")
        for key, value in expected.items():
            got = found.get(key)
            good = got == value
            ok &= good
            lines.append(
                f"  {'ok  ' if good else 'FAIL'} {key:<16} {got!s:>8}  (published {value})"
            )
    files = sorted({f for listing in listings.values() for f in listing.files})
    missing = [f for f in files if not Path(f).is_file()]
    unreadable: list[str] = []
    if decode:
        present = [f for f in files if f not in set(missing)]
        log.info("decoding %d images with %d threads ...", len(present), DECODE_THREADS)
        with ThreadPoolExecutor(DECODE_THREADS) as pool:
            unreadable = [p for p in pool.map(_problem, present) if p is not None]
    lines.append(
        f"files: {len(files)} listed, {len(missing)} missing"
        + (f", {len(unreadable)} unreadable" if decode else " (not decoded: --quick)")
    )
    for path in missing[:SHOWN]:
        lines.append(f"  missing {path}")
    if len(missing) > SHOWN:
        lines.append(f"  ... and {len(missing) - SHOWN} more missing")
    for problem in unreadable[:SHOWN]:
        lines.append(f"  unreadable: {problem}")
    if len(unreadable) > SHOWN:
        lines.append(f"  ... and {len(unreadable) - SHOWN} more unreadable")
    ok = ok and not missing and not unreadable
    lines.append("OK" if ok else "FAIL: the dataset does not match the published one")
    return ok, "\n".join(lines)
