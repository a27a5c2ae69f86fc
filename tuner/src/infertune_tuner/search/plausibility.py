"""Measurements that cannot be true are not evidence.

Two checks, applied to every trial before the search sees it (driver.py):

- **The decode bound.** Every decode step streams the weights once (at least the layers' weights
  of the experts a token touches, and the LM head; the input embedding is a lookup): at the GPU's
  peak memory bandwidth, a replica of TP GPUs running B sequences makes at most
  B x bandwidth / (weight bytes) output tokens per second per GPU, whatever else it does. A trial
  above it (by more than `SearchSettings.plausible_margin`) measured something else: published
  benchmark tables hold such rows (38k tok/s/GPU for a 7B model at batch 16 on an H100, ten times
  the bound: generation that ended at once).
- **Short outputs.** A trial whose responses averaged more than `SearchSettings.short_output`
  below the requested output length measured a shorter workload (the model stopped early, EOS).

Such a trial is `invalid` with the reason: recorded and reported, never the best, never a point
of the posterior, never a reason to rule a neighbour out.
"""

from __future__ import annotations

from infertune_tuner.catalog.gpus import Gpu
from infertune_tuner.catalog.llms import ModelArch
from infertune_tuner.catalog.quantization import QUANTIZATIONS
from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement


def decode_bound(model: ModelArch, gpu: Gpu, cfg: TrialConfig) -> float:
    """The most output tok/s/GPU `cfg` can physically make (see the module doc)."""
    streamed = (model.active_params - model.embedding_params) * QUANTIZATIONS[
        cfg.quantization
    ].weight_bytes
    return cfg.max_batch_size * gpu.hbm_bandwidth_gbs * 1e9 / max(streamed, 1.0)


def judged(
    m: Measurement,
    cfg: TrialConfig,
    *,
    model: ModelArch,
    gpu: Gpu,
    output_tokens: int,
    margin: float,
    short_output: float,
    speedup: float = 1.0,
) -> Measurement:
    """`m`, or the same measurement marked `invalid` with why it cannot be true.

    Args:
        m: What the trial measured.
        cfg: The configuration it ran.
        model: The model served (its weight bytes per token).
        gpu: The GPU (its peak memory bandwidth).
        output_tokens: The requested output length per request.
        margin: How far above the decode bound a measurement may be (datasheet rounding).
        short_output: How far below the requested length the mean output may fall.
        speedup: How much faster than the GPU the backend's clock runs (a time-scaled
            simulated server); the bound scales with it.
    """
    if m.status != "ok":
        return m
    tps = m.output_tokens_per_s_per_gpu or 0.0
    bound = decode_bound(model, gpu, cfg) * speedup
    if tps > bound * margin:
        return m.invalid(
            f"{tps:.0f} tok/s/GPU is {tps / bound:.1f}x what streaming the weights once per "
            f"decode step allows ({bound:.0f} at batch {cfg.max_batch_size} and "
            f"{gpu.hbm_bandwidth_gbs:.0f} GB/s): not a valid measurement (did generation stop "
            "early?)"
        )
    mean = m.output_tokens_mean
    if mean is not None and output_tokens > 0 and mean < output_tokens * (1 - short_output):
        return m.invalid(
            f"responses averaged {mean:.0f} output tokens of the {output_tokens} requested "
            f"({1 - mean / output_tokens:.0%} short: the model stopped early): the trial "
            "measured a shorter workload"
        )
    return m
