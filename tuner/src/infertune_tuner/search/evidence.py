"""What the study knows: every measurement per configuration, combined into its typical run.

A configuration may be measured more than once (finalists are confirmed before one is declared;
a contender whose repeats straddle an SLO bound is measured a third time). Repeats are new
measurements of one distribution and combine into the *typical* run (`combine`): the mean
tok/s/GPU and the geometric mean of each latency percentile. An out-of-memory in any repeat
makes the configuration out of memory (production must not OOM now and then).

What the measurements rule out, and why, is classify.py's concern; this module gives it the
memory order of configurations (`memory_dims`) and the model's twins (`twin`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from infertune_tuner import slo
from infertune_tuner.catalog.quantization import KV_DTYPE_BYTES, QUANTIZATIONS
from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement
from infertune_tuner.metrics import LATENCY_METRICS, PERCENTILES
from infertune_tuner.perfmodel.latency import Percentiles
from infertune_tuner.request import TuningRequest
from infertune_tuner.result import SloCheck


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

    def state(self) -> tuple[frozenset[tuple[TrialConfig, int]], frozenset[TrialConfig]]:
        """What a decision from this evidence depends on (how often each configuration was
        measured, what is in flight): equal states decide alike, so a decision is reused."""
        return frozenset((c, len(ms)) for c, ms in self.runs.items()), frozenset(self.in_flight)

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


def memory_dims(c: TrialConfig) -> tuple[float, float, float, float]:
    """Larger in every dimension = needs more memory per GPU."""
    return (
        -c.tp,
        c.max_batch_size,
        QUANTIZATIONS[c.quantization].weight_bytes,
        KV_DTYPE_BYTES[c.kv_cache_dtype],
    )


def kernels(quantization: str) -> tuple[object, ...]:
    """Weight quantizations that run the same kernels at the same width (bf16 and fp16) share
    this key: the model cannot tell them apart, and neither can a measurement's shape."""
    q = QUANTIZATIONS[quantization]
    return (q.weight_bytes, q.compute)


def twins(quantization: str) -> str:
    """The weight quantizations that share `quantization`'s kernels, as one name ("bf16/fp16")."""
    key = kernels(quantization)
    return "/".join(sorted(n for n in QUANTIZATIONS if kernels(n) == key))


def twin(c: TrialConfig) -> tuple[object, ...]:
    """Configurations the model cannot tell apart (bf16 vs fp16 weights) share a twin key."""
    return (c.tp, c.max_batch_size, *kernels(c.quantization), c.kv_cache_dtype)
