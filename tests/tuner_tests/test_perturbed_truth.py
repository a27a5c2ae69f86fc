"""A perturbed truth changes what it perturbs and keeps every other factor of the prior."""

from __future__ import annotations

import dataclasses

from infertune_tuner.backends.simulated import perturbed_truth
from infertune_tuner.perfmodel.factors import default_efficiency

PERTURBED = {
    "weight_bw", "kv_bw", "gemm", "prefill", "link", "allreduce_latency_us", "step_overhead_ms",
    "per_seq_overhead_us",
}  # fmt: skip


def test_unperturbed_factors_keep_the_priors_values() -> None:
    prior = default_efficiency("hopper")
    for seed in range(5):
        truth, _ = perturbed_truth("hopper", seed)
        for f in dataclasses.fields(truth):
            if f.name not in PERTURBED:
                assert getattr(truth, f.name) == getattr(prior, f.name), f.name
        assert any(getattr(truth, k) != getattr(prior, k) for k in PERTURBED)
        assert all(getattr(truth, k) <= 0.95 for k in ("weight_bw", "kv_bw", "gemm", "prefill"))
