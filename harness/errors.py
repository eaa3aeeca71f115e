"""User-facing errors: the CLI prints them as one line and exits with status 2."""

from __future__ import annotations


class HarnessError(Exception):
    """A problem with the user's input or environment, explained in one line with how to fix it."""
