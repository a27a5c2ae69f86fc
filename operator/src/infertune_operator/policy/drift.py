"""Has the live workload left the tuned one, or does a live SLO bound miss? (pure)

The thresholds, and why:

* **Token lengths: x1.5 either way** (mean input or output tokens per request, against the
  workload the serving configuration was tuned for). Per request, KV-cache bytes and prefill work
  grow with the input and decode work with the output; at x1.5 the batch that fit the KV cache may
  no longer fit, and the prefill share of each step moves enough that another batch size or TP
  can win (the performance model's roofline; the tuner's trials measure exactly this shape).
  Smaller changes are within what a tuned configuration absorbs.
* **Concurrency: x1.5 above the max batch per replica.** The tuned configuration serves at most
  its max batch at once; beyond it requests queue, and half a batch of queue per replica is
  TTFT that no configuration of this replica count avoids: the message says to add replicas. A
  retune cannot act on it (a trial runs at its own max batch), so it starts none; lower
  concurrency is less traffic, not drift.
* **A live SLO bound** (SloAtRisk): TTFT percentiles from the first-response histogram against
  ``spec.slo.ttftMs``; the E2E and ITL *means* (``observe.window``) against the p50 bounds of
  ``e2eLatencyMs`` and ``itlMs`` (a mean above a median bound is a miss in any right-skewed
  latency distribution; tail bounds of E2E and ITL are not observable from the pods' metrics and
  are not judged).
* **Evidence**: a window with fewer than :data:`MIN_REQUESTS` completed requests decides nothing.

Either condition turns True only once it has held for the whole window
(``spec.serving.observe.windowMinutes``; :class:`Persistence`), and False as soon as it does not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infertune_operator.api.types import InferenceDeployment
from infertune_operator.observe.window import Summary
from infertune_tuner.metrics import E2E, LATENCY_METRICS, TTFT

LENGTH_RATIO = 1.5
CONCURRENCY_RATIO = 1.5
MIN_REQUESTS = 20
_QUANTILE = {"p50": 0.5, "p95": 0.95, "p99": 0.99}


@dataclass(frozen=True)
class Tuned:
    """The workload the serving configuration was tuned for."""

    input_tokens: int
    output_tokens: int
    max_batch: int


@dataclass(frozen=True)
class Assessment:
    judged: bool  # enough requests in the window to say anything
    drift: tuple[str, ...] = ()  # what left the tuned workload, with the numbers
    lengths_drifted: bool = False  # a retune (with the observed lengths) can act on it
    at_risk: tuple[str, ...] = ()  # live SLO misses, with the numbers
    unjudged: tuple[str, ...] = ()  # SLO bounds the metrics cannot show


def significant(value: float, digits: int = 2) -> int:
    """``value`` rounded to ``digits`` significant digits (4137 -> 4100): the observed workload a
    retune tunes for, so that noise in the means does not make every window another retune."""
    if value <= 0:
        return 1
    step = 10 ** max(math.floor(math.log10(value)) - digits + 1, 0)
    return max(int(round(value / step) * step), 1)


def _ratio_off(observed: float, tuned: float, ratio: float) -> bool:
    return observed > tuned * ratio or observed * ratio < tuned


def assess(s: Summary, tuned: Tuned, obj: InferenceDeployment) -> Assessment:
    """The drift and the live SLO misses a window shows (see the module docstring)."""
    if s.pods == 0 or s.requests < MIN_REQUESTS:
        return Assessment(judged=False)
    drift: list[str] = []
    lengths = False
    for what, seen, want in (("input", s.input_tokens_mean, tuned.input_tokens),
                             ("output", s.output_tokens_mean, tuned.output_tokens)):  # fmt: skip
        if seen is not None and _ratio_off(seen, want, LENGTH_RATIO):
            lengths = True
            drift.append(f"mean {what} tokens {seen:.0f} vs {want} tuned (x{seen / want:.2f}, "
                         f"threshold x{LENGTH_RATIO:g})")  # fmt: skip
    if s.concurrency is not None and s.concurrency > tuned.max_batch * CONCURRENCY_RATIO:
        drift.append(f"{s.concurrency:.1f} requests in flight per replica vs max batch "
                     f"{tuned.max_batch} (threshold x{CONCURRENCY_RATIO:g}): requests queue; add "
                     "replicas (spec.serving.replicas)")  # fmt: skip
    at_risk: list[str] = []
    unjudged: list[str] = []
    for metric in LATENCY_METRICS:
        bound = obj.spec.slo.bound(metric)
        for p, limit in (bound.bounds() if bound else {}).items():
            value: float | None = None
            if metric is TTFT:
                value = s.first_token_ms(_QUANTILE[p])
            elif p == "p50":
                value = s.e2e_mean_ms if metric is E2E else s.itl_mean_ms
            if value is None:
                unjudged.append(f"{metric.label} {p}")
            elif value > limit:
                said = "mean" if metric is not TTFT else p
                at_risk.append(f"{metric.label} {said} {value:.0f} ms > {limit:g} ms "
                               f"({metric.label} {p} bound)")  # fmt: skip
    return Assessment(True, tuple(drift), lengths, tuple(at_risk), tuple(unjudged))


@dataclass
class Persistence:
    """Since when a finding has held (monotonic seconds, and the wall-clock time for the status);
    None while it does not."""

    since: float | None = None
    since_wall: str | None = None

    def update(self, holds: bool, now: float, now_wall: str) -> None:
        if not holds:
            self.since = self.since_wall = None
        elif self.since is None:
            self.since, self.since_wall = now, now_wall

    def sustained(self, now: float, window_s: float) -> bool:
        return self.since is not None and now - self.since >= window_s
