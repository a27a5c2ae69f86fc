"""The simulated GPU pool: noise, spread, OOM, and a truth that differs from the prior."""

from __future__ import annotations

from infertune_tuner.backends.simulated import SimulatedBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.perfmodel import predict

from .helpers import request


def test_deterministic_per_seed_and_config() -> None:
    cfg = TrialConfig(4, 64, "fp8", "auto")
    a = SimulatedBackend(request(), seed=1).run(cfg)
    b = SimulatedBackend(request(), seed=1).run(cfg)
    c = SimulatedBackend(request(), seed=2).run(cfg)
    assert a == b
    assert a.output_tokens_per_s_per_gpu != c.output_tokens_per_s_per_gpu


def test_percentile_spread_and_oom() -> None:
    sim = SimulatedBackend(request(), seed=0)
    m = sim.run(TrialConfig(4, 128, "fp8", "auto"))
    assert m.status == "ok" and m.ttft_ms and m.itl_ms and m.e2e_ms
    for p in (m.ttft_ms, m.itl_ms, m.e2e_ms):
        assert p.p50 < p.p95 <= p.p99
    oom = sim.run(TrialConfig(1, 8, "fp16", "auto"))
    assert oom.status == "oom" and "out of memory" in (oom.reason or "")


def test_tail_widens_with_prefill_interference() -> None:
    sim = SimulatedBackend(request(), seed=0, noise=0.0)
    small = sim.run(TrialConfig(8, 1, "fp8", "auto"))
    big = sim.run(TrialConfig(8, 256, "fp8", "auto"))
    assert small.itl_ms and big.itl_ms
    assert big.itl_ms.p95 / big.itl_ms.p50 > small.itl_ms.p95 / small.itl_ms.p50


def test_perturbed_truth_differs_from_the_prior() -> None:
    req = request()
    model, gpu, work = req.resolve_model(), req.resolve_gpu(), req.work
    ratios = set()
    for seed in range(4):
        sim = SimulatedBackend.perturbed(req, seed=seed)
        cfg = TrialConfig(4, 64, "fp8", "auto")
        measured = sim.run(cfg).output_tokens_per_s_per_gpu
        prior = predict(model, gpu, cfg, work).output_tokens_per_s_per_gpu
        assert measured is not None
        ratios.add(round(measured / prior, 3))
    assert len(ratios) >= 3
    assert max(abs(r - 1) for r in ratios) > 0.05
