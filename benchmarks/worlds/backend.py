"""A simulated GPU pool of one world family, as a benchmark backend (`tune(backend=...)`).

`run` measures like a benchmark: each repeat of a configuration (`repeat`: the study's earlier
runs of it) is a new run with its own noise, as on real GPUs. `truth` is the same configuration
without noise and with a large sample: what the configuration really does, for benchmarks that
score a search against the true optimum. A `failing` world is the `mixed` one with a failure
form (failures.py): inside its failing structures (`failing`) every run and the truth fail.
"""

from __future__ import annotations

import hashlib

import numpy as np

from infertune_tuner import slo
from infertune_tuner.backends.simulated import SimulatedBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.errors import InputError
from infertune_tuner.measurement import Measurement, trial_requests
from infertune_tuner.request import TuningRequest
from infertune_tuner.space import build_space
from worlds import failures, physics
from worlds.closed_loop import run_loop
from worlds.failures import FAILING, FailureForm, Structure
from worlds.families import FAMILIES, knobs_for

TRUTH_REQUESTS = 20000  # a population-sized sample: what production would see
# A failing world's form per (request, seed): choosing it reads every configuration's truth.
_FORMS: dict[tuple[str, int], FailureForm] = {}


def _rng(*parts: object) -> np.random.Generator:
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


class WorldBackend:
    """One simulated pool of a world family; deterministic per (family, GPU, seed)."""

    def __init__(self, request: TuningRequest, family: str, *, seed: int = 0) -> None:
        if family not in (*FAMILIES, FAILING):
            raise InputError(
                f"unknown world family {family!r}; use one of {', '.join((*FAMILIES, FAILING))}"
            )
        self.name = f"world:{family}"
        self.speedup = 1.0
        self.family = family
        # Whose physics (and runs) it has: a failing world is the mixed one where it runs.
        self._physics = failures.PHYSICS if family == FAILING else family
        self.form = FailureForm("none", ())
        self._model = request.resolve_model()
        self._gpu = request.resolve_gpu()
        self._isl = request.workload.input_tokens
        self._osl = request.workload.output_tokens
        self._seed = seed
        self._percentiles = [b.percentile for b in request.slo]
        self._own = (
            SimulatedBackend.perturbed(request, seed=seed) if family == "own-model" else None
        )
        self._knobs = None if self._own else knobs_for(self._physics, self._gpu, seed, request.name)
        if family == FAILING:
            self.form = self._failure_form(request)

    def _failure_form(self, request: TuningRequest) -> FailureForm:
        key = (request.model_dump_json(exclude={"tuning"}), self._seed)
        if key not in _FORMS:
            configs = build_space(request, self._model, self._gpu).configs

            def margin(cfg: TrialConfig) -> float | None:
                checks = slo.check(request, self._truth(cfg))
                return -max(slo.constraint_values(checks)) if checks else None

            where = f"{request.name}:{self._seed}"
            _FORMS[key] = failures.choose(list(configs), self._gpu, where, margin)
        return _FORMS[key]

    @property
    def failing(self) -> tuple[Structure, ...]:
        """The structures that fail in this world (none but in a failing world)."""
        return self.form.structures

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
        if (failed := self.form.failure(config)) is not None:
            return failed
        if self._own is not None:
            return self._own.measure(config, repeat=repeat)
        rng = _rng(self._physics, self._gpu.key, self._seed, config.label(), repeat)
        return self._measure(config, rng, noisy=True, requests=None)

    def truth(self, config: TrialConfig) -> Measurement:
        """What `config` really does on this pool: no run noise, a large sample."""
        return self.form.failure(config) or self._truth(config)

    def _truth(self, config: TrialConfig) -> Measurement:
        if self._own is not None:
            return self._own.typical(config)
        rng = _rng("truth", self._physics, self._gpu.key, self._seed, config.label())
        return self._measure(config, rng, noisy=False, requests=TRUTH_REQUESTS)

    @property
    def noise(self) -> float:
        """The pool's run-to-run noise (relative standard deviation of a run's timings)."""
        return self._knobs.noise if self._knobs is not None else 0.02

    def close(self) -> None:
        return None
