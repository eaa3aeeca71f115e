"""A method's name names its results folder (`runs/<protocol>/<method>/seed<k>.json`), so it
follows the protocols' rule, checked at registration, and every path built from a name is
checked again where it is built: a name like `../../escaped` never writes outside
--results-dir (issue #40)."""

from __future__ import annotations

import re

import pytest

import harness.core.protocol
from harness.cli import main
from harness.core import (
    METHODS,
    NAME_PATTERN,
    HarnessError,
    is_plain_name,
    load_methods,
    register_method,
)
from harness.records import result_path
from harness.sweep.policy import checkpoint_path
from harness.sweep.tuned import overlay_path, tuning_dir


def _build(ctx, *, margin: float = 0.5):
    raise AssertionError("never built")


BAD = ["../../escaped", "a/b", "a b", "x<y", ".hidden", "", "-dash", "contrastive+tuned",
       "pml:MyLoss", "a\\b", "tab\t"]  # fmt: skip


@pytest.mark.parametrize("name", BAD)
def test_register_method_refuses_a_name_that_is_not_one_plain_folder_name(name):
    with pytest.raises(HarnessError) as caught:
        register_method(name, version=1, family="pairs")(_build)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"method name {name!r} from built-in")
    assert "a method name must start with a letter or digit and hold only letters" in message
    assert name not in METHODS.names()


def test_a_plain_name_with_dots_dashes_and_digits_registers():
    try:
        register_method("my.loss-2_v1", version=1, family="pairs")(_build)
        assert "my.loss-2_v1" in METHODS.names()
    finally:
        METHODS.remove("my.loss-2_v1")


def test_every_built_in_method_and_the_protocols_share_the_one_rule():
    load_methods()
    assert METHODS.names() and all(is_plain_name(n) for n in METHODS.names())
    assert re.fullmatch(NAME_PATTERN, "cosine_margin") and not is_plain_name("../x")
    assert harness.core.protocol.is_plain_name is is_plain_name  # one rule, not two copies


@pytest.mark.parametrize("method", ["contrastive", "contrastive+tuned",
                                    "pml:TripletMarginLoss+BatchHardMiner+tuned"])  # fmt: skip
def test_result_paths_take_the_names_runs_use(method, tmp_path):
    assert result_path(tmp_path, "smoke", method, 3).parent == tmp_path / "runs" / "smoke" / method
    assert checkpoint_path(tmp_path, "smoke", method, 3).parent.parent.parent == (
        tmp_path / "checkpoints")  # fmt: skip
    assert overlay_path(tmp_path, "smoke", method).parent == tuning_dir(tmp_path, "smoke")


@pytest.mark.parametrize("protocol, method", [("smoke", "../../escaped"), ("..", "x"),
                                              ("smoke", "a/b"), ("smoke", ".."), ("a b", "x")])  # fmt: skip
def test_a_path_is_never_built_from_a_name_that_would_leave_its_folder(protocol, method, tmp_path):
    for build in (result_path, checkpoint_path):
        with pytest.raises(HarnessError, match="cannot name a results folder"):
            build(tmp_path, protocol, method, 0)
    with pytest.raises(HarnessError, match="cannot name a results folder"):
        overlay_path(tmp_path, protocol, method)


def test_a_name_that_slipped_past_registration_is_refused_before_any_run(tmp_path, capsys):
    """The second line of defence: a registry entry added without register_method's check."""
    load_methods()
    METHODS.add("../../escaped", METHODS.get("contrastive"))
    try:
        results = tmp_path / "a" / "b" / "results"
        code = main(["run", "--protocol", "smoke", "--method", "../../escaped",
                     "--results-dir", str(results), "--max-steps", "1"])  # fmt: skip
    finally:
        METHODS.remove("../../escaped")
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "method '../../escaped' cannot name a results folder" in err
    assert not results.exists() and not list(tmp_path.rglob("seed0.json"))
