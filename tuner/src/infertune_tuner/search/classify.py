"""Whether a configuration is a candidate, and if not, why: decided here and nowhere else.

The planner ranks the candidates, the wrapped Optuna samplers propose only candidates, and the
report lists every other configuration with the reason this module gives. The reasons, in the
order they are decided:

- **memory**: the memory model rules it out by a wide margin (never a candidate, never run);
- **measured** / **in flight**: it has its measurement, or a worker is measuring it;
- **out of memory**: at least as large in every memory dimension (same or lower TP, same or
  larger batch, same or wider weights and KV) as a configuration that ran out of memory;
- **KV-capped**: at least as large as one whose KV cache held fewer sequences than its batch;
- **SLO miss**: same TP and precision (bf16 and fp16 weights count as one: `evidence.kernels`)
  as a measured configuration that missed a latency bound by more than the dominance margin,
  with a larger batch (latency grows with batch); or a smaller batch than one that missed the
  tok/s/GPU floor by as much. The margin is wide because real
  pools are not perfectly monotonic (a batch size without a CUDA graph can be slower than the
  next larger one);
- **twin**: the performance model cannot tell it from a measured configuration (bf16 and fp16
  weights run the same kernels at the same width): that measurement covers both.

A measurement that was not valid (plausibility.py) rules nothing out.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from infertune_tuner.config import TrialConfig
from infertune_tuner.metrics import OBJECTIVE
from infertune_tuner.result import SloCheck
from infertune_tuner.search.evidence import Known, kernels, memory_dims, twin


class Exclusion(StrEnum):
    MEMORY = "memory"
    MEASURED = "measured"
    IN_FLIGHT = "in-flight"
    OUT_OF_MEMORY = "out-of-memory"
    KV_CAPPED = "kv-capped"
    SLO_MISS = "slo-miss"
    TWIN = "twin"


@dataclass(frozen=True)
class Ruling:
    """Why a configuration is not a candidate."""

    exclusion: Exclusion
    by: TrialConfig | None = None  # the measured configuration that rules it out
    bound: str | None = None  # the SLO bound `by` missed ("E2E p95 <= 25600 ms")
    detail: str | None = None  # the memory arithmetic, or the sequences a KV cache held

    def text(self) -> str:
        by = self.by.label() if self.by else ""
        match self.exclusion:
            case Exclusion.MEMORY:
                return self.detail or "does not fit in GPU memory"
            case Exclusion.MEASURED:
                return "measured"
            case Exclusion.IN_FLIGHT:
                return "being measured"
            case Exclusion.OUT_OF_MEMORY:
                return f"at least as large in memory as {by}, which ran out of memory"
            case Exclusion.KV_CAPPED:
                return f"at least as large in memory as {by}, whose KV cache {self.detail}"
            case Exclusion.SLO_MISS:
                side = "smaller" if self.detail == "floor" else "larger"
                return f"{side} batch than {by}, which missed {self.bound}"
            case Exclusion.TWIN:
                return f"the model cannot tell it from {by}, which was measured"


def _clear_miss(ch: SloCheck, margin: float) -> bool:
    if ch.ok:
        return False
    if ch.metric == OBJECTIVE.key:
        return ch.value_ms < ch.limit_ms * (1 - margin)
    return ch.value_ms > ch.limit_ms * (1 + margin)


def implied(cfg: TrialConfig, known: Known, dominance_margin: float) -> Ruling | None:
    """Why `cfg` need not run, given what was measured (out of memory, KV-capped, SLO miss,
    twin), or None."""
    dims = memory_dims(cfg)
    for other, m in known.measured.items():
        if m.status == "invalid":
            continue
        larger = all(a >= b for a, b in zip(dims, memory_dims(other), strict=True))
        if m.status == "oom" and larger:
            return Ruling(Exclusion.OUT_OF_MEMORY, other)
        if larger and cfg.max_batch_size >= other.max_batch_size and m.capped(other.max_batch_size):
            held = f"held only {m.concurrency:.0f} of its {other.max_batch_size} sequences"
            return Ruling(Exclusion.KV_CAPPED, other, detail=held)
        same = (other.tp, kernels(other.quantization), other.kv_cache_dtype) == (
            cfg.tp, kernels(cfg.quantization), cfg.kv_cache_dtype,
        )  # fmt: skip
        if m.status != "ok" or not same:
            continue
        for ch in known.checks.get(other, []):
            if not _clear_miss(ch, dominance_margin):
                continue
            if ch.metric == OBJECTIVE.key:
                if cfg.max_batch_size < other.max_batch_size:
                    return Ruling(Exclusion.SLO_MISS, other, ch.bound, "floor")
            elif cfg.max_batch_size > other.max_batch_size:
                return Ruling(Exclusion.SLO_MISS, other, ch.bound)
    key = twin(cfg)
    for other, m in known.measured.items():
        if other != cfg and m.status != "invalid" and twin(other) == key:
            return Ruling(Exclusion.TWIN, other)
    return None


def classify(
    cfg: TrialConfig,
    known: Known,
    *,
    memory_ruled_out: bool,
    memory_reason: str | None,
    dominance_margin: float,
) -> Ruling | None:
    """None when `cfg` is a candidate; else why it is not (see the module doc).

    Args:
        cfg: A configuration of the space.
        known: What the study measured and has in flight.
        memory_ruled_out: Whether the memory model rules it out by a wide margin.
        memory_reason: The memory model's arithmetic, for the report.
        dominance_margin: How far a measured neighbour must miss a bound to rule it out.
    """
    if memory_ruled_out:
        return Ruling(Exclusion.MEMORY, detail=memory_reason)
    if cfg in known.measured:
        return Ruling(Exclusion.MEASURED)
    if cfg in known.in_flight:
        return Ruling(Exclusion.IN_FLIGHT)
    return implied(cfg, known, dominance_margin)
