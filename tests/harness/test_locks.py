"""The run lock: one holder at a time, even with several processes racing for a fresh or a
stale lock; a lock is stale only when its owner is a dead process on this machine."""

from __future__ import annotations

import multiprocessing
import os
import socket
import time
from pathlib import Path

from harness.records import run_lock

HOST = socket.gethostname()
DEAD_PID = 999_999_999  # above any pid_max: no such process


def _dead_pid_here(lock: Path) -> None:
    lock.write_text(f"{DEAD_PID} {HOST}\n")


def test_a_lock_is_stale_only_when_its_owner_is_dead_on_this_machine(tmp_path: Path):
    result, lock = tmp_path / "seed0.json", tmp_path / "seed0.lock"
    lock.write_text(f"{DEAD_PID} another-node\n")  # another machine's: cannot be judged here
    with run_lock(result) as got:
        assert not got
    lock.write_text(f"{os.getpid()} {HOST}\n")  # alive
    with run_lock(result) as got:
        assert not got
    lock.write_text("")  # an older harness between creating and writing it: not yet stale
    with run_lock(result) as got:
        assert not got
    os.utime(lock, (time.time() - 120,) * 2)  # ... but a minute later its owner is gone
    with run_lock(result) as got:
        assert got and lock.read_text().split()[:2] == [str(os.getpid()), HOST]
    assert not lock.exists()  # released
    _dead_pid_here(lock)  # kill -9 on this machine: taken over
    with run_lock(result) as got:
        assert got
    assert not lock.exists() and [p.name for p in tmp_path.iterdir()] == []


def _race(result: Path, processes: int = 6) -> tuple[int, int]:
    """Start `processes` processes at once on one lock: (how many held it, most at once)."""
    ctx = multiprocessing.get_context("fork")
    start, holding, most = ctx.Barrier(processes), ctx.Value("i", 0), ctx.Value("i", 0)
    held = ctx.Value("i", 0)

    workers = [ctx.Process(target=_counting, args=(result, start, holding, most, held))
               for _ in range(processes)]  # fmt: skip
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    return held.value, most.value


def _counting(result: Path, start, holding, most, held) -> None:
    start.wait()
    with run_lock(result) as got:
        if got:
            with held.get_lock():
                held.value += 1
            with holding.get_lock():
                holding.value += 1
                most.value = max(most.value, holding.value)
            time.sleep(0.2)
            with holding.get_lock():
                holding.value -= 1


def test_racing_processes_never_hold_one_lock_together(tmp_path: Path):
    for trial in range(12):
        result = tmp_path / f"seed{trial}.json"
        if trial % 2:
            _dead_pid_here(tmp_path / f"seed{trial}.lock")  # a stale lock to take over
        held, most = _race(result)
        assert most == 1 and held >= 1, (trial, held, most)  # one at a time
        assert not (tmp_path / f"seed{trial}.lock").exists()
    assert not [p.name for p in tmp_path.iterdir()]  # no temporary or set-aside files left


def test_a_file_system_without_hard_links_still_locks(tmp_path: Path, monkeypatch):
    def no_links(src, dst):
        raise PermissionError(1, "Operation not permitted")  # e.g. some network shares

    monkeypatch.setattr(os, "link", no_links)
    result, lock = tmp_path / "seed0.json", tmp_path / "seed0.lock"
    with run_lock(result) as got:
        assert got and lock.read_text().split()[:2] == [str(os.getpid()), HOST]
        with run_lock(result) as again:
            assert not again
    assert [p.name for p in tmp_path.iterdir()] == []
