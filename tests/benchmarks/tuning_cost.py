"""What equal-budget tuning of every method cost on the real-photo protocols, read from the
committed studies and tuned runs themselves (issue 55: the whole study and the tuned sweep
of each protocol must be affordable on 2 cores).

    python tests/benchmarks/tuning_cost.py        # results/reference/benchmarks/tuning_cost.{json,md}

For each protocol with a committed study (results/reference/tuning/<protocol>/studies.db):

* per method family, the median seconds of a finished trial (the learned similarity of
  PDDM, which scores pairs with an MLP at every validation, apart from the rest);
* the trials, how many the median pruner stopped, the trial-minutes in all (the time one
  process of one thread would take) and the wall-clock time during which a trial ran (the
  studies ran as 2 processes of 1 thread each on 2 cores; a study resumed in a later
  session does not count the time between);
* the tuned sweep (results/reference/runs/<protocol>/*+tuned/): runs, run-minutes in all,
  and the wall-clock time during which a run ran.

A study landed part way (it resumes across sessions) is headed `in progress` with how many
of the protocol's studies are finished.

The timings are those recorded while the studies and runs were made, on the machine the
results record; nothing is re-run, and nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

LEARNED = ("pddm_", "lmdm_")  # PDDM's learned similarity: an MLP over every validation pair


def family(name: str) -> str:
    from harness.core import METHODS

    if name.startswith(LEARNED):
        return "learned similarity (PDDM)"
    return METHODS.get(name).family


def busy_seconds(intervals: list[tuple[datetime, datetime]]) -> float:
    """The wall-clock time during which at least one of the intervals ran (their union):
    a study resumed in a later session does not count the time between."""
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += (stop - start).total_seconds()
            end = stop
        elif stop > end:
            total += (stop - end).total_seconds()
            end = stop
    return total


def study_cost(db: Path) -> dict:
    """Per method: finished trials, pruned, seconds per finished trial; the span."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{db}"
    methods, intervals = {}, []
    for summary in optuna.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        done = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]
        if not done:  # a study just begun: nothing to time yet
            continue
        seconds = [(t.datetime_complete - t.datetime_start).total_seconds() for t in done]
        methods[summary.study_name.split("/")[1].split("@")[0]] = {
            "trials": len(done),
            "pruned": sum(t.state.name == "PRUNED" for t in done),
            "seconds": seconds,
        }
        intervals += [(t.datetime_start, t.datetime_complete) for t in done]
    return {"methods": methods, "wall_seconds": busy_seconds(intervals)}


def sweep_cost(runs: Path) -> dict:
    """The +tuned runs: how many, their seconds in all, the wall-clock span."""
    seconds, intervals = [], []
    for path in sorted(runs.glob("*+tuned/seed*.json")):
        record = json.loads(path.read_text())
        start = datetime.fromisoformat(record["started_at"])
        end = datetime.fromisoformat(record["finished_at"])
        seconds.append((end - start).total_seconds())
        intervals.append((start, end))
    return {"runs": len(seconds), "run_seconds": sum(seconds),
            "wall_seconds": busy_seconds(intervals)}  # fmt: skip


def planned_studies(runs: Path) -> int:
    """The studies `tune --all` runs on a protocol: each method with a search space whose
    paper-default runs the data could serve (not `not_applicable`)."""
    from harness.core import METHODS

    served = {p.parent.name for p in runs.glob("*/seed0.json")
              if not p.parent.name.endswith("+tuned")
              and json.loads(p.read_text()).get("status") != "not_applicable"}  # fmt: skip
    return sum(1 for m in served if METHODS.get(m).search)


def table(protocol: str, study: dict, sweep: dict, planned: int) -> list[str]:
    by_family: dict[str, list[float]] = {}
    for name, m in study["methods"].items():
        by_family.setdefault(family(name), []).extend(m["seconds"])
    trials = sum(m["trials"] for m in study["methods"].values())
    pruned = sum(m["pruned"] for m in study["methods"].values())
    total = sum(sum(m["seconds"]) for m in study["methods"].values())
    budget = max((m["trials"] for m in study["methods"].values()), default=0)
    finished = sum(m["trials"] >= budget for m in study["methods"].values())
    lines = [f"## {protocol}" + (f" (in progress: {finished} of {planned} studies finished)"
                                 if finished < planned else ""), "",
             f"{len(study['methods'])} studies, {trials} finished trials ({pruned} pruned): "
             f"{total / 60:.0f} trial-minutes, {study['wall_seconds'] / 60:.0f} min of wall "
             f"time with a trial running. Tuned sweep: {sweep['runs']} runs, "
             f"{sweep['run_seconds'] / 60:.0f} run-minutes, {sweep['wall_seconds'] / 60:.0f} "
             "min of wall time with a run running.", "",
             "| family | methods | trials | median s/trial | slowest method (median s/trial) |",
             "|---|---:|---:|---:|---|"]  # fmt: skip
    for fam, seconds in sorted(by_family.items(), key=lambda kv: statistics.median(kv[1])):
        names = [n for n in study["methods"] if family(n) == fam]
        slow = max(names, key=lambda n: statistics.median(study["methods"][n]["seconds"]))
        lines.append(f"| {fam} | {len(names)} | {len(seconds)} | {statistics.median(seconds):.1f}"
                     f" | {slow} ({statistics.median(study['methods'][slow]['seconds']):.1f}) |")  # fmt: skip
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", type=Path, default=REPO / "results/reference")
    parser.add_argument("--out", type=Path, default=REPO / "results/reference/benchmarks")
    args = parser.parse_args()

    import harness.methods  # noqa: F401  (registers the methods: their families)

    found = {}
    lines = ["# Equal-budget tuning on real photos: what it cost", "",
             "Generated by `python tests/benchmarks/tuning_cost.py` from the committed studies' "
             "trial timestamps and the tuned runs' records (made on 2 cores: the studies as 2 "
             "processes of 1 torch thread, `tune --processes 2`).", ""]  # fmt: skip
    for db in sorted(args.reference.glob("tuning/*/studies.db")):
        protocol = db.parent.name
        if protocol == "tuning":  # the glyph study: docs/verdicts.md gives its cost
            continue
        study = study_cost(db)
        sweep = sweep_cost(args.reference / "runs" / protocol)
        found[protocol] = {"study": study, "sweep": sweep}
        lines += table(protocol, study, sweep, planned_studies(args.reference / "runs" / protocol))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tuning_cost.json").write_text(json.dumps(found, indent=1) + "\n")
    (args.out / "tuning_cost.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
