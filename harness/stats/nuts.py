"""The hierarchical model of harness.stats.hierarchical in NumPyro, and its NUTS chains: sampled
from a fixed PRNG key, so that a posterior regenerates draw for draw.

The model, for the differences x_ij (points of the main metric, method minus reference) on
seed j of protocol i, as the authors' Stan program states it (baycomp 1.0.3,
`hierarchical-t-test.stan`, and the tutorial code of Benavoli et al., JMLR 2017):

    x_i.     ~ MVN(delta_i 1, sigma_i^2 M)     M: 1 on the diagonal, rho elsewhere
    delta_i  ~ Student-t(nu, delta0, std0)     the protocols' mean differences, shrunk
    sigma_i  ~ Uniform(0, 1000 s_within)
    delta0   ~ Uniform(-max|x|, max|x|)        the paper's unif(-1, 1) on accuracies, as
    std0     ~ Uniform(0, 1000 s_among)        baycomp scales it to the data
    nu - 1   ~ Gamma(alpha, beta)  (rate beta)  nu > 1: the paper's truncation
    alpha    ~ Uniform(1, 2),  beta ~ Uniform(0.01, 0.1)

with the data first divided by the mean over protocols of their within-protocol standard
deviations, as baycomp does (s_within is then 1; s_among is the standard deviation of the
protocols' means, in those units; both with ddof 0, baycomp's np.std). The correlation rho
is 0 here: the seeds are independent trainings evaluated on one fixed split, not
cross-validation folds that share training data (docs/verdicts.md; the within-protocol test,
harness.stats.bayes.seed_probs, uses 0 for the same reason). baycomp's 1 / folds is
available for its own examples.

Two changes of computation that leave the posterior as it is:

- sigma_i is integrated out in closed form: under its uniform prior the seeds' likelihood of
  delta_i is (1/H) (2 pi)^(-n/2) det(M)^(-1/2) (1/2) (A/2)^((1-n)/2) Gamma((n-1)/2, A/(2 H^2)),
  A the quadratic form of the residuals in M^-1 and H the prior's upper bound. NUTS then
  samples delta_i without the funnel between delta_i and sigma_i (fewer divergences, a few
  times fewer gradient steps).
- nu - 1 is drawn as Gamma(alpha, 1) / beta, the same distribution as Gamma(alpha, beta),
  without the funnel between beta and nu.

The settings here (SEED, CHAINS, WARMUP, DRAWS, the priors' bounds, the step-size target)
fix a posterior besides its data: `settings()` lists them for the key of every kept
posterior (harness.stats.posteriors).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

MODEL_VERSION = 1  # part of every cached posterior's key: raise it when the model changes
SEED = 0  # the PRNG key of every comparison: its posterior regenerates draw for draw
CHAINS = 4  # side by side, one thread; R-hat compares them
WARMUP = 1000  # per chain, NUTS's adaptation of step size and mass matrix (Stan's default)
DRAWS = 2500  # per chain after warmup: 10,000 in all
RHO = 0.0  # the correlation of one protocol's seeds (docs/verdicts.md)
ALPHA_BOUNDS = (1.0, 2.0)  # nu - 1 ~ Gamma(alpha, beta): baycomp's lower_alpha, upper_alpha
BETA_BOUNDS = (0.01, 0.1)  # and lower_beta, upper_beta
UPPER_SIGMA = 1000.0  # baycomp's upper_sigma: the scales' priors reach 1000 sample sds
# A protocol with this many seeds or more is sampled as delta_i itself (centred); one with
# fewer as delta0 + std0 z_i (non-centred): its seeds alone give delta_i a likelihood
# ~ Student-t with n - 2 degrees of freedom (sigma_i integrated out), of infinite variance
# below 5 seeds, and a chain that samples such a delta_i centred sticks for hundreds of draws
# at small std0 (measured: R-hat 1.045 on 3-seed protocols; 1.002 with this rule).
CENTRED_SEEDS = 5
PAD = 8  # the arrays' sizes are multiples of this: one compiled sampler for most comparisons
TARGET_ACCEPT = 0.95  # NUTS's step-size target: 0.8 left divergences at small std0
# A comparison not converged is sampled once more, with a longer warmup and smaller steps (2
# of the 84 committed comparisons needed it: a chain stuck at a small nu; both then converged)
RETRY_WARMUP, RETRY_TARGET_ACCEPT = 2000, 0.99
_CHAINS: dict[tuple[int, ...], Any] = {}  # one compiled chain per padded shape


def settings() -> dict[str, Any]:
    """Everything besides the data that fixes a posterior (a kept one's key holds it; a
    change of the code that moves the draws raises MODEL_VERSION)."""
    return {"model": MODEL_VERSION, "seed": SEED, "chains": CHAINS, "warmup": WARMUP,
            "draws": DRAWS, "rho": RHO, "alpha": list(ALPHA_BOUNDS), "beta": list(BETA_BOUNDS),
            "upper_sigma": UPPER_SIGMA, "target_accept": TARGET_ACCEPT,
            "centred_seeds": CENTRED_SEEDS, "pad": PAD,
            "retry": {"warmup": RETRY_WARMUP, "target_accept": RETRY_TARGET_ACCEPT},
            "diagnostics": "rank-normalised split R-hat (bulk, folded), bulk ESS"}  # fmt: skip


@dataclass(frozen=True)
class Samples:
    """The draws that matter, in points: delta0, std0 and nu (each chains × draws), and the
    sampled protocols' delta_i (chains × draws × protocols)."""

    delta0: np.ndarray
    std0: np.ndarray
    nu: np.ndarray
    delta: np.ndarray
    divergent: int


def marginal_log_likelihood(x: Any, mask: Any, delta: Any, upper: Any, rho: Any = RHO) -> Any:
    """log p(x_i | delta_i) with sigma_i ~ Uniform(0, upper) integrated out, per protocol
    (rows of x, padded; mask marks the seeds, at least 2 a row): see the module's docstring.
    JAX arrays in, JAX arrays out (jit- and grad-safe)."""
    import jax.numpy as jnp
    from jax.scipy.special import gammaincc, gammaln

    n = mask.sum(axis=1)
    e = jnp.where(mask, x - delta[:, None], 0.0)
    total, squares = e.sum(axis=1), (e * e).sum(axis=1)
    quadratic = (squares - rho / (1 + (n - 1) * rho) * total**2) / (1 - rho)  # A = e' M^-1 e
    log_det = jnp.log1p((n - 1) * rho) + (n - 1) * jnp.log1p(-rho)
    shape = (n - 1) / 2
    return (-jnp.log(upper) - n / 2 * math.log(2 * math.pi) - log_det / 2 - math.log(2)
            - shape * jnp.log(quadratic / 2) + gammaln(shape)
            + jnp.log(gammaincc(shape, quadratic / (2 * upper**2))))  # fmt: skip


def _model(x, mask, rows, centred, known, known_mask, bounds):  # noqa: ANN001, ANN202
    """The hierarchical model in NumPyro, in the units of the scaled data. The arrays are
    padded to a few fixed shapes, so that one compiled sampler serves most comparisons:
    `rows` marks the protocols sampled (a padding row's delta is a standard normal, with no
    data: the others' posterior is unchanged), `known_mask` the known deltas; `bounds` the
    priors' upper bounds (delta0's, std0's, sigma_i's) and rho."""
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    # the arguments are checked before sampling; NumPyro's check of each distribution's
    # arguments would evaluate them eagerly at every trace
    quiet = {"validate_args": False}
    delta_high, std0_high, sigma_high, rho = bounds
    delta0 = numpyro.sample("delta0", dist.Uniform(-delta_high, delta_high, **quiet))
    std0 = numpyro.sample("std0", dist.Uniform(0.0, std0_high, **quiet))
    alpha = numpyro.sample("alpha", dist.Uniform(*ALPHA_BOUNDS, **quiet))
    beta = numpyro.sample("beta", dist.Uniform(*BETA_BOUNDS, **quiet))
    unit = numpyro.sample("nu_gamma", dist.Gamma(alpha, 1.0, **quiet))  # (nu - 1) beta
    nu = numpyro.deterministic("nu", 1.0 + unit / beta)
    t = dist.StudentT(nu, delta0, std0, **quiet)
    raw = numpyro.sample("raw", dist.ImproperUniform(dist.constraints.real, (), (x.shape[0],)))
    unit_t = dist.StudentT(nu, 0.0, 1.0, **quiet)
    delta = numpyro.deterministic("delta", jnp.where(centred, raw, delta0 + std0 * raw))
    prior = jnp.where(centred, t.log_prob(raw), unit_t.log_prob(raw))
    seeds = marginal_log_likelihood(x, mask, delta, sigma_high, rho)
    numpyro.factor("seeds", jnp.where(rows, prior + seeds, -0.5 * raw**2).sum())
    numpyro.factor("known", jnp.where(known_mask, t.log_prob(known), 0.0).sum())


def _jax() -> None:
    """64-bit floats and one thread on the CPU (the thread flags only where nobody set
    XLA_FLAGS before JAX started)."""
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false "
                          "intra_op_parallelism_threads=1")  # fmt: skip
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import numpyro

    numpyro.enable_x64()


def _chain(shape: tuple[int, int, int], warmup: int, draws: int, target_accept: float) -> Any:
    """The chains as one jitted function of (PRNG keys, a starting point, model arguments),
    compiled once per padded shape and process (NumPyro's MCMC would compile again for every
    chain and every run). Each chain starts at the starting point (`_start`, unconstrained)
    moved by uniform draws in (-1/2, 1/2) on every coordinate, adapts the step size and a
    diagonal mass matrix for `warmup` iterations, and returns its constrained draws and
    whether each transition diverged. The chains of one comparison run side by side
    (vectorised: half the time of one after another); a comparison is never batched with
    another, so its draws depend on its own data and key only."""
    key = (*shape, warmup, draws, target_accept)
    if key in _CHAINS:
        return _CHAINS[key]
    import jax
    from numpyro.infer.hmc import hmc
    from numpyro.infer.util import initialize_model

    example = (*_padded({"a": [0.0, 1.0]}, {}, shape)[0], (1.0, 1.0, 1.0, 0.0))
    info = initialize_model(jax.random.PRNGKey(0), _model, model_args=example, dynamic_args=True)
    init_kernel, sample_kernel = hmc(potential_fn_gen=info.potential_fn, algo="NUTS")

    def chain(rng_key: Any, start: Any, *args: Any) -> Any:
        start_key, run_key = jax.random.split(rng_key)
        leaves, tree = jax.tree.flatten(start)
        keys = jax.random.split(start_key, len(leaves))
        z = tree.unflatten([v + jax.random.uniform(k, v.shape, v.dtype, -0.5, 0.5)
                            for k, v in zip(keys, leaves, strict=True)])  # fmt: skip
        state = init_kernel(z, warmup, target_accept_prob=target_accept, model_args=args,
                            rng_key=run_key)  # fmt: skip

        def step(state: Any, _: Any) -> Any:
            state = sample_kernel(state, model_args=args)
            return state, (state.z, state.diverging)

        _, (zs, diverging) = jax.lax.scan(step, state, None, length=warmup + draws)
        kept = jax.tree.map(lambda v: v[warmup:], zs)
        return jax.vmap(info.postprocess_fn(*args))(kept), diverging[warmup:]

    _CHAINS[key] = jax.jit(jax.vmap(chain, in_axes=(0, None) + (None,) * len(example)))
    return _CHAINS[key]


def _start(
    scaled: Mapping[str, np.ndarray], pinned: Mapping[str, float], rows: int,
    delta_high: float, std0_high: float,
) -> dict[str, Any]:  # fmt: skip
    """Where the chains start, on the unconstrained scale: delta0 at the mean of the
    protocols' mean differences, std0 at their standard deviation (or 1, the within-protocol
    one, where they agree), each delta_i at its protocol's mean (on the non-centred scale
    where sampled so), the Gamma's alpha, beta and nu at the middle of their priors. The
    protocols' means can lie a hundred within-protocol deviations from 0 (MAP@R gaps of 10
    points against seed noise of 0.1): a chain started at NumPyro's default, uniform in
    (-2, 2), met gradients so steep there that its step size collapsed and it never moved
    (measured: R-hat 75 on triplet_global against multi_similarity)."""
    import jax.numpy as jnp

    def logit(p: float) -> float:  # p at 0 or 1: every difference the same but for rounding
        p = min(max(p, 1e-9), 1 - 1e-9)
        return math.log(p / (1 - p))

    means = [float(np.mean(r)) for r in scaled.values()] + list(pinned.values())
    centre = float(np.mean(means))
    spread = float(np.std(means)) if len(means) > 1 else 0.0
    spread = min(spread or 1.0, std0_high / 2)
    raw = np.zeros(rows)
    for i, r in enumerate(scaled.values()):
        mean = float(np.mean(r))
        raw[i] = mean if len(r) >= CENTRED_SEEDS else (mean - centre) / spread
    return {"delta0": jnp.asarray(logit((centre + delta_high) / (2 * delta_high))),
            "std0": jnp.asarray(logit(spread / std0_high)), "alpha": jnp.asarray(0.0),
            "beta": jnp.asarray(0.0), "nu_gamma": jnp.asarray(0.0), "raw": jnp.asarray(raw)}  # fmt: skip


def _padded(
    differences: Mapping[str, Sequence[float]], known: Mapping[str, float],
    shape: tuple[int, int, int] | None = None,
) -> tuple[tuple[Any, ...], tuple[int, int, int]]:  # fmt: skip
    """The model's array arguments (before the bounds), padded up to multiples of PAD (or to
    `shape`): x, its seed mask, the sampled rows, the known deltas and their mask. A padding
    row holds two seeds, -1 and 1, so that its (discarded) likelihood stays finite."""
    import jax.numpy as jnp

    def up(k: int) -> int:
        return PAD * max(1, math.ceil(k / PAD))

    width = max((len(d) for d in differences.values()), default=2)
    shape = shape or (up(len(differences)), up(width), up(len(known)))
    x, mask = np.zeros(shape[:2]), np.zeros(shape[:2], bool)
    x[:, :2], mask[:, :2] = (-1.0, 1.0), True
    rows = np.arange(shape[0]) < len(differences)
    for i, d in enumerate(differences.values()):
        x[i], mask[i] = 0.0, False
        x[i, : len(d)], mask[i, : len(d)] = d, True
    values = np.zeros(shape[2])
    values[: len(known)] = list(known.values())
    known_mask = np.arange(shape[2]) < len(known)
    centred = np.zeros(shape[0], bool)
    centred[: len(differences)] = [len(d) >= CENTRED_SEEDS for d in differences.values()]
    arrays = (x, mask, rows, centred, values, known_mask)
    return tuple(jnp.asarray(a) for a in arrays), shape


def sample(
    differences: Mapping[str, Sequence[float]], known: Mapping[str, float] | None = None, *,
    rho: float | None = None, seed: int | None = None, chains: int | None = None,
    warmup: int | None = None, draws: int | None = None, target_accept: float | None = None,
) -> Samples:  # fmt: skip
    """NUTS draws of the model for `differences` (protocol -> per-seed differences, in points,
    at least 2 each) and `known` (protocol -> a delta_i taken as known), with some spread
    among them all; chain c starts from the c-th split of PRNGKey(seed). Options left out
    are the module's settings (RHO, SEED, CHAINS, WARMUP, DRAWS, TARGET_ACCEPT) at the time
    of the call."""
    _jax()
    import jax

    rho, seed = RHO if rho is None else rho, SEED if seed is None else seed
    chains, warmup = CHAINS if chains is None else chains, WARMUP if warmup is None else warmup
    draws = DRAWS if draws is None else draws
    target_accept = TARGET_ACCEPT if target_accept is None else target_accept

    known = dict(known or {})
    rows = [np.asarray(d, np.float64) for d in differences.values()]
    means = [float(np.mean(r)) for r in rows] + list(known.values())
    # baycomp's units: the mean within-protocol standard deviation (ddof 0) is 1
    scale = float(np.mean([np.std(r) for r in rows])) if rows else 0.0
    scale = scale or float(np.std(means))
    if scale == 0:
        raise ValueError("nothing to sample: every difference is the same value")
    scaled = {p: r / scale for p, r in zip(differences, rows, strict=True)}
    pinned = {p: v / scale for p, v in known.items()}
    every = np.concatenate([*scaled.values(), list(pinned.values())])
    within = float(np.mean([np.std(r) for r in scaled.values()])) if rows else 0.0
    among = float(np.std(np.asarray(means) / scale)) if len(means) > 1 else within
    among = among or within  # every protocol the same mean: std0's prior would be a point
    within = within or among  # no protocol with seeds: the bound is not used
    arrays, shape = _padded(scaled, pinned)
    bounds = (float(np.abs(every).max()), UPPER_SIGMA * among, UPPER_SIGMA * within, float(rho))
    start = _start(scaled, pinned, shape[0], bounds[0], bounds[1])
    run = _chain(shape, warmup, draws, target_accept)
    keys = jax.random.split(jax.random.PRNGKey(seed), chains)
    values, diverging = run(keys, start, *arrays, bounds)
    v = {k: np.asarray(a, np.float64) for k, a in values.items()}  # chains × draws (× rows)
    return Samples(v["delta0"] * scale, v["std0"] * scale, v["nu"],
                   v["delta"][:, :, : len(rows)] * scale, int(np.asarray(diverging).sum()))  # fmt: skip
