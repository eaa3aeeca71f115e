"""Shared fixtures: a per-session data cache, so tests never touch the user's cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OMNIGLOT_DIR = REPO.parent / "shared" / "data" / "omniglot"


@pytest.fixture(scope="session", autouse=True)
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("cache")
    os.environ["DML_HARNESS_CACHE"] = str(cache)
    return cache
