"""The search as Optuna samplers and callbacks.

- `AutoSampler`: the model-guided search (planner.Planner) as a relative sampler over the four
  configuration parameters, handed to `optuna.create_study` like any other sampler. It reads
  everything it decides from from the study's storage: the measurements the trials recorded and
  the configurations in flight (RUNNING trials; records.known_from), so every worker - a thread
  here, a process on shared storage - decides from the same evidence and nothing has to tell
  the sampler what happened. Like Optuna's `BruteForceSampler`, its `after_trial` calls
  `study.stop()` when the search is done (here: when the stop rule holds).
- `SkipRuledOut`: wraps any sampler (TPE, random, grid) so that it never proposes a
  configuration the memory model rules out by a wide margin, one the measurements already rule
  out, or one already measured: a full relative proposal that breaks a rule is dropped, and each
  independently sampled value is kept only if some admissible configuration still extends the
  parameters chosen so far (else an admissible value is drawn instead). `Admissible` answers
  which configurations those are, from the study's storage as well.
- `BudgetCallback`: stops the study once `maxTrials` trials have been executed (the trials that
  count: measured ones, confirmations included; skipped ones cost nothing).

Why a study stopped (a typed `stop.StopReason`) is kept as the study's user attribute `stop`, so
that every worker (threads here, processes on shared storage) and the report see the same
answer.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from infertune_tuner.config import CONFIG_KEYS, TrialConfig
from infertune_tuner.search.evidence import Known
from infertune_tuner.search.planner import Decision, Planner
from infertune_tuner.search.records import config_of, deciding, known_from
from infertune_tuner.stop import STOP_ATTR, StopReason, budget


def stop(study: Study, reason: StopReason) -> None:
    """Stop the study for `reason` (the first reason given wins)."""
    if stopped(study) is None:
        study.set_user_attr(STOP_ATTR, reason.as_attr())
    study.stop()


def stopped(study: Study) -> StopReason | None:
    """Why the study stopped, as its workers recorded it (None: it has not)."""
    return StopReason.from_attr(study.user_attrs.get(STOP_ATTR))


class AutoSampler(BaseSampler):
    """Model-guided relative sampling with a posterior stop rule (see planner.py).

    Args:
        planner: The pure search core for the request.
        distributions: The four configuration parameters.
        budget: `maxTrials`: executed trials plus trials in flight never exceed it.
        scope: The run whose `error` trials count (None: every run's; records.current_trials).
        seed: For the values Optuna asks of `sample_independent` (a decision with no
            configuration: the trial is skipped).
    """

    def __init__(
        self,
        planner: Planner,
        distributions: dict[str, BaseDistribution],
        *,
        budget: int,
        scope: str | None = None,
        seed: int = 0,
    ) -> None:
        self.planner = planner
        self._dists = distributions
        self._budget = budget
        self._scope = scope
        self._fallback = RandomSampler(seed=seed)
        self._lock = threading.Lock()
        # What this process decided for its running trials, by number: a decision is final once
        # made (the trial's parameters follow it), and in flight until the trial ends.
        self._decided: dict[int, Decision] = {}
        self._last: tuple[object, Decision] | None = None

    def known(self, study: Study, extra: FrozenTrial | None = None) -> Known:
        """The study's evidence, with this process's choices for running trials in flight."""
        mine = {n: d.config for n, d in self._decided.items() if d.config is not None}
        return known_from(self.planner.request, study, self._scope, extra, mine)

    def _decide(self, known: Known) -> Decision:
        remaining = self._budget - known.executed - len(known.in_flight)
        # after_trial and the next sample_relative usually see the same state: decide once.
        state = (known.state(), remaining)
        if self._last is not None and self._last[0] == state:
            return self._last[1]
        decision = self.planner.decide(known, remaining=remaining)
        self._last = (state, decision)
        return decision

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return dict(self._dists)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        decision = self.decision_for(study, trial.number)
        return decision.config.as_dict() if decision.config is not None else {}

    def decision_for(self, study: Study, number: int) -> Decision:
        """What trial `number` measures, or why it measures nothing (stop), or neither (wait:
        only trials in flight may still change the answer; asked again, it decides again).

        Optuna asks `sample_relative` only for parameters with more than one choice, so an
        objective asks here before it suggests: both get the same, final, decision.
        """
        with self._lock:
            if number in self._decided:
                return self._decided[number]
            decision = self._decide(self.known(study))
            if decision.config is not None or decision.stop is not None:
                self._decided[number] = decision
            return decision

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        with self._lock:
            self._decided.pop(trial.number, None)
            if state == TrialState.PRUNED:
                return
            if deciding(study.get_trials(deepcopy=False), exclude=trial.number):
                return  # a worker choosing (or waiting) decides whether to stop
            decision = self._decide(self.known(study, trial))
        if decision.stop is not None:
            stop(study, decision.stop)

    def reseed_rng(self) -> None:
        self._fallback.reseed_rng()


class Admissible:
    """The configurations a wrapped sampler may propose in a study (Planner.admissible, from
    the study's storage), read once per study state: every parameter of a trial asks again."""

    def __init__(self, planner: Planner, scope: str | None = None) -> None:
        self.planner = planner
        self._scope = scope
        self._last: tuple[object, set[TrialConfig]] | None = None

    def __call__(self, study: Study) -> set[TrialConfig]:
        known = known_from(self.planner.request, study, self._scope)
        state = known.state()
        if self._last is not None and self._last[0] == state:
            return self._last[1]
        allowed = self.planner.admissible(known)
        self._last = (state, allowed)
        return allowed


class SkipRuledOut(BaseSampler):
    """Wraps a sampler so that it only proposes admissible configurations."""

    def __init__(
        self,
        base: BaseSampler,
        admissible: Callable[[Study], set[TrialConfig]],
        distributions: dict[str, BaseDistribution],
        *,
        seed: int = 0,
    ) -> None:
        self._base = base
        self.admissible = admissible
        self._rng = random.Random(seed)
        # Parameters with a single choice are never part of a relative proposal: Optuna fixes
        # them. They still belong to the configuration a proposal stands for.
        self._fixed = {
            k: d.choices[0]
            for k, d in distributions.items()
            if isinstance(d, CategoricalDistribution) and len(d.choices) == 1
        }

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return self._base.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        params = self._base.sample_relative(study, trial, search_space)
        full = {**self._fixed, **params}
        if set(CONFIG_KEYS) <= set(full) and config_of(full) not in self.admissible(study):
            return {}  # sampled again, parameter by parameter, under the rules
        return params

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        value = self._base.sample_independent(study, trial, param_name, param_distribution)
        allowed = self.admissible(study)

        def extends(v: Any) -> bool:
            partial = {**trial.params, param_name: v}
            return any(
                all(getattr(c, k) == val for k, val in partial.items() if k in CONFIG_KEYS)
                for c in allowed
            )

        if extends(value) or not isinstance(param_distribution, CategoricalDistribution):
            return value
        choices = [v for v in param_distribution.choices if extends(v)]
        return self._rng.choice(choices) if choices else value

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self._base.before_trial(study, trial)

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self._base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._base.reseed_rng()


class BudgetCallback:
    """Stop the study when `max_trials` trials that count have been executed."""

    def __init__(self, max_trials: int, executed: Callable[[Study], int]) -> None:
        self.max_trials = max_trials
        self._executed = executed

    def __call__(self, study: Study, trial: FrozenTrial) -> None:
        if self._executed(study) >= self.max_trials:
            stop(study, budget(self.max_trials))


def make_base_sampler(
    name: str, distributions: dict[str, BaseDistribution], seed: int
) -> BaseSampler:
    """Optuna's own sampler for `tpe`, `random` or `grid`."""
    if name == "tpe":
        # Constraint-aware: each SLO bound is recorded with Trial.set_constraint (<= 0 = met).
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=5)
    if name == "grid":
        grid = {
            k: list(v.choices)  # type: ignore[attr-defined]
            for k, v in distributions.items()
        }
        return optuna.samplers.GridSampler(grid, seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)
