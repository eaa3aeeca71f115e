"""The real-photo datasets (cub100, cars196_mini, grocery_store_mini, plankton) as their files, not
their container.

Each dataset's identity is a manifest shipped in the package (`manifests/<name>.manifest.csv.gz`,
the rows of the dataset's `<name>.sources.csv.gz` sorted by file, its columns reordered):
every file's path in the dataset, its source in a public GitHub repository at a pinned commit,
the rule that derives it from the source and the sha256 of the result. The published zips
also hold a labels table their builder wrote (`<name>/manifest.csv`): accepted beside the
dataset's files, never required, never read (`PhotoSet.beside`).

The data is accepted by content wherever it is: the published zip, any zip of the same files
(for example one made with `zip -r`), or the extracted folder. Verifying hashes every file
once and records the result in a stamp beside the data (in the cache when the data's folder
is read-only), keyed by the files' sizes and modification times, so later runs do not hash
again. A missing, extra or altered file is named in one line.

Where the data is looked for, in order: --data-root when given; else `../shared/data/<name>`
beside the clone, then `<user data dir>/<name>` (harness.core.default_data_dir), where
`python -m harness data fetch <name>` (harness.data.rebuild) builds it from its source.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import os
import zipfile
import zlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from harness.core import (
    HarnessError,
    default_cache_dir,
    default_data_dir,
    file_sha256,
    program_name,
)
from harness.core.paths import PROTOCOL_DIR

MANIFESTS = Path(__file__).resolve().parent / "manifests"
FETCH_ENV = "DML_HARNESS_FETCH"  # "1": a run or check fetches missing data by itself
STAMP_FORMAT = 1


@dataclass(frozen=True)
class PhotoSet:
    """One dataset: its name, its published zip's sha256 (a fast path), where it comes from
    and under which terms."""

    name: str
    zip_sha256: str  # "" where no zip of the set was ever published
    repo: str  # owner/name on GitHub
    commit: str
    terms: str
    size: str  # what a user downloads and keeps
    beside: tuple[str, ...] = ()  # files a published zip holds beyond the dataset's: accepted
    domain: str = ""  # what its photos show, in a few words (the leaderboard's datasets table)

    @property
    def archive_url(self) -> str:
        return f"https://codeload.github.com/{self.repo}/tar.gz/{self.commit}"

    @property
    def shared_root(self) -> Path:
        # the clone's sibling shared/data/<name> (PROTOCOL_DIR is <clone>/protocols)
        return PROTOCOL_DIR.parent.parent / "shared" / "data" / self.name

    @property
    def user_root(self) -> Path:
        return default_data_dir() / self.name

    def fetch_command(self, data_root: Path | None = None) -> str:
        root = f" --data-root {data_root}" if data_root is not None else ""
        return f"{program_name()} data fetch {self.name}{root}"


SETS = {
    s.name: s
    for s in (
        PhotoSet("cub100", "483798f945ad93a5be92ef60ee4369440e1352dcb1e0e7775f6ecd22bfa5b297",
                 "serizba/vision", "16a8a47ea88abb31d9b61b81dbbe09347bf72385",
                 "CUB-200-2011's: research and non-commercial use only (Wah et al., 2011)",
                 "the repository's whole archive is downloaded; 57 MB kept",
                 domain="bird species, cropped (fine-grained)"),
        PhotoSet("cars196_mini", "2999500f41527c86a780bf9622013e0fbbdfb530e1d2c299cd4819dbe7782c0b",
                 "fmejbah/car_dataset1", "2ac6920297f51277ac4e24afd231c46d35077831",
                 "Stanford Cars' (Krause et al., 2013): no licence was published; treat as "
                 "non-commercial research use only, images owned by their copyright holders",
                 "the repository's whole archive (about 160 MB with the groceries'); 72 MB kept",
                 ("cars196_mini/manifest.csv",), "car models, cropped (fine-grained)"),
        PhotoSet("grocery_store_mini", "679f15ca4daa8b2bbd7733bedd5290e8982fab3b6c80a9261f4842b279adba75",
                 "marcusklasson/GroceryStoreDataset", "fc80ba90f803d79d0383df52c5a4ac5de99ff6fc",
                 "MIT (Klasson et al., WACV 2019): keep the copyright notice and licence",
                 "the repository's whole archive (about 160 MB with the cars'); 73 MB kept",
                 ("grocery_store_mini/manifest.csv",), "grocery products on shelves"),
        PhotoSet("plankton", "", "Jaime-Rangel/Alexnet_Matlab",
                 "e0eff0e96e4528ff820af06b8d42c812f57253b2",
                 "PlanktonSet 1.0's (Cowen, Sponaugle, Robinson, Luo 2015; NOAA NCEI accession "
                 "0127422): the repository states no licence; cite the dataset, research use",
                 "the repository's whole archive (about 30 MB); 7 MB kept",
                 domain="plankton, greyscale underwater microscopy (far from ImageNet)"),
        PhotoSet("pollen", "", "jaylebakken/Applied_Computational_Homology_On_Organic_Objects_JayL_BenC",
                 "36a9c319937614f589abc4414864855dc043d6b1",
                 "POLLEN73S's (Astolfi et al., Ecological Informatics 60, 2020): the repository "
                 "states no licence; cite the dataset, research use",
                 "the repository's whole archive (about 420 MB); 38 MB kept",
                 domain="pollen grains under a microscope"),
        PhotoSet("caltech101", "", "MachineLearning2020/Homework2-Caltech101",
                 "836044dd000296b2bb74d0aa4b4e462e459b01d7",
                 "Caltech-101's (Fei-Fei, Fergus, Perona 2004): the repository states no "
                 "licence; cite the dataset, research use, images owned by their copyright "
                 "holders",
                 "the repository's whole archive (about 150 MB); 62 MB kept",
                 domain="everyday objects (close to ImageNet)"),
        PhotoSet("flowers", "", "Shmaltalk/colorization-tf",
                 "de236b5728bdff6c78b3d65ca472fd72a2e67a04",
                 "Oxford Flowers-102's (Nilsback & Zisserman, ICVGIP 2008): neither repository "
                 "states a licence; cite the dataset, research use",
                 "the repository's whole archive (about 13 MB); 17 MB kept",
                 domain="flower species at 64 px (fine-grained)"),
    )
}  # fmt: skip


@dataclass(frozen=True)
class Row:
    """One file of a dataset: where it comes from and what its bytes must be."""

    file: str
    source_path: str
    source_sha256: str
    rule: str
    file_sha256: str


@dataclass(frozen=True)
class Manifest:
    """Every file of one dataset, each derived from its source."""

    name: str
    rows: tuple[Row, ...]

    @property
    def expected(self) -> dict[str, str]:
        """file -> sha256, for every file of the dataset."""
        return {r.file: r.file_sha256 for r in self.rows}

    @property
    def tops(self) -> tuple[str, ...]:
        """The top-level folders that hold the dataset's files."""
        return tuple(sorted({f.split("/", 1)[0] for f in self.expected}))

    @property
    def sha256(self) -> str:
        """The manifest's identity: the sha256 of its sorted `sha256  file` lines."""
        lines = "".join(f"{s}  {f}\n" for f, s in sorted(self.expected.items()))
        return hashlib.sha256(lines.encode()).hexdigest()


@cache
def manifest(name: str) -> Manifest:
    """The shipped manifest of dataset `name`."""
    if name not in SETS:
        raise HarnessError(f"no shipped manifest for {name!r}; known: {', '.join(SETS)}")
    with gzip.open(MANIFESTS / f"{name}.manifest.csv.gz", "rt", encoding="utf-8") as f:
        rows = tuple(Row(**r) for r in csv.DictReader(f))
    return Manifest(name, rows)


class DataFiles:
    """A dataset's files by their path in the dataset, read from a zip or a folder."""

    def __init__(self, path: Path, tops: tuple[str, ...]) -> None:
        self.path = path  # the zip, or the folder holding the top-level folders
        self.kind = "zip" if path.is_file() else "folder"
        self.tops = tops
        try:
            self._zip = zipfile.ZipFile(path) if self.kind == "zip" else None
        except (zipfile.BadZipFile, OSError) as exc:
            raise HarnessError(
                f"{path} is not a readable zip ({exc}): truncated, or another "
                "kind of file; delete it, or fetch the dataset again"
            ) from None
        self.provenance: dict[str, Any] = {"exact": True}

    def __enter__(self) -> DataFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._zip is not None:
            self._zip.close()

    def names(self) -> list[str]:
        """Every file (not folder) the dataset's container holds, sorted."""
        if self._zip is not None:
            return sorted(n for n in self._zip.namelist() if not n.endswith("/"))
        found = []
        for top in self.tops:
            for folder, _dirs, files in os.walk(self.path / top):
                rel = Path(folder).relative_to(self.path).as_posix()
                found += [f"{rel}/{f}" for f in files]
        return sorted(found)

    def read(self, name: str) -> bytes:
        """One file's bytes; KeyError when the container has no such file, a one-line
        HarnessError naming the file when the zip's copy of it is damaged."""
        if self._zip is not None:
            try:
                return self._zip.read(name)
            except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
                raise HarnessError(f"{self.path}: {name} is damaged ({exc}); delete the zip "
                                   "and fetch the dataset again (`data fetch NAME`)") from None  # fmt: skip
        try:
            return (self.path / name).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            raise KeyError(name) from None

    def state(self) -> str:
        """What a stamp is keyed by: the zip's, or every file's, size and modification time."""
        paths = [self.path] if self._zip is not None else [self.path / n for n in self.names()]
        text = "".join(f"{p.relative_to(self.path.parent)} {p.stat().st_size} "
                       f"{p.stat().st_mtime_ns}\n" for p in paths)  # fmt: skip
        return hashlib.sha256(text.encode()).hexdigest()


def _stamp_paths(name: str, files: DataFiles) -> list[Path]:
    """Beside the data, unless its folder is marked read-only (no write bit: even root, who
    could write there, leaves it alone), then in the cache, keyed by the data's path."""
    beside = files.path.parent if files.kind == "zip" else files.path
    key = hashlib.sha256(str(files.path.resolve()).encode()).hexdigest()[:16]
    cached = default_cache_dir() / "verified" / f"{name}-{key}.json"
    try:
        read_only = not beside.stat().st_mode & 0o222
    except OSError:
        read_only = True
    return [cached] if read_only else [beside / f".{name}.verified.json", cached]


def read_stamp(name: str, files: DataFiles) -> dict[str, Any] | None:
    """The stamp beside the data (or in the cache), when one names this dataset's manifest."""
    for path in _stamp_paths(name, files):
        try:
            stamp = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if stamp.get("dataset") == name and stamp.get("format") == STAMP_FORMAT:
            return stamp
    return None


def write_stamp(name: str, files: DataFiles, provenance: dict[str, Any]) -> None:
    """Record a verification beside the data, or in the cache when that folder is read-only."""
    stamp = {"format": STAMP_FORMAT, "dataset": name, "manifest_sha256": manifest(name).sha256,
             "container": files.kind, "state": files.state(), "provenance": provenance}  # fmt: skip
    for path in _stamp_paths(name, files):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(stamp, indent=1, sort_keys=True) + "\n")
            os.replace(tmp, path)
            return
        except OSError:
            continue


def _listed(paths: list[str], what: str) -> str:
    more = f" and {len(paths) - 3} more" if len(paths) > 3 else ""
    return f"{len(paths)} {what} ({', '.join(paths[:3])}{more})"


def _other_dataset(names: set[str], name: str) -> str:
    """`; it holds <other>'s files` when the container holds another dataset's files."""
    for other in SETS:
        if other != name and names & set(manifest(other).expected):
            return f"; it holds {other}'s files, not {name}'s"
    return ""


def verify(name: str, files: DataFiles, how_to_fix: str) -> DataFiles:
    """The container's files against the manifest (once: a matching stamp skips the hashing);
    sets `files.provenance`. A missing, extra or altered file is one HarnessError line."""
    want = manifest(name)
    stamp = read_stamp(name, files)
    if stamp and stamp["manifest_sha256"] == want.sha256 and stamp["state"] == files.state():
        files.provenance = stamp["provenance"]
        return files
    provenance = (stamp or {}).get("provenance", {"exact": True})
    differs = provenance.get("differing", {})  # files derived by another Pillow: their sha256
    expected = want.expected
    published = (
        files.kind == "zip"
        and bool(SETS[name].zip_sha256)
        and file_sha256(files.path) == SETS[name].zip_sha256
    )
    names = files.names()
    missing = sorted(set(expected) - set(names))
    extra = sorted(set(names) - set(expected) - set(SETS[name].beside))
    altered = [] if published else [
        n for n in sorted(set(names) & set(expected))
        if _sha256_of(files, n) not in (expected[n], differs.get(n))
    ]  # fmt: skip
    if missing or extra or altered:
        parts = [_listed(p, w) for p, w in ((missing, "missing"), (extra, "extra"),
                                            (altered, "altered")) if p]  # fmt: skip
        raise HarnessError(f"{name}: {files.path} is not the dataset: {'; '.join(parts)} "
                           f"against its {len(expected)} files{_other_dataset(set(names), name)}; "
                           f"{how_to_fix}")  # fmt: skip
    if not differs:
        provenance = {"exact": True}
    write_stamp(name, files, provenance)
    files.provenance = provenance
    return files


def _sha256_of(files: DataFiles, name: str) -> str | None:
    """A file's sha256, or None when it cannot be read (a damaged zip member: altered)."""
    try:
        return hashlib.sha256(files.read(name)).hexdigest()
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError):
        return None


def find(name: str, root: Path) -> DataFiles | None:
    """The dataset's zip (`<name>.zip`) or extracted folder under `root`, unverified."""
    tops = manifest(name).tops
    if (root / f"{name}.zip").is_file():
        return DataFiles(root / f"{name}.zip", tops)
    if tops and all((root / t).is_dir() for t in tops):
        return DataFiles(root, tops)
    return None


def describe(files: DataFiles) -> str:
    """How the data differs from the published files, for a run's source line ('' if not)."""
    p = files.provenance
    if p.get("exact", True):
        return ""
    return (f"; {len(p.get('differing', {}))} derived files differ from the published bytes "
            f"(Pillow {p.get('pillow')}): compare numbers statistically")  # fmt: skip
