"""`python -m harness data verify`: a dataset on disk against its published counts, or a
dataset you brought (`folder`, `csv`) against what a run needs.

For the papers' datasets it parses the official lists (the same code the loaders use),
compares the counts of classes and images per part with protocols/reference/paper_results.yaml,
and opens every image the lists name: missing files and files that do not decode (truncated,
corrupt) are reported by path. For `folder` and `csv` there is nothing published to count
against: it reports, one line each, missing and unreadable images, classes with fewer training
images than the sampler's K, and structural errors (a class in both parts, a missing column).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.core import HarnessError, dataset_counts
from harness.data import cars196, cub200, folder, inshop, own, sop, table, vehicleid
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


def _problem(path: str, own: bool = False) -> str | None:
    try:
        open_rgb(path, own)
    except HarnessError as exc:
        return str(exc)
    return None


def verify_own(
    dataset: str, root: Path, k: int, params: dict | None = None, decode: bool = True
) -> tuple[bool, str]:
    """(all good, report) for a `folder` or `csv` dataset: every problem on one line; `k` is
    the sampler's images per class; params are the protocol's dataset.params."""
    module = {"folder": folder, "csv": table}[dataset]
    lines = [f"{dataset} under {root}"]
    try:
        listing = module.listing(root, **(params or {}))
    except HarnessError as exc:
        return False, "\n".join([*lines, f"FAIL {exc}"])
    lines.append(listing.to_images().source)
    missing = set(own.missing_files(listing))
    unreadable: list[str] = []
    if decode:
        present = [f for f in listing.files if f not in missing]
        with ThreadPoolExecutor(DECODE_THREADS) as pool:
            problems = pool.map(lambda path: _problem(path, own=True), present)
            unreadable = [p for p in problems if p is not None]
    small = [f"class {c}: fewer than K={k} training images"
             for c in own.small_classes(listing, k)]  # fmt: skip
    lines += own.shown([f"missing {f}" for f in sorted(missing)], "missing")
    lines += own.shown([f"unreadable: {u}" for u in unreadable], "unreadable")
    lines += own.shown(small, "classes with fewer than K images")
    ok = not (missing or unreadable or small)
    lines.append("OK" if ok else "FAIL: fix the problems above before a run")
    return ok, "\n".join(lines)


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
