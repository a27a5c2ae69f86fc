"""Quantization formats: bytes per weight, which tensor-core path runs the GEMMs, accuracy cost.

Accuracy costs are the documented, typical losses versus 16-bit weights (percent, MMLU-style),
used to decide whether a format is a candidate under `spec.search.maxAccuracyLossPercent`:

- fp8 (ModelOpt FP8, per-tensor scales): < 1 % -> 0.5
- w4a8_awq (INT4 weights, FP8 activations): 1-2 % -> 1.5
- w4a16_awq (INT4 AWQ, 16-bit activations): 1-2 % MMLU -> 2.0 (one public Llama-2-70B study
  measured a 7 % perplexity change; the allowance is about task accuracy, so 2.0 stands)
- nvfp4 (FP4 E2M1 with FP8 block scales): about 1 % on large models -> 1.5
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ComputePath = Literal["bf16", "fp8", "fp4"]


@dataclass(frozen=True, slots=True)
class QuantSpec:
    key: str
    weight_bytes: float  # bytes per quantized weight, block scales included
    compute: ComputePath  # which tensor-core throughput the GEMMs run at
    compute_efficiency: float  # extra factor for dequantisation work in mixed-precision GEMMs
    accuracy_loss_percent: float
    description: str


QUANTIZATIONS: dict[str, QuantSpec] = {
    "bf16": QuantSpec("bf16", 2.0, "bf16", 1.0, 0.0, "16-bit brain float weights and activations"),
    "fp16": QuantSpec("fp16", 2.0, "bf16", 1.0, 0.0, "16-bit float weights and activations"),
    "fp8": QuantSpec("fp8", 1.0 + 4 / 4096, "fp8", 1.0, 0.5, "FP8 E4M3 weights and activations"),
    # INT4 weights with one fp16 scale per group of 128 weights.
    "w4a16_awq": QuantSpec(
        "w4a16_awq", 0.5 + 2 / 128, "bf16", 0.7, 2.0, "INT4 AWQ weights, 16-bit activations"
    ),
    "w4a8_awq": QuantSpec(
        "w4a8_awq", 0.5 + 2 / 128, "fp8", 0.7, 1.5, "INT4 AWQ weights, FP8 activations"
    ),
    # FP4 E2M1 with one FP8 scale per block of 16 weights.
    "nvfp4": QuantSpec("nvfp4", 0.5 + 1 / 16, "fp4", 0.85, 1.5, "NVFP4 weights and activations"),
}

KV_DTYPE_BYTES: dict[str, float] = {"auto": 2.0, "fp8": 1.0}
