"""The performance model: memory fit and latency/throughput prediction (pure, no I/O)."""

from infertune_tuner.perfmodel.factors import Efficiency, default_efficiency
from infertune_tuner.perfmodel.latency import Percentiles, Prediction, StepModel, predict
from infertune_tuner.perfmodel.memory import MemoryEstimate, estimate_memory

__all__ = [
    "Efficiency",
    "MemoryEstimate",
    "Percentiles",
    "Prediction",
    "StepModel",
    "default_efficiency",
    "estimate_memory",
    "predict",
]
