"""The simulated GPU pool: measurements from the performance model plus seeded noise.

`truth` may differ from the prior the tuner ranks with (`perturbed_truth`), so tuner tests can't
pass merely because prior and truth are the same function. Noise is deterministic per (seed,
config, repeat): the first measurement of a configuration is always the same, and re-measuring
it (a confirmation trial; `repeat` counts the study's earlier runs of it, whichever process made
them) draws the next repeat, as a second run on real GPUs would.

A simulated trial returns at once, unless ``INFERTUNE_SIMULATED_TIME_SCALE`` (or `time_scale`)
is set: then it takes that fraction of the time the trial would take on the pool
(:func:`trial_seconds`: server start, weight load, warm-up and measurement; a configuration that
does not fit fails at load). Parallel workers then overlap as real ones do (demos, the
parallel-tuning benchmark, the worker tests).
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import statistics
import time
from dataclasses import replace

from infertune_tuner.catalog.gpus import Gpu
from infertune_tuner.catalog.llms import ModelArch
from infertune_tuner.config import TrialConfig, Workload
from infertune_tuner.errors import InputError
from infertune_tuner.measurement import Measurement, trial_requests
from infertune_tuner.metrics import E2E, LATENCY_METRICS, OBJECTIVE, PERCENTILES, TTFT
from infertune_tuner.perfmodel.factors import Efficiency, default_efficiency
from infertune_tuner.perfmodel.latency import Percentiles, predict
from infertune_tuner.perfmodel.memory import RESERVE_GIB
from infertune_tuner.request import TuningRequest

NOISE = 0.02  # relative standard deviation of a p50 across benchmark runs
TIME_SCALE_ENV = "INFERTUNE_SIMULATED_TIME_SCALE"
SERVER_START_S = 60.0  # process start, CUDA initialisation, CUDA graph capture
LOAD_GIB_PER_S = 2.0  # weights read from a local cache
WARMUP_SHARE = 0.25  # the warm-up before the measured requests


def trial_seconds(weights_gib: float, m: Measurement) -> float:
    """How long a trial takes on real GPUs: start + load (+ warm-up and measurement when ok)."""
    return pool_seconds(weights_gib, m.duration_s if m.status == "ok" else 0.0)


def pool_seconds(weights_gib: float, measured_s: float) -> float:
    """A trial's time on this pool's clock: the server start, the load of `weights_gib`, and
    `measured_s` of measured requests with their warm-up."""
    return SERVER_START_S + weights_gib / LOAD_GIB_PER_S + measured_s * (1 + WARMUP_SHARE)


def time_scale_from_env() -> float:
    raw = os.environ.get(TIME_SCALE_ENV, "").strip()
    try:
        value = float(raw) if raw else 0.0
    except ValueError:
        raise InputError(f"{TIME_SCALE_ENV} must be a number, not {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise InputError(f"{TIME_SCALE_ENV} must be a non-negative number")
    return value


def perturbed_truth(
    architecture: str, seed: int, magnitude: float = 0.35
) -> tuple[Efficiency, float]:
    """A GPU pool that behaves differently from the prior: a different serving stack (all
    bandwidth/compute efficiencies x one factor in [0.7, 1.5], overheads / that factor), then
    every factor jittered by up to +-m, and the memory reserve shifted by up to +-0.75 GiB."""
    rng = random.Random(f"truth:{architecture}:{seed}")
    base = default_efficiency(architecture)
    stack = math.exp(rng.uniform(math.log(0.7), math.log(1.5)))
    base = base.scaled(
        weight_bw=stack, kv_bw=stack, gemm=stack, prefill=stack, link=stack,
        allreduce_latency_us=1 / stack, step_overhead_ms=1 / stack, per_seq_overhead_us=1 / stack,
    )  # fmt: skip
    fields = (
        "weight_bw", "kv_bw", "gemm", "prefill", "link", "allreduce_latency_us",
        "step_overhead_ms", "per_seq_overhead_us",
    )  # fmt: skip
    scale = {f: 1 + rng.uniform(-magnitude, magnitude) for f in fields}
    eff = base.scaled(**scale)
    # Fractions of peak stay below 0.95; factors not listed above keep the prior's value.
    fractions = ("weight_bw", "kv_bw", "gemm", "prefill", "link")
    eff = replace(eff, **{f: min(getattr(eff, f), 0.95) for f in fractions})
    return eff, RESERVE_GIB + rng.uniform(-0.75, 0.75)


def _rng(seed: int, cfg: TrialConfig, repeat: int = 0) -> random.Random:
    key = f"{seed}:{cfg.label()}" + (f":{repeat}" if repeat else "")
    digest = hashlib.sha256(key.encode()).hexdigest()
    return random.Random(int(digest[:16], 16))


class SimulatedBackend:
    name = "simulated"
    speedup = 1.0

    def __init__(
        self,
        request: TuningRequest,
        *,
        seed: int = 0,
        truth: Efficiency | None = None,
        reserve_gib: float | None = None,
        noise: float = NOISE,
        time_scale: float | None = None,
    ) -> None:
        self._model: ModelArch = request.resolve_model()
        self._gpu: Gpu = request.resolve_gpu()
        self._workload: Workload = request.work
        self._seed = seed
        self._truth = truth
        self._reserve = reserve_gib
        self._noise = noise
        self._percentiles = [b.percentile for b in request.slo]
        self.time_scale = time_scale if time_scale is not None else time_scale_from_env()

    @classmethod
    def perturbed(
        cls, request: TuningRequest, *, seed: int, magnitude: float = 0.35
    ) -> SimulatedBackend:
        eff, reserve = perturbed_truth(request.resolve_gpu().architecture, seed, magnitude)
        return cls(request, seed=seed, truth=eff, reserve_gib=reserve)

    def run(self, config: TrialConfig, *, repeat: int = 0) -> Measurement:
        m = self.measure(config, repeat=repeat)
        if self.time_scale > 0:
            time.sleep(self.time_scale * self.seconds(config, m))
        return m

    def seconds(self, config: TrialConfig, m: Measurement) -> float:
        """The time this trial would take on the pool (see :func:`trial_seconds`)."""
        p = predict(self._model, self._gpu, config, self._workload, self._truth, self._reserve)
        return trial_seconds(p.memory.weights_gib_per_gpu * config.tp, m)

    def typical(self, config: TrialConfig, repeats: int = 21) -> Measurement:
        """What a typical run of `config` shows: the median of many repeats, per quantity
        (the truth a search is judged against; the noise-free model would sit below the
        measured tails, which this pool's noise only ever widens)."""
        runs = [self.measure(config, repeat=1000 + r) for r in range(repeats)]
        if runs[0].status != "ok":
            return runs[0]

        def med(key: str) -> Percentiles:
            ps = [p for m in runs if (p := m.percentiles(key)) is not None]
            return Percentiles(*(statistics.median(p.get(q) for p in ps) for q in PERCENTILES))

        return Measurement.ok(
            {x.key: med(x.key) for x in LATENCY_METRICS},
            output_tokens_per_s_per_gpu=statistics.median(OBJECTIVE.of(m) or 0.0 for m in runs),
            requests=runs[0].requests, duration_s=runs[0].duration_s,
            concurrency=runs[0].concurrency,
        )  # fmt: skip

    def measure(self, config: TrialConfig, *, repeat: int = 0, noisy: bool = True) -> Measurement:
        """Measure `config`; `repeat` > 0 is a re-measurement, `noisy=False` the noise-free truth."""
        p = predict(self._model, self._gpu, config, self._workload, self._truth, self._reserve)
        mem = p.memory
        if mem.max_concurrent_sequences < 1:
            return Measurement.failed(
                "oom",
                f"CUDA out of memory while loading: {mem.reason or 'no room for the KV cache'}",
            )
        rng = _rng(self._seed, config, repeat)
        tail = 1 + 2 * p.prefill_share  # interference widens the tail
        sd = self._noise if noisy else 0.0

        def jitter(x: Percentiles, scale: float = 1.0) -> Percentiles:
            base = math.exp(rng.gauss(0, sd * scale))
            t95 = base * math.exp(abs(rng.gauss(0, sd * 2 * tail * scale)))
            t99 = t95 * math.exp(abs(rng.gauss(0, sd * 3 * tail * scale)))
            return Percentiles(
                x.p50 * base, max(x.p95 * t95, x.p50 * base), max(x.p99 * t99, x.p95 * t95)
            )

        # TTFT spreads twice as much as the rest: it is one short interval, not a sum of many.
        latency = {m.key: jitter(m.of(p), 2.0 if m is TTFT else 1.0) for m in LATENCY_METRICS}
        ttft, e2e = latency[TTFT.key], latency[E2E.key]
        tps = p.output_tokens_per_s_per_gpu * p.e2e_ms.p50 / e2e.p50
        if mem.max_concurrent_sequences < config.max_batch_size:
            # The KV cache caps concurrency: the rest queue, which shows up in TTFT and E2E.
            cap = mem.max_concurrent_sequences
            capped = predict(
                self._model, self._gpu,
                TrialConfig(config.tp, cap, config.quantization, config.kv_cache_dtype),
                self._workload, self._truth, self._reserve,
            )  # fmt: skip
            wait = capped.e2e_ms.p50 * (config.max_batch_size / cap - 1)
            ttft = Percentiles(ttft.p50 + wait, ttft.p95 + wait * 1.5, ttft.p99 + wait * 2)
            e2e = Percentiles(e2e.p50 + wait, e2e.p95 + wait * 1.5, e2e.p99 + wait * 2)
            latency[TTFT.key], latency[E2E.key] = ttft, e2e
            tps = capped.output_tokens_per_s_per_gpu
        requests = trial_requests(config.max_batch_size, self._percentiles)
        return Measurement.ok(
            latency, output_tokens_per_s_per_gpu=tps, requests=requests,
            duration_s=requests / config.max_batch_size * e2e.p50 / 1e3,
            concurrency=min(config.max_batch_size, mem.max_concurrent_sequences),
        )  # fmt: skip

    def close(self) -> None:
        return None
