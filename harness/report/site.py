"""The HTML report's folder as it is built: the runs it shows, the temporary folder it is
written in (moved into place at the end, so that a report is never half written), its
figures (PNG under `assets/`, palette-quantised without metadata: the same results give the
same bytes), the page of each run folder and protocol section, and how a link in the
leaderboard's markdown becomes a link of the report.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core import HarnessError
from harness.records import RunResult, row_names, zero_shot_row
from harness.report.glance import safe_name
from harness.report.markup import GENERATOR
from harness.report.verdicts import zero_shot_label

ASSETS = "assets"
PALETTE_COLOURS = 96  # plots have few colours: a palette PNG is a quarter of the RGBA one


@dataclass
class Run:
    """One result file of the report and its record."""

    path: Path
    result: RunResult

    @property
    def protocol_folder(self) -> str:
        return self.path.parent.parent.name

    @property
    def run_folder(self) -> str:
        return self.path.parent.name


@dataclass
class Build:
    """The folder being written and what the pages share."""

    results_dir: Path
    out: Path  # the report's final folder (relative links to the results are made from it)
    tmp: Path  # where it is built, moved to `out` at the end
    copied: dict[Path, str] = field(default_factory=dict)

    def asset(self, name: str) -> Path:
        """Where an asset of that name is written in the folder being built (its folder made)."""
        path = self.tmp / ASSETS / name
        path.parent.mkdir(parents=True, exist_ok=True)
        return path


def quantise(png: Path) -> Path:
    """Rewrite a PNG as a palette image without metadata (no Software, no dates): smaller, and
    the same bytes for the same figure."""
    from PIL import Image

    with Image.open(png) as image:
        rgb = image.convert("RGB")
    small = rgb.quantize(colors=PALETTE_COLOURS, dither=Image.Dither.NONE)
    small.save(png, format="PNG", optimize=True)
    return png


# ----------------------------------------------------------------------------- pages


def group_id(key: tuple[str, int, str, Any]) -> str:
    """The HTML id of a protocol group's section (name, version, hash, shortened budget)."""
    name, version, hash_, max_steps = key
    steps = f"-steps{max_steps}" if max_steps is not None else ""
    return f"protocol-{safe_name(name)}-v{version}-{hash_}{steps}"


def page_path(run: Run) -> str:
    """A run folder's page, relative to the report's folder."""
    return f"{safe_name(run.protocol_folder)}/{safe_name(run.run_folder)}.html"


def resolver(build: Build, depth: int) -> Callable[[str], str | None]:
    """Links in the leaderboard's markdown are relative to the results folder: a PNG there
    is copied into assets/ (quantised), another file there is linked where it lies, a file
    that is not there becomes text; web addresses and anchors are kept."""
    up = "../" * depth

    def link(href: str) -> str | None:
        if re.match(r"^[a-z]+:", href) or href.startswith("#"):
            return href
        if href.startswith(f"{ASSETS}/"):  # drawn for the report itself
            return up + href
        source = (build.results_dir / href).resolve()
        if not source.is_file():
            return None
        if source.suffix.lower() == ".png":
            if source not in build.copied:
                name = "copied/" + safe_name(Path(href).as_posix().replace("/", "__"))
                shutil.copyfile(source, build.asset(name))
                quantise(build.asset(name))
                build.copied[source] = f"{ASSETS}/{name}"
            return up + build.copied[source]
        return up + Path(os.path.relpath(source, build.out.resolve())).as_posix()

    return link


def shown_names(group: list[RunResult]) -> dict[int, str]:
    """Each run's row as the leaderboard's main table names it (row_names, with the zero-shot
    row of a pretrained protocol labelled so)."""
    names, zero = row_names(group), zero_shot_row(group)
    return {key: zero_shot_label(name) if name == zero else name for key, name in names.items()}


def prepare(out: Path) -> Path:
    """The temporary folder to build in, beside `out`; refuses an `out` that holds files
    other than a report's."""
    if out.exists():
        index = out / "index.html"
        ours = index.is_file() and GENERATOR in index.read_text(encoding="utf-8", errors="replace")
        if not out.is_dir() or (any(out.iterdir()) and not ours):
            raise HarnessError(f"--out {out} exists and is not a report this command wrote; "
                               "pass a new or empty folder")  # fmt: skip
    tmp = out.parent / f".{out.name}.building"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp
