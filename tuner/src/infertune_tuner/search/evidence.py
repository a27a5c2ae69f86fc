"""What the study knows: every measurement per configuration, and what the measurements rule out.

A configuration may be measured more than once (the winner is confirmed before it is declared).
Its repeats combine conservatively: the SLO is checked against the *worse* repeat of every
bound, the objective is the *mean* tok/s/GPU, and an out-of-memory in any repeat makes the
configuration out of memory (production must not OOM now and then).

Rules that skip a configuration without running it (they cost no budget):
- OOM dominance: at least as large in every memory dimension (same or lower TP, same or larger
  batch, same or wider weights and KV) as a configuration that ran out of memory;
- SLO dominance: same TP/precision as a measured configuration that missed a latency bound by
  more than `DOMINANCE_MARGIN`, with a larger max batch (latency grows with batch), or a smaller
  batch than one that missed the throughput floor by as much. The margin is wide because real
  pools are not perfectly monotonic (a batch size without a CUDA graph can be slower than the
  next larger one).
- twins: a configuration the performance model cannot tell apart from a measured one (bf16 and
  fp16 weights run the same kernels at the same width) is covered by that measurement.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from infertune_tuner import slo
from infertune_tuner.catalog.quantization import KV_DTYPE_BYTES, QUANTIZATIONS
from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement
from infertune_tuner.metrics import LATENCY_METRICS, OBJECTIVE, PERCENTILES
from infertune_tuner.perfmodel.latency import Percentiles
from infertune_tuner.request import TuningRequest
from infertune_tuner.result import SloCheck

DOMINANCE_MARGIN = 0.10


def _typical(ps: list[Percentiles]) -> Percentiles:
    """Each percentile's geometric mean over runs (latency noise is multiplicative)."""
    return Percentiles(*(math.exp(statistics.fmean(math.log(max(p.get(q), 1e-9)) for p in ps))
                         for q in PERCENTILES))  # fmt: skip


def combine(runs: list[Measurement]) -> Measurement:
    """What a configuration's repeats say together: its typical run.

    The mean tok/s/GPU and, per latency percentile, the geometric mean over the repeats: the
    estimate of what a typical run shows, which is what production sees and what the SLO is
    checked against (a repeat that misses a bound while another meets it is noise around that
    estimate; the planner measures such a configuration a third time). An out-of-memory in any
    repeat makes the configuration out of memory (production must not OOM now and then); runs
    that were not valid measurements are left out while a valid one exists."""
    if len(runs) == 1:
        return runs[0]
    failed = [m for m in runs if m.status == "oom"]
    ok = [m for m in runs if m.status == "ok"]
    if failed or not ok:
        return failed[-1] if failed else runs[-1]
    lat = {
        x.key: _typical([p for m in ok if (p := m.percentiles(x.key)) is not None])
        for x in LATENCY_METRICS
        if all(m.percentiles(x.key) is not None for m in ok)
    }
    seen = [m.concurrency for m in ok if m.concurrency is not None]
    return Measurement(
        status="ok",
        **lat,  # type: ignore[arg-type]
        output_tokens_per_s_per_gpu=statistics.fmean(
            m.output_tokens_per_s_per_gpu or 0.0 for m in ok
        ),
        requests=sum(m.requests for m in ok),
        errors=sum(m.errors for m in ok),
        duration_s=sum(m.duration_s for m in ok),
        concurrency=min(seen) if len(seen) == len(ok) else None,
    )


@dataclass
class Known:
    """Everything measured or in flight, as the study records it."""

    runs: dict[TrialConfig, list[Measurement]] = field(default_factory=dict)
    measured: dict[TrialConfig, Measurement] = field(default_factory=dict)
    checks: dict[TrialConfig, list[SloCheck]] = field(default_factory=dict)
    in_flight: set[TrialConfig] = field(default_factory=set)
    covers: list[TrialConfig] = field(default_factory=list)  # measured to cover a structure

    @classmethod
    def build(
        cls,
        request: TuningRequest,
        runs: dict[TrialConfig, list[Measurement]],
        in_flight: set[TrialConfig] | None = None,
        covers: list[TrialConfig] | None = None,
    ) -> Known:
        known = cls(runs=runs, in_flight=set(in_flight or ()), covers=list(covers or ()))
        for cfg, ms in runs.items():
            typical = combine(ms)
            known.measured[cfg] = typical
            known.checks[cfg] = slo.check(request, typical)
        return known

    @property
    def executed(self) -> int:
        """Executed trials, repeats included."""
        return sum(len(ms) for ms in self.runs.values())

    def repeats(self, cfg: TrialConfig) -> int:
        return len(self.runs.get(cfg, ()))

    def feasible(self) -> dict[TrialConfig, Measurement]:
        return {
            c: m
            for c, m in self.measured.items()
            if m.status == "ok" and self.checks.get(c) and all(ch.ok for ch in self.checks[c])
        }

    def best(self) -> TrialConfig | None:
        """The feasible configuration with the highest mean tok/s/GPU (ties: fewer GPUs)."""
        feasible = self.feasible()
        if not feasible:
            return None
        return max(
            feasible,
            key=lambda c: (feasible[c].output_tokens_per_s_per_gpu or 0.0, -c.tp, c),
        )

    def best_tps(self) -> float:
        b = self.best()
        return (self.measured[b].output_tokens_per_s_per_gpu or 0.0) if b else 0.0


def _mem_dims(c: TrialConfig) -> tuple[float, float, float, float]:
    # Larger = needs more memory per GPU.
    return (
        -c.tp,
        c.max_batch_size,
        QUANTIZATIONS[c.quantization].weight_bytes,
        KV_DTYPE_BYTES[c.kv_cache_dtype],
    )


def twin(c: TrialConfig) -> tuple[object, ...]:
    """Configurations the model cannot tell apart (bf16 vs fp16 weights) share a twin key."""
    q = QUANTIZATIONS[c.quantization]
    return (c.tp, c.max_batch_size, q.weight_bytes, q.compute, c.kv_cache_dtype)


def _clear_miss(ch: SloCheck) -> bool:
    if ch.ok:
        return False
    if ch.metric == OBJECTIVE.key:
        return ch.value_ms < ch.limit_ms * (1 - DOMINANCE_MARGIN)
    return ch.value_ms > ch.limit_ms * (1 + DOMINANCE_MARGIN)


def implied_infeasible(cfg: TrialConfig, known: Known) -> str | None:
    """Why `cfg` need not run, given what was measured.

    Args:
        cfg: An unmeasured configuration.
        known: What the study has measured.

    Returns:
        The reason (a neighbour ran out of memory or was KV-capped while smaller in every memory
        dimension; a same-precision neighbour with a smaller batch clearly missed a latency
        bound, or one with a larger batch clearly missed the throughput floor), or None.
    """
    dims = _mem_dims(cfg)
    for other, m in known.measured.items():
        larger = all(a >= b for a, b in zip(dims, _mem_dims(other), strict=True))
        if m.status == "oom" and larger:
            return f"at least as large in memory as {other.label()}, which ran out of memory"
        if larger and cfg.max_batch_size >= other.max_batch_size and m.capped(other.max_batch_size):
            return (
                f"at least as large in memory as {other.label()}, whose KV cache held only "
                f"{m.concurrency:.0f} of its {other.max_batch_size} sequences"
            )
        if m.status != "ok" or (other.tp, other.quantization, other.kv_cache_dtype) != (
            cfg.tp,
            cfg.quantization,
            cfg.kv_cache_dtype,
        ):
            continue
        for ch in known.checks.get(other, []):
            if not _clear_miss(ch):
                continue
            if ch.metric == OBJECTIVE.key:
                if cfg.max_batch_size < other.max_batch_size:
                    return f"smaller batch than {other.label()}, which missed {ch.bound}"
            elif cfg.max_batch_size > other.max_batch_size:
                return f"larger batch than {other.label()}, which missed {ch.bound}"
    return None


def measured_twin(cfg: TrialConfig, known: Known) -> TrialConfig | None:
    """A measured configuration the model cannot tell apart from `cfg`, if any."""
    key = twin(cfg)
    for other in known.measured:
        if other != cfg and twin(other) == key:
            return other
    return None
