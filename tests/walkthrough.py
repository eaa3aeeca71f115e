"""Run a documentation page's walk-through exactly as written.

A page's fenced ```bash blocks are its commands (one per line; `\\` continues a line; `#`
comments and blank lines are skipped) and its titled blocks (```yaml, ```python or ```toml
with `title="NAME"`) are files the reader writes. `run_page` writes those files into a
folder, runs the commands (all, or one section's) there in order with this interpreter for
`python` (the repository on PYTHONPATH, so `python -m harness` works from any folder), and
returns each command's outcome; the caller asserts what the page promises. Untitled blocks
in other languages (```text) are shown, not run.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```\s*$", re.M | re.S)
TITLE = re.compile(r'title="([^"]+)"')


@dataclass(frozen=True)
class Block:
    """One fenced code block: its language, its title (a file name) or "", its text."""

    language: str
    title: str
    text: str


def blocks(page: Path, section: str | None = None) -> list[Block]:
    """Every fenced code block of a markdown page, in order; with `section`, only those under
    the `## <section>` heading (up to the next `## `)."""
    page_text = page.read_text()
    if section is not None:
        start = page_text.index(f"\n## {section}\n")
        end = page_text.find("\n## ", start + 1)
        page_text = page_text[start : end if end > 0 else len(page_text)]
    out = []
    for language, info, text in FENCE.findall(page_text):
        title = TITLE.search(info)
        out.append(Block(language, title.group(1) if title else "", text))
    return out


def files(page: Path) -> dict[str, str]:
    """The files the page has the reader write: titled blocks (yaml, python, toml), name ->
    text."""
    return {b.title: b.text for b in blocks(page) if b.language != "bash" and b.title}


def commands(page: Path, section: str | None = None) -> list[str]:
    """The page's shell commands, one per logical line of its bash blocks (of one section)."""
    out = []
    for block in blocks(page, section):
        if block.language != "bash":
            continue
        text = block.text.replace("\\\n", " ")
        out += [line.strip() for line in text.splitlines()
                if line.strip() and not line.strip().startswith("#")]  # fmt: skip
    return out


def run_page(
    page: Path, folder: Path, timeout: float = 300, section: str | None = None
) -> list[subprocess.CompletedProcess]:
    """Write the page's files into `folder`, then run its commands (of one section) there, in
    order; a command's `python` is this interpreter. Stops at the first command that fails."""
    for name, text in files(page).items():
        (folder / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
           os.environ.get("PYTHONPATH")]))}  # fmt: skip
    results = []
    for command in commands(page, section):
        argv = shlex.split(command)
        if argv[0] == "python":
            argv[0] = sys.executable
        done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
        results.append(done)
        if done.returncode != 0:
            break
    return results
