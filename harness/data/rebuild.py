"""`python -m harness data fetch NAME`: build a real-photo dataset from its public source.

The source is the GitHub repository's archive at the manifest's pinned commit
(harness.data.photo_sets). It is downloaded into the cache with a progress bar; an interrupted
download resumes where the server allows a range request and is retried otherwise. Only the
files the manifest lists are extracted. Each is checked against its `source_sha256`, derived
by its rule (`copy`, or `short_side_256_bicubic_q90`: the short side to 256 px, bicubic, JPEG
quality 90), and the result checked against `file_sha256`.

Another Pillow than the one the manifest was made with (13.0.0) may encode other bytes from
the same pixels: such a file is kept, and the difference recorded in the dataset's provenance
(the stamp beside the data, then every run made on it), so that its numbers are compared
statistically, as another processor's are. Files are written into a hidden folder beside the
data and moved into place only when all are built: a failure leaves nothing half-written.

`open_data` is what a dataset loader calls: the verified files, wherever they are, fetched
first when they are missing and fetching was asked for (`--fetch`, DML_HARNESS_FETCH=1).
"""

from __future__ import annotations

import hashlib
import http.client
import io
import logging
import os
import shutil
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

from harness.core import HarnessError, default_cache_dir
from harness.data.photo_sets import (
    FETCH_ENV,
    SETS,
    DataFiles,
    Row,
    find,
    manifest,
    verify,
    write_stamp,
)

log = logging.getLogger(__name__)

TIMEOUT_S = 60
TRIES = 4
PILLOW_OF_MANIFEST = "13.0.0"
GZIP, ZIP = b"\x1f\x8b", b"PK\x03\x04"


def derive(rule: str, data: bytes) -> bytes:
    """A dataset file's bytes from its source's bytes, by the manifest's rule."""
    if rule == "copy":
        return data
    if rule == "short_side_256_bicubic_q90":
        from PIL import Image

        with Image.open(io.BytesIO(data)) as im:
            w, h = im.size
            s = 256 / min(w, h)
            out = io.BytesIO()
            im.convert("RGB").resize((round(w * s), round(h * s)), Image.BICUBIC).save(
                out, "JPEG", quality=90
            )
        return out.getvalue()
    raise HarnessError(f"the manifest names an unknown rule {rule!r}; update the harness")


def download(url: str, target: Path, tries: int = TRIES) -> Path:
    """`url` to `target` through `<target>.part`: resumed by a range request when the server
    allows one, retried with a pause; HTML instead of an archive is refused in one line."""
    part = target.with_name(target.name + ".part")
    target.parent.mkdir(parents=True, exist_ok=True)
    last: Exception | None = None
    for attempt in range(tries):
        have = part.stat().st_size if part.is_file() else 0
        request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                if "html" in (response.headers.get("Content-Type") or "").lower():
                    part.unlink(missing_ok=True)
                    raise HarnessError(f"{url} returned a web page, not an archive: check the "
                                       "address, or download the archive by hand and pass "
                                       "--from FILE")  # fmt: skip
                if have and getattr(response, "status", 200) != 206:
                    have = 0  # no range support: start again
                length = response.headers.get("Content-Length")
                total = have + int(length) if length and length.isdigit() else None
                with open(part, "ab" if have else "wb") as out, tqdm(
                    total=total, initial=have, unit="B", unit_scale=True, desc=target.name,
                    disable=None, file=sys.stderr,
                ) as bar:  # fmt: skip
                    while chunk := response.read(1 << 20):
                        out.write(chunk)
                        bar.update(len(chunk))
                if total is not None and part.stat().st_size < total:
                    raise http.client.IncompleteRead(b"", total - part.stat().st_size)
            os.replace(part, target)
            return target
        except urllib.error.HTTPError as exc:
            if exc.code == 416 and have:  # the part file is already whole
                os.replace(part, target)
                return target
            last = exc
            if exc.code in (403, 404, 410):
                break
        except (urllib.error.URLError, OSError, http.client.HTTPException, TimeoutError) as exc:
            last = exc
        if attempt + 1 < tries:
            log.warning("download of %s stopped (%s); trying again", url, last)
            time.sleep(min(2**attempt, 10))
    reason = getattr(last, "reason", None) or last
    kept = f"; {part} is kept and the same command resumes it" if part.is_file() else ""
    raise HarnessError(f"could not download {url} ({reason}){kept}")


def members(archive: Path, wanted: set[str]) -> Iterator[tuple[str, bytes]]:
    """(source path, bytes) of each wanted file in a .tar.gz or .zip of the source repository;
    a GitHub archive's top folder (`<repo>-<commit>/`) is skipped over."""
    with open(archive, "rb") as f:
        magic = f.read(4)
    if magic[:2] == GZIP:
        with tarfile.open(archive, "r:gz") as tar:
            for info in tar:
                name = _wanted(info.name, wanted)
                if name and info.isfile():
                    yield name, tar.extractfile(info).read()  # type: ignore[union-attr]
    elif magic == ZIP:
        with zipfile.ZipFile(archive) as z:
            for name in z.namelist():
                found = _wanted(name, wanted)
                if found:
                    yield found, z.read(name)
    else:
        kind = "a web page" if magic.lstrip()[:1] == b"<" else "neither a .tar.gz nor a .zip"
        raise HarnessError(f"{archive} is {kind}: delete it and fetch again")


def _wanted(name: str, wanted: set[str]) -> str | None:
    if name in wanted:
        return name
    rest = name.split("/", 1)[-1]
    return rest if rest in wanted else None


def _writable(root: Path) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise HarnessError(f"cannot write to the data root {root} ({exc.strerror or exc}): pass "
                           "--data-root with a folder you can write to") from None  # fmt: skip


def build(name: str, rows: list[Row], source: Path, out: Path) -> dict[str, Any]:
    """Write each row's file under `out` from the source archive; returns the provenance:
    which derived files differ from the manifest's bytes (another Pillow). A source file that
    is missing or whose sha256 differs is a one-line HarnessError."""
    from PIL import __version__ as pillow

    by_source: dict[str, list[Row]] = {}
    for row in rows:
        by_source.setdefault(row.source_path, []).append(row)
    seen: set[str] = set()
    differing: dict[str, str] = {}
    bar = tqdm(total=len(by_source), unit="file", desc=f"{name}: building", disable=None,
               file=sys.stderr)  # fmt: skip
    with bar:
        for path, data in members(source, set(by_source)):
            found = hashlib.sha256(data).hexdigest()
            for row in by_source[path]:
                if found != row.source_sha256:
                    raise HarnessError(f"{name}: source file {path} in {source} has sha256 "
                                       f"{found[:16]}..., not {row.source_sha256[:16]}...: the "
                                       "archive is not the pinned commit's, or was altered; "
                                       "delete it and fetch again")  # fmt: skip
                made = derive(row.rule, data)
                digest = hashlib.sha256(made).hexdigest()
                if digest != row.file_sha256:
                    differing[row.file] = digest
                target = out / row.file
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(made)
            seen.add(path)
            bar.update(1)
    missing = sorted(set(by_source) - seen)
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise HarnessError(f"{name}: {source} lacks {len(missing)} source files "
                           f"({', '.join(missing[:3])}{more}): is it the archive of "
                           f"{SETS[name].repo} at {SETS[name].commit[:7]}?")  # fmt: skip
    if not differing:
        return {"exact": True}
    log.warning("%s: %d derived files differ from the published bytes (Pillow %s here, %s for "
                "the manifest): kept, and recorded so that runs on them compare statistically",
                name, len(differing), pillow, PILLOW_OF_MANIFEST)  # fmt: skip
    return {"exact": False, "pillow": pillow, "differing": differing}


def fetch(name: str, root: Path, source: str | None = None, force: bool = False) -> DataFiles:
    """Build dataset `name` into `root` (the folder that then holds its top-level folders)
    from `source` (a URL or a local archive; default the pinned GitHub archive), unless it is
    there and verifies. Prints the data's terms before a download."""
    spec, want = SETS[name], manifest(name)
    root = Path(root).expanduser()
    present = find(name, root)
    if present is not None and present.kind == "zip":
        return verify(name, present, "delete or move it, then run the same command again")
    if present is not None and not force:
        try:
            return verify(name, present, "")
        except HarnessError as exc:
            log.warning("%s; building it again", exc)
    _writable(root)
    local = Path(source).expanduser() if source and "://" not in source else None
    if local is None:
        url = source or spec.archive_url
        print(f"{name}: from {url} ({spec.size})\nterms: {spec.terms}", file=sys.stderr)
        cached = default_cache_dir() / "downloads" / f"{spec.repo.replace('/', '-')}-{spec.commit}"
        local = download(url, cached.with_suffix(".archive"))
    elif not local.is_file():
        raise HarnessError(f"--from {local}: no such file")
    staging = root / f".{name}.building-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        provenance = build(name, list(want.rows), local, staging)
        for top in want.tops:
            if (root / top).exists():
                shutil.rmtree(root / top)
            os.replace(staging / top, root / top)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    files = DataFiles(root, want.tops)
    write_stamp(name, files, {**provenance, "source": source or spec.archive_url})
    if local.parent == default_cache_dir() / "downloads":
        local.unlink(missing_ok=True)
    return verify(name, files, "fetch it again with --force")


def fetch_wanted() -> bool:
    """Whether a run may fetch missing data by itself (`--fetch`, or DML_HARNESS_FETCH=1)."""
    return os.environ.get(FETCH_ENV, "").strip().lower() in ("1", "true", "yes")


def open_data(name: str, data_root: Path | None) -> DataFiles:
    """The verified files of dataset `name`: under --data-root when given, else in the first
    default place that holds them; fetched into the user data folder when it is missing and
    fetching was asked for; otherwise a one-line error giving the command that fetches it."""
    spec = SETS[name]
    roots = [Path(data_root).expanduser()] if data_root is not None else [spec.shared_root,
                                                                          spec.user_root]  # fmt: skip
    for root in roots:
        files = find(name, root)
        if files is not None:
            fix = f"fetch it again with `{spec.fetch_command(data_root)}`"
            if files.kind == "zip":
                fix = f"delete {files.path}, then fetch it with `{spec.fetch_command(root)}`"
            try:
                return verify(name, files, fix)
            except BaseException:
                files.__exit__()
                raise
    if fetch_wanted():
        return verify(name, fetch(name, roots[-1]), "fetch it again with --force")
    tops = "/, ".join(manifest(name).tops)
    where = f"--data-root {roots[0]}" if data_root is not None else \
        f"{spec.shared_root} or {spec.user_root}"  # fmt: skip
    others = [o for o in SETS if o != name and any(find(o, r) for r in roots)]
    held = f"; it holds {others[0]}, not {name}" if others else ""
    raise HarnessError(f"{name} is not in {where} (neither {name}.zip nor its extracted {tops}/)"
                       f"{held}: fetch it from its source with `{spec.fetch_command(data_root)}`"
                       f" (a run or check does that by itself with --fetch)")  # fmt: skip
