from pathlib import Path

import pytest
import yaml

from harness.core import PROTOCOL_DIR, HarnessError, load_protocol, parse_protocol, protocol_names

BASE = yaml.safe_load((PROTOCOL_DIR / "smoke.yaml").read_text())


def with_change(path: str, value):
    data = yaml.safe_load((PROTOCOL_DIR / "smoke.yaml").read_text())
    *parents, last = path.split(".")
    node = data
    for p in parents:
        node = node[p]
    node[last] = value
    return data


def test_shipped_protocols_load():
    assert {"default", "smoke", "omniglot"} <= set(protocol_names())
    for name in protocol_names():
        p = load_protocol(name)
        assert p.name == name
        assert len(p.hash) == 16


def test_hash_ignores_comments_and_key_order_but_not_values(tmp_path: Path):
    original = load_protocol("smoke")
    text = (PROTOCOL_DIR / "smoke.yaml").read_text()
    (tmp_path / "a.yaml").write_text("# a comment\n" + text)
    assert load_protocol(str(tmp_path / "a.yaml")).hash == original.hash
    reordered = dict(reversed(list(BASE.items())))
    assert parse_protocol(reordered, "x").hash == original.hash
    assert parse_protocol(with_change("embedding_dim", 32), "x").hash != original.hash


def test_protocol_is_frozen():
    p = load_protocol("smoke")
    with pytest.raises(AttributeError):
        p.embedding_dim = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "change, message",
    [
        (("embeddding_dim", 3), "unknown key 'embeddding_dim' (did you mean 'embedding_dim'?)"),
        (("sampler.images_per_clas", 4), "did you mean 'images_per_class'"),
        (("embedding_dim", 0), "embedding_dim must be >= 1"),
        (("embedding_dim", "64"), "expected int"),
        (("sampler.images_per_class", -1), "images_per_class (K) must be at least 2"),
        (("split.train_fraction", 1.5), "train_fraction must be in (0, 1)"),
        (("budget", {"epochs": 1, "steps": 2}), "exactly one of epochs or steps"),
        (("optimizer.name", "adagrad"), "adam, adamw or sgd"),
        (("seeds", []), "at least one seed"),
        (("schema", 7), "schema 7 is not supported"),
        (("backbone.input_size", True), "expected int"),
        (("evaluation.clustering", "fais"), "must be harness or faiss, got 'fais' (did you mean"),
        (("evaluation.clustering", "sklearn"), "clustering (the k-means convention) must be"),
        (("evaluation.clustering", 1), "evaluation.clustering: expected str"),
    ],
)
def test_bad_values_are_one_line_errors(change, message):
    with pytest.raises(HarnessError) as info:
        parse_protocol(with_change(*change), "p.yaml")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_clustering_defaults_to_harness_and_leaves_the_hash_alone_at_its_default():
    smoke = load_protocol("smoke")
    assert smoke.evaluation.clustering == "harness"
    assert "clustering" not in smoke.content()["evaluation"]
    explicit = parse_protocol(with_change("evaluation.clustering", "harness"), "x")
    assert explicit.hash == smoke.hash
    faiss = parse_protocol(with_change("evaluation.clustering", "faiss"), "x")
    assert faiss.evaluation.clustering == "faiss" and faiss.hash != smoke.hash
    assert faiss.content()["evaluation"]["clustering"] == "faiss"


def test_missing_key_and_malformed_yaml(tmp_path: Path):
    data = dict(BASE)
    del data["sampler"]
    with pytest.raises(HarnessError, match="missing required key 'sampler'"):
        parse_protocol(data, "p.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nsampler: {classes_per_batch: 4,\n  images_per_class: [\n")
    with pytest.raises(HarnessError, match=r"bad.yaml:\d+: malformed YAML"):
        load_protocol(str(bad))


def test_unknown_protocol_name_suggests():
    with pytest.raises(HarnessError, match="did you mean 'smoke'"):
        load_protocol("smokee")


def test_an_installation_without_protocols_says_so(tmp_path: Path, monkeypatch):
    import harness.core.protocol

    monkeypatch.setattr(harness.core.protocol, "PROTOCOL_DIR", tmp_path)
    with pytest.raises(HarnessError, match="no shipped protocols in .*installation is incomplete"):
        load_protocol("smoke")
    assert load_protocol(str(PROTOCOL_DIR / "smoke.yaml")).name == "smoke"  # a path still works


def test_the_clone_finds_its_own_protocols_and_git_history():
    from harness.core import REFERENCE_FILE, source_tree
    from harness.records.provenance import _git

    repo = Path(__file__).resolve().parents[2]
    assert PROTOCOL_DIR == repo / "protocols" and REFERENCE_FILE.is_file()
    assert source_tree() == repo
    if (repo / ".git").exists():
        assert len(_git("rev-parse", "HEAD")) == 40


def test_an_installed_harness_records_no_git_commit(monkeypatch):
    """A virtualenv inside some other clone must not record that clone's commit."""
    import harness.records.provenance

    monkeypatch.setattr(harness.records.provenance, "source_tree", lambda: None)
    assert harness.records.provenance._git("rev-parse", "HEAD") == ""


@pytest.mark.parametrize("name", ["../../escape", "..", ".hidden", "a/b", "a\\b", "", "-x", "a b"])
def test_a_name_that_is_not_one_plain_folder_name_is_an_error(name: str):
    """The name is the results folder under --results-dir: nothing that leaves it."""
    with pytest.raises(HarnessError, match="name must start with a letter or digit"):
        parse_protocol(with_change("name", name), "x.yaml")


def test_shipped_protocol_names_and_plain_ones_are_accepted():
    for name in [*protocol_names(), "fair_cub200", "v1.2-test", "A9"]:
        assert parse_protocol(with_change("name", name), "x").name == name
