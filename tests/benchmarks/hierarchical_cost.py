"""What the hierarchical model across protocols costs (harness.stats.hierarchical): the time
per comparison sampled from nothing, the sampler's compilation, and what the leaderboard's
equivalence section costs with the committed posteriors against the signed-rank test alone.

    python tests/benchmarks/hierarchical_cost.py               # writes results/reference/benchmarks/hierarchical_cost.{json,md}
    python tests/benchmarks/hierarchical_cost.py --sample 84 --out /tmp/hier   # every comparison

What it measures, on the committed results (results/reference):

* sampled: `--sample` comparisons (default 12, spread evenly over the leaderboard's 84: all
  protocols, pretrained, from scratch), each sampled from nothing in this process (4 chains
  of 1,000 warmup and 2,500 draws, one thread); the first one's extra time is the sampler's
  compilation (once per process and padded shape);
* the same posteriors against the committed ones (results/reference/posteriors/
  hierarchical.json): identical to the last bit on the machine type that made them;
* recorded: the seconds the committed file records for every comparison, when it was made;
* cached: the leaderboard's equivalence section (all three comparisons, their sensitivity
  tables) from the committed posteriors, against the same section computed by the
  signed-rank test alone (what it cost before the model).

Nothing is asserted; the figures go to --out with the machine and the versions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=12,
                        help="comparisons to sample from nothing (default 12 of 84)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=REPO / "results/reference/benchmarks",
                        help="folder for hierarchical_cost.json and .md")  # fmt: skip
    args = parser.parse_args()

    import pandas as pd
    import torch

    from harness.core import load_methods
    from harness.records import load_results, machine_fingerprint
    from harness.report.equivalence import section
    from harness.stats import (
        ALL,
        average_ranks,
        by_setting,
        hierarchical,
        nuts,
        posteriors,
        protocol_blocks,
        shared_blocks,
    )
    from harness.stats.bayes import ROPES, SCALE, signed_rank_probs
    from harness.stats.posteriors import CACHE_FILE, PosteriorCache, inputs_of

    load_methods()
    reference = REPO / "results" / "reference"
    blocks = protocol_blocks(load_results(reference))
    committed = json.loads((reference / CACHE_FILE).read_text(encoding="utf-8"))["entries"]

    # every comparison the leaderboard makes, as `across` names and feeds them
    todo = []
    for label, group in [(ALL, blocks), *by_setting(blocks).items()]:
        kept, shared, _ = shared_blocks(group)
        table = pd.DataFrame([[b.means[m] for m in shared] for b in kept], columns=shared)
        ranks, means = average_ranks(table), table.mean(axis=0)
        ref = min(shared, key=lambda m: (ranks[m], -means[m], m))
        rope = {b.rope for b in kept}.pop()
        ropes = sorted({*ROPES, rope})
        for m in shared:
            if m != ref:
                a = {b.name: {s: SCALE * v for s, v in b.values[m].items()} for b in kept}
                b_ = {b.name: {s: SCALE * v for s, v in b.values[ref].items()} for b in kept}
                todo.append((f"{label}: {m} vs {ref}", a, b_, ropes))
    step = max(1, len(todo) // max(1, args.sample))
    chosen = todo[::step][: args.sample]

    seconds, identical = [], 0
    start = time.perf_counter()
    for name, a, b, ropes in chosen:
        t0 = time.perf_counter()
        posterior = hierarchical.compare(a, b, ropes)
        seconds.append(time.perf_counter() - t0)
        entry = posteriors.to_entry(inputs_of(a, b), posterior)
        stored = committed.get(name, {})
        identical += all(entry[k] == stored.get(k) for k in ("predictive", "shares", "shrunk"))
        print(f"{name}: {seconds[-1]:.1f} s, {posterior.diagnostics.text()}", flush=True)
    sampled_wall = time.perf_counter() - start
    steady = seconds[1:] or seconds  # the first compiled the sampler

    # the leaderboard's section: from the committed posteriors, and the signed-rank test alone
    posteriors._MEMORY.clear()
    t0 = time.perf_counter()
    section(blocks, PosteriorCache(reference / CACHE_FILE, fallback=None))
    cached_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _, a, b, ropes in todo:
        x = [statistics.fmean(v.values()) for v in b.values()]
        y = [statistics.fmean(v.values()) for v in a.values()]
        for rope in ropes:
            signed_rank_probs(x, y, rope)
    signed_rank_s = time.perf_counter() - t0
    recorded = [float(e["seconds"]) for e in committed.values()]

    figures = {
        "machine": machine_fingerprint(torch.device("cpu")),
        "platform": platform.platform(), "cores": os.cpu_count(),
        "versions": posteriors._versions(), "settings": nuts.settings(),
        "sampled": {"comparisons": len(chosen), "of": len(todo), "wall_s": round(sampled_wall, 1),
                    "first_s": round(seconds[0], 1),
                    "median_s": round(statistics.median(steady), 1),
                    "mean_s": round(statistics.fmean(steady), 1),
                    "max_s": round(max(steady), 1),
                    "identical_to_committed": identical},
        "recorded": {"comparisons": len(recorded), "total_s": round(sum(recorded), 1),
                     "median_s": round(statistics.median(recorded), 1),
                     "max_s": round(max(recorded), 1)},
        "section": {"cached_s": round(cached_s, 2), "signed_rank_alone_s": round(signed_rank_s, 2)},
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hierarchical_cost.json").write_text(json.dumps(figures, indent=1) + "\n")
    (args.out / "hierarchical_cost.md").write_text(markdown(figures))
    print(markdown(figures))


def markdown(f: dict) -> str:
    s, r, c, v = f["sampled"], f["recorded"], f["section"], f["settings"]
    return f"""# What the hierarchical model across protocols costs

Measured by `python tests/benchmarks/hierarchical_cost.py` in one run on
{f["machine"].get("cpu_model", "?")} ({f["cores"]} cores, {f["platform"]}); numpyro
{f["versions"]["numpyro"]}, jax {f["versions"]["jax"]}, one thread; {v["chains"]} chains of
{v["warmup"]:,} warmup and {v["draws"]:,} draws each.

| what | comparisons | seconds |
|---|---|---|
| one comparison sampled from nothing, median (mean; slowest) | {s["comparisons"] - 1} | {s["median_s"]} ({s["mean_s"]}; {s["max_s"]}) |
| the first of a process, compiling the sampler | 1 | {s["first_s"]} |
| every comparison of the leaderboard, as the committed file records them (median; slowest) | {r["comparisons"]} | {r["total_s"]} ({r["median_s"]}; {r["max_s"]}) |
| the leaderboard's equivalence section from the committed posteriors | {s["of"]} | {c["cached_s"]} |
| the same section's signed-rank test alone, every ROPE (before the model) | {s["of"]} | {c["signed_rank_alone_s"]} |

Of the {s["comparisons"]} comparisons sampled here, {s["identical_to_committed"]} are identical
to the last bit to the committed posteriors (the same machine type gives the same draws;
another processor rounds differently and its chains part ways, within Monte-Carlo error).
"""


if __name__ == "__main__":
    main()
