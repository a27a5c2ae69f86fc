"""The Optuna study: an objective that measures one configuration, driven by `study.optimize`.

Every executed trial lives in the study (default: an Optuna journal file in the output
directory; an RDB URL when given), with its configuration, measurement and SLO checks as user
attributes. Re-running the same request resumes the study: a completed trial is never repeated,
and a trial left RUNNING by an interrupted single-worker run is marked failed and retried.
`parallelism` > 1 runs that many workers (threads, one backend each) on the same study.

Samplers (sampler.py): `auto` (model-guided, strategy.py), or Optuna's `tpe` (constraint-aware),
`random` and `grid` wrapped so that they never propose what the memory model or the measurements
rule out. A proposal that still cannot run (the search is done, the budget is spent) is told to
the study as PRUNED and costs no budget.
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.storages import BaseStorage
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from infertune_tuner import slo
from infertune_tuner.backends.base import BenchmarkBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.known import Known, implied_infeasible
from infertune_tuner.measurement import Measurement
from infertune_tuner.memory_fit import ruled_out
from infertune_tuner.metrics import LATENCY_METRICS
from infertune_tuner.perfmodel.latency import Percentiles, Prediction
from infertune_tuner.request import TuningRequest
from infertune_tuner.result import SloCheck
from infertune_tuner.sampler import (
    STOP_REASON,
    AutoSampler,
    BudgetCallback,
    SkipRuledOut,
    config_of,
    make_base_sampler,
    stop,
)
from infertune_tuner.space import SearchSpace
from infertune_tuner.strategy import Planner
from infertune_tuner.study_storage import journal_storage

log = logging.getLogger(__name__)
optuna.logging.set_verbosity(optuna.logging.ERROR)  # failures are reported by the tuner itself

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
ATTR_PURPOSE = "purpose"


class TrialFailed(Exception):
    """The configuration ran out of memory or failed: recorded, the search goes on."""


def study_name(request: TuningRequest, backend: str) -> str:
    """Same request + backend + sampler -> same study (so a re-run resumes it)."""
    payload = request.model_dump(mode="json", exclude={"tuning": {"max_trials", "parallelism"}})
    payload["_backend"] = backend
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:10]
    return f"infertune-{request.name}-{digest}"


def open_storage(request: TuningRequest, out_dir: Path) -> str | BaseStorage:
    """The RDB URL, else the journal in ``out_dir`` (hold ``study_storage.lock_study`` first)."""
    if request.tuning.storage:
        return request.tuning.storage
    return journal_storage(out_dir)


def distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    return {
        "tp": CategoricalDistribution(list(space.tensor_parallel)),
        "max_batch_size": CategoricalDistribution(list(space.max_batch_size)),
        "quantization": CategoricalDistribution(list(space.quantization)),
        "kv_cache_dtype": CategoricalDistribution(list(space.kv_cache_dtype)),
    }


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
        "concurrency": m.concurrency,
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
        concurrency=d.get("concurrency"),
    )


@dataclass
class ExecutedTrial:
    number: int
    config: TrialConfig
    measurement: Measurement
    checks: list[SloCheck]
    run: str | None = None
    purpose: str = "explore"


def _executed(t: FrozenTrial) -> ExecutedTrial | None:
    if ATTR_MEASUREMENT not in t.user_attrs or ATTR_CONFIG not in t.user_attrs:
        return None
    return ExecutedTrial(
        t.number,
        config_of(t.user_attrs[ATTR_CONFIG]),
        measurement_from_attr(t.user_attrs[ATTR_MEASUREMENT]),
        [SloCheck.model_validate(c) for c in t.user_attrs.get(ATTR_CHECKS, [])],
        t.user_attrs.get(ATTR_RUN),
        t.user_attrs.get(ATTR_PURPOSE, "explore"),
    )


def executed_trials(study: Study) -> list[ExecutedTrial]:
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
        if (e := _executed(t)) is not None:
            out.append(e)
    return out


def current_trials(
    study: Study, run: str | None = None, extra: FrozenTrial | None = None
) -> list[ExecutedTrial]:
    """The executed trials that count, in trial order (repeats of a configuration included).

    Trials that failed with `error` in an *earlier* run are left out, so a re-run after fixing
    the set-up (server command, checkpoint) retries them; OOMs and measurements are kept for
    good (the study keeps everything). `extra`: a trial just measured but not yet told."""
    trials = executed_trials(study)
    if extra is not None and (e := _executed(extra)) is not None:
        trials = [t for t in trials if t.number != e.number] + [e]
    out = [
        e
        for e in trials
        if not (run is not None and e.measurement.status == "error" and e.run != run)
    ]
    return sorted(out, key=lambda e: e.number)


def known_from(
    request: TuningRequest, study: Study, run: str | None = None, extra: FrozenTrial | None = None
) -> Known:
    """What the study knows: every current measurement and the configurations in flight."""
    runs: dict[TrialConfig, list[Measurement]] = {}
    for e in current_trials(study, run, extra):
        runs.setdefault(e.config, []).append(e.measurement)
    in_flight = set()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if ATTR_CONFIG in t.user_attrs and (extra is None or t.number != extra.number):
            in_flight.add(config_of(t.user_attrs[ATTR_CONFIG]))
    return Known.build(request, runs, in_flight)


# ------------------------------------------------------------------ the search


@dataclass
class SearchOutcome:
    stopped_reason: str
    study: Study
    confidence: float | None


OnTrial = Callable[[TrialConfig, Measurement, list[SloCheck], Known], None]


class Search:
    def __init__(
        self,
        request: TuningRequest,
        space: SearchSpace,
        priors: dict[TrialConfig, Prediction],
        study: Study,
        *,
        seed: int,
        on_trial: OnTrial | None = None,
        deadline: float | None = None,
    ) -> None:
        self.request = request
        self.space = space
        self.priors = priors
        self.study = study
        self.max_trials = request.tuning.max_trials
        self.on_trial = on_trial
        self.deadline = deadline
        self.run_id = uuid.uuid4().hex
        self.dists = distributions(space)
        self.planner = Planner(request, space, priors, seed=seed)
        self.auto: AutoSampler | None = None
        self._admissible: tuple[object, set[TrialConfig]] | None = None
        if request.tuning.sampler == "auto":
            self.auto = AutoSampler(
                self.planner, self.dists, self.known, budget=self.max_trials, seed=seed
            )
            study.sampler = self.auto
        else:
            base = make_base_sampler(request.tuning.sampler, self.dists, seed)
            study.sampler = SkipRuledOut(base, self.admissible, self.dists, seed=seed)

    def known(self, study: Study, extra: FrozenTrial | None = None) -> Known:
        return known_from(self.request, study, self.run_id, extra)

    def admissible(self, study: Study) -> set[TrialConfig]:
        """Configurations a wrapped sampler may propose: not ruled out, not measured, not running."""
        known = self.known(study)
        # Each parameter of a trial asks again: answer from the same study state once.
        state = (
            frozenset((c, len(ms)) for c, ms in known.runs.items()),
            frozenset(known.in_flight),
        )
        if self._admissible is not None and self._admissible[0] == state:
            return self._admissible[1]
        allowed = {
            c
            for c in self.space.configs
            if not ruled_out(self.planner.margin[c])
            and c not in known.measured
            and c not in known.in_flight
            and implied_infeasible(c, known) is None
        }
        self._admissible = (state, allowed)
        return allowed

    # -- resume

    def recover_interrupted(self) -> int:
        """Mark trials a killed single-worker run left RUNNING as failed (they will be rerun)."""
        stale = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        # Bookkeeping, not a search decision: the search's sampler must not hear of it (it
        # would decide to stop, and Study.stop outside optimize() raises).
        sampler, self.study.sampler = self.study.sampler, optuna.samplers.RandomSampler()
        try:
            for t in stale:
                self.study.tell(t.number, state=TrialState.FAIL)
        finally:
            self.study.sampler = sampler
        return len(stale)

    # -- one trial

    def _skip(self, trial: optuna.Trial, cfg: TrialConfig, why: str, *, done: bool) -> None:
        trial.set_user_attr(ATTR_SKIP, f"{cfg.label()}: {why}")
        if done:
            stop(self.study, why)
        raise optuna.TrialPruned(why)

    def _record(self, trial: optuna.Trial, m: Measurement) -> list[SloCheck]:
        checks = slo.check(self.request, m)
        trial.set_user_attr(ATTR_MEASUREMENT, measurement_to_attr(m))
        trial.set_user_attr(ATTR_CHECKS, [c.model_dump() for c in checks])
        values = slo.constraint_values(checks)
        trial.set_user_attr(ATTR_CONSTRAINTS, values)
        for c, v in zip(checks, values, strict=True):
            trial.set_constraint(f"{c.metric}/{c.percentile}", v)
        return checks

    def _objective(
        self, backends: queue.Queue[BenchmarkBackend]
    ) -> Callable[[optuna.Trial], float]:
        def objective(trial: optuna.Trial) -> float:
            params = {k: trial.suggest_categorical(k, d.choices) for k, d in self.dists.items()}  # type: ignore[attr-defined]
            cfg = config_of(params)
            purpose = "explore"
            if self.auto is not None:
                decision = self.auto.decision_for(self.study, trial.number)
                self.auto.decisions.pop(trial.number, None)
                if decision is None or decision.config != cfg:
                    reason = decision.stop_reason if decision else None
                    self._skip(trial, cfg, reason or "nothing to measure now", done=True)
                assert decision is not None
                purpose = decision.purpose
            known = self.known(self.study)
            if known.executed + len(known.in_flight) >= self.max_trials:
                self._skip(trial, cfg, f"budget: maxTrials ({self.max_trials}) executed", done=True)
            trial.set_user_attr(ATTR_CONFIG, cfg.as_dict())
            trial.set_user_attr(ATTR_RUN, self.run_id)
            trial.set_user_attr(ATTR_PURPOSE, purpose)
            if (pred := self.priors.get(cfg)) is not None:
                trial.set_user_attr("predicted_tps", pred.output_tokens_per_s_per_gpu)
            backend = backends.get()
            try:
                m = backend.run(cfg)
            except Exception as exc:  # a backend bug must not lose the study
                log.exception("trial %s crashed", cfg.label())
                m = Measurement.failed("error", f"backend crashed: {exc!r}")
            finally:
                backends.put(backend)
            checks = self._record(trial, m)
            if self.on_trial is not None:
                known = self.known(self.study)
                known = Known.build(
                    self.request,
                    {**known.runs, cfg: [*known.runs.get(cfg, []), m]},
                    known.in_flight - {cfg},
                )
                self.on_trial(cfg, m, checks, known)
            if m.status == "ok" and m.output_tokens_per_s_per_gpu is not None:
                return m.output_tokens_per_s_per_gpu
            raise TrialFailed(m.reason or m.status)

        return objective

    def _abort_on_errors(self, study: Study, trial: FrozenTrial) -> None:
        statuses = [m.status for m in self.known(study).measured.values()]
        if len(statuses) >= ABORT_AFTER_ERRORS and all(s == "error" for s in statuses):
            last = trial.user_attrs.get(ATTR_MEASUREMENT, {}).get("reason")
            stop(study, f"{ABORTED}: the first {len(statuses)} trials all failed; last: {last}")

    def run(self, backends: list[BenchmarkBackend]) -> SearchOutcome:
        pool: queue.Queue[BenchmarkBackend] = queue.Queue()
        for b in backends:
            pool.put(b)
        first = self._first_check()
        if first is None:
            timeout = None if self.deadline is None else max(self.deadline - time.monotonic(), 0)
            self._clear_stop_reason()
            self.study.optimize(
                self._objective(pool),
                n_jobs=len(backends),
                catch=(TrialFailed,),
                callbacks=[BudgetCallback(self.max_trials, self._count), self._abort_on_errors],
                timeout=timeout,
            )
        reason = first or self.study.user_attrs.get(STOP_REASON) or self._timeout_or_budget()
        confidence = self.planner.assess(self.known(self.study)).confidence
        return SearchOutcome(reason, self.study, confidence)

    def _count(self, study: Study) -> int:
        return self.known(study).executed

    def _first_check(self) -> str | None:
        """A reason not to start at all (budget spent, or nothing left to do on resume)."""
        known = self.known(self.study)
        if known.executed >= self.max_trials:
            return f"budget: maxTrials ({self.max_trials}) executed"
        if self.auto is not None and known.executed:
            d = self.planner.decide(known, remaining=self.max_trials - known.executed)
            return d.stop_reason
        return None

    def _clear_stop_reason(self) -> None:
        # A re-run after a stop decides afresh (a bigger budget, a fixed set-up).
        if self.study.user_attrs.get(STOP_REASON) is not None:
            self.study.set_user_attr(STOP_REASON, None)

    def _timeout_or_budget(self) -> str:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return "timeout: spec.tuning.timeoutMinutes reached"
        return f"budget: maxTrials ({self.max_trials}) executed"
