"""Pinned numerics (issue 72): the check's runs take processor-independent kernels, so its
baselines hold bit for bit on any x86-64 processor with AVX2 and FMA; an ISA stand-in changes
nothing under them; a pinned baseline made on one processor is checked exactly on another;
`--update` writes only in the pinned mode, and a pinned check refuses a baseline of another
mode; a planted 0.01 MAP@R drop in one method fails."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from stand_in import other_kernels_env, plain_env

from harness.check import BASELINE_DIR, check
from harness.check.baselines import load_baseline
from harness.check.pinned import STATISTICAL_SEEDS, check_seeds, expect_exact
from harness.check.verdict import report
from harness.cli import main
from harness.core.numerics import (
    MODE_VAR,
    PINNED_ENV,
    PINNED_VERSION,
    is_pinned,
    mlas_level,
    numerics_id,
    pinned_environ,
    pinned_unavailable,
)
from harness.records import Environment, MethodInfo, ProtocolInfo, RunResult

REPO = Path(__file__).resolve().parents[3]
needs_pinned = pytest.mark.skipif(bool(pinned_unavailable()), reason=pinned_unavailable())
PRINT_FP = ("from harness.records.fingerprint import machine_fingerprint as f; import json; "
            "print(json.dumps(f()))")  # fmt: skip


def pinned(env: dict[str, str]) -> dict[str, str]:
    """`env` as pinned_environ leaves it for a worker process."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        with pinned_environ():
            return dict(os.environ)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_pinned_environ_overrides_a_stand_in_and_restores_it(monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "SSE4_2")
    monkeypatch.delenv("MKL_CBWR", raising=False)
    with pinned_environ():
        assert {k: os.environ[k] for k in PINNED_ENV} == PINNED_ENV
        assert "MKL_ENABLE_INSTRUCTIONS" not in os.environ
        assert os.environ[MODE_VAR] == f"pinned-{PINNED_VERSION}"
    assert os.environ["ATEN_CPU_CAPABILITY"] == "default"
    assert os.environ["MKL_ENABLE_INSTRUCTIONS"] == "SSE4_2"
    assert "MKL_CBWR" not in os.environ and MODE_VAR not in os.environ


@needs_pinned
def test_a_pinned_process_has_one_fingerprint_under_any_stand_in():
    def fingerprint(env: dict[str, str]) -> dict:
        out = subprocess.run([sys.executable, "-c", PRINT_FP], capture_output=True, text=True,
                             env=env, check=True, timeout=120, cwd=REPO)  # fmt: skip
        return json.loads(out.stdout)

    plain, stand_in = fingerprint(pinned(plain_env())), fingerprint(pinned(other_kernels_env()))
    assert plain["torch_cpu_isa"] == "AVX2" and is_pinned(plain)
    assert plain["numerics"]["onnxruntime_mlas"] == mlas_level()
    assert plain == stand_in  # the stand-in's variables are overridden or removed
    native = fingerprint(plain_env())
    assert "numerics" not in native and numerics_id(native) is None


def fake_fp(cpu: str, **changes) -> dict:
    """A pinned fingerprint of processor `cpu` (vendor/model fields), with `changes`."""
    fp = {"cpu_vendor": cpu, "cpu_model": f"{cpu} processor", "cpu_family_model_stepping": cpu,
          "cpu_count": 2, "torch_cpu_isa": "AVX2", "blas": "mkl", "onednn": "v3",
          "numpy_blas": "openblas Haswell", "kernel_env": dict(PINNED_ENV), "torch_threads": 1,
          "device": "cpu", "packages": {"torch": "2"}, "id": cpu,
          "numerics": {"mode": "pinned", "version": PINNED_VERSION, "holds": True,
                       "onnxruntime_mlas": "AVX512F"}}  # fmt: skip
    return {**fp, **changes}


def test_numerics_id_ignores_the_processor_but_not_the_kernels():
    intel, amd = fake_fp("GenuineIntel"), fake_fp("AuthenticAMD")
    assert numerics_id(intel) == numerics_id(amd) is not None
    assert numerics_id(fake_fp("x", torch_threads=2)) != numerics_id(intel)
    assert numerics_id(fake_fp("x", packages={"torch": "3"})) != numerics_id(intel)
    other_mlas = fake_fp("x", numerics={**intel["numerics"], "onnxruntime_mlas": "FMA3"})
    assert numerics_id(other_mlas) == numerics_id(intel)  # onnxruntime not used
    assert numerics_id(other_mlas, True) != numerics_id(intel, True)
    assert numerics_id(fake_fp("x", numerics={**intel["numerics"], "holds": False})) is None
    assert numerics_id({k: v for k, v in intel.items() if k != "numerics"}) is None


def test_mlas_level_follows_the_feature_bits_only():
    assert mlas_level(frozenset({"avx", "avx2", "fma", "avx512f"})) == "AVX512F"
    assert mlas_level(frozenset({"avx", "avx2", "fma"})) == "FMA3"
    assert mlas_level(frozenset({"sse2"})) == "SSE2"


def test_the_pinned_mode_needs_x86_64_and_the_cpu(monkeypatch):
    import platform

    assert "cuda" in pinned_unavailable("cuda") or "x86-64" in pinned_unavailable("cuda")
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert pinned_unavailable() == "the processor is aarch64, not x86-64"


def test_exact_seeds_where_pinned_and_more_seeds_where_statistical():
    base = {"fingerprint": fake_fp("GenuineIntel"), "seeds": list(range(20))}
    glyphs = SimpleNamespace(features=SimpleNamespace(cached=False, engine="torch"))
    assert expect_exact(base, True, glyphs) and not expect_exact(base, False, glyphs)
    assert check_seeds([0, 1, 2, 3], base["seeds"], True) == [0, 1, 2, 3]
    assert check_seeds([0, 1, 2, 3], base["seeds"], False) == list(range(STATISTICAL_SEEDS))
    assert check_seeds([0, 1], [0, 1, 2], False) == [0, 1, 2]


def runs_on(fp: dict, values: dict[str, list[float]]) -> dict:
    """Runs of methods with map@r `values` per seed, made on a machine of fingerprint `fp`."""
    runs = {m: [RunResult(status="ok", protocol=ProtocolInfo("p", 1, "h"), seed=s,
                          method=MethodInfo(m, 1), metrics={"map@r": v, "recall@1": 0.5})
                for s, v in enumerate(vs)] for m, vs in values.items()}  # fmt: skip
    for rs in runs.values():
        for r in rs:
            r.environment = Environment(fingerprint=fp)
    return runs


PINNED_BASE = {
    "format": 2, "protocol_hash": "h", "seeds": [0, 1, 2, 3], "fingerprint": fake_fp("GenuineIntel"),
    "methods": {m: {"version": 1, "metrics": {"map@r": vs, "recall@1": [0.5] * 4}}
                for m, vs in {"a": [0.50, 0.52, 0.48, 0.50], "b": [0.30, 0.32, 0.28, 0.31]}.items()},
}  # fmt: skip


def test_a_pinned_baseline_is_exact_on_another_processor_and_a_planted_drop_fails():
    protocol = SimpleNamespace(hash="h")
    same = {m: e["metrics"]["map@r"] for m, e in PINNED_BASE["methods"].items()}
    amd = fake_fp("AuthenticAMD")
    passed, out = report(PINNED_BASE, protocol, runs_on(amd, same), [0, 1, 2, 3], "auto",
                         Path("b.json"))  # fmt: skip
    assert passed, out
    assert "mode: exact (pinned numerics on both machines" in out
    assert "GenuineIntel" in out and "AuthenticAMD" in out  # both machines named
    dropped = {**same, "b": [v - 0.01 for v in same["b"]]}  # b's MAP@R 0.01 lower
    passed, out = report(PINNED_BASE, protocol, runs_on(amd, dropped), [0, 1, 2, 3], "auto",
                         Path("b.json"))  # fmt: skip
    assert not passed and "check FAILED (exact)" in out
    assert "CHANGED" in out and "1 failed" in out


@needs_pinned
def test_update_outside_the_pinned_mode_is_one_line(tmp_path: Path, capsys):
    args = ["check", "--update", "--reason", "r", "--numerics", "native", "--baselines",
            str(tmp_path), "--methods", "contrastive"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --update writes baselines only in the pinned mode")
    assert len(err.splitlines()) == 1 and not list(tmp_path.iterdir())


@needs_pinned
def test_a_baseline_of_another_mode_is_refused_with_the_command(tmp_path: Path, capsys):
    baseline = load_baseline(BASELINE_DIR / "regression.json")
    baseline["fingerprint"].pop("numerics", None)  # as written before issue 72: native
    (tmp_path / "regression.json").write_text(json.dumps(baseline))
    assert main(["check", "--baselines", str(tmp_path), "--methods", "contrastive"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "was written in native numerics, and this check runs in pinned numerics" in err
    assert "check --protocol regression --update --reason TEXT" in err


def test_the_committed_baselines_are_pinned():
    for name in ("regression", "photo_regression"):
        fp = load_baseline(BASELINE_DIR / f"{name}.json")["fingerprint"]
        assert is_pinned(fp), name
        assert fp["torch_cpu_isa"] == "AVX2" and fp["kernel_env"] == PINNED_ENV, name


@pytest.mark.slow
@needs_pinned
def test_a_planted_drop_of_001_map_at_r_in_one_method_fails_the_real_check(tmp_path: Path):
    """contrastive's MAP@R recorded 0.01 higher than it is (the same as the method dropping
    0.01): the pinned check fails that row, and passes the others."""
    baseline = load_baseline(BASELINE_DIR / "regression.json")
    values = baseline["methods"]["contrastive"]["metrics"]["map@r"]
    values[:] = [v + 0.01 for v in values]
    (tmp_path / "regression.json").write_text(json.dumps(baseline))
    passed, out = check("regression", ["contrastive"], tmp_path, full=True)
    assert not passed and "check FAILED (exact): 8/9 rows pass" in out, out
    changed = [line for line in out.splitlines() if "CHANGED" in line]
    assert len(changed) == 1 and "map@r" in changed[0] and "-0.0100" in changed[0], out


def test_the_statistical_design_sees_a_005_drop_in_every_method():
    """Where the check is statistical (no pinned mode: ARM, a GPU), STATISTICAL_SEEDS check
    seeds against the baseline's 20 bound every method's MAP@R drop well under 0.05, with the
    committed baseline's own seed spread standing in for the other machine's."""
    from harness.check.compare import WATCH_DROP, WATCH_METRIC, t_bound

    baseline = load_baseline(BASELINE_DIR / "regression.json")
    rows = sum(len(e["metrics"]) for e in baseline["methods"].values())
    bounds = {m: t_bound(e["metrics"][WATCH_METRIC], e["metrics"][WATCH_METRIC][:STATISTICAL_SEEDS], rows)
              for m, e in baseline["methods"].items()}  # fmt: skip
    assert max(bounds.values()) <= 0.8 * WATCH_DROP, sorted(bounds.items(), key=lambda x: -x[1])[:3]
