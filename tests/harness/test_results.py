import ast
import dataclasses
import io
import json
import os
import pickle
import re
import stat
import tokenize
from pathlib import Path

import pytest

from harness.core import HarnessError, load_protocol
from harness.records import (
    RunResult,
    load_results,
    read_result,
    result_path,
    write_json_atomic,
    write_result,
)
from harness.records.results import RESULT_SCHEMA, Record
from harness.report import render, write_leaderboard
from harness.sweep import RunSpec, plan, resolve


def run(method: str, seed: int, recall: float, status: str = "ok", hash_: str = "h1", **extra):
    record = {
        "schema": RESULT_SCHEMA,
        "status": status,
        "failure": None if status == "ok" else "loss became nan at step 3",
        "protocol": {"name": "p", "version": 1, "hash": hash_},
        "method": {"name": method, "version": 1, "hyperparameters": {}},
        "seed": seed,
        "training": {"max_steps": None},
        "environment": {"git_commit": "abc", "hardware": {"device": "cpu"}},
        "finished_at": "2026-11-22T00:00:00+00:00",
    }
    if status == "ok":
        record["metrics"] = {"recall@1": recall, "map@r": recall / 2}
        record["timings"] = {"images_per_second": 100.0, "seconds_per_epoch": 2.0}
    record.update(extra)
    return record


def test_atomic_write_never_leaves_half_a_file(tmp_path: Path):
    path = tmp_path / "r" / "seed0.json"
    write_json_atomic(path, {"a": 1})

    class Boom:
        pass

    with pytest.raises(TypeError):
        write_json_atomic(path, {"a": Boom()})  # fails half-way through serialising
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in path.parent.iterdir()] == ["seed0.json"]


def test_leaderboard_mean_std_over_seeds_and_failures_shown():
    text = render(
        [run("a", 0, 0.5), run("a", 1, 0.7), run("b", 0, 0.9), run("c", 0, 0, status="failed")]
    )
    lines = {
        line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")
    }
    # mean 60.0; sample std of (50, 70) = 14.142, standard error 10.0, t_{0.975, 1} = 12.706:
    # the 95 % t-interval's half-width is 127.1
    assert "60.0 ± 127.1" in lines["a"] and "| 2 " in lines["a"]
    assert "90.0" in lines["b"]
    assert "failed (loss became nan at step 3)" in lines["c"] and "| 0 " in lines["c"]
    order = [k for k in lines if k in ("a", "b", "c")]
    assert order == ["b", "a", "c"]  # best map@r (the main metric) first, failures last


def test_protocol_versions_and_short_budgets_get_separate_tables():
    text = render([run("a", 0, 0.5), run("a", 0, 0.9, hash_="h2"),
                   run("a", 1, 0.1, training={"max_steps": 5})])  # fmt: skip
    assert text.count("## p ") == 3
    assert "shortened to 5 steps, not comparable" in text


def test_leaderboard_errors(tmp_path: Path):
    with pytest.raises(HarnessError, match="no run results"):
        write_leaderboard(tmp_path)
    bad = tmp_path / "runs" / "p" / "a" / "seed0.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"schema": 1, "status": ')
    with pytest.raises(HarnessError, match="unreadable result file .*seed0.json"):
        load_results(tmp_path)


# --- typed results: schema, old files, round trip ---------------------------------------------

REPO = Path(__file__).resolve().parents[2]
COMMITTED = sorted((REPO / "results" / "reference").rglob("seed*.json"))


def _extras(record: Record) -> list[str]:
    """Keys the typed records did not recognise, anywhere in the record."""
    found = list(record.extra)
    for f in dataclasses.fields(record):  # type: ignore[arg-type]
        value = getattr(record, f.name)
        if isinstance(value, Record):
            found += [f"{f.name}.{k}" for k in _extras(value)]
    return found


def test_every_committed_result_loads_and_writes_back_the_same_json():
    assert len(COMMITTED) >= 18
    schemas = set()
    for path in COMMITTED:
        data = json.loads(path.read_text())
        result = read_result(path)
        assert result.schema == data["schema"]
        schemas.add(data["schema"])
        assert _extras(result) == [], path  # every key is a typed field
        # same keys, same order, same values: nothing is lost reading and writing a file
        assert json.dumps(result.to_json()) == json.dumps(data), path
    assert schemas == {1, RESULT_SCHEMA}  # old files and new ones, both committed


def test_schema_1_file_asks_for_the_protocols_seeds_and_schema_2_records_the_sweep():
    old = REPO / "results/reference/studies/default_v2/runs/default"  # a schema-1 file
    result = read_result(old / "triplet" / "seed0.json")
    assert result.sweep_seeds is None and result.asked_seeds() == [0]
    assert result.ok and result.metrics["recall@1"] > 0 and result.tuples.kind == "triplets"
    assert result.hardware.device == "cpu" and result.training.epoch_loss
    fresh = RunResult.from_json(
        {**result.to_json(), "schema": RESULT_SCHEMA, "sweep_seeds": [4, 5]}
    )
    assert fresh.asked_seeds() == [4, 5]
    assert list(fresh.to_json())[:7] == [
        "schema", "status", "failure", "protocol", "method", "seed", "sweep_seeds",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "schema, message",
    [
        (RESULT_SCHEMA + 1, "newer than this harness reads .*update the harness"),
        (0, "unknown schema 0 .*delete or move it"),
        ("1", "not a run result"),
    ],
)
def test_newer_unknown_and_malformed_schemas_are_refused_in_one_line(tmp_path, schema, message):
    path = tmp_path / "runs" / "p" / "a" / "seed0.json"
    write_json_atomic(path, {**run("a", 0, 0.5), "schema": schema})
    with pytest.raises(HarnessError, match=message) as info:
        load_results(tmp_path)
    assert "\n" not in str(info.value) and "seed0.json" in str(info.value)


def test_a_result_missing_a_required_key_names_it(tmp_path: Path):
    record = run("a", 0, 0.5)
    del record["protocol"]["hash"]
    path = tmp_path / "runs" / "p" / "a" / "seed0.json"
    write_json_atomic(path, record)
    with pytest.raises(HarnessError, match="malformed schema-2 run result .*'protocol.hash'"):
        read_result(path)


def test_the_clustering_convention_is_recorded_and_older_files_used_harness():
    old = RunResult.from_json(run("a", 0, 0.5, metrics={"recall@1": 0.5, "nmi": 0.4}))
    assert old.clustering_convention is None and old.kmeans_convention == "harness"
    assert "clustering_convention" not in old.to_json()  # an old file writes back unchanged
    assert RunResult.from_json(run("a", 0, 0.5)).kmeans_convention is None  # no nmi, no f1
    new = RunResult.from_json(
        run("a", 0, 0.5, metrics={"nmi": 0.4, "f1": 0.2}, clustering_convention="faiss")
    )
    assert new.kmeans_convention == "faiss" and new.extra == {}
    data = new.to_json()
    assert data["clustering_convention"] == "faiss"
    keys = list(data)  # written beside the metrics it describes
    assert keys.index("metrics") < keys.index("clustering_convention") < keys.index("timings")


def test_unknown_keys_survive_a_round_trip():
    data = {**run("a", 0, 0.5), "later_field": {"x": 1}}
    data["method"]["also_new"] = 3
    result = RunResult.from_json(data)
    assert result.extra == {"later_field": {"x": 1}} and result.method.extra == {"also_new": 3}
    assert result.to_json()["later_field"] == {"x": 1}
    assert result.to_json()["method"]["also_new"] == 3


def test_diagnostics_are_optional_and_typed():
    old = RunResult.from_json(run("a", 0, 0.5))  # a file from before the field
    assert old.diagnostics is None and "diagnostics" not in old.to_json()
    new = RunResult.from_json(run("a", 0, 0.5, diagnostics={"unit_auc": 0.7}))
    assert new.diagnostics == {"unit_auc": 0.7} and new.extra == {}
    assert RunResult.from_json(new.to_json()).diagnostics == {"unit_auc": 0.7}


# --- run specs: parsed once, resolved once, picklable -----------------------------------------


def test_plan_parses_the_protocol_once_and_its_specs_pickle():
    import harness.methods  # noqa: F401

    protocol = load_protocol("smoke")
    specs = plan(protocol, ["contrastive", "triplet"], [0, 3], results_dir="r")
    assert all(s.protocol is protocol for s in specs)  # the same parsed object, not a path
    assert specs[0].hyperparameters == {"margin": 1.0} and specs[0].sweep_seeds == (0, 3)
    again = pickle.loads(pickle.dumps(specs))  # what the spawn workers of sweep_pinned receive
    assert again == specs and again[0].parsed_protocol.hash == protocol.hash
    assert hash(again[0]) == hash(specs[0])  # still usable as a key
    assert resolve(again[0]) is again[0]  # a resolved spec is not parsed again
    by_name = resolve(RunSpec(protocol="smoke", method="contrastive", seed=0, results_dir="r"))
    assert by_name.parsed_protocol == protocol and by_name.hyperparameters == {"margin": 1.0}
    assert by_name.sweep_seeds is None  # made by hand: new_result records the protocol's seeds
    with pytest.raises(HarnessError, match="not resolved"):
        _ = RunSpec(protocol="smoke", method="contrastive", seed=0).parsed_protocol


def test_same_run_reads_typed_results(monkeypatch):
    import harness.sweep.policy as policy

    monkeypatch.setattr(policy, "machine_id", lambda: "here")
    old = RunResult.from_json(run("a", 0, 0.5, environment={"hardware": {"machine_id": "here"}}))
    new = RunResult.from_json(run("a", 0, 0.0, status="running"))
    assert policy._same_run(old, new)
    new.method.hyperparameters = {"margin": 2.0}
    assert not policy._same_run(old, new)
    new.method.hyperparameters = {}
    old.environment.hardware.machine_id = "elsewhere"  # made on another machine: rerun
    assert not policy._same_run(old, new)
    assert policy._differences(old, new) == ["made on another machine"]  # the log says why
    new.method.hyperparameters = {"margin": 2.0}
    assert policy._differences(old, new) == ["made on another machine", "other hyperparameters"]
    old.status, old.training = "failed", None  # a failed run's record may hold no training
    assert policy._differences(old, new) == ["a failed run"]


def test_the_machine_id_outlives_the_data_cache(tmp_path, monkeypatch):
    """The id lives in the user's configuration: a cleared or moved data cache does not make
    this machine another one (which would rerun and archive every finished result); an id
    kept in the cache by an older version is carried over."""
    from harness.records import machine_id

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("DML_HARNESS_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "machine-id").write_text("from-the-old-cache\n")
    assert machine_id() == "from-the-old-cache"
    monkeypatch.setenv("DML_HARNESS_CACHE", str(tmp_path / "another-cache"))
    assert machine_id() == "from-the-old-cache"
    assert (tmp_path / "config" / "dml-harness" / "machine-id").read_text().strip() == (
        "from-the-old-cache"
    )


# --- leaderboard honesty ----------------------------------------------------------------------


def test_an_incomplete_method_is_marked_and_ranked_below_complete_ones(tmp_path: Path):
    """`complete` finished all 3 seeds its sweep asked for; `partial` only 2 (seed 2 was cut
    off) but with a better mean: it is marked 2/3 and ranks below, not above."""
    seeds = {"sweep_seeds": [0, 1, 2]}
    runs = [run("complete", s, 0.5, **seeds) for s in (0, 1, 2)]
    runs += [run("partial", s, 0.9, **seeds) for s in (0, 1)]
    for record in runs:
        path = result_path(tmp_path, "p", record["method"]["name"], record["seed"])
        write_result(path, RunResult.from_json(record))
    text = write_leaderboard(tmp_path).read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and "method" not in line]
    assert [r.split("|")[1].strip() for r in rows] == ["complete", "partial"]
    assert "| 3 " in rows[0] and "incomplete" not in rows[0]
    assert "2/3 (incomplete)" in rows[1] and "not finished: seed 2" in rows[1]
    assert "90.0" in rows[1]  # the partial mean is shown, marked, never as a full one


def test_a_failed_seed_makes_a_row_incomplete_and_old_files_ask_for_the_protocols_seeds():
    content = {"content": {"seeds": [0, 1]}}
    a = [run("a", s, 0.9, protocol={"name": "p", "version": 1, "hash": "h1", **content})
         for s in (0, 1)]  # fmt: skip
    b = [run("b", 0, 0.95, protocol={"name": "p", "version": 1, "hash": "h1", **content}),
         run("b", 1, 0, status="failed", protocol={"name": "p", "version": 1, "hash": "h1",
                                                  **content})]  # fmt: skip
    lines = [line for line in render(a + b).splitlines() if line.startswith("| ")][1:]
    assert lines[0].startswith("| a ") and "| 2 " in lines[0]
    assert lines[1].startswith("| b ") and "1/2 (incomplete)" in lines[1]
    assert "seed 1: failed" in lines[1]


def test_a_method_that_cannot_run_on_the_protocol_is_n_a_not_incomplete():
    """A method that needs coarse labels on a dataset without them: every seed is recorded
    not applicable; its row says `n/a` and why, once, below the methods that ran, and is
    neither incomplete nor tested. A method with one failed seed stays incomplete."""
    content = {"protocol": {"name": "p", "version": 1, "hash": "h1", "content": {"seeds": [0, 1]}}}
    why = "quadruplet needs coarse labels; caltech101 has none"
    runs = [run("a", s, 0.9, **content) for s in (0, 1)]
    runs += [run("b", 0, 0.5, **content), run("b", 1, 0, status="failed", **content)]
    runs += [run("quad", s, 0, status="not_applicable", **content) | {"failure": why}
             for s in (0, 1)]  # fmt: skip
    lines = [line for line in render(runs).splitlines() if line.startswith("| ")][1:]
    assert [line.split("|")[1].strip() for line in lines] == ["a", "b", "quad"]
    cells = [c.strip() for c in lines[2].split("|")[2:-1]]
    assert cells[0] == "n/a" and cells[-1] == f"not applicable: {why}"
    assert "incomplete" not in lines[2] and "n/a" in cells[1]
    assert "1/2 (incomplete)" in lines[1] and "n/a" not in lines[1]


def test_parts_table_is_labelled_without_naming_a_method():
    parts = {"metrics_by_part": {"head1": {"recall@1": 0.4}, "head2": {"recall@1": 0.6}}}
    text = render([run("composite", 0, 0.7, **parts)])
    assert "composite / head1" in text and "composite / head2" in text
    assert "each part scored alone as `method / part`" in text and "HDC" not in text


def _named_methods(path: Path, names: set[str]) -> list[str]:
    """String literals equal to a method's name, and comments or strings that name one of the
    methods' papers, outside docstrings."""
    source = path.read_text()
    docstrings = {
        node.body[0].lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.body and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }  # fmt: skip
    pattern = re.compile(r"\b(HDC|PDDM|LMDM|" + "|".join(n for n in names if "_" in n) + r")\b")
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.STRING and token.start[0] not in docstrings:
            value = ast.literal_eval(token.string) if token.string[0] in "'\"" else ""
            if isinstance(value, str) and (value in names or pattern.search(value)):
                found.append(f"{path.name}:{token.start[0]} {token.string[:50]}")
        elif token.type == tokenize.COMMENT and pattern.search(token.string):
            found.append(f"{path.name}:{token.start[0]} {token.string[:50]}")
    return found


# Files other branches of the redesign clean up (issue 12); empty this once they are merged.


def test_harness_code_names_no_method_outside_docstrings(tmp_path: Path):
    import harness.methods  # noqa: F401

    from harness.core import METHODS

    names = set(METHODS.names())
    files = sorted((REPO / "harness").rglob("*.py"))
    assert len(files) > 10
    assert [hit for p in files for hit in _named_methods(p, names)] == []
    planted = tmp_path / "planted.py"  # the scan does see a name in code, and skips docstrings
    planted.write_text('"""HDC and contrastive, in a docstring."""\n'
                       'LOOSE = ("contrastive",)  # per-method tolerance for HDC\n')  # fmt: skip
    assert [hit.split()[0] for hit in _named_methods(planted, names)] == ["planted.py:2"] * 2


def test_a_sweep_of_specs_by_path_parses_each_protocol_once(monkeypatch):
    import harness.methods  # noqa: F401

    import harness.sweep.spec as spec_module

    calls = []
    monkeypatch.setattr(
        spec_module, "load_protocol", lambda name: calls.append(name) or load_protocol(name)
    )
    specs = [RunSpec(protocol="smoke", method=m, seed=s) for m in ("contrastive", "triplet")
             for s in (0, 1)]  # fmt: skip
    resolved = spec_module.resolve_all(specs)
    assert calls == ["smoke"]
    assert len({id(s.protocol) for s in resolved}) == 1
    assert [s.hyperparameters for s in resolved[::2]] == [{"margin": 1.0}, {"margin": 0.2}]


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_result_files_get_the_umasks_mode_not_0600(tmp_path: Path, umask: int):
    previous = os.umask(umask)
    try:
        write_json_atomic(tmp_path / "seed0.json", {"a": 1})
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "seed0.json").stat().st_mode) == 0o666 & ~umask


def test_leaderboard_writers_never_share_a_temporary_file(tmp_path: Path):
    """Two `leaderboard` processes at once: each writes its own temporary file (a fixed
    name let one rename the other's away). Stand-in: the fixed name is taken."""
    path = tmp_path / "runs" / "p" / "a" / "seed0.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(run("a", 0, 0.5)))
    (tmp_path / "LEADERBOARD.md.tmp").mkdir()  # another writer's, in the way
    assert write_leaderboard(tmp_path).read_text().startswith("# Leaderboard")
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["LEADERBOARD.md"]
