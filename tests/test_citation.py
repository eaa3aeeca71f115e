"""The licence and the citation file: LICENSE is the MIT text that pyproject.toml declares,
and CITATION.cff is Citation File Format 1.2.0 with the package's own version and licence
(its required keys, and no identifier or address the project does not have)."""

from __future__ import annotations

from pathlib import Path

import tomllib
import yaml

import harness

REPO = Path(__file__).resolve().parent.parent

# CFF 1.2.0's schema: the required keys, and every top-level key it defines
REQUIRED = {"cff-version", "message", "title", "authors"}
KEYS = REQUIRED | {
    "abstract", "commit", "contact", "date-released", "doi", "identifiers", "keywords",
    "license", "license-url", "preferred-citation", "references", "repository",
    "repository-artifact", "repository-code", "type", "url", "version",
}  # fmt: skip


def test_the_licence_is_mit_as_pyproject_says():
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2026 the dml-harness contributors" in text
    assert 'THE SOFTWARE IS PROVIDED "AS IS"' in text
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "MIT"}


def test_the_citation_file_is_cff_1_2_0_of_this_version():
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text(encoding="utf-8"))
    assert cff["cff-version"] == "1.2.0"
    assert REQUIRED <= set(cff) <= KEYS, set(cff) - KEYS
    assert cff["type"] in ("software", "dataset")
    assert cff["authors"] and all(
        isinstance(a, dict) and ({"name"} <= set(a) or {"family-names"} <= set(a))
        for a in cff["authors"]
    )
    assert str(cff["version"]) == harness.__version__
    assert cff["license"] == "MIT"
    # no public DOI or address is known: none may be invented
    assert not {"doi", "identifiers", "url", "repository-code", "repository"} & set(cff)
