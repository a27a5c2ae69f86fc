"""World families: which real effect a simulated pool exaggerates, and its hidden constants.

Every world draws its constants from ranges seen on real stacks (`_base`); a family then turns
one effect on or up. Each stands for something real that bends the curves in ways a roofline
has no term for:

- `admission`: prompts are prefilled in separate steps that stall every decode (no chunked
  prefill, as in schedulers that prioritise prefill); arrivals cluster in a closed loop, so TTFT
  and ITL grow with batch faster than the model's picture and their tails widen with load.
- `interconnect`: all-reduce cost dominated by per-call latency on PCIe-class links (tens of
  microseconds per call, two calls per layer), and better than modelled on NVLink (low latency,
  high achieved bandwidth, as with NVLS/one-shot kernels).
- `quantization`: the FP8 decode gain is large at small batch (~30 % lower TPOT below batch 8)
  and fades to ~10 % at large batch, as published H100 measurements show; 4-bit weight GEMMs
  pay dequantisation in the mainloop, a compute cost that grows with batch.
- `memory`: the memory frontier sits elsewhere: a workspace that grows with the max batch, a
  different usable fraction for the KV cache, a larger or smaller runtime reserve, larger KV
  blocks. Configurations the memory model calls borderline do or don't fit.
- `cuda-graphs`: decode steps whose batch size has no captured CUDA graph (upstream captures a
  fixed list unless padding is on) pay kernel-launch time per layer.
- `noisy`: run-to-run noise of 3-4 % and outliers in 3-6 % of runs (stragglers, slow phases).
- `mixed`: all of the above at once, with noise of 1-4 % and rare outliers.
- `own-model`: the tuner's own performance model with perturbed efficiency factors (the old
  benchmark worlds, kept as one family among several: the prior has the right shape there).
"""

from __future__ import annotations

import random
from dataclasses import replace

from infertune_tuner.catalog.gpus import Gpu
from worlds.physics import Knobs

FAMILIES = (
    "admission",
    "interconnect",
    "quantization",
    "memory",
    "cuda-graphs",
    "noisy",
    "mixed",
    "own-model",
)
# Upstream TensorRT-LLM's default CUDA-graph batch sizes without padding (a fixed list).
CAPTURED_BATCHES = frozenset({1, 2, 4, 8, 16, 32, 64, 128})


def _base(rng: random.Random, gpu: Gpu) -> Knobs:
    pcie = gpu.link == "pcie"
    return Knobs(
        bw_eff=rng.uniform(0.62, 0.88),
        attn_eff=rng.uniform(0.35, 0.8),
        mma_eff=rng.uniform(0.3, 0.65),
        prefill_eff=rng.uniform(0.45, 0.75),
        soft_p=rng.uniform(2.5, 6.0),
        ar_latency_us=rng.uniform(12.0, 22.0) if pcie else rng.uniform(5.0, 10.0),
        ar_bw_eff=rng.uniform(0.35, 0.6),
        step_ms=rng.uniform(0.5, 3.0),
        per_seq_us=rng.uniform(5.0, 35.0),
        launch_us_per_layer=rng.uniform(30.0, 80.0),
        graph_batches=None,
        fp8_ratio_small=None,
        fp8_ratio_large=0.9,
        fp8_knee=8.0,
        w4_compute_mult=rng.uniform(1.1, 1.4),
        stall_prefill=False,
        chunk_overlap=rng.uniform(0.1, 0.4),
        sync=rng.uniform(0.01, 0.04),
        usable_fraction=rng.uniform(0.88, 0.92),
        reserve_gib=rng.uniform(1.2, 2.2),
        workspace_gib=rng.uniform(0.0, 0.6),
        workspace_mib_per_seq=rng.uniform(0.5, 2.0),
        block_tokens=64,
        noise=rng.uniform(0.01, 0.02),
        outlier_rate=0.0,
    )


def _admission(k: Knobs, rng: random.Random) -> Knobs:
    return replace(k, stall_prefill=True, sync=rng.uniform(0.05, 0.15))


def _interconnect(k: Knobs, rng: random.Random, gpu: Gpu) -> Knobs:
    if gpu.link == "pcie":
        return replace(k, ar_latency_us=rng.uniform(30.0, 70.0), ar_bw_eff=rng.uniform(0.3, 0.5))
    return replace(k, ar_latency_us=rng.uniform(1.5, 3.5), ar_bw_eff=rng.uniform(0.65, 0.85))


def _quantization(k: Knobs, rng: random.Random) -> Knobs:
    return replace(
        k,
        fp8_ratio_small=rng.uniform(0.64, 0.74),
        fp8_ratio_large=rng.uniform(0.86, 0.93),
        fp8_knee=rng.uniform(6.0, 20.0),
        w4_compute_mult=rng.uniform(1.8, 3.2),
    )


def _memory(k: Knobs, rng: random.Random) -> Knobs:
    return replace(
        k,
        usable_fraction=rng.uniform(0.8, 0.97),
        reserve_gib=rng.uniform(0.5, 3.5),
        workspace_gib=rng.uniform(0.0, 1.5),
        workspace_mib_per_seq=rng.uniform(2.0, 30.0),
        block_tokens=rng.choice((64, 128)),
    )


def _graphs(k: Knobs, rng: random.Random) -> Knobs:
    return replace(k, graph_batches=CAPTURED_BATCHES, launch_us_per_layer=rng.uniform(35.0, 90.0))


def _noisy(k: Knobs, rng: random.Random) -> Knobs:
    return replace(k, noise=rng.uniform(0.03, 0.04), outlier_rate=rng.uniform(0.03, 0.06))


def knobs_for(family: str, gpu: Gpu, seed: int, salt: str = "") -> Knobs:
    """The hidden constants of world `family` on `gpu` (deterministic per seed and salt)."""
    if family not in FAMILIES or family == "own-model":
        raise ValueError(f"no knob set for world family {family!r}")
    rng = random.Random(f"world:{family}:{gpu.key}:{seed}:{salt}")
    k = _base(rng, gpu)
    if family in ("admission", "mixed"):
        k = _admission(k, rng)
    if family in ("interconnect", "mixed"):
        k = _interconnect(k, rng, gpu)
    if family in ("quantization", "mixed"):
        k = _quantization(k, rng)
    if family in ("memory", "mixed"):
        k = _memory(k, rng)
    if family in ("cuda-graphs", "mixed"):
        k = _graphs(k, rng)
    if family == "noisy":
        k = _noisy(k, rng)
    if family == "mixed":
        k = replace(k, noise=rng.uniform(0.01, 0.04), outlier_rate=0.02)
    return k
