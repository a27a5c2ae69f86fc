"""The posterior of an outcome as a whole: a slope in the model's error carries on (the kernel's
trend term), and the latencies Little's law ties to tok/s/GPU move with it
(LatencyMetric.throughput_tie, posterior.Posterior)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement
from infertune_tuner.perfmodel.latency import Percentiles
from infertune_tuner.search.evidence import Evidence
from infertune_tuner.search.hyperprior import KindPrior, LogNormal
from infertune_tuner.search.posterior import (
    FEATURES,
    TPS,
    Hyper,
    Observation,
    Posterior,
    Quantity,
    QuantityKey,
    feature_rows,
    kernel,
    log_bound,
    residuals,
)

from .helpers import Core, request

E2E_P95 = QuantityKey("e2e_ms", "p95")


def cfg(tp: int, bs: int, q: str = "fp8", kv: str = "auto") -> TrialConfig:
    return TrialConfig(tp, bs, q, kv)


x = feature_rows  # the configurations' rows, as the posterior sees them


def fit(obs: list[Observation], kind: KindPrior) -> Quantity:
    return Quantity.fit(
        TPS, x([o.config for o in obs]), obs, particles=kind.particles(64), noise=0.03,
        keep_mass=0.999, max_components=24,
    )  # fmt: skip


def prior(sigma_local: float = 0.05, trend: float = 0.0, length: float = 1.5) -> KindPrior:
    """A hyperprior almost certain of one setting (trend 0: no slope term)."""
    tight = 0.01
    trends = () if trend == 0 else (LogNormal(trend, tight), LogNormal(trend, tight))
    return KindPrior(
        LogNormal(0.05, tight),
        LogNormal(sigma_local, tight),
        tuple(LogNormal(length, tight) for _ in FEATURES),
        trends,
    )


def test_a_slope_seen_where_the_run_measured_carries_on() -> None:
    # The model's error grows by 0.1 per batch doubling from batch 16 to 64 (a batching
    # efficiency it has wrong). Without a slope term the posterior at batch 256 falls back
    # towards the shared error; with one it carries the slope on, and doubts it more the
    # farther it goes.
    obs = [Observation(cfg(2, b), 0.1 * math.log2(b / 16)) for b in (16, 32, 64)]
    flat = fit(obs, prior())
    sloped = fit(obs, prior(trend=0.2))
    mean_flat, _ = flat.marginal(x([cfg(2, 256)]))
    mean, sd = sloped.marginal(x([cfg(2, 128), cfg(2, 256)]))
    assert mean_flat[0] < 0.25  # the 0.4 the slope says at batch 256 is outside its reach
    assert mean[1] == pytest.approx(0.4, abs=0.05)
    assert mean[0] < mean[1] and sd[0] < sd[1]


def test_the_kernel_is_a_covariance() -> None:
    h = Hyper(0.1, 0.2, (1.5, 1.2, 2.0, 1.8, 3.0), (0.1, 0.07))
    rng = np.random.default_rng(0)
    configs = {
        cfg(int(rng.choice([1, 2, 4, 8])), int(rng.choice([1, 8, 64, 256])),
            str(rng.choice(["bf16", "fp8", "w4a16_awq"])))
        for _ in range(60)
    }  # fmt: skip
    rows = x(sorted(configs))
    k = kernel(rows, rows, h)
    assert np.allclose(k, k.T)
    assert np.linalg.eigvalsh(k).min() > -1e-9


def test_the_own_part_of_a_tied_latency_is_what_little_does_not_explain() -> None:
    req = request(e2e_p95=25600)
    core = Core(req)
    c = cfg(4, 64, "fp8", "fp8")
    p = core.prior.predictions[c]
    e2e = p.e2e_ms
    # 1.5x the predicted throughput, and an E2E 1/1.5 of the predicted, 10 % slower at p95 on
    # top: the own part is log(1.1).
    measured = Measurement.ok(
        {"ttft_ms": p.ttft_ms, "itl_ms": p.itl_ms,
         "e2e_ms": Percentiles(e2e.p50 / 1.5, e2e.p95 / 1.5 * 1.1, e2e.p99 / 1.5)},
        output_tokens_per_s_per_gpu=p.output_tokens_per_s_per_gpu * 1.5,
        concurrency=c.max_batch_size,
    )  # fmt: skip
    r = residuals(Evidence(req, {c: (measured,)}), core.prior)
    assert [b.tie for b in core.prior.bounds] == [-1.0]  # E2E (TTFT's tie is 0: its own)
    assert r.observations[E2E_P95][0].log_ratio == pytest.approx(math.log(1.1 / 1.5))
    assert r.own[E2E_P95][0].log_ratio == pytest.approx(math.log(1.1))


def faster_world_posterior() -> tuple[
    Posterior, list[TrialConfig], dict[QuantityKey, np.ndarray], float
]:
    """A run that measured TP4 x batch 64 at 1.6x the predicted tok/s/GPU (and E2E 1/1.6 of the
    predicted): the posterior, the TP4 batch 128/192 neighbours, their E2E log bounds and the
    log threshold a neighbour must beat (30 % above the measured tok/s/GPU)."""
    req = request(e2e_p95=12000)
    core = Core(req)
    priors = core.prior.predictions
    c = cfg(4, 64, "fp8", "fp8")
    p = priors[c]
    m = Measurement.ok(
        {"ttft_ms": p.ttft_ms, "itl_ms": p.itl_ms,
         "e2e_ms": Percentiles(*(v / 1.6 for v in (p.e2e_ms.p50, p.e2e_ms.p95, p.e2e_ms.p99)))},
        output_tokens_per_s_per_gpu=p.output_tokens_per_s_per_gpu * 1.6, concurrency=64,
    )  # fmt: skip
    post = Posterior.fit(residuals(Evidence(req, {c: (m,)}), core.prior), core.prior, core.settings)
    near = [cfg(4, 128, "fp8", "fp8"), cfg(4, 192, "fp8", "fp8")]
    [b] = core.prior.bounds
    bounds = {E2E_P95: log_bound(b.bound.max_ms, np.array([b.predicted[n] for n in near]))}
    need = math.log(p.output_tokens_per_s_per_gpu * 1.6 * 1.3)
    above = need - np.log([priors[x].output_tokens_per_s_per_gpu for x in near])
    return post, near, bounds, above  # type: ignore[return-value]


def test_a_faster_world_is_faster_in_throughput_and_latency_alike() -> None:
    post, near, bounds, above = faster_world_posterior()
    both = post.success(near, bounds, above)
    meets = post.success(near, bounds, None)
    beats = post.success(near, {}, above)
    # Tied by Little's law, "beats the best" and "meets the E2E bound" are nearly one event: the
    # less likely of the two implies the other, and together they are more likely than
    # independent errors would make them.
    assert np.all(both >= 0.97 * np.minimum(meets, beats))
    assert np.all(both <= np.minimum(meets, beats) + 1e-9)
    assert np.all(both > 1.1 * meets * beats)


def test_the_integrated_probability_agrees_with_the_joint_draws() -> None:
    post, near, bounds, above = faster_world_posterior()
    p = post.success(near, bounds, above)
    tps, lat = post.sample(near, 40000, np.random.default_rng(3), near)
    hits = (tps > above) & (lat[E2E_P95] < bounds[E2E_P95])
    assert p == pytest.approx(hits.mean(axis=0), abs=0.015)
