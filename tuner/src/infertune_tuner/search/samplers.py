"""The search as Optuna samplers and callbacks (public Optuna API only).

- `AutoSampler`: the model-guided search (strategy.Planner) as a relative sampler over the four
  configuration parameters. Like Optuna's `BruteForceSampler`, its `after_trial` calls
  `study.stop()` when the search is done (here: when the stop rule holds).
- `SkipRuledOut`: wraps any sampler (TPE, random, grid) so that it never proposes a
  configuration the memory model rules out by a wide margin, one the measurements already rule
  out, or one already measured: a full relative proposal that breaks a rule is dropped, and each
  independently sampled value is kept only if some admissible configuration still extends the
  parameters chosen so far (else an admissible value is drawn instead).
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
from infertune_tuner.stop import STOP_ATTR, StopReason, budget

KnownSource = Callable[[Study, FrozenTrial | None], Known]


def config_of(params: dict[str, Any]) -> TrialConfig:
    return TrialConfig(
        int(params["tp"]),
        int(params["max_batch_size"]),
        str(params["quantization"]),
        str(params["kv_cache_dtype"]),
    )


def stop(study: Study, reason: StopReason) -> None:
    """Stop the study for `reason` (the first reason given wins)."""
    if stopped(study) is None:
        study.set_user_attr(STOP_ATTR, reason.as_attr())
    study.stop()


def stopped(study: Study) -> StopReason | None:
    """Why the study stopped, as its workers recorded it (None: it has not)."""
    return StopReason.from_attr(study.user_attrs.get(STOP_ATTR))


class AutoSampler(BaseSampler):
    """Model-guided relative sampling with a posterior stop rule (see planner.py)."""

    def __init__(
        self,
        planner: Planner,
        distributions: dict[str, BaseDistribution],
        known: KnownSource,
        *,
        budget: int,
        seed: int = 0,
    ) -> None:
        self._planner = planner
        self._dists = distributions
        self._known = known
        self._budget = budget
        self._fallback = RandomSampler(seed=seed)
        self._lock = threading.Lock()
        self._pending: dict[int, TrialConfig] = {}
        self.decisions: dict[int, Decision] = {}
        self.last: Decision | None = None
        self._state: object = None

    def _decide(self, known: Known) -> Decision:
        remaining = self._budget - known.executed - len(known.in_flight)
        # after_trial and the next sample_relative usually see the same state: decide once.
        state = (tuple((c, len(ms)) for c, ms in sorted(known.runs.items())),
                 frozenset(known.in_flight), remaining)  # fmt: skip
        if self.last is not None and self._state == state:
            return self.last
        decision = self._planner.decide(known, remaining=remaining)
        self.last, self._state = decision, state
        return decision

    def _with_pending(self, known: Known, exclude: int | None = None) -> Known:
        known.in_flight |= {c for n, c in self._pending.items() if n != exclude}
        return known

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
        """Decide what trial `number` measures (once; Optuna never asks the sampler when every
        parameter has a single choice, so the objective asks here instead)."""
        with self._lock:
            if number in self.decisions:
                return self.decisions[number]
            decision = self._decide(self._with_pending(self._known(study, None), number))
            self.decisions[number] = decision
            if decision.config is not None:
                self._pending[number] = decision.config
            return decision

    def forget(self, number: int) -> None:
        """Drop what was decided for trial `number` (claimed, skipped, or waiting to decide
        again): from now on the study says what is in flight."""
        with self._lock:
            self.decisions.pop(number, None)
            self._pending.pop(number, None)

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
            self._pending.pop(trial.number, None)
            if state == TrialState.PRUNED:
                return
            decision = self._decide(self._with_pending(self._known(study, trial)))
        if decision.stop is not None:
            stop(study, decision.stop)

    def reseed_rng(self) -> None:
        self._fallback.reseed_rng()


Admissible = Callable[[Study], set[TrialConfig]]


class SkipRuledOut(BaseSampler):
    """Wraps a sampler so that it only proposes admissible configurations."""

    def __init__(
        self,
        base: BaseSampler,
        admissible: Admissible,
        distributions: dict[str, BaseDistribution],
        *,
        seed: int = 0,
    ) -> None:
        self._base = base
        self._admissible = admissible
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
        if set(CONFIG_KEYS) <= set(full) and config_of(full) not in self._admissible(study):
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
        allowed = self._admissible(study)

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
