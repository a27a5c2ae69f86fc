"""The Optuna study run: an objective that claims, measures and records one trial, driven by
`study.optimize`. It decides nothing: the study's sampler (sampler.py) decides what each trial
measures and when the search stops; the driver runs the trials and tells their results.

Every executed trial lives in the study (default: an Optuna journal file in the output
directory; an RDB URL when given, see storage.py), with its configuration, measurement and SLO
checks as user attributes (evidence.py). Re-running the same request resumes the study: a
completed trial is never repeated, and a trial left RUNNING by an interrupted single-worker run
is marked failed and retried.

Workers: `parallelism` > 1 runs that many threads (one backend each) in this process; on an RDB
storage, every `infertune tune` process of the same request joins the same study as further
workers. A worker *claims* its trial under the study's claim lock: the sampler decides with every
other worker's claims in flight and records its decision on the trial before the lock is
released, so no two workers measure the same configuration and the budget holds across workers.
When the sampler says to wait (only trials in flight elsewhere may still change the answer), the
worker waits until the study changes and gives its trial up for the next. A trial whose worker
died is re-run by another worker after the heartbeat's grace period (the retry keeps the
configuration it had claimed). A trial that measures nothing is told to the study as PRUNED,
with its typed reason (`Skip`), and costs no budget. A configuration that failed transiently
(evidence.is_transient) is re-run on another worker's backend when one is free.
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
from enum import StrEnum
from typing import NoReturn

import optuna
from optuna.distributions import BaseDistribution
from optuna.study import Study
from optuna.trial import TrialState

from infertune_tuner import pools, slo
from infertune_tuner.backends.base import BenchmarkBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement
from infertune_tuner.request import TuningRequest
from infertune_tuner.result import Check
from infertune_tuner.search.evidence import (
    ATTR_CHECKS,
    ATTR_CONFIG,
    ATTR_CONSTRAINTS,
    ATTR_MEASUREMENT,
    ATTR_RUN,
    ATTR_SETUP,
    ATTR_SKIP,
    Decision,
    Evidence,
    Scope,
    State,
    config_of,
    is_transient,
    judge,
    measurement_to_attr,
    read,
)
from infertune_tuner.search.posterior import Prior
from infertune_tuner.search.sampler import distributions
from infertune_tuner.search.settings import SearchSettings
from infertune_tuner.stop import STOP_ATTR, TIMEOUT, StopReason, why_stopped
from infertune_tuner.storage import ClaimLock, fail_stale

log = logging.getLogger(__name__)
optuna.logging.set_verbosity(optuna.logging.ERROR)  # failures are reported by the tuner itself

POLL_S = 0.25  # how often a waiting worker looks at the study again
Claim = Callable[[], AbstractContextManager[None]]


class TrialFailed(Exception):
    """The configuration ran out of memory or failed: recorded, the search goes on."""


class Skip(StrEnum):
    """Why a trial measures nothing (recorded on it as `skipped`)."""

    STOPPED = "the search stopped"
    WAITED = "waited for trials in flight"
    GIVE_WAY = "a failed worker's trial is waiting to be re-run"
    DEADLINE = "spec.tuning.timeoutMinutes reached while waiting"
    TAKEN = "being measured by another worker"
    MEASURED = "measured before its worker died"
    NOT_PROPOSED = "the sampler proposed nothing to measure now"
    OTHER_POOL = "a trial of another GPU pool (its own worker measures it when it is needed)"


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


@dataclass
class SearchOutcome:
    """Why the search stopped, and the study (the report reads its confidence from there)."""

    stop: StopReason
    study: Study


def _elsewhere(
    backends: queue.Queue[BenchmarkBackend], avoid: BenchmarkBackend | None
) -> BenchmarkBackend:
    """A free backend, another than `avoid` (where the configuration failed transiently) when
    one is free too: its re-run runs elsewhere."""
    backend = backends.get()
    if backend is avoid:
        try:
            other = backends.get_nowait()
        except queue.Empty:
            return backend
        backends.put(backend)
        return other
    return backend


def failure_scope(
    run_id: str, setup: str | None, *, shared: bool, retry_failed: bool
) -> Scope | None:
    """Whose `error` trials count as evidence (evidence.Scope): every worker's on a shared
    study (None); else this run's, and those of earlier runs on the same set-up unless
    `retry_failed`."""
    return None if shared else Scope(run_id, setup, retry_failed)


OnTrial = Callable[[TrialConfig, Measurement, list[Check], Evidence], None]


class Search:
    """Runs a study whose sampler `sampler.make_sampler` built: claims, measures and records
    trials.

    Args:
        prior: The space's predictions and fixed facts (the sampler's).
        settings: The search's constants (which measurements are valid).
        study: The study, created with the sampler.
        run_id: This run's id, recorded on its trials (the sampler's scope, unless shared).
        on_trial: Called after each measurement with what the study then knows.
        deadline: `time.monotonic()` after which no trial starts.
        lock: The study's claim lock (storage.ClaimLock).
        shared: Whether other processes work on the same study.
        setup: The set-up fingerprint (run.setup_fingerprint), recorded on each trial.
        scope: Whose failed trials count as evidence (:func:`failure_scope`, as the sampler
            was given it).
        pool: The one GPU pool this worker measures on (as the sampler was given it); "":
            every pool of the space.
    """

    def __init__(
        self,
        prior: Prior,
        settings: SearchSettings,
        study: Study,
        *,
        run_id: str,
        on_trial: OnTrial | None = None,
        deadline: float | None = None,
        lock: Claim | None = None,
        shared: bool = False,
        setup: str | None = None,
        scope: Scope | None = None,
        pool: str = "",
    ) -> None:
        self.prior = prior
        self.pool = pool
        self.request = prior.request
        self.settings = settings
        self.study = study
        self.max_trials = self.request.tuning.max_trials
        self.on_trial = on_trial
        self.deadline = deadline
        self.run_id = run_id
        self.setup = setup
        self.scope = scope
        self.shared = shared
        self.lock: Claim = lock if lock is not None else ClaimLock(None)
        self.dists: dict[str, BaseDistribution] = distributions(prior.space)

    def evidence(self) -> Evidence:
        return read(
            self.request, self.study, self.scope,
            transient_retries=self.settings.transient_retries,
        )  # fmt: skip

    # -- resume

    def recover_interrupted(self) -> int:
        """Mark trials a killed run left RUNNING in a journal as failed (they will be rerun)."""
        stale = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        # Bookkeeping, not a search decision: the search's sampler must not hear of it.
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

    def _skip(self, trial: optuna.Trial, skip: Skip, cfg: TrialConfig | None = None) -> NoReturn:
        """Prune `trial`: it measures nothing, for `skip`."""
        trial.set_user_attr(
            ATTR_SKIP, {"skip": skip.name.lower(), "config": cfg.label() if cfg else None}
        )
        raise optuna.TrialPruned(skip.value)

    def _record(self, trial: optuna.Trial, m: Measurement) -> list[Check]:
        checks = slo.check(self.request, m)
        trial.set_user_attr(ATTR_MEASUREMENT, measurement_to_attr(m))
        trial.set_user_attr(ATTR_CHECKS, [c.model_dump() for c in checks])
        values = slo.constraint_values(checks)
        trial.set_user_attr(ATTR_CONSTRAINTS, values)
        for c, v in zip(checks, values, strict=True):
            trial.set_constraint(c.constraint_key, v)
        return checks

    def _suggest(self, trial: optuna.Trial) -> TrialConfig:
        return config_of(
            {k: trial.suggest_categorical(k, d.choices) for k, d in self.dists.items()}  # type: ignore[attr-defined]
        )

    def _decision(self, trial: optuna.Trial) -> Decision | None:
        """What the sampler recorded on `trial` (None: it proposes without deciding)."""
        return Decision.of(self.study.get_trials(deepcopy=False)[trial.number])

    def _choose(self, trial: optuna.Trial) -> TrialConfig | State:
        """Under the claim lock: what this trial measures, or, when the sampler says to wait,
        the state of the evidence before it decided (prunes the trial when it measures
        nothing)."""
        retried = trial.user_attrs.get(ATTR_CONFIG)  # a trial whose worker died, to re-run
        if retried is not None:
            cfg = config_of(retried)
            self._suggest(trial)  # the retried trial keeps its parameters
            if ATTR_MEASUREMENT in trial.user_attrs:  # its worker died after measuring it
                self._skip(trial, Skip.MEASURED, cfg)
            if self.pool and cfg.gpu != self.pool:  # this worker's GPUs cannot run it
                self._skip(trial, Skip.OTHER_POOL, cfg)
        else:
            # Read before the sampler decides: a trial that ends meanwhile must wake a wait.
            before = self.evidence().state
            _ = trial.relative_params  # the sampler decides for this trial (before any suggest)
            decision = self._decision(trial)
            if decision is not None and decision.waits:
                return before
            cfg = self._suggest(trial)
            if decision is not None and decision.stop is not None:
                self._skip(trial, Skip.STOPPED, cfg)  # the sampler stopped the study
            if decision is not None and decision.config != cfg:
                self._skip(trial, Skip.NOT_PROPOSED, cfg)
            if decision is None and cfg in self.evidence().in_flight:
                self._skip(trial, Skip.TAKEN, cfg)  # a guarded sampler drew another's claim
            if self.pool and cfg.gpu != self.pool:  # never proposed here: a safety net
                self._skip(trial, Skip.OTHER_POOL, cfg)
        trial.set_user_attr(ATTR_CONFIG, cfg.as_dict())
        trial.set_user_attr(ATTR_RUN, self.run_id)
        if self.setup is not None:
            trial.set_user_attr(ATTR_SETUP, self.setup)
        if (tps := self.prior.tps.get(cfg)) is not None:  # its tok/s/GPU, not the objective
            trial.set_user_attr("predicted_tps", tps)
        return cfg

    def _claim(self, trial: optuna.Trial) -> TrialConfig:
        """Claim this trial's configuration, or wait for the trials in flight and give the
        trial up (the next one is decided afresh)."""
        with self.lock():
            cfg = self._choose(trial)
        if not isinstance(cfg, TrialConfig):
            self._wait(trial, cfg)
        return cfg

    def _wait(self, trial: optuna.Trial, before: State) -> NoReturn:
        """Wait until the evidence differs from `before`, then give the trial up."""
        while True:
            time.sleep(POLL_S)
            if self.deadline is not None and time.monotonic() >= self.deadline:
                self._skip(trial, Skip.DEADLINE)
            if self.shared:
                fail_stale(self.study)
            if self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                self._skip(trial, Skip.GIVE_WAY)  # a dead worker's trial: this worker takes it
            if self.evidence().state != before:
                self._skip(trial, Skip.WAITED)

    def _objective(
        self, backends: queue.Queue[BenchmarkBackend]
    ) -> Callable[[optuna.Trial], float]:
        model = self.request.resolve_model()
        failed_on: dict[TrialConfig, BenchmarkBackend] = {}  # where a transient failure happened

        def objective(trial: optuna.Trial) -> float:
            cfg = self._claim(trial)
            repeat = len(self.evidence().runs.get(cfg, ()))  # runs of it the study holds already
            backend = _elsewhere(backends, failed_on.get(cfg))
            try:
                m = backend.run(cfg, repeat=repeat)
            except Exception as exc:  # a backend bug must not lose the study
                log.exception("trial %s crashed", cfg.label())
                m = Measurement.failed("error", f"backend crashed: {exc!r}")
            finally:
                backends.put(backend)
            if is_transient(m):  # its re-run goes to another worker's backend when one is free
                failed_on[cfg] = backend
            s = self.settings
            m = judge(m, cfg, model=model, gpu=pools.gpu_of(self.request, cfg),
                      output_tokens=self.request.workload.output_tokens,
                      margin=s.plausible_margin, short_output=s.short_output,
                      speedup=backend.speedup)  # fmt: skip
            checks = self._record(trial, m)
            if self.on_trial is not None:
                ev = self.evidence()
                runs = {**ev.runs, cfg: (*ev.runs.get(cfg, ()), m)}
                self.on_trial(
                    cfg,
                    m,
                    checks,
                    Evidence(
                        self.request, runs, ev.in_flight - {cfg}, ev.covers, ev.transient_retries
                    ),
                )
            if m.status == "ok" and m.output_tokens_per_s_per_gpu is not None:
                return pools.value(self.request, cfg, m.output_tokens_per_s_per_gpu)
            raise TrialFailed(m.reason or m.status)

        return objective

    def run(self, backends: list[BenchmarkBackend]) -> SearchOutcome:
        pool: queue.Queue[BenchmarkBackend] = queue.Queue()
        for b in backends:
            pool.put(b)
        timeout = None if self.deadline is None else max(self.deadline - time.monotonic(), 0)
        self._clear_stop()
        self.study.optimize(
            self._objective(pool), n_jobs=len(backends), catch=(TrialFailed,), timeout=timeout
        )
        # The sampler records why it stopped the study; otherwise optimize's timeout ended it.
        return SearchOutcome(why_stopped(self.study) or TIMEOUT, self.study)

    def _clear_stop(self) -> None:
        # A re-run after a stop decides afresh (a bigger budget, a fixed set-up); a worker
        # joining others at work leaves their answer alone.
        with self.lock():
            if why_stopped(self.study) is not None and not self.others_running():
                self.study.set_user_attr(STOP_ATTR, None)
