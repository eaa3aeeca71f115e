"""Search spaces: declared next to the paper defaults, checked when a method registers."""

import pytest

from harness.core import METHODS, Choice, Float, HarnessError, Int, register_method
from harness.core.search import check_space


class Trial:  # records what a space asks of optuna's Trial
    def suggest_float(self, name, low, high, *, log=False):
        return ("float", low, high, log)

    def suggest_int(self, name, low, high, *, log=False):
        return ("int", low, high, log)

    def suggest_categorical(self, name, choices):
        return ("choice", tuple(choices))


def test_ranges_ask_optuna_for_what_they_declare():
    assert Float(0.1, 1.0, log=True).suggest(Trial(), "m") == ("float", 0.1, 1.0, True)
    assert Int(1, 32).suggest(Trial(), "n") == ("int", 1, 32, False)
    assert Choice((True, False)).suggest(Trial(), "c") == ("choice", (True, False))
    assert Int(1, 4).contains(2) and not Int(1, 4).contains(2.5)


def test_a_space_must_name_hyperparameters_and_hold_the_paper_default():
    with pytest.raises(HarnessError, match="names 'margn', which is not one of its"):
        check_space("m", {"margn": Float(0, 1)}, {"margin": 0.5})
    with pytest.raises(HarnessError, match=r"paper default margin=2\.0 lies outside"):
        check_space("m", {"margin": Float(0.1, 1.0)}, {"margin": 2.0})
    with pytest.raises(HarnessError, match="paper default"):

        @register_method("bad_space_method", version=1, family="pairs",
                         search={"margin": Float(0.5, 1.0)})  # fmt: skip
        def build(ctx, *, margin: float = 0.2):
            raise AssertionError("never built")

    assert "bad_space_method" not in METHODS


def test_every_trained_method_declares_a_space():
    import harness.methods  # noqa: F401

    untuned = [n for n in METHODS.names() if not METHODS.get(n).search]
    assert set(untuned) <= {"untrained"}, untuned


@pytest.mark.parametrize("draws", [12])
def test_every_point_the_tuner_may_propose_builds(draws):
    """Random draws from each method's space (optuna's RandomSampler, as the tuner's TPE
    draws its first trials) must build under the tuning protocol: a space that proposes a
    value the method refuses (histogram's delta once did: 2 / delta must be whole) would end
    the study for every method after it."""
    import optuna
    import torch

    from harness.core import RunContext, load_methods, load_protocol
    from harness.core.method import protocol_hyperparameters
    from harness.train import build_model
    from harness.tune.trial import suggest

    load_methods()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    protocol = load_protocol("tuning")
    ctx = RunContext(protocol=protocol, seed=0, device=torch.device("cpu"))
    refused = []
    for name in METHODS.names():
        spec = METHODS.get(name)
        if not spec.search:
            continue
        base = protocol_hyperparameters(protocol, name)
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        for _ in range(draws):
            trial = study.ask()
            hyper = spec.hyperparameters(suggest(trial, base, spec.search), "a draw")
            try:
                build_model(ctx, name, hyper, in_channels=1, num_classes=70,
                            num_coarse_classes=5)  # fmt: skip
            except HarnessError as exc:
                refused.append((name, hyper, str(exc)))
                break
            study.tell(trial, 0.0)
    assert refused == []
