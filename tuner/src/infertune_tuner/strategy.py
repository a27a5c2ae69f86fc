"""What is known so far, what it rules out, and the model-guided (`auto`) choice of the next trial.

Rules that skip a configuration without running it (they cost no budget):
- memory: the memory model says it cannot fit (`infeasible_predicted`);
- OOM dominance: it is at least as large in every memory dimension (same or lower TP, same or
  larger batch, same or wider weights and KV) as a configuration that ran out of memory;
- SLO dominance: same TP/precision as a measured configuration that missed a latency bound by
  more than the measurement noise (5 %), with a larger max batch (latency only grows with
  batch), or a smaller batch than one that missed the throughput floor.

`auto` ranks every untried, unruled configuration by the prior corrected with the measurements
so far: expected improvement over the best feasible measured tok/s/GPU times the probability of
meeting every SLO bound. It stops when no configuration can plausibly beat the best measured one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from infertune_tuner.catalog.quantization import KV_DTYPE_BYTES, QUANTIZATIONS
from infertune_tuner.config import TrialConfig
from infertune_tuner.correction import Correction
from infertune_tuner.measurement import Measurement
from infertune_tuner.metrics import latency_metric
from infertune_tuner.perfmodel.latency import Prediction
from infertune_tuner.request import SloBound, TuningRequest
from infertune_tuner.result import SloCheck

MIN_FEASIBLE_PROBABILITY = 0.08
# A bound missed by less than this is within measurement noise: it rules out no neighbours.
DOMINANCE_MARGIN = 0.05
IMPROVEMENT_MARGIN = 1.01  # chasing gains under 1 % is not worth a GPU trial
OPTIMISM_SIGMAS = 1.0
# When the prior says nothing can meet the SLO we still measure the closest few before giving
# up: the prior may be wrong, and the user needs measured nearest misses, not guesses.
CONFIRMATION_TRIALS = 3


@dataclass
class Known:
    """Everything measured or in flight, as the study records it."""

    measured: dict[TrialConfig, Measurement] = field(default_factory=dict)
    checks: dict[TrialConfig, list[SloCheck]] = field(default_factory=dict)
    in_flight: set[TrialConfig] = field(default_factory=set)

    @property
    def executed(self) -> int:
        return len(self.measured)

    def feasible(self) -> dict[TrialConfig, Measurement]:
        return {
            c: m
            for c, m in self.measured.items()
            if m.status == "ok" and all(ch.ok for ch in self.checks.get(c, []))
        }

    def best_tps(self) -> float:
        return max(
            (m.output_tokens_per_s_per_gpu or 0.0 for m in self.feasible().values()), default=0.0
        )


def _mem_dims(c: TrialConfig) -> tuple[float, float, float, float]:
    # Larger = needs more memory per GPU.
    return (
        -c.tp,
        c.max_batch_size,
        QUANTIZATIONS[c.quantization].weight_bytes,
        KV_DTYPE_BYTES[c.kv_cache_dtype],
    )


def implied_infeasible(cfg: TrialConfig, known: Known) -> str | None:
    """A reason `cfg` need not run, given what was measured; None if it still might."""
    dims = _mem_dims(cfg)
    for other, m in known.measured.items():
        if m.status == "oom" and all(a >= b for a, b in zip(dims, _mem_dims(other), strict=True)):
            return f"at least as large in memory as {other.label()}, which ran out of memory"
        if m.status != "ok" or (other.tp, other.quantization, other.kv_cache_dtype) != (
            cfg.tp,
            cfg.quantization,
            cfg.kv_cache_dtype,
        ):
            continue
        for ch in known.checks.get(other, []):
            if ch.ok or _within_noise(ch):
                continue
            if ch.metric == "output_tokens_per_s_per_gpu":
                if cfg.max_batch_size < other.max_batch_size:
                    return f"smaller batch than {other.label()}, which missed {ch.bound}"
            elif cfg.max_batch_size > other.max_batch_size:
                return f"larger batch than {other.label()}, which missed {ch.bound}"
    return None


def _twin(c: TrialConfig) -> tuple[object, ...]:
    """Configurations the model cannot tell apart (bf16 vs fp16 weights): one probe covers both."""
    q = QUANTIZATIONS[c.quantization]
    return (c.tp, c.max_batch_size, q.weight_bytes, q.compute, c.kv_cache_dtype)


def _within_noise(ch: SloCheck) -> bool:
    if ch.metric == "output_tokens_per_s_per_gpu":
        return ch.value_ms >= ch.limit_ms * (1 - DOMINANCE_MARGIN)
    return ch.value_ms <= ch.limit_ms * (1 + DOMINANCE_MARGIN)


def _phi(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


@dataclass(frozen=True)
class Candidate:
    config: TrialConfig
    tps: float  # corrected prediction
    p_feasible: float
    score: float
    potential: float
    violation: float  # predicted worst log(value / bound) over the SLO bounds; <= 0 = meets


def _key(b: SloBound) -> str:
    """The correction-model quantity of one SLO bound, e.g. 'e2e_ms/p95'."""
    return f"{b.metric}/{b.percentile}"


def correction_rows(
    request: TuningRequest, known: Known, priors: dict[TrialConfig, Prediction]
) -> list[tuple[TrialConfig, dict[str, float]]]:
    rows = []
    for cfg, m in known.measured.items():
        p = priors.get(cfg)
        if p is None or m.status != "ok" or not m.output_tokens_per_s_per_gpu:
            continue
        d = {"tps": math.log(m.output_tokens_per_s_per_gpu / p.output_tokens_per_s_per_gpu)}
        for b in request.slo:
            mp, pp = m.percentiles(b.metric), latency_metric(b.metric).of(p)
            if mp is not None:
                d[_key(b)] = math.log(
                    max(mp.get(b.percentile), 1e-6) / max(pp.get(b.percentile), 1e-6)
                )
        rows.append((cfg, d))
    return rows


def rank(
    request: TuningRequest,
    candidates: list[TrialConfig],
    priors: dict[TrialConfig, Prediction],
    correction: Correction,
    best: float,
) -> list[Candidate]:
    out = []
    s_tps = correction.sigma("tps")
    for cfg in candidates:
        p = priors[cfg]
        tps = correction.apply("tps", cfg, p.output_tokens_per_s_per_gpu)
        p_feas = 1.0
        violation = -math.inf
        for b in request.slo:
            predicted = latency_metric(b.metric).of(p).get(b.percentile)
            lat = correction.apply(_key(b), cfg, predicted)
            p_feas *= _phi(math.log(b.max_ms / lat) / correction.sigma(_key(b)))
            violation = max(violation, math.log(lat / b.max_ms))
        if request.min_output_tokens_per_s_per_gpu:
            p_feas *= _phi(math.log(tps / request.min_output_tokens_per_s_per_gpu) / s_tps)
            violation = max(violation, math.log(request.min_output_tokens_per_s_per_gpu / tps))
        # Expected improvement of a log-normal tok/s over the best feasible measured one.
        if best > 0:
            d2 = math.log(tps / best) / s_tps
            ei = tps * math.exp(s_tps**2 / 2) * _phi(d2 + s_tps) - best * _phi(d2)
        else:
            ei = tps
        potential = tps * math.exp(OPTIMISM_SIGMAS * s_tps)
        out.append(Candidate(cfg, tps, p_feas, p_feas * ei, potential, violation))
    out.sort(key=lambda c: (-c.score, -c.tps, c.config))
    return out


def propose(
    request: TuningRequest,
    untried: list[TrialConfig],
    priors: dict[TrialConfig, Prediction],
    known: Known,
) -> tuple[TrialConfig | None, str]:
    """The next configuration to measure, or None and why the search is done."""
    if not untried:
        return None, "every configuration that could fit has been measured or ruled out"
    correction = Correction.fit(correction_rows(request, known, priors))
    best = known.best_tps()
    ranked = rank(request, untried, priors, correction, best)
    for c in ranked:
        if c.p_feasible < MIN_FEASIBLE_PROBABILITY:
            continue
        if best > 0 and c.potential <= best * IMPROVEMENT_MARGIN:
            continue
        return c.config, ""
    if best > 0:
        return None, (
            f"converged: no untried configuration can plausibly beat {best:.0f} tok/s/GPU "
            "while meeting the SLO"
        )
    probes = sum(1 for m in known.measured.values() if m.status == "ok")
    measured_twins = {_twin(c) for c in known.measured}
    fresh = [c for c in ranked if _twin(c.config) not in measured_twins]
    if probes < CONFIRMATION_TRIALS and fresh:
        # The configuration predicted to miss the SLO by the least (then the fastest).
        closest = min(fresh, key=lambda c: (c.violation, -c.tps))
        return closest.config, ""
    return None, (
        "no untried configuration is plausibly able to meet the SLO "
        f"(the {probes} closest measured all missed it)"
    )
