"""A closed-loop benchmark at concurrency = max batch, as per-request samples.

Step timings (physics.py) become what a benchmark client records for each request, and the
percentiles are taken over requests the way GenAI-Perf takes them (numpy's linear percentile):

- every engine step serves one token to each decoding sequence; in a closed loop each slot
  turns over once per `osl` steps, so about `B - 1` other prompts are prefilled during one
  request's decode. With chunked prefill (the default) they ride along in mixed steps and part
  of their cost hides under the decode; with `stall_prefill` they run as separate steps that
  stall every decode (TTFT stays short, ITL pays). How many a request meets varies: arrivals
  cluster (`sync`), so the count is over-dispersed (a gamma-Poisson draw).
- TTFT: the rest of the running step, then the prompt's place among the prompts that arrived
  with it (prompts per step are bounded by the token budget), then the KV-capacity queue when
  the cache holds fewer sequences than the max batch.
- ITL per request = (E2E - TTFT) / (output tokens - 1), GenAI-Perf's definition.
- a run's timings carry noise (one factor per run, jitter per request) and, rarely, an outlier:
  a few straggler requests (host hiccup) or a slow phase (clock throttling).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infertune_tuner.metrics import E2E, ITL, TTFT
from infertune_tuner.perfmodel.latency import Percentiles
from worlds.physics import MAX_NUM_TOKENS, Knobs, Steps

PCTS = (50.0, 95.0, 99.0)


@dataclass(frozen=True, slots=True)
class LoopResult:
    latency: dict[str, Percentiles]  # by metric key (metrics.LATENCY_METRICS)
    output_tokens_per_s: float
    requests: int
    duration_s: float


def _pcts(x: np.ndarray) -> Percentiles:
    p50, p95, p99 = (float(v) for v in np.percentile(x, PCTS))
    return Percentiles(p50, p95, p99)


def run_loop(
    s: Steps,
    max_batch: int,
    isl: int,
    osl: int,
    k: Knobs,
    rng: np.random.Generator,
    *,
    requests: int,
    noisy: bool = True,
) -> LoopResult:
    b = s.concurrency
    n = requests
    noise = k.noise if noisy else 0.0
    run_factor = float(np.exp(rng.normal(0.0, noise))) if noisy else 1.0
    slow_phase = 1.0
    stragglers = 0.0
    if noisy and rng.random() < k.outlier_rate:
        if rng.random() < 0.5:
            slow_phase = float(rng.uniform(1.05, 1.15))
        else:
            stragglers = 0.02
    t_dec = s.decode_ms * run_factor * slow_phase
    t_pre = s.prefill_ms * run_factor * slow_phase

    # Prompts admitted per engine step: bounded by the token budget (minus decode tokens when
    # they share the step); a prompt longer than the budget takes several chunks.
    if k.stall_prefill:
        per_step = max(1, MAX_NUM_TOKENS // isl)
        chunks = 1
    else:
        room = max(MAX_NUM_TOKENS - b, 256)
        per_step = max(1, room // isl)
        chunks = max(1, -(-isl // room))
    cluster = 1 + rng.poisson(k.sync * b, size=n)
    position = (rng.random(n) * cluster).astype(int)
    together = np.minimum(cluster, per_step)
    if k.stall_prefill:
        cost_per_prompt = t_pre + s.prefill_step_ms / np.maximum(together, 1)
        step_cost = s.prefill_step_ms + together * t_pre
        ttft = rng.random(n) * t_dec + (position // per_step + 1) * step_cost
    else:
        cost_per_prompt = np.full(n, t_pre * (1 - k.chunk_overlap))
        step_cost = t_dec + together * t_pre * (1 - k.chunk_overlap)
        ttft = rng.random(n) * t_dec + (position // per_step + chunks) * step_cost

    # Other prompts met during one request's decode: over-dispersed around b - 1.
    shape = 1.0 / (k.sync + 0.02)
    lam = max(b - 1, 0) * rng.gamma(shape, 1.0 / shape, size=n)
    met = rng.poisson(lam)
    gaps = max(osl - 1, 1)
    itl = (t_dec * gaps + met * cost_per_prompt) / gaps
    # Prompt admission is not perfectly periodic (step boundaries, sampling, host work):
    # smear TTFT so that its tail is a continuum, not a staircase.
    ttft = ttft * np.exp(rng.normal(0.0, 0.08, size=n))
    if noisy:
        itl = itl * np.exp(rng.normal(0.0, noise / 2, size=n))
        ttft = ttft * np.exp(rng.normal(0.0, noise, size=n))
    if stragglers:
        hit = rng.random(n) < stragglers
        ttft = np.where(hit, ttft * rng.uniform(3.0, 8.0, size=n), ttft)
        itl = np.where(hit, itl * rng.uniform(1.2, 1.6, size=n), itl)
    service = ttft + (osl - 1) * itl

    queue = np.zeros(n)
    if max_batch > b:
        # Clients beyond the KV cache's capacity wait for a free slot.
        mean_wait = (max_batch / b - 1) * float(service.mean())
        queue = mean_wait * rng.gamma(4.0, 0.25, size=n)
    ttft_all = ttft + queue
    e2e = ttft_all + (osl - 1) * itl
    tps = b * osl / float(service.mean()) * 1e3
    return LoopResult(
        latency={TTFT.key: _pcts(ttft_all), ITL.key: _pcts(itl), E2E.key: _pcts(e2e)},
        output_tokens_per_s=tps,
        requests=n,
        duration_s=n / max_batch * float(e2e.mean()) / 1e3,
    )
