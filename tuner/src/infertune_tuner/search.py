"""The Optuna study: workers that pick a configuration, measure it and record it.

Every executed trial lives in the study (default: an Optuna journal file in the output
directory; an RDB URL when given), with its configuration, measurement and SLO checks as user
attributes. Re-running the same request resumes the study: a completed trial is never repeated,
and a trial left RUNNING by an interrupted single-worker run is marked failed and retried.
`parallelism` > 1 runs that many workers against the same storage.

Samplers: `auto` (model-guided, see strategy.py; Optuna records what it enqueues), `tpe`
(constraint-aware TPE), `random`, `grid`. A sampler's suggestion that the memory model rules out,
or that was already measured, is told to the study as PRUNED and costs no budget.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.storages import BaseStorage, JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from infertune_tuner import slo
from infertune_tuner.backends.base import BenchmarkBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement
from infertune_tuner.metrics import LATENCY_METRICS
from infertune_tuner.perfmodel.latency import Percentiles, Prediction
from infertune_tuner.request import TuningRequest
from infertune_tuner.result import SloCheck
from infertune_tuner.space import SearchSpace
from infertune_tuner.strategy import Known, implied_infeasible, propose

log = logging.getLogger(__name__)
optuna.logging.set_verbosity(optuna.logging.WARNING)

MAX_CONSECUTIVE_SKIPS = 25  # a sampler stuck on tried configs falls back to an untried one
# The first trials all failing with `error` (not OOM) means the set-up is broken (server not
# found, no checkpoint, no GPU): stop instead of burning the whole budget on the same failure.
ABORT_AFTER_ERRORS = 3
ABORTED = "aborted"
ATTR_CONFIG = "config"
ATTR_MEASUREMENT = "measurement"
ATTR_CHECKS = "slo_checks"
ATTR_CONSTRAINTS = "constraints"
ATTR_SKIP = "skipped"
ATTR_RUN = "run"


def study_name(request: TuningRequest, backend: str) -> str:
    """Same request + backend + sampler -> same study (so a re-run resumes it)."""
    payload = request.model_dump(mode="json", exclude={"tuning": {"max_trials", "parallelism"}})
    payload["_backend"] = backend
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:10]
    return f"infertune-{request.name}-{digest}"


def open_storage(request: TuningRequest, out_dir: Path) -> str | BaseStorage:
    if request.tuning.storage:
        return request.tuning.storage
    out_dir.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(out_dir / "study.journal")))


def distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    return {
        "tp": CategoricalDistribution(list(space.tensor_parallel)),
        "max_batch_size": CategoricalDistribution(list(space.max_batch_size)),
        "quantization": CategoricalDistribution(list(space.quantization)),
        "kv_cache_dtype": CategoricalDistribution(list(space.kv_cache_dtype)),
    }


def make_sampler(name: str, space: SearchSpace, seed: int) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        # Constraint-aware: each SLO bound is recorded with Trial.set_constraint (<= 0 = met).
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=5)
    if name == "grid":
        grid: dict[str, Sequence[Any]] = {
            k: list(v.choices)  # type: ignore[attr-defined]
            for k, v in distributions(space).items()
        }
        return optuna.samplers.GridSampler(grid, seed=seed)
    # `auto` enqueues its own choices; the random sampler only covers fallbacks.
    return optuna.samplers.RandomSampler(seed=seed)


# ------------------------------------------------------------------ (de)serialising measurements


def measurement_to_attr(m: Measurement) -> dict[str, Any]:
    def pct(p: Percentiles | None) -> dict[str, float] | None:
        return p.as_dict() if p else None

    return {
        "status": m.status,
        **{x.key: pct(m.percentiles(x.key)) for x in LATENCY_METRICS},
        "output_tokens_per_s_per_gpu": m.output_tokens_per_s_per_gpu,
        "requests": m.requests,
        "errors": m.errors,
        "reason": m.reason,
        "duration_s": m.duration_s,
    }


def measurement_from_attr(d: dict[str, Any]) -> Measurement:
    def pct(v: dict[str, float] | None) -> Percentiles | None:
        return Percentiles(v["p50"], v["p95"], v["p99"]) if v else None

    return Measurement(
        status=d["status"],
        **{x.key: pct(d.get(x.key)) for x in LATENCY_METRICS},
        output_tokens_per_s_per_gpu=d.get("output_tokens_per_s_per_gpu"),
        requests=d.get("requests", 0),
        errors=d.get("errors", 0),
        reason=d.get("reason"),
        duration_s=d.get("duration_s", 0.0),
    )


def config_of(params: dict[str, Any]) -> TrialConfig:
    return TrialConfig(
        int(params["tp"]),
        int(params["max_batch_size"]),
        str(params["quantization"]),
        str(params["kv_cache_dtype"]),
    )


@dataclass
class ExecutedTrial:
    number: int
    config: TrialConfig
    measurement: Measurement
    checks: list[SloCheck]
    run: str | None = None


def executed_trials(study: optuna.Study) -> list[ExecutedTrial]:
    out = []
    for t in study.get_trials(deepcopy=False):
        if t.state in (TrialState.COMPLETE, TrialState.FAIL) and ATTR_MEASUREMENT in t.user_attrs:
            out.append(
                ExecutedTrial(
                    t.number,
                    config_of(t.user_attrs[ATTR_CONFIG]),
                    measurement_from_attr(t.user_attrs[ATTR_MEASUREMENT]),
                    [SloCheck.model_validate(c) for c in t.user_attrs.get(ATTR_CHECKS, [])],
                    t.user_attrs.get(ATTR_RUN),
                )
            )
    return out


def current_trials(study: optuna.Study, run: str | None = None) -> list[ExecutedTrial]:
    """The executed trials that count, one per configuration (the latest), in trial order.

    Trials that failed with `error` in an *earlier* run are left out, so a re-run after fixing
    the set-up (server command, checkpoint) retries them; OOMs and measurements are kept for
    good (the study keeps everything)."""
    latest: dict[TrialConfig, ExecutedTrial] = {}
    for e in executed_trials(study):
        if run is not None and e.measurement.status == "error" and e.run != run:
            continue
        latest[e.config] = e
    return sorted(latest.values(), key=lambda e: e.number)


def known_from(study: optuna.Study, run: str | None = None) -> Known:
    """What the study knows: current measurements and the configurations in flight."""
    known = Known()
    for e in current_trials(study, run):
        known.measured[e.config] = e.measurement
        known.checks[e.config] = e.checks
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if ATTR_CONFIG in t.user_attrs:
            known.in_flight.add(config_of(t.user_attrs[ATTR_CONFIG]))
    return known


# ------------------------------------------------------------------ the worker loop


@dataclass
class SearchOutcome:
    stopped_reason: str
    study: optuna.Study


@dataclass
class _Shared:
    stop_reason: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def stop(self, reason: str) -> None:
        with self.lock:
            if self.stop_reason is None:
                self.stop_reason = reason


OnTrial = Callable[[TrialConfig, Measurement, list[SloCheck], Known], None]


class Search:
    def __init__(
        self,
        request: TuningRequest,
        space: SearchSpace,
        priors: dict[TrialConfig, Prediction],
        study: optuna.Study,
        *,
        seed: int,
        on_trial: OnTrial | None = None,
        deadline: float | None = None,
    ) -> None:
        self.request = request
        self.space = space
        self.priors = priors
        self.fits = [c for c in space.configs if priors[c].fits]
        self.fit_set = set(self.fits)
        self.study = study
        self.sampler_name = request.tuning.sampler
        self.dists = distributions(space)
        self.max_trials = request.tuning.max_trials
        self.rng = random.Random(seed)
        self.on_trial = on_trial
        self.deadline = deadline
        self._shared = _Shared()
        self._ask_lock = threading.Lock()
        self.run_id = uuid.uuid4().hex

    # -- resume

    def recover_interrupted(self) -> int:
        """Mark trials a killed single-worker run left RUNNING as failed (they will be rerun)."""
        stale = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        for t in stale:
            self.study._storage.set_trial_user_attr(t._trial_id, "interrupted", True)
            self.study.tell(t.number, state=TrialState.FAIL)
        return len(stale)

    # -- choosing

    def _untried(self, known: Known) -> list[TrialConfig]:
        return [
            c
            for c in self.fits
            if c not in known.measured
            and c not in known.in_flight
            and implied_infeasible(c, known) is None
        ]

    def _next(self, known: Known) -> tuple[optuna.trial.Trial | None, TrialConfig | None]:
        untried = self._untried(known)
        if not untried:
            self._shared.stop("every configuration that could fit has been measured or ruled out")
            return None, None
        if self.sampler_name == "auto":
            cfg, why = propose(self.request, untried, self.priors, known)
            if cfg is None:
                self._shared.stop(why)
                return None, None
            return self._ask_fixed(cfg), cfg
        skips = 0
        untried_set = set(untried)
        while True:
            trial = self.study.ask(self.dists)
            cfg = config_of(trial.params)
            if cfg in untried_set:
                return trial, cfg
            reason = (
                self.priors[cfg].memory.reason
                if cfg not in self.fit_set
                else implied_infeasible(cfg, known) or "already measured"
            )
            trial.set_user_attr(ATTR_SKIP, f"{cfg.label()}: {reason}")
            self.study.tell(trial, state=TrialState.PRUNED)
            skips += 1
            if skips >= MAX_CONSECUTIVE_SKIPS:
                cfg = self.rng.choice(untried)
                return self._ask_fixed(cfg), cfg

    def _ask_fixed(self, cfg: TrialConfig) -> optuna.trial.Trial:
        self.study.enqueue_trial(cfg.as_dict(), skip_if_exists=False)
        trial = self.study.ask(self.dists)
        return trial

    # -- running

    def _record(
        self, trial: optuna.trial.Trial, cfg: TrialConfig, m: Measurement
    ) -> list[SloCheck]:
        checks = slo.check(self.request, m)
        trial.set_user_attr(ATTR_MEASUREMENT, measurement_to_attr(m))
        trial.set_user_attr(ATTR_CHECKS, [c.model_dump() for c in checks])
        values = slo.constraint_values(checks)
        trial.set_user_attr(ATTR_CONSTRAINTS, values)
        for c, v in zip(checks, values, strict=True):
            trial.set_constraint(f"{c.metric}/{c.percentile}", v)
        if m.status == "ok" and m.output_tokens_per_s_per_gpu is not None:
            self.study.tell(trial, m.output_tokens_per_s_per_gpu)
        else:
            self.study.tell(trial, state=TrialState.FAIL)
        return checks

    def worker(self, backend: BenchmarkBackend) -> None:
        while self._shared.stop_reason is None:
            if self.deadline is not None and time.monotonic() > self.deadline:
                self._shared.stop("timeout: spec.tuning.timeoutMinutes reached")
                break
            with self._ask_lock:
                known = known_from(self.study, self.run_id)
                if known.executed + len(known.in_flight) >= self.max_trials:
                    if not known.in_flight:
                        self._shared.stop(f"budget: maxTrials ({self.max_trials}) executed")
                    break
                trial, cfg = self._next(known)
                if trial is None or cfg is None:
                    break
                trial.set_user_attr(ATTR_CONFIG, cfg.as_dict())
                trial.set_user_attr(ATTR_RUN, self.run_id)
                pred = self.priors.get(cfg)
                if pred is not None:
                    trial.set_user_attr("predicted_tps", pred.output_tokens_per_s_per_gpu)
            try:
                m = backend.run(cfg)
            except Exception as exc:  # a backend bug must not lose the study
                log.exception("trial %s crashed", cfg.label())
                m = Measurement.failed("error", f"backend crashed: {exc!r}")
            with self._ask_lock:
                checks = self._record(trial, cfg, m)
                known = known_from(self.study, self.run_id)
                if self.on_trial is not None:
                    self.on_trial(cfg, m, checks, known)
                statuses = [x.status for x in known.measured.values()]
                if len(statuses) >= ABORT_AFTER_ERRORS and all(x == "error" for x in statuses):
                    self._shared.stop(
                        f"{ABORTED}: the first {len(statuses)} trials all failed; last: {m.reason}"
                    )

    def run(self, backends: list[BenchmarkBackend]) -> SearchOutcome:
        if len(backends) == 1:
            self.worker(backends[0])
        else:
            threads = [
                threading.Thread(target=self.worker, args=(b,), name=f"tuner-worker-{i}")
                for i, b in enumerate(backends)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        reason = self._shared.stop_reason
        if reason is None:
            reason = f"budget: maxTrials ({self.max_trials}) executed"
        return SearchOutcome(reason, self.study)
