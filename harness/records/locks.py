"""The run lock: one lock file per run next to its result, so that two sweeps sharing a
results folder (or two machines sharing it over a network file system) never run the same
run at once, and a lock whose owner was killed (kill -9) does not block the run for ever."""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)


@contextmanager
def run_lock(path: Path) -> Iterator[bool]:
    """An exclusive lock file next to the result: yields False if another process holds it,
    so two sweeps sharing a results folder never run (or write) the same run at once.

    The lock file appears with its content (pid, host, a random token) in one step: it is
    written to a temporary file and hard-linked into place, which fails if a lock exists. A
    lock is stale only when its host is this machine and its pid is dead (kill -9); a lock
    from another machine is never judged from here. A stale lock is renamed aside (only one
    taker's rename finds it) and checked by its token before the taker links its own."""
    lock = path.with_name(path.stem + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    mine = f"{os.getpid()} {socket.gethostname()} {uuid.uuid4().hex}\n"
    for _ in range(3):
        if _link_lock(lock, mine):
            try:
                yield True
            finally:
                _release(lock, mine)
            return
        try:
            held = lock.read_text()
        except FileNotFoundError:
            continue  # released meanwhile: try again
        if not _stale(lock, held):
            yield False
            return
        _take_aside(lock, held)
    yield False


def _link_lock(lock: Path, content: str) -> bool:
    """Create `lock` holding `content`, atomically; False if it exists."""
    fd, tmp = tempfile.mkstemp(prefix=f".{lock.name}.", suffix=".new", dir=lock.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(content)
        os.link(tmp, lock)
        return True
    except FileExistsError:
        return False
    except OSError:  # a file system without hard links: exclusive create, then write
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as handle:
            handle.write(content)
        return True
    finally:
        os.unlink(tmp)


def _stale(lock: Path, held: str) -> bool:
    """Whether a lock's owner is gone: a dead pid on this machine. A lock without a pid and
    host (left by an older harness killed between creating and writing it) is stale once
    it is a minute old."""
    fields = held.split()
    if len(fields) < 2 or not fields[0].isdigit():
        try:
            return time.time() - lock.stat().st_mtime > 60
        except FileNotFoundError:
            return False
    if fields[1] != socket.gethostname():
        log.warning("%s is held by pid %s on %s; delete it if that run is gone", lock,
                    fields[0], fields[1])  # fmt: skip
        return False
    try:
        os.kill(int(fields[0]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def _take_aside(lock: Path, stale: str) -> None:
    """Move the stale lock out of the way. Of several takers, one renames it; a taker that
    finds it has moved a fresh lock instead (another taker's) links that one back."""
    aside = lock.with_name(f".{lock.name}.stale-{uuid.uuid4().hex}")
    try:
        os.rename(lock, aside)
    except FileNotFoundError:
        return
    try:
        if aside.read_text() != stale:
            try:
                os.link(aside, lock)
            except FileExistsError:
                log.warning("%s: two processes may have taken over a stale lock at once", lock)
    finally:
        aside.unlink(missing_ok=True)


def _release(lock: Path, mine: str) -> None:
    """Remove our own lock (never one that another process has put in its place)."""
    try:
        if lock.read_text() == mine:
            lock.unlink()
    except FileNotFoundError:
        pass
