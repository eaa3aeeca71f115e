"""User-facing errors: the CLI prints them as one line and exits with status 2."""

from __future__ import annotations


class HarnessError(Exception):
    """A problem with the user's input or environment, explained in one line with how to fix it."""


class TrainingFailed(Exception):
    """The run cannot go on (non-finite loss, a miner that finds nothing, a model whose
    embeddings are not finite); the reason goes into its result file and a sweep goes on."""
