"""The Optuna study: an objective that measures one configuration, driven by `study.optimize`.

Every executed trial lives in the study (default: an Optuna journal file in the output
directory; an RDB URL when given, see storage.py), with its configuration, measurement and SLO
checks as user attributes (records.py). Re-running the same request resumes the study: a
completed trial is never repeated, and a trial left RUNNING by an interrupted single-worker run
is marked failed and retried.

Workers: `parallelism` > 1 runs that many threads (one backend each) in this process; on an RDB
storage, every `infertune tune` process of the same request joins the same study as further
workers. A worker *claims* its next configuration under the study's claim lock: it decides with
every other worker's claims in flight, checks the budget (executed + in flight, global) and
records the configuration on its trial before the lock is released, so no two workers measure
the same configuration and the budget holds across workers. When the only trials that may still
change the answer are in flight elsewhere, a worker waits for them instead of stopping. A trial
whose worker died is re-run by another worker after the heartbeat's grace period (the retry
keeps the configuration it had claimed).

Samplers (samplers.py): `auto` (model-guided, planner.py), or Optuna's `tpe` (constraint-aware),
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
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from infertune_tuner import slo
from infertune_tuner.backends.base import BenchmarkBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement
from infertune_tuner.request import TuningRequest
from infertune_tuner.result import SloCheck
from infertune_tuner.search.evidence import Known
from infertune_tuner.search.planner import Planner
from infertune_tuner.search.plausibility import judged
from infertune_tuner.search.records import (
    ATTR_CHANCES,
    ATTR_CHECKS,
    ATTR_CONFIG,
    ATTR_CONSTRAINTS,
    ATTR_MEASUREMENT,
    ATTR_PURPOSE,
    ATTR_RUN,
    ATTR_SKIP,
    config_of,
    known_from,
    measurement_to_attr,
)
from infertune_tuner.search.samplers import (
    Admissible,
    AutoSampler,
    BudgetCallback,
    SkipRuledOut,
    make_base_sampler,
    stop,
    stopped,
)
from infertune_tuner.space import SearchSpace
from infertune_tuner.stop import STOP_ATTR, TIMEOUT, StopKind, StopReason, aborted, budget
from infertune_tuner.storage import ClaimLock, fail_stale

log = logging.getLogger(__name__)
optuna.logging.set_verbosity(optuna.logging.ERROR)  # failures are reported by the tuner itself

POLL_S = 0.25  # how often a waiting worker looks at the study again
Claim = Callable[[], AbstractContextManager[None]]


class TrialFailed(Exception):
    """The configuration ran out of memory or failed: recorded, the search goes on."""


class _Wait(Exception):
    """Nothing to claim now: trials in flight elsewhere may still change the answer."""


def study_name(request: TuningRequest, backend: str) -> str:
    """Same request + backend + sampler -> same study (so a re-run resumes it, and every worker
    of a shared storage joins it). Where the study lives, the budget, the confidence target and
    the number of workers are no part of it."""
    tuning = {"max_trials", "parallelism", "confidence"}
    tuning |= {"storage"} if request.tuning.storage else set()
    payload = request.model_dump(mode="json", exclude={"tuning": tuning})
    payload["_backend"] = backend
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:10]
    return f"infertune-{request.name}-{digest}"


def distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    return {
        "tp": CategoricalDistribution(list(space.tensor_parallel)),
        "max_batch_size": CategoricalDistribution(list(space.max_batch_size)),
        "quantization": CategoricalDistribution(list(space.quantization)),
        "kv_cache_dtype": CategoricalDistribution(list(space.kv_cache_dtype)),
    }


# ------------------------------------------------------------------ the search


@dataclass
class SearchOutcome:
    """Why the search stopped, and the study (the report reads its confidence from there)."""

    stop: StopReason
    study: Study


OnTrial = Callable[[TrialConfig, Measurement, list[SloCheck], Known], None]


def make_sampler(
    request: TuningRequest, space: SearchSpace, planner: Planner, *, scope: str | None, seed: int
) -> BaseSampler:
    """The study's sampler for `request.tuning.sampler`: `auto`, or Optuna's own wrapped so
    that it proposes candidates only. It is handed to `optuna.create_study`.

    Args:
        request: The tuning request.
        space: Its search space.
        planner: The search core for it.
        scope: The run whose `error` trials count (None: every worker's, on a shared study).
        seed: The sampler's seed.
    """
    dists = distributions(space)
    if request.tuning.sampler == "auto":
        return AutoSampler(planner, dists, budget=request.tuning.max_trials, scope=scope, seed=seed)
    base = make_base_sampler(request.tuning.sampler, dists, seed)
    return SkipRuledOut(base, Admissible(planner, scope), dists, seed=seed)


class Search:
    """Runs a study whose sampler `make_sampler` built: claims, measures and records trials.

    Args:
        request: The tuning request.
        space: Its search space.
        planner: The search core (the sampler's, for `auto`).
        study: The study, created with `make_sampler`'s sampler.
        run_id: This run's id, recorded on its trials (`make_sampler`'s scope, unless shared).
        on_trial: Called after each measurement with what the study then knows.
        deadline: `time.monotonic()` after which no trial starts.
        lock: The study's claim lock (storage.ClaimLock).
        shared: Whether other processes work on the same study.
    """

    def __init__(
        self,
        request: TuningRequest,
        space: SearchSpace,
        planner: Planner,
        study: Study,
        *,
        run_id: str,
        on_trial: OnTrial | None = None,
        deadline: float | None = None,
        lock: Claim | None = None,
        shared: bool = False,
    ) -> None:
        self.request = request
        self.space = space
        self.priors = planner.priors
        self.study = study
        self.max_trials = request.tuning.max_trials
        self.on_trial = on_trial
        self.deadline = deadline
        self.run_id = run_id
        # Workers of a shared study are one run: an error another worker met counts for all.
        self.scope: str | None = None if shared else self.run_id
        self.shared = shared
        self.lock: Claim = lock if lock is not None else ClaimLock(None)
        self.dists = distributions(space)
        self.planner = planner
        self.auto = study.sampler if isinstance(study.sampler, AutoSampler) else None
        # A wrapped sampler's answer, read once per study state for both of them.
        self.admissible = (
            study.sampler.admissible
            if isinstance(study.sampler, SkipRuledOut)
            else Admissible(planner, self.scope)
        )

    def known(self, study: Study, extra: FrozenTrial | None = None) -> Known:
        return known_from(self.request, study, self.scope, extra)

    # -- resume

    def recover_interrupted(self) -> int:
        """Mark trials a killed run left RUNNING in a journal as failed (they will be rerun)."""
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

    def others_running(self) -> bool:
        """Whether any trial of the study is running (in this process or another worker)."""
        if self.shared:
            fail_stale(self.study)  # a dead worker's trial is no worker
        return bool(self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))

    # -- one trial

    def _skip(self, trial: optuna.Trial, what: str, why: str | StopReason) -> None:
        """Prune `trial` (it measures nothing) for `why`; a StopReason also stops the study."""
        trial.set_user_attr(ATTR_SKIP, f"{what}: {why}")
        if isinstance(why, StopReason):
            stop(self.study, why)
        raise optuna.TrialPruned(str(why))

    def _record(self, trial: optuna.Trial, m: Measurement) -> list[SloCheck]:
        checks = slo.check(self.request, m)
        trial.set_user_attr(ATTR_MEASUREMENT, measurement_to_attr(m))
        trial.set_user_attr(ATTR_CHECKS, [c.model_dump() for c in checks])
        values = slo.constraint_values(checks)
        trial.set_user_attr(ATTR_CONSTRAINTS, values)
        for c, v in zip(checks, values, strict=True):
            trial.set_constraint(f"{c.metric}/{c.percentile}", v)
        return checks

    def _suggest(self, trial: optuna.Trial) -> TrialConfig:
        return config_of(
            {k: trial.suggest_categorical(k, d.choices) for k, d in self.dists.items()}  # type: ignore[attr-defined]
        )

    def _choose(self, trial: optuna.Trial) -> tuple[TrialConfig, str]:
        """Under the claim lock: what this trial measures (raises _Wait, or skips the trial)."""
        retried = trial.user_attrs.get(ATTR_CONFIG)  # a trial whose worker died, to re-run
        purpose = str(trial.user_attrs.get(ATTR_PURPOSE, "explore"))
        chances = None
        if retried is not None:
            cfg = config_of(retried)
            self._suggest(trial)  # the retried trial keeps its parameters
            if ATTR_MEASUREMENT in trial.user_attrs:  # its worker died after measuring it
                self._skip(trial, cfg.label(), "measured before its worker died")
        elif self.auto is not None:
            decision = self.auto.decision_for(self.study, trial.number)
            if decision.config is None and decision.stop is None:
                raise _Wait
            cfg = self._suggest(trial)
            if decision.config != cfg:
                why = decision.stop or StopReason(StopKind.EXHAUSTED, "nothing to measure now")
                self._skip(trial, cfg.label(), why)
            purpose, chances = decision.purpose, decision.chances
        else:
            cfg = self._suggest(trial)
            if not self.admissible(self.study):  # a wrapped sampler has nothing left to propose
                exhausted = StopReason(
                    StopKind.EXHAUSTED,
                    "every configuration was measured, is being measured, or is ruled out",
                )
                self._skip(trial, cfg.label(), exhausted)
        known = self.known(self.study, None)
        if retried is not None:
            known.in_flight.discard(cfg)  # its own claim
        if known.executed + len(known.in_flight) >= self.max_trials:
            self._skip(trial, cfg.label(), budget(self.max_trials))
        if retried is None and cfg in known.in_flight:
            self._skip(trial, cfg.label(), "being measured by another worker")
        trial.set_user_attr(ATTR_CONFIG, cfg.as_dict())
        trial.set_user_attr(ATTR_RUN, self.run_id)
        trial.set_user_attr(ATTR_PURPOSE, purpose)
        if chances is not None:
            trial.set_user_attr(ATTR_CHANCES, chances.model_dump())
        if (pred := self.priors.get(cfg)) is not None:
            trial.set_user_attr("predicted_tps", pred.output_tokens_per_s_per_gpu)
        return cfg, purpose

    def _claim(self, trial: optuna.Trial) -> TrialConfig:
        """Claim the next configuration for `trial`, waiting while only trials in flight
        elsewhere may change the answer."""
        while True:
            with self.lock():
                try:
                    return self._choose(trial)[0]
                except _Wait:
                    pass
            self._wait(trial)

    def _wait(self, trial: optuna.Trial) -> None:
        time.sleep(POLL_S)
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self._skip(trial, "wait", TIMEOUT)
        if self.shared:
            fail_stale(self.study)
        if self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            # A dead worker's trial waits to be re-run: give way so this worker picks it up.
            self._skip(trial, "wait", "a failed worker's trial is waiting")

    def _objective(
        self, backends: queue.Queue[BenchmarkBackend]
    ) -> Callable[[optuna.Trial], float]:
        def objective(trial: optuna.Trial) -> float:
            cfg = self._claim(trial)
            repeat = self.known(self.study).repeats(cfg)  # runs of it the study holds already
            backend = backends.get()
            try:
                m = backend.run(cfg, repeat=repeat)
            except Exception as exc:  # a backend bug must not lose the study
                log.exception("trial %s crashed", cfg.label())
                m = Measurement.failed("error", f"backend crashed: {exc!r}")
            finally:
                backends.put(backend)
            s = self.planner.settings
            m = judged(m, cfg, model=self.request.resolve_model(), gpu=self.request.resolve_gpu(),
                       output_tokens=self.request.workload.output_tokens,
                       margin=s.plausible_margin, short_output=s.short_output,
                       speedup=backend.speedup)  # fmt: skip
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
        after = self.planner.settings.abort_after_errors
        if len(statuses) >= after and all(s == "error" for s in statuses):
            last = trial.user_attrs.get(ATTR_MEASUREMENT, {}).get("reason")
            stop(study, aborted(len(statuses), last))

    def run(self, backends: list[BenchmarkBackend]) -> SearchOutcome:
        pool: queue.Queue[BenchmarkBackend] = queue.Queue()
        for b in backends:
            pool.put(b)
        first = self._first_check()
        if first is None:
            timeout = None if self.deadline is None else max(self.deadline - time.monotonic(), 0)
            self._clear_stop()
            self.study.optimize(
                self._objective(pool),
                n_jobs=len(backends),
                catch=(TrialFailed,),
                callbacks=[BudgetCallback(self.max_trials, self._count), self._abort_on_errors],
                timeout=timeout,
            )
        reason = first or stopped(self.study) or self._timeout_or_budget()
        return SearchOutcome(reason, self.study)

    def _count(self, study: Study) -> int:
        return self.known(study).executed

    def _first_check(self) -> StopReason | None:
        """A reason not to start at all (budget spent, or nothing left to do on resume)."""
        known = self.known(self.study)
        if known.executed >= self.max_trials:
            return budget(self.max_trials)
        if self.auto is not None and known.executed:
            d = self.planner.decide(known, remaining=self.max_trials - known.executed)
            return d.stop
        return None

    def _clear_stop(self) -> None:
        # A re-run after a stop decides afresh (a bigger budget, a fixed set-up); a worker
        # joining others at work leaves their answer alone.
        with self.lock():
            if stopped(self.study) is not None and not self.others_running():
                self.study.set_user_attr(STOP_ATTR, None)

    def _timeout_or_budget(self) -> StopReason:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return TIMEOUT
        return budget(self.max_trials)
