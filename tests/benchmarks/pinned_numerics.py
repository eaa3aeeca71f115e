"""Which numeric settings make the regression check's numbers independent of the processor
(issue 72): a few methods of a protocol, each in a fresh process under each candidate setting
and each ISA stand-in, compared bit for bit.

    python tests/benchmarks/pinned_numerics.py --out /tmp/pinned.json
    python tests/benchmarks/pinned_numerics.py --protocol photo_regression --methods untrained,triplet

A candidate (environment variables and torch backend switches, applied before torch loads)
is good on this machine when every stand-in gives it the same bits: the stand-ins make torch,
oneDNN and MKL take the code paths of a lesser processor. Agreement between vendors (Intel
and AMD) cannot be shown on one machine; run this on both and compare the `hex` columns of
the two output files. The child process's own time per candidate (imports excluded; wall and
CPU seconds, the CPU time being the steadier measure on shared cores) is the setting's cost. Nothing is asserted; the table goes to stdout and the numbers to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

# Stand-ins for other processors (kernel caps that any machine honours).
STAND_INS: dict[str, dict[str, str]] = {
    "native": {},
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },  # fmt: skip
    "aten-default": {"ATEN_CPU_CAPABILITY": "default"},
    "sse4": {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
}
# The pinned candidates: environment (set over the stand-in's) and "switches" applied in the
# child before any run (mkldnn / nnpack off).
_BASE = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "COMPATIBLE",
         "OPENBLAS_CORETYPE": "Haswell", "FAISS_SIMD_LEVEL": "AVX2"}  # fmt: skip
CANDIDATES: dict[str, dict[str, Any]] = {
    "today": {"env": {}},
    "aten-avx2": {"env": {"ATEN_CPU_CAPABILITY": "avx2"}},
    "onednn-avx2": {"env": {"ONEDNN_MAX_CPU_ISA": "AVX2"}},
    "cbwr-compatible": {"env": {"MKL_CBWR": "COMPATIBLE"}},
    "cbwr-avx2-strict": {"env": {**_BASE, "MKL_CBWR": "AVX2,STRICT"}},
    "aten-avx2+cbwr-compatible": {"env": _BASE},
    "aten-default+cbwr-compatible": {"env": {**_BASE, "ATEN_CPU_CAPABILITY": "default"}},
    "aten-avx2+cbwr-compatible+no-onednn": {"env": _BASE, "switches": ["no-mkldnn", "no-nnpack"]},
}


def child(args: argparse.Namespace) -> None:
    """Run the methods for the seeds in this process (one torch thread) and print one JSON
    line: every metric as float.hex, the fingerprint, the seconds spent running."""
    import torch

    sys.path.insert(0, str(REPO))
    if "no-mkldnn" in args.switches:
        torch.backends.mkldnn.enabled = False
    if "no-nnpack" in args.switches:
        torch.backends.nnpack.set_flags(False)
    from harness.core import load_methods, load_protocol
    from harness.records import read_result, result_path
    from harness.sweep import plan, sweep_pinned

    load_methods()
    protocol = load_protocol(args.protocol)
    methods = args.methods.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        specs = plan(protocol, methods, seeds, device="cpu", results_dir=tmp)
        start, cpu = time.perf_counter(), time.process_time()
        sweep_pinned(specs, workers=1, threads=1)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        metrics, fingerprint = {}, None
        for m in methods:
            for s in seeds:
                r = read_result(result_path(Path(tmp), protocol.name, m, s))
                metrics[f"{m}/{s}"] = {k: float(v).hex() for k, v in (r.metrics or {}).items()}
                fingerprint = r.environment.fingerprint if r.environment else None
    print(json.dumps({"metrics": metrics, "fingerprint": fingerprint, "seconds": seconds,
                      "cpu_seconds": cpu}))  # fmt: skip


def run_one(args: argparse.Namespace, stand_in: str, candidate: str) -> dict[str, Any]:
    """One child process under the stand-in's environment with the candidate's set over it."""
    env = {k: v for k, v in os.environ.items() if k not in _ALL_VARS}
    env.update(STAND_INS[stand_in])
    env.update(CANDIDATES[candidate]["env"])
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, __file__, "--child", "--protocol", args.protocol, "--methods",
           args.methods, "--seeds", args.seeds,
           "--switches", ",".join(CANDIDATES[candidate].get("switches", []))]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO, check=False)
    if done.returncode:
        return {"error": done.stderr[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


_ALL_VARS = {k for s in STAND_INS.values() for k in s} | {
    k for c in CANDIDATES.values() for k in c["env"]
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--switches", default="", help=argparse.SUPPRESS)
    p.add_argument("--protocol", default="regression")
    p.add_argument(
        "--methods",
        default="contrastive,triplet,supcon,histogram,lifted_structure,multi_similarity",
    )
    p.add_argument("--seeds", default="0")
    p.add_argument("--candidates", default=",".join(CANDIDATES))
    p.add_argument("--stand-ins", default=",".join(STAND_INS))
    p.add_argument("--out", type=Path, default=Path("/tmp/pinned_numerics.json"))
    args = p.parse_args()
    if args.child:
        args.switches = [s for s in args.switches.split(",") if s]
        return child(args)
    results: dict[str, dict[str, Any]] = {}
    for candidate in args.candidates.split(","):
        for stand_in in args.stand_ins.split(","):
            out = run_one(args, stand_in, candidate)
            results.setdefault(candidate, {})[stand_in] = out
            args.out.write_text(json.dumps(results, indent=1))
            print(_line(candidate, stand_in, out, results[candidate]), flush=True)


def _line(candidate: str, stand_in: str, out: dict[str, Any], same: dict[str, Any]) -> str:
    """candidate, stand-in, seconds, torch ISA, and how many metrics equal the first
    stand-in's bit for bit."""
    if "error" in out:
        return f"{candidate:40s} {stand_in:14s} ERROR {out['error'][-300:]}"
    first = next(iter(same.values()))
    keys = [(r, k) for r, ms in out["metrics"].items() for k in ms]
    equal = sum(first.get("metrics", {}).get(r, {}).get(k) == out["metrics"][r][k]
                for r, k in keys)  # fmt: skip
    differ = sorted({r for r, k in keys
                     if first.get("metrics", {}).get(r, {}).get(k) != out["metrics"][r][k]})  # fmt: skip
    isa = (out.get("fingerprint") or {}).get("torch_cpu_isa")
    return (f"{candidate:40s} {stand_in:14s} {out['seconds']:7.1f} s "
            f"({out.get('cpu_seconds', 0):6.1f} s CPU)  {isa:8s} "
            f"{equal}/{len(keys)} bits equal to {next(iter(same))}"
            + (f"; differ: {', '.join(differ)}" if differ else ""))  # fmt: skip


if __name__ == "__main__":
    main()
