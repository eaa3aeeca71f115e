"""User-facing errors: the CLI prints them as one line and exits with status 2."""

from __future__ import annotations

import sys
from pathlib import Path


class HarnessError(Exception):
    """A problem with the user's input or environment, explained in one line with how to fix it."""


class TrainingFailed(Exception):
    """The run cannot go on (non-finite loss, a miner that finds nothing, a model whose
    embeddings are not finite); the reason goes into its result file and a sweep goes on."""


def program_name() -> str:
    """How the user started the harness, for the commands that messages suggest: `dml-harness`
    (the installed console script) or `python -m harness` (a clone)."""
    return "dml-harness" if Path(sys.argv[0]).stem == "dml-harness" else "python -m harness"
