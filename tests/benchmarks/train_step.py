"""What a training step on cached features costs in the harness against a bare torch loop doing
the same work, measured in one run on the same machine (issue 55: tuning every method on
real photos must be affordable, and the harness must not be the slow part).

    python tests/benchmarks/train_step.py                      # results/reference/benchmarks/train_step.{json,md}
    python tests/benchmarks/train_step.py --protocol cars --steps 200 --out /tmp/step

For each reference method (one per family: pair, triplet, general pair weighting, proxy,
classification, lifted structure), on the protocol's cached trunk features (loaded, never
built here: run the protocol once first, or `--fetch` its data):

* harness: `train_model` for `--steps` steps (the sampler, the feeder, the step, the loop's
  bookkeeping), seconds per step from its own TrainStats, and the share of them spent
  waiting for a batch (data_wait_seconds / train_seconds);
* bare: the same backbone tail, head, miner and loss objects on ONE fixed batch of the same
  size, in a plain loop (forward, mining, loss, zero_grad, backward, optimizer step), seconds
  per step;
* the ratio harness / bare (the goal: 2 or less).

Nothing is asserted; the figures go to --out with the machine and the versions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

METHODS = {
    "contrastive": "pair",
    "triplet": "triplet",
    "multi_similarity": "pair weighting",
    "lifted_structure": "lifted structure",
    "proxy_anchor": "proxy",
    "arcface": "classification",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", default="groceries")
    parser.add_argument("--steps", type=int, default=300, help="steps per method (default 300)")
    parser.add_argument("--out", type=Path, default=REPO / "results/reference/benchmarks")
    args = parser.parse_args()

    import harness.methods  # noqa: F401
    import numpy as np
    import torch

    from harness.core import RunContext, load_protocol, protocol_hyperparameters
    from harness.data import prepare_data
    from harness.records import machine_fingerprint
    from harness.train import train_model, with_cached_features
    from harness.train.fit import contiguous
    from harness.train.loop import train_augmentation
    from harness.train.step import TrainingSet, TrainingStep, trainable_modules

    protocol = load_protocol(args.protocol)
    prepared = prepare_data(protocol, None)
    ctx = RunContext(protocol, 0, torch.device("cpu"), max_steps=args.steps)
    data = with_cached_features(ctx, prepared.data, prepared.split)
    train = prepared.split.train
    batch_size = protocol.sampler.classes_per_batch * protocol.sampler.images_per_class
    rows = []
    for method, family in METHODS.items():
        hyper = protocol_hyperparameters(protocol, method)
        started = time.perf_counter()
        model, stats = train_model(ctx, method, hyper, data, train)
        wall = time.perf_counter() - started
        harness_step = stats.train_seconds / stats.steps
        # the bare loop: the same kinds of objects, one fixed batch, nothing else
        torch.manual_seed(0)
        model, _ = train_model(RunContext(protocol, 0, torch.device("cpu"), max_steps=1), method,
                               hyper, data, train)  # fmt: skip
        labels = contiguous(data.labels[train])
        training = TrainingSet(data.images[train], labels, None)
        params = [p for p in trainable_modules(model.backbone, model.method).parameters()]
        optimizer = torch.optim.Adam(params, lr=protocol.optimizer.lr)
        helper = TrainingStep(model, optimizer, training, ctx, augment=train_augmentation(ctx))
        idx = torch.as_tensor(np.arange(batch_size) * (len(train) // batch_size))
        x, batch = helper.batch(idx)
        backbone, head, miner, loss_fn = (model.backbone, model.method.head, model.method.miner,
                                          model.method.loss)  # fmt: skip

        def bare_step() -> None:
            out = head(backbone(x))  # noqa: B023
            with torch.no_grad():
                mined = miner(out, batch) if miner is not None else None  # noqa: B023
            loss = loss_fn(out, batch, mined)  # noqa: B023
            optimizer.zero_grad(set_to_none=True)  # noqa: B023
            if loss.requires_grad:
                loss.backward()
                optimizer.step()  # noqa: B023

        for _ in range(10):
            bare_step()
        started = time.perf_counter()
        for _ in range(args.steps):
            bare_step()
        bare = (time.perf_counter() - started) / args.steps
        rows.append({"method": method, "family": family, "steps": stats.steps,
                     "harness_ms": round(harness_step * 1000, 2), "bare_ms": round(bare * 1000, 2),
                     "ratio": round(harness_step / bare, 2),
                     "data_wait_share": round(stats.data_wait_seconds / stats.train_seconds, 3),
                     "run_wall_s": round(wall, 2)})  # fmt: skip
        print(rows[-1], flush=True)

    fingerprint = machine_fingerprint()
    machine = (f"{fingerprint.get('cpu_vendor', '')} {fingerprint.get('cpu_model', '')} "
               f"({fingerprint.get('torch_cpu_isa', '')})").strip()  # fmt: skip
    record = {
        "benchmark": "train_step", "protocol": protocol.name, "protocol_version": protocol.version,
        "protocol_hash": protocol.hash, "batch": batch_size, "steps": args.steps,
        "machine": {"cpu": fingerprint, "platform": platform.platform(), "cores": os.cpu_count(),
                    "torch": torch.__version__, "threads": torch.get_num_threads()},
        "rows": rows,
        "median_ratio": float(np.median([r["ratio"] for r in rows])),
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "train_step.json").write_text(json.dumps(record, indent=1) + "\n")
    lines = [
        "# A training step on cached features: the harness against a bare torch loop",
        "",
        f"Generated by `python tests/benchmarks/train_step.py --protocol {protocol.name}` on "
        f"{machine} ({os.cpu_count()} cores), torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; {args.steps} steps per method, batches of "
        f"{batch_size}. `harness`: `train_model`'s own seconds per step (sampler, feeder, step, "
        "bookkeeping); `bare`: the same tail, head, miner and loss on one fixed batch in a plain "
        "loop. Goal: a ratio of 2 or less.",
        "",
        "| method | family | harness ms/step | bare ms/step | ratio | data wait |",
        "|---|---|---:|---:|---:|---:|",
        *[f"| {r['method']} | {r['family']} | {r['harness_ms']} | {r['bare_ms']} | "
          f"{r['ratio']} | {r['data_wait_share']:.0%} |" for r in rows],
        "",
        f"Median ratio: {record['median_ratio']:.2f}.",
        "",
    ]  # fmt: skip
    (args.out / "train_step.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
