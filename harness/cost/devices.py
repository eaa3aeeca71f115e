"""Scaling across devices: one method's training step on 1, 2, ... processes under torchrun,
as `torchrun -m harness run` trains it (each rank embeds 1/N of every P x K batch; the
embeddings are gathered, the gradients averaged), against the same step on one process.

speedup(N) = images/s on N processes / images/s on 1; efficiency(N) = speedup(N) / N, the
share of N devices' throughput that one run on them delivers. Every count is launched the
same way (torchrun, so one process pays for the process group too) and times the same whole
batches after a warm-up. On CUDA, rank r takes GPU r. On the CPU a "device" is a process
with a fixed number of torch threads (`threads_per_rank`, default: the cores divided by the
largest count), so N processes use N times the cores of one; the measure is then what
splitting a batch across processes costs and gains on this machine, not a GPU figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness.core import (
    HarnessError,
    init_from_env,
    leave,
    load_methods,
    load_protocol,
    resolve_device,
)
from harness.cost.measure import _setup
from harness.cost.records import COST_SCHEMA
from harness.cost.throughput import WARMUP_STEPS, cost_context, measure_throughput, random_init
from harness.data import prepare_data
from harness.records import environment

DEFAULT_COUNTS = (1, 2)
DEFAULT_DEVICE_STEPS = 16


def parse_counts(text: str, batch_size: int) -> list[int]:
    """Sorted distinct process counts, 1 included (the baseline), each dividing the batch."""
    try:
        counts = {int(s) for s in text.split(",") if s.strip()}
    except ValueError:
        raise HarnessError(f"--devices: expected comma-separated integers, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise HarnessError("--devices: give process counts of at least 1, e.g. 1,2,4")
    for n in counts:
        if batch_size % n:
            raise HarnessError(
                f"--devices: {n} processes do not split the protocol's batch of {batch_size} "
                "images evenly; use counts that divide it"
            )
    return sorted(counts | {1})


def measure_devices(
    protocol: Any,
    method: str,
    counts: Sequence[int],
    *,
    device: str = "auto",
    steps: int = DEFAULT_DEVICE_STEPS,
    threads_per_rank: int | None = None,
    data_root: str | None = None,
) -> dict[str, Any]:
    """Launch torchrun once per count and return the record written to
    results/cost/devices/<protocol>.json."""
    import torch

    resolved = resolve_device(device)
    if resolved.type == "cuda" and max(counts) > torch.cuda.device_count():
        raise HarnessError(f"--devices: {max(counts)} processes need as many GPUs; this "
                           f"machine has {torch.cuda.device_count()}")  # fmt: skip
    threads = threads_per_rank or max(1, (os.cpu_count() or 1) // max(counts))
    prepare_data(protocol, data_root)  # the dataset cache, built once before the ranks read it
    started = time.perf_counter()
    rows = [_launch(protocol.path, method, n, resolved.type, steps, threads, data_root)
            for n in counts]  # fmt: skip
    base = rows[0]["images_per_second"]
    for row in rows:
        row["speedup"] = round(row["images_per_second"] / base, 3)
        row["efficiency"] = round(row["speedup"] / row["processes"], 3)
    return {
        "schema": COST_SCHEMA,
        "kind": "cost_devices",
        "protocol": {"name": protocol.name, "version": protocol.version, "hash": protocol.hash,
                     "path": protocol.path},
        "method": method,
        "settings": {"steps": steps, "warmup_steps": WARMUP_STEPS, "device": resolved.type,
                     "threads_per_rank": threads if resolved.type == "cpu" else None,
                     "backbone_weights": "random (timing only)" if (
                         protocol.backbone.pretrained != "none" or protocol.backbone.weights_file
                     ) else "none",
                     "batch_size": protocol.sampler.batch_size},
        "rows": rows,
        "seconds": round(time.perf_counter() - started, 1),
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "environment": environment(resolved),
    }  # fmt: skip


def _launch(protocol: str, method: str, n: int, device: str, steps: int, threads: int,
            data_root: str | None) -> dict[str, Any]:  # fmt: skip
    """One torchrun of n processes; rank 0's measurement."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc_per_node={n}", "-m", "harness.cost.devices", "--protocol",
                   protocol, "--method", method, "--steps", str(steps), "--device", device,
                   "--threads", str(threads), "--out", str(out)]  # fmt: skip
        if data_root:
            command += ["--data-root", data_root]
        code = str(Path(__file__).resolve().parents[2])  # the ranks import this harness
        path = os.pathsep.join(p for p in (code, os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": path}
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode or not out.is_file():
            raise HarnessError(f"--devices: the run on {n} processes failed: "
                               f"{_rank_error(done.stderr)}")  # fmt: skip
        return json.loads(out.read_text())


def _rank_error(stderr: str) -> str:
    """The ranks' own error from torchrun's output (its banners and tracebacks around it):
    the last HarnessError line, else the last exception line, else the last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()] or ["no output"]
    for marker in ("HarnessError: ", "Error: "):
        found = [line for line in lines if marker in line and not line.startswith("=")]
        if found:
            return found[-1].split(marker, 1)[1] if marker == "HarnessError: " else found[-1]
    return lines[-1]


def _rank(argv: list[str]) -> None:
    """Under torchrun: time the training step on this rank's shard; rank 0 writes --out."""
    parser = argparse.ArgumentParser(prog="harness.cost.devices")
    for flag in ("--protocol", "--method", "--device", "--out"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--data-root")
    args = parser.parse_args(argv)
    import torch

    load_methods()

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    here = init_from_env(device)
    protocol = load_protocol(args.protocol)
    prepared = prepare_data(protocol, args.data_root)
    ctx = cost_context(random_init(protocol), device, args.data_root)  # timing only, as `cost`
    setup = _setup(ctx.replace(dist=here), prepared, [args.method], 2)
    measured = measure_throughput(setup.ctx, setup.model(args.method), setup.data,
                                  steps=args.steps)  # fmt: skip
    if here.is_main:
        ips = measured["images_per_second"]
        row = {"processes": here.world_size, "backend": here.backend, "images_per_second": ips,
               "images_per_second_per_rank": round(ips / here.world_size, 2),
               "step_ms": measured["step_ms"], "mining_loss_share": measured["mining_loss_share"]}  # fmt: skip
        Path(args.out).write_text(json.dumps(row))
    leave(here, 0)


if __name__ == "__main__":
    _rank(sys.argv[1:])
