"""Run specifications: one per (method, seed), plain picklable data, so a sweep can run here,
in worker processes or as Ray tasks. `plan` parses the protocol once, resolves each method's
hyperparameters (the paper's, the protocol's overrides, or a tuned configuration) and fails
on bad input before any run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core import (
    METHODS,
    HarnessError,
    Protocol,
    RunContext,
    load_protocol,
    protocol_hyperparameters,
    resolve_device,
)
from harness.data import check_data_root
from harness.records import NO_TRACKING, TrackerConfig, read_result, result_path
from harness.sweep.identity import refuse_to_replace
from harness.sweep.preflight import check_protocol
from harness.sweep.tuned import load_overlay


@dataclass(frozen=True)
class RunSpec:
    """Everything one run needs; plain, picklable data, so a sweep can be shipped to other
    workers. `plan` fills in the parsed protocol, the method's resolved hyperparameters and
    the sweep's seeds once; a spec made by hand may give a protocol name or path instead, and
    `resolve` completes it."""

    protocol: Protocol | str = field(hash=False)  # parsed by plan; a name or path is parsed once
    method: str
    seed: int
    data_root: str | None = None
    device: str = "auto"
    max_steps: int | None = None
    results_dir: str = "results"
    force: bool = False
    weights: str | None = None  # a local ImageNet weights file (overrides backbone.weights_file)
    workers: int | None = None  # processes preparing batches (None: pipeline.default_workers)
    decoder: str = "pil"  # who decodes image files: "pil" (the workers) or "torch" (the device)
    compile: bool = False  # the training step's backbone through torch.compile
    hyperparameters: dict[str, Any] | None = field(default=None, hash=False)  # None: resolve
    sweep_seeds: tuple[int, ...] | None = None  # what the sweep asked for (None: the protocol's)
    # a tuned configuration (`run --tuned`): the tuning study's record; None: paper defaults
    tuning: dict[str, Any] | None = field(default=None, hash=False)
    # `run --save-embeddings`: the test embeddings, labels and flags beside the result
    save_embeddings: bool = False
    # `run --save-model`: the whole embedding network beside the result (harness.deploy)
    save_model: bool = False
    # `run --tracker`: where the run also reports as it trains; not part of the run's
    # identity (harness.sweep.identity): a tracked and an untracked run are the same run
    tracking: TrackerConfig = field(default=NO_TRACKING, compare=False)

    @property
    def run_name(self) -> str:
        """The method's folder under runs/<protocol>/: tuned runs apart from paper-default ones."""
        return f"{self.method}{TUNED_SUFFIX}" if self.tuning else self.method

    @property
    def parsed_protocol(self) -> Protocol:
        if isinstance(self.protocol, str):
            raise HarnessError(f"run spec for {self.method} is not resolved; call resolve() first")
        return self.protocol


def resolve(spec: RunSpec) -> RunSpec:
    """The spec with its protocol parsed and the method's hyperparameters resolved (defaults
    with the protocol's overrides; an unknown override is an error); a resolved spec as is."""
    protocol = load_protocol(spec.protocol) if isinstance(spec.protocol, str) else spec.protocol
    hyper = spec.hyperparameters
    if hyper is None:
        hyper = protocol_hyperparameters(protocol, spec.method)
    if protocol is spec.protocol and hyper is spec.hyperparameters:
        return spec
    return dataclasses.replace(spec, protocol=protocol, hyperparameters=hyper)


def resolve_all(specs: list[RunSpec]) -> list[RunSpec]:
    """Resolve a sweep, parsing each protocol named by path once (not once per spec)."""
    parsed: dict[str, Protocol] = {}
    for spec in specs:
        if isinstance(spec.protocol, str) and spec.protocol not in parsed:
            parsed[spec.protocol] = load_protocol(spec.protocol)
    return [
        resolve(dataclasses.replace(s, protocol=parsed[s.protocol]))
        if isinstance(s.protocol, str)
        else resolve(s)
        for s in specs
    ]


def _check_weights(protocol: Protocol, weights: str | None) -> None:
    """`--weights FILE` before any run: a file that exists, for a pretrained backbone."""
    if not weights:
        return
    if protocol.backbone.pretrained == "none":
        raise HarnessError(f"--weights loads pretrained weights, but protocol {protocol.name} "
                           f"trains its {protocol.backbone.name} from random weights "
                           "(backbone.pretrained: none): drop --weights")  # fmt: skip
    if not Path(weights).is_file():
        raise HarnessError(f"weights file {weights} does not exist (from --weights)")


def plan(
    protocol: Protocol,
    methods: list[str],
    seeds: list[int] | None = None,
    tuned: bool = False,
    **options: Any,
) -> list[RunSpec]:
    """One resolved RunSpec per (method, seed): the protocol parsed once, each method's
    hyperparameters resolved once (with `tuned`, the configuration `harness tune` found on
    validation classes); unknown methods, bad overrides and missing tunings fail before any run."""
    hyper = check_protocol(protocol, methods)  # what `validate` checks too
    tuning: dict[str, dict[str, Any] | None] = dict.fromkeys(methods)
    if tuned:
        for name in methods:
            overlay = load_overlay(options.get("results_dir", "results"), protocol, name,
                                   options.get("max_steps"))  # fmt: skip
            hyper[name] = METHODS.get(name).hyperparameters(
                overlay.get("hyperparameters"), f"{overlay['path']}: hyperparameters"
            )
            tuning[name] = {**overlay["study"], "overlay": overlay["path"]}
    _check_weights(protocol, options.get("weights"))
    check_data_root(protocol, options.get("data_root"))  # before any run folder exists
    asked = tuple(seeds if seeds is not None else protocol.seeds)
    specs = [
        RunSpec(
            protocol=protocol,
            method=m,
            seed=s,
            hyperparameters=hyper[m],
            sweep_seeds=asked,
            tuning=tuning[m],
            **options,
        )
        for m in methods
        for s in asked
    ]
    for spec in specs:  # before any run, not half-way through the sweep
        path = result_path(Path(spec.results_dir), protocol.name, spec.run_name, spec.seed)
        if path.exists() and not spec.force:
            refuse_to_replace(read_result(path), spec.max_steps, protocol.hash, path)
    return specs


TUNED_SUFFIX = "+tuned"


def run_context(spec: RunSpec, progress: bool = False) -> RunContext:
    """What every stage of a resolved spec's run reads: its protocol, seed and device, the
    process group it joined under torchrun, and its options."""
    return RunContext(
        protocol=spec.parsed_protocol, seed=spec.seed, device=resolve_device(spec.device),
        results_dir=Path(spec.results_dir), max_steps=spec.max_steps, workers=spec.workers,
        compile=spec.compile, progress=progress, weights=spec.weights, data_root=spec.data_root,
        decoder=spec.decoder,
    )  # fmt: skip
