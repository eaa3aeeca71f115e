"""`python -m harness data download`: fetch a dataset where a stable public URL exists.

Only CUB-200-2011 has one (CaltechDATA). The others need a form, a login or an e-mail to
their authors (NO_DOWNLOAD says which); the command says so instead of guessing a mirror.
The network call is `fetch` alone, so tests replace it.
"""

from __future__ import annotations

import logging
import os
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from harness.core import HarnessError
from harness.data import cub200

log = logging.getLogger(__name__)

TIMEOUT_S = 60
# dataset -> (url, archive file name)
DOWNLOADS = {"cub200": (cub200.URL, "CUB_200_2011.tgz")}
NO_DOWNLOAD = {
    "cars196": "Stanford Cars: the original ai.stanford.edu download is gone; get cars_annos.mat "
    "and car_ims.tgz (or the devkit with cars_test_annos_withlabels.mat) from a mirror you trust",
    "sop": "Stanford Online Products: Stanford_Online_Products.zip from the authors' page "
    "(cvgl.stanford.edu/projects/lifted_struct); it is not reliably reachable by script",
    "inshop": "DeepFashion In-shop: the authors' page (mmlab.ie.cuhk.edu.hk/projects/DeepFashion"
    "/InShopRetrieval.html) links Google Drive files behind an agreement",
    "vehicleid": "PKU VehicleID: ask the authors (pkuml.org/resources/pku-vehicleid.html) under "
    "their license agreement",
}


def fetch(url: str, target: Path) -> None:
    """Download `url` to `target` (a temporary file, then a rename): the only network call."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)


def download(dataset: str, root: Path) -> Path:
    """Fetch and extract `dataset` into `root`; returns the archive's path."""
    if dataset not in DOWNLOADS:
        why = NO_DOWNLOAD.get(dataset, f"no dataset {dataset!r}")
        raise HarnessError(f"{dataset} has no stable public download: {why}")
    url, name = DOWNLOADS[dataset]
    archive = root / name
    if not archive.is_file():
        log.info("downloading %s to %s", url, archive)
        try:
            fetch(url, archive)
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise HarnessError(
                f"could not download {url} ({reason}); check the network, or download it by "
                f"hand into {root}"
            ) from None
    try:
        with tarfile.open(archive) as tar:
            log.info("extracting %s", archive)
            if hasattr(tarfile, "data_filter"):
                tar.extractall(root, filter="data")
            else:  # pragma: no cover - Python < 3.10.12
                for member in tar.getmembers():
                    if member.name.startswith("/") or ".." in Path(member.name).parts:
                        raise HarnessError(f"{archive}: unsafe member path {member.name}")
                tar.extractall(root)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise HarnessError(
            f"{archive} is not a readable archive ({exc}); delete it and download again"
        ) from None
    return archive
