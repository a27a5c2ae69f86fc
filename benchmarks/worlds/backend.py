"""A simulated GPU pool of one world family, as a benchmark backend (`tune(backend=...)`).

`run` measures like a benchmark: each repeat of a configuration (`repeat`: the study's earlier
runs of it) is a new run with its own noise, as on real GPUs. `truth` is the same configuration
without noise and with a large sample: what the configuration really does, for benchmarks that
score a search against the true optimum.
"""

from __future__ import annotations

import hashlib

import numpy as np

from infertune_tuner.backends.simulated import SimulatedBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.errors import InputError
from infertune_tuner.measurement import Measurement, trial_requests
from infertune_tuner.request import TuningRequest
from worlds import physics
from worlds.closed_loop import run_loop
from worlds.families import FAMILIES, knobs_for

TRUTH_REQUESTS = 20000  # a population-sized sample: what production would see


def _rng(*parts: object) -> np.random.Generator:
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


class WorldBackend:
    """One simulated pool of a world family; deterministic per (family, GPU, seed)."""

    def __init__(self, request: TuningRequest, family: str, *, seed: int = 0) -> None:
        if family not in FAMILIES:
            raise InputError(f"unknown world family {family!r}; use one of {', '.join(FAMILIES)}")
        self.name = f"world:{family}"
        self.speedup = 1.0
        self.family = family
        self._model = request.resolve_model()
        self._gpu = request.resolve_gpu()
        self._isl = request.workload.input_tokens
        self._osl = request.workload.output_tokens
        self._seed = seed
        self._percentiles = [b.percentile for b in request.slo]
        self._own = (
            SimulatedBackend.perturbed(request, seed=seed) if family == "own-model" else None
        )
        self._knobs = None if self._own else knobs_for(family, self._gpu, seed, request.name)

    def _measure(
        self, cfg: TrialConfig, rng: np.random.Generator, *, noisy: bool, requests: int | None
    ) -> Measurement:
        k = self._knobs
        assert k is not None
        cap = physics.capacity(self._model, self._gpu, cfg, self._isl + self._osl, k)
        if cap.load_error is not None:
            return Measurement.failed("oom", cap.load_error)
        b = min(cfg.max_batch_size, cap.kv_sequences)
        s = physics.steps(self._model, self._gpu, cfg, b, self._isl, self._osl, k)
        n = requests or trial_requests(cfg.max_batch_size, self._percentiles)
        r = run_loop(s, cfg.max_batch_size, self._isl, self._osl, k, rng, requests=n, noisy=noisy)
        return Measurement.ok(
            r.latency,
            output_tokens_per_s_per_gpu=r.output_tokens_per_s / cfg.tp,
            requests=r.requests,
            duration_s=r.duration_s,
            concurrency=b,
        )

    def run(self, config: TrialConfig, *, repeat: int = 0) -> Measurement:
        if self._own is not None:
            return self._own.measure(config, repeat=repeat)
        rng = _rng(self.family, self._gpu.key, self._seed, config.label(), repeat)
        return self._measure(config, rng, noisy=True, requests=None)

    def truth(self, config: TrialConfig) -> Measurement:
        """What `config` really does on this pool: no run noise, a large sample."""
        if self._own is not None:
            return self._own.typical(config)
        rng = _rng("truth", self.family, self._gpu.key, self._seed, config.label())
        return self._measure(config, rng, noisy=False, requests=TRUTH_REQUESTS)

    @property
    def noise(self) -> float:
        """The pool's run-to-run noise (relative standard deviation of a run's timings)."""
        return self._knobs.noise if self._knobs is not None else 0.02

    def close(self) -> None:
        return None
