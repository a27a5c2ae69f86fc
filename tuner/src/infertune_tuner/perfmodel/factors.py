"""Achieved-efficiency factors: the fraction of datasheet peak a serving stack reaches.

One set per GPU generation (never per configuration), fitted by `benchmarks/calibrate.py` against
the public Llama-2-70B A100/H100 sweep (TensorRT-LLM v0.5, see docs/performance-model.md).
Ada and Turing borrow Ampere's factors and Blackwell Hopper's until measurements exist; the
tuner refits a correction from its own trials anyway.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class Efficiency:
    weight_bw: float  # fraction of HBM bandwidth reached streaming weights in decode
    kv_bw: float  # fraction of HBM bandwidth reached reading the KV cache in attention
    gemm: float  # fraction of tensor-core peak in decode GEMMs
    prefill: float  # fraction of tensor-core peak in prefill
    link: float  # fraction of link bandwidth reached by all-reduce
    allreduce_latency_us: float  # fixed cost of one all-reduce (launch + sync)
    step_overhead_ms: float  # scheduler, sampling, launch gaps per engine step
    per_seq_overhead_us: float  # per active sequence per step (sampling, detokenisation)

    def scaled(self, **factors: float) -> Efficiency:
        """A copy with fields multiplied by the given factors (used for perturbed truths)."""
        return replace(self, **{k: getattr(self, k) * v for k, v in factors.items()})


# Fitted by benchmarks/calibrate.py (see docs/performance-model.md for the residuals).
HOPPER = Efficiency(
    weight_bw=0.8496,
    kv_bw=0.2063,
    gemm=0.3032,
    prefill=0.8,
    link=0.3687,
    allreduce_latency_us=4.4366,
    step_overhead_ms=8.3955,
    per_seq_overhead_us=1.0,
)
AMPERE = Efficiency(
    weight_bw=0.6831,
    kv_bw=0.3056,
    gemm=0.2633,
    prefill=0.7899,
    link=0.3687,
    allreduce_latency_us=4.4366,
    step_overhead_ms=8.3955,
    per_seq_overhead_us=1.0,
)

BY_ARCHITECTURE: dict[str, Efficiency] = {
    "turing": AMPERE,
    "ampere": AMPERE,
    "ada": AMPERE,
    "hopper": HOPPER,
    "blackwell": HOPPER,
}


def default_efficiency(architecture: str) -> Efficiency:
    return BY_ARCHITECTURE[architecture]
