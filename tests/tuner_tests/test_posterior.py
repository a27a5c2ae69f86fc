"""The posterior on the performance model's errors, its learned hyperparameters, and the
memory-fit probability."""

from __future__ import annotations

import math

import numpy as np
import pytest

from infertune_tuner.config import TrialConfig
from infertune_tuner.search.hyperprior import (
    Field,
    KindPrior,
    LogNormal,
    default_hyperprior,
    fit_hyperprior,
    roughness_likelihood,
)
from infertune_tuner.search.posterior import (
    FEATURES,
    TPS,
    Hyper,
    MemoryFit,
    Observation,
    Quantity,
    QuantityKey,
    feature_rows,
    kernel,
    learned_noise,
    noise_of,
)
from infertune_tuner.search.settings import SearchSettings

S = SearchSettings()
E2E_P95, TTFT_P99 = QuantityKey("e2e_ms", "p95"), QuantityKey("ttft_ms", "p99")


def cfg(tp: int, bs: int, q: str = "fp8", kv: str = "auto") -> TrialConfig:
    return TrialConfig(tp, bs, q, kv)


x = feature_rows  # the configurations' rows, as the posterior sees them


def fit(key: QuantityKey, obs: list[Observation], prior: KindPrior | None = None) -> Quantity:
    kind = prior or default_hyperprior().of(key.metric)
    return Quantity.fit(
        key, x([o.config for o in obs]), obs, particles=kind.particles(S.particles),
        noise=noise_of(key, S.run_noise), keep_mass=S.keep_mass,
        max_components=S.max_components,
    )  # fmt: skip


def noise(key: QuantityKey, repeats: list[list[float]]) -> float:
    return learned_noise(key, repeats, S.run_noise, S.noise_prior_weight)


def narrow(sigma_global: float, sigma_local: float, length: float = 1.5) -> KindPrior:
    """A hyperprior almost certain of one setting."""
    tight = 0.01
    return KindPrior(
        LogNormal(sigma_global, tight),
        LogNormal(sigma_local, tight),
        tuple(LogNormal(length, tight) for _ in FEATURES),
    )


def test_without_data_every_configuration_has_the_hyperpriors_uncertainty() -> None:
    q = fit(TPS, [], narrow(0.2, 0.3))
    mean, sd = q.marginal(x([cfg(1, 1), cfg(8, 256, "bf16", "fp8")]))
    assert np.allclose(mean, 0.0)
    assert np.allclose(sd, math.hypot(0.2, 0.3), rtol=0.03)


def test_a_measurement_moves_its_neighbourhood_more_than_far_configurations() -> None:
    q = fit(TPS, [Observation(cfg(2, 64), math.log(1.4))])
    mean, sd = q.marginal(x([cfg(2, 64), cfg(2, 96), cfg(8, 1, "bf16", "fp8")]))
    assert mean[0] == pytest.approx(math.log(1.4), abs=0.03)  # the measured point itself
    assert abs(mean[1] - mean[0]) < 0.05  # a neighbour shares the measured error ...
    assert mean[0] > mean[2] > 0  # ... a far configuration only the shared part of it
    assert sd[0] < sd[1] < sd[2]


def test_a_configuration_unlike_anything_measured_is_never_written_off() -> None:
    # Many TP2 measurements, all agreeing: the global error is known, the shape near TP2 too.
    obs = [Observation(cfg(2, b), math.log(1.2)) for b in (8, 16, 32, 64, 128, 256)]
    q = fit(TPS, obs)
    _, sd = q.marginal(x([cfg(2, 48), cfg(8, 8, "bf16", "fp8")]))
    assert sd[0] < 0.06  # interpolating between measured batches: well known
    # TP8 at 16-bit weights and KV: the shape error there is still the prior's.
    assert sd[1] > 0.5 * q.shape_error()


def test_a_run_whose_model_is_badly_wrong_learns_a_larger_shape_error() -> None:
    # The same hyperprior, two worlds: one where the model is right to 2 %, one where it is off
    # by -60 %..+80 % from one configuration to the next. The mixture's weight moves to the
    # settings that explain each, so the second run doubts its unmeasured neighbours more.
    batches = (8, 16, 32, 64, 128)
    calm = [Observation(cfg(2, b), 0.02 * (-1) ** i) for i, b in enumerate(batches)]
    wild = [Observation(cfg(2, b), (0.6, -0.5, 0.55, -0.4, 0.5)[i]) for i, b in enumerate(batches)]
    q_calm, q_wild = fit(TPS, calm), fit(TPS, wild)
    assert q_wild.shape_error() > 2 * q_calm.shape_error()
    far = [cfg(4, 24, "bf16")]
    assert q_wild.marginal(x(far))[1][0] > 1.5 * q_calm.marginal(x(far))[1][0]


def test_probability_agrees_with_the_mixtures_draws() -> None:
    q = fit(TPS, [Observation(cfg(2, 64), 0.3), Observation(cfg(2, 16), -0.2)])
    targets = [cfg(4, 32), cfg(1, 8, "bf16")]
    draws = q.sample(x(targets), 20000, np.random.default_rng(1))
    p = q.probability(x(targets), 0.1, below=False)
    assert p == pytest.approx((draws > 0.1).mean(axis=0), abs=0.02)


def test_repeats_average_the_noise_down() -> None:
    once = fit(E2E_P95, [Observation(cfg(2, 64), 0.1, repeats=1)])
    thrice = fit(E2E_P95, [Observation(cfg(2, 64), 0.1, repeats=3)])
    assert thrice.marginal(x([cfg(2, 64)]))[1][0] < once.marginal(x([cfg(2, 64)]))[1][0]


def test_twins_share_their_draws_and_draws_follow_the_posterior() -> None:
    q = fit(TPS, [Observation(cfg(4, 32), 0.3)])
    draws = q.sample(
        x([cfg(4, 32, "bf16"), cfg(4, 32, "fp16"), cfg(1, 4)]), 4000, np.random.default_rng(0)
    )
    assert np.array_equal(draws[:, 0], draws[:, 1])  # bf16 and fp16 weights: one point
    mean, sd = q.marginal(x([cfg(1, 4)]))
    assert draws[:, 2].mean() == pytest.approx(mean[0], abs=0.03)
    assert draws[:, 2].std() == pytest.approx(sd[0], rel=0.08)


def test_noise_is_learned_from_repeats_but_never_below_the_prior() -> None:
    assert noise(TPS, []) == pytest.approx(noise_of(TPS, S.run_noise))
    assert noise(TPS, [[0.1, 0.1], [0.2, 0.2]]) == pytest.approx(noise_of(TPS, S.run_noise))
    noisy = noise(TTFT_P99, [[0.0, 0.4], [0.1, -0.3], [0.2, 0.6]])
    assert noisy > 2 * noise_of(TTFT_P99, S.run_noise)


def _field(family: str, h: Hyper, seed: int, n: int = 40) -> Field:
    """A residual field drawn from the GP with setting `h` at random configurations."""
    rng = np.random.default_rng(seed)
    configs = {
        cfg(int(rng.choice([1, 2, 4, 8])), int(rng.choice([4, 8, 16, 32, 64, 128, 256])),
            str(rng.choice(["bf16", "fp8", "w4a16_awq"])), str(rng.choice(["auto", "fp8"])))
        for _ in range(3 * n)
    }  # fmt: skip
    rows = x(sorted(configs, key=lambda c: c.label())[:n])
    cov = kernel(rows, rows, h) + 1e-4 * np.eye(len(rows))
    y = np.linalg.cholesky(cov) @ rng.standard_normal(len(rows))
    return Field(family, "tps", rows, y)


def test_the_hyperprior_fit_recovers_the_scale_of_the_worlds_errors() -> None:
    # Two families of worlds: errors of 10 % and 40 % in the shape of the curves. The fitted
    # hyperprior's median lies between them and its width covers both.
    small = Hyper(0.05, 0.10, (1.5,) * len(FEATURES))
    large = Hyper(0.05, 0.40, (1.5,) * len(FEATURES))
    fields = [_field("calm", small, s) for s in range(4)]
    fields += [_field("wild", large, 10 + s) for s in range(4)]
    prior = fit_hyperprior(fields, source="test").of("tps")
    local = prior.sigma_local
    assert 0.10 < local.median < 0.40
    lo, hi = (local.median * math.exp(k * local.sd_log) for k in (-2, 2))
    assert lo < 0.10 and hi > 0.40  # both families' settings inside two standard deviations


def test_roughness_is_found_where_each_configuration_sits_off_the_smooth_field() -> None:
    # The same smooth world, once as it is and once with every configuration a fixed 6 % off
    # (a GEMM tactic, a padded batch): the likelihood peaks at the roughness each was given.
    noises = (0.01, 0.02, 0.04, 0.06, 0.10)
    smooth = _field("calm", Hyper(0.05, 0.2, (1.5,) * len(FEATURES)), 3, n=48)
    luck = np.random.default_rng(7).normal(0.0, 0.06, len(smooth.y))
    rough = Field("rough", "tps", smooth.x, smooth.y + luck)
    best = {
        f.family: noises[int(np.argmax(roughness_likelihood(f, noises)))] for f in (smooth, rough)
    }
    assert best["calm"] <= 0.02
    assert 0.04 <= best["rough"] <= 0.10


def test_a_kind_without_fields_borrows_the_throughput_prior() -> None:
    h = fit_hyperprior([_field("calm", Hyper(0.05, 0.1, (1.5,) * len(FEATURES)), 0)])
    assert h.of("ttft_ms") == h.of("tps")


def test_the_shipped_hyperprior_names_the_worlds_it_was_fitted_on() -> None:
    h = default_hyperprior()
    assert dict(h.worlds)  # families and how many worlds of each
    assert "fit_hyperprior" in h.source
    # TTFT depends on the server's admission policy, which the roofline only sketches: its
    # errors are larger a priori than those of throughput.
    assert h.of("ttft_ms").sigma_local.median > h.of("tps").sigma_local.median


def test_the_memory_frontier_is_a_probability() -> None:
    prior = MemoryFit.learn([], S)
    p = prior.probability(np.array([-0.1, 0.0, 0.2]))
    assert p[0] < 0.05 and p[1] == pytest.approx(0.5, abs=0.05) and p[2] > 0.99


def test_memory_fit_is_learned_from_ooms_and_successes() -> None:
    prior = MemoryFit.learn([], S)
    after_oom = MemoryFit.learn([(0.05, False)], S)  # predicted 5 % headroom, ran out of memory
    after_run = MemoryFit.learn([(-0.06, True)], S)  # predicted 6 % short, ran
    near = np.array([0.03])
    below = np.array([-0.04])
    assert after_oom.probability(near)[0] < 0.05 < prior.probability(near)[0]
    assert after_run.probability(below)[0] > 0.95 > prior.probability(below)[0]
