"""The hierarchical model's posteriors kept between leaderboard runs
(`<results-dir>/posteriors/hierarchical.json`): sampling all of the leaderboard's
comparisons takes minutes (harness.stats.hierarchical; docs/verdicts.md has the timings),
so each posterior, summarised, is kept with the inputs that made it.

A kept posterior is a result, keyed by everything that made it: the per-seed values of both
methods on every protocol (in points, exactly as the results give them) and the model's
settings (its version, the PRNG seed, chains, warmup, draws and priors). On every use its
stored inputs are compared with the comparison's own, and its key with a hash of what it
stores: an entry that does not match is sampled again, with a warning naming it, and never
reused. A changed result therefore recomputes the comparisons it enters and nothing else.

The file holds the entries the last run used, in a stable order, written atomically. Where a
results folder has none yet, the committed reference's file (results/reference/posteriors/)
is read too: its entries are used only where their inputs are the same to the last bit.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness.core.paths import source_tree
from harness.records.fingerprint import package_versions
from harness.records.results import write_json_atomic
from harness.stats.bayes import Probs
from harness.stats.convergence import Diagnostics
from harness.stats.hierarchical import Posterior, Shrunk
from harness.stats.nuts import settings

log = logging.getLogger(__name__)

FORMAT = 1
CACHE_FILE = Path("posteriors") / "hierarchical.json"
REFERENCE_CACHE = (source_tree() or Path()) / "results" / "reference" / CACHE_FILE
_MEMORY: dict[str, tuple[Posterior, dict[str, Any]]] = {}  # this process's, by key


def inputs_of(
    a: Mapping[str, Mapping[int, float]], b: Mapping[str, Mapping[int, float]],
) -> dict[str, dict[str, dict[str, float]]]:  # fmt: skip
    """What a comparison is made of, as stored: protocol -> {"a": seed -> value, "b": ...}
    (points; every seed each ran: the model takes the shared ones), JSON's own types."""
    return {p: {"a": {str(s): float(v) for s, v in sorted(a.get(p, {}).items())},
                "b": {str(s): float(v) for s, v in sorted(b.get(p, {}).items())}}
            for p in sorted(set(a) | set(b))}  # fmt: skip


def key_of(inputs: Mapping[str, Any]) -> str:
    """The sha256 of the inputs and the model's settings, canonical JSON (floats as Python
    writes them: every bit counts)."""
    text = json.dumps({"settings": settings(), "inputs": inputs}, sort_keys=True,
                      allow_nan=True, separators=(",", ":"))  # fmt: skip
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _probs(table: Mapping[float, Probs]) -> dict[str, list[float]]:
    return {f"{r:g}": [p.worse, p.equivalent, p.better, p.n] for r, p in sorted(table.items())}


def _unprobs(table: Mapping[str, Sequence[float]]) -> dict[float, Probs]:
    return {
        float(r): Probs(float(w), float(e), float(b), int(n)) for r, (w, e, b, n) in table.items()
    }


def to_entry(inputs: Mapping[str, Any], posterior: Posterior) -> dict[str, Any]:
    """A posterior as the cache file stores it."""
    return {"key": key_of(inputs), "inputs": inputs, "predictive": _probs(posterior.probs),
            "shares": _probs(posterior.shares),
            "shrunk": [asdict(s) for s in posterior.shrunk],
            "diagnostics": asdict(posterior.diagnostics), "left_out": posterior.left_out,
            "means_only": posterior.means_only, "seconds": round(posterior.seconds, 2),
            "versions": package_versions(("numpyro", "jax", "jaxlib"))}  # fmt: skip


def from_entry(entry: Mapping[str, Any]) -> Posterior:
    """The posterior a cache entry stores (KeyError or ValueError where it is malformed)."""
    return Posterior(_unprobs(entry["predictive"]), _unprobs(entry["shares"]),
                     [Shrunk(**s) for s in entry["shrunk"]], Diagnostics(**entry["diagnostics"]),
                     list(entry["left_out"]), bool(entry["means_only"]),
                     float(entry["seconds"]))  # fmt: skip


def _read(path: Path) -> dict[str, Any]:
    """A cache file's entries, or none (with a warning) where it cannot be used."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        log.warning("hierarchical posteriors %s are unreadable (%s): every comparison is "
                    "sampled again", path, " ".join(str(exc).split()))  # fmt: skip
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        log.warning("hierarchical posteriors %s are not of format %d: every comparison is "
                    "sampled again", path, FORMAT)  # fmt: skip
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


def _matching(entry: Any, inputs: Mapping[str, Any], key: str) -> Posterior | None:
    """The entry's posterior where its key is `key`, its stored inputs are `inputs` and its
    key is the hash of what it stores; else None (malformed entries too)."""
    try:
        if entry["key"] == key == key_of(entry["inputs"]) and entry["inputs"] == inputs:
            return from_entry(entry)
    except (KeyError, TypeError, ValueError):
        pass
    return None


class PosteriorCache:
    """The posteriors of one results folder (`path`, None: kept in memory only), with the
    committed reference's as a read-only fallback. `get` returns a posterior for a
    comparison, from the file where it matches, else sampled; `save` writes the entries
    used since the cache was opened."""

    def __init__(self, path: Path | None, fallback: Path | None = REFERENCE_CACHE) -> None:
        self.path = Path(path) if path is not None else None
        self.entries = _read(self.path) if self.path is not None else {}
        fallback = Path(fallback) if fallback is not None else None
        same = fallback is not None and self.path is not None and (
            fallback.resolve() == self.path.resolve())  # fmt: skip
        self.fallback = _read(fallback) if fallback is not None and not same else {}
        self.used: dict[str, dict[str, Any]] = {}
        self.sampled = 0

    def _stored(self, name: str, inputs: Mapping[str, Any], key: str,
                ropes: Sequence[float]) -> tuple[Posterior, dict[str, Any]] | None:  # fmt: skip
        """The posterior stored for `name` with its entry, where it is these inputs' and holds
        every ROPE; a stored entry of other inputs is named in a warning."""
        entry = self.entries.get(name)
        if entry is not None:
            found = _matching(entry, inputs, key)
            if found is None:
                log.warning("hierarchical posteriors %s: %s does not match its inputs (a result "
                            "or the model changed): sampled again", self.path, name)  # fmt: skip
            elif all(r in found.probs for r in ropes):
                return found, entry
        for candidate in self.fallback.values():  # the committed reference's: by key only
            if isinstance(candidate, dict) and candidate.get("key") == key:
                found = _matching(candidate, inputs, key)
                if found is not None and all(r in found.probs for r in ropes):
                    return found, candidate
        return None

    def get(
        self, name: str, a: Mapping[str, Mapping[int, float]],
        b: Mapping[str, Mapping[int, float]], ropes: Sequence[float],
        compute: Callable[[], Posterior | None],
    ) -> Posterior | None:  # fmt: skip
        """The posterior of the comparison `name` (a against b, protocol -> seed -> points):
        this process's, the file's, the reference's, or `compute()`'s, in that order."""
        inputs = inputs_of(a, b)
        key = key_of(inputs)
        kept = _MEMORY.get(key)
        if kept is None or not all(r in kept[0].probs for r in ropes):
            kept = self._stored(name, inputs, key, ropes)
        if kept is None:
            posterior = compute()
            self.sampled += 1
            if posterior is None:
                return None
            log.info("hierarchical model: %s sampled in %.1f s (%s)", name, posterior.seconds,
                     posterior.diagnostics.text())  # fmt: skip
            kept = posterior, to_entry(inputs, posterior)
        _MEMORY[key] = kept
        self.used[name] = kept[1]
        return kept[0]

    def save(self) -> Path | None:
        """Write the entries used (sorted by name) to the file; None where there is none."""
        if self.path is None or not self.used:
            return None
        entries = {name: self.used[name] for name in sorted(self.used)}
        if entries == self.entries and self.path.is_file():
            return self.path  # unchanged: the file (and its timings) stay as they are
        write_json_atomic(self.path, {"format": FORMAT, "settings": settings(),
                                      "entries": entries})  # fmt: skip
        return self.path


def cache_for(results_dir: Path | None) -> PosteriorCache:
    """The posteriors of a results folder (in memory only when None)."""
    return PosteriorCache(None if results_dir is None else Path(results_dir) / CACHE_FILE)
