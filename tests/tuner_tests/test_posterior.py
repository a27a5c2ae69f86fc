"""The posterior on the performance model's errors and the memory-fit probability."""

from __future__ import annotations

import math

import numpy as np
import pytest

from infertune_tuner.config import TrialConfig
from infertune_tuner.search.memory_fit import WIDE_MARGIN, FitModel, ruled_out
from infertune_tuner.search.model import (
    SIGMA_GLOBAL,
    Observation,
    Quantity,
    learned_noise,
    local_sigma,
    noise_of,
)


def cfg(tp: int, bs: int, q: str = "fp8", kv: str = "auto") -> TrialConfig:
    return TrialConfig(tp, bs, q, kv)


def test_without_data_every_configuration_has_the_full_prior_uncertainty() -> None:
    q = Quantity.fit("tps", [])
    mean, sd = q.marginal([cfg(1, 1), cfg(8, 256, "bf16", "fp8")])
    assert np.allclose(mean, 0.0)
    assert np.allclose(sd, math.hypot(SIGMA_GLOBAL, local_sigma("tps")))


def test_a_measurement_moves_its_neighbourhood_more_than_far_configurations() -> None:
    q = Quantity.fit("tps", [Observation(cfg(2, 64), math.log(1.4))])
    mean, sd = q.marginal([cfg(2, 64), cfg(2, 96), cfg(8, 1, "bf16", "fp8")])
    assert mean[0] == pytest.approx(math.log(1.4), abs=0.02)  # the measured point itself
    assert mean[0] > mean[1] > mean[2] > 0  # the global error moves everything a little
    assert sd[0] < sd[1] < sd[2]


def test_a_configuration_unlike_anything_measured_is_never_written_off() -> None:
    # Many TP2 measurements, all agreeing: the global error is known, the shape near TP2 too.
    obs = [Observation(cfg(2, b), math.log(1.2)) for b in (8, 16, 32, 64, 128, 256)]
    q = Quantity.fit("tps", obs)
    _, sd = q.marginal([cfg(2, 48), cfg(8, 8, "bf16", "fp8")])
    assert sd[0] < 0.05  # interpolating between measured batches: well known
    # TP8 at 16-bit weights and KV: the shape error there is still the prior's.
    assert sd[1] > 0.8 * local_sigma("tps")


def test_ttft_and_tails_are_less_certain_a_priori_than_throughput() -> None:
    # TTFT is decided by the server's admission policy, which the roofline only sketches.
    assert local_sigma("ttft_ms/p99") > local_sigma("itl_ms/p95") > local_sigma("tps")
    assert local_sigma("e2e_ms/p99") > local_sigma("e2e_ms/p50")


def test_repeats_average_the_noise_down() -> None:
    once = Quantity.fit("e2e_ms/p95", [Observation(cfg(2, 64), 0.1, repeats=1)])
    thrice = Quantity.fit("e2e_ms/p95", [Observation(cfg(2, 64), 0.1, repeats=3)])
    assert thrice.marginal([cfg(2, 64)])[1][0] < once.marginal([cfg(2, 64)])[1][0]


def test_twins_share_their_draws_and_draws_follow_the_posterior() -> None:
    q = Quantity.fit("tps", [Observation(cfg(4, 32), 0.3)])
    draws = q.sample(
        [cfg(4, 32, "bf16"), cfg(4, 32, "fp16"), cfg(1, 4)], 4000, np.random.default_rng(0)
    )
    assert np.array_equal(draws[:, 0], draws[:, 1])  # bf16 and fp16 weights: one point
    mean, sd = q.marginal([cfg(1, 4)])
    assert draws[:, 2].mean() == pytest.approx(mean[0], abs=0.03)
    assert draws[:, 2].std() == pytest.approx(sd[0], rel=0.08)


def test_noise_is_learned_from_repeats_but_never_below_the_prior() -> None:
    assert learned_noise("tps", []) == pytest.approx(noise_of("tps"))
    assert learned_noise("tps", [[0.1, 0.1], [0.2, 0.2]]) == pytest.approx(noise_of("tps"))
    noisy = learned_noise("ttft_ms/p99", [[0.0, 0.4], [0.1, -0.3], [0.2, 0.6]])
    assert noisy > 2 * noise_of("ttft_ms/p99")


def test_memory_wide_margin_rules_out_and_the_frontier_is_a_probability() -> None:
    assert ruled_out(-WIDE_MARGIN - 0.01) and not ruled_out(-WIDE_MARGIN + 0.01)
    prior = FitModel.learn([])
    p = prior.probability(np.array([-0.1, 0.0, 0.2]))
    assert p[0] < 0.05 and p[1] == pytest.approx(0.5, abs=0.05) and p[2] > 0.99


def test_memory_fit_is_learned_from_ooms_and_successes() -> None:
    prior = FitModel.learn([])
    after_oom = FitModel.learn([(0.05, False)])  # predicted 5 % headroom, ran out of memory
    after_run = FitModel.learn([(-0.06, True)])  # predicted 6 % short, ran
    near = np.array([0.03])
    below = np.array([-0.04])
    assert after_oom.probability(near)[0] < 0.05 < prior.probability(near)[0]
    assert after_run.probability(below)[0] > 0.95 > prior.probability(below)[0]
