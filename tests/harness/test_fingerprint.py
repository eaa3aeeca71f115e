"""The machine fingerprint names what decides float rounding, and only that."""

import json
import subprocess
import sys

import torch
from stand_in import other_kernels_env, plain_env

from harness.records import describe, environment, machine_fingerprint
from harness.records.fingerprint import fingerprint_id

PRINT_FP = "from harness.records.fingerprint import machine_fingerprint as f; import json; print(json.dumps(f()))"


def fingerprint_in_subprocess(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", PRINT_FP], capture_output=True, text=True,
                         env=env, check=True, timeout=120)  # fmt: skip
    return json.loads(out.stdout)


def test_fingerprint_records_processor_kernels_builds_and_threads():
    fp = machine_fingerprint()
    for key in ("cpu_vendor", "cpu_model", "torch_cpu_isa", "blas", "onednn", "numpy_blas",
                "torch_threads", "packages", "id"):  # fmt: skip
        assert fp[key] not in (None, ""), key
    assert fp["torch_cpu_isa"] == torch.backends.cpu.get_cpu_capability()
    assert machine_fingerprint()["id"] == fp["id"]  # stable
    assert environment(torch.device("cpu"))["fingerprint"]["id"] == fp["id"]
    assert fp["id"] in describe(fp) and fp["cpu_model"] in describe(fp)
    assert "unknown machine" in describe(None)


def test_id_follows_threads_but_not_core_count():
    fp = machine_fingerprint()
    assert fingerprint_id({**fp, "cpu_count": 999}) == fp["id"]
    assert fingerprint_id({**fp, "torch_threads": fp["torch_threads"] + 1}) != fp["id"]
    assert fingerprint_id({**fp, "cpu_model": "another processor"}) != fp["id"]


def test_the_isa_stand_in_gives_another_fingerprint():
    plain = fingerprint_in_subprocess(plain_env())
    stand_in = fingerprint_in_subprocess(other_kernels_env())
    assert plain["torch_cpu_isa"] != stand_in["torch_cpu_isa"]
    assert "ATEN_CPU_CAPABILITY" not in plain["kernel_env"]
    assert stand_in["kernel_env"]["ATEN_CPU_CAPABILITY"] in ("avx2", "default")
    assert stand_in["id"] != plain["id"]
    assert machine_fingerprint()["id"] != stand_in["id"]
