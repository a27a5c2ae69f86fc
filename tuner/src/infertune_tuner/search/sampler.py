"""The search as Optuna samplers: handed to `optuna.create_study`, deciding from the storage.

- `AutoSampler`: the model-guided search as a relative sampler over the four configuration
  parameters. Asked for a trial (`sample_relative`) it reads the study's evidence
  (evidence.py), assesses every configuration (posterior.py) and decides (planner.py); it
  records the decision on the trial as a system attribute (as Optuna's TPE records its
  constraints) and, when the decision is to stop, stops the study. After a trial it decides
  whether the search is done. Nothing else tells it anything: every worker, a thread here or a
  process on shared storage, reads the same evidence, the configurations other workers have in
  flight included.
- `SkipRuledOut`: wraps Optuna's TPE, random or grid sampler so that it never proposes a
  configuration that is no candidate (`posterior.verdicts`: ruled out by the memory model or
  by the measurements, measured, or in flight): a full relative proposal that breaks the rule is
  dropped, and each independently sampled value is kept only if some candidate still extends
  the parameters chosen so far. It stops the study by the same rule (`planner.stop_reason`).
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

from infertune_tuner.config import GPU_KEY, PARAM_KEYS, TrialConfig
from infertune_tuner.search.evidence import (
    ATTR_CONFIG,
    DECISION_ATTR,
    Decision,
    Evidence,
    Scope,
    config_of,
    read,
    worker_choosing,
)
from infertune_tuner.search.failures import FailureModel
from infertune_tuner.search.planner import Planner, stop_reason
from infertune_tuner.search.posterior import Prior, assess, verdicts
from infertune_tuner.search.settings import SearchSettings
from infertune_tuner.space import SearchSpace
from infertune_tuner.stop import StopKind, StopReason, record

PlannerFactory = Callable[..., Planner]  # Planner's own arguments; the oracle builds its own
_FIXED = "fixed_params"  # Optuna's system attribute on a trial re-run with its parameters


def distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    """One categorical parameter per dimension of the space (the pool only where it has several)."""
    out: dict[str, BaseDistribution] = {
        "tp": CategoricalDistribution(list(space.tensor_parallel)),
        "max_batch_size": CategoricalDistribution(list(space.max_batch_size)),
        "quantization": CategoricalDistribution(list(space.quantization)),
        "kv_cache_dtype": CategoricalDistribution(list(space.kv_cache_dtype)),
    }
    if space.gpus:
        out[GPU_KEY] = CategoricalDistribution(list(space.gpus))
    return out


def _retried(trial: FrozenTrial) -> bool:
    """A trial re-run as it was claimed (its worker died): it decides nothing anew."""
    return ATTR_CONFIG in trial.user_attrs or _FIXED in trial.system_attrs


class AutoSampler(BaseSampler):
    """Model-guided relative sampling with a posterior stop rule.

    Args:
        prior: The space's predictions and fixed facts (`posterior.Prior.build`).
        settings: Every constant the search decides with (the request's confidence applied).
        seed: Seeds the posterior's draws, and the values Optuna asks of `sample_independent`
            for a trial that measures nothing.
        scope: Whose `error` trials count (evidence.Scope; None: every run's).
        planner: Builds the planner from (prior, settings, max_trials=); the benchmark's oracle
            is the one other.
        pool: The one GPU pool this worker measures on ("": every pool of the space).
    """

    def __init__(
        self,
        prior: Prior,
        settings: SearchSettings,
        *,
        seed: int = 0,
        scope: Scope | None = None,
        planner: PlannerFactory = Planner,
        pool: str = "",
    ) -> None:
        self.prior = prior
        self.settings = settings
        self.max_trials = prior.request.tuning.max_trials
        own = {"pool": pool} if pool else {}  # the oracle's factory knows no pools
        self.planner = planner(prior, settings, max_trials=self.max_trials, **own)
        self._dists = distributions(prior.space)
        self._seed = seed
        self._scope = scope
        self._fallback = RandomSampler(seed=seed)
        self._lock = threading.Lock()
        # after_trial and the next sample_relative usually see the same evidence: decide once.
        self._last: tuple[object, Decision] | None = None

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return dict(self._dists)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        """Decide what `trial` measures (or that the search stops, or waits), record it on the
        trial, and propose its parameters."""
        if _retried(trial):
            return {}
        with self._lock:
            decision = self._decide(study)
        # Recorded on the trial: no public API lets a sampler annotate a trial; Optuna's own
        # samplers write system attributes through the storage the same way.
        study._storage.set_trial_system_attr(trial._trial_id, DECISION_ATTR, decision.as_attr())
        if decision.stop is not None:
            record(study, decision.stop)
        return decision.config.as_dict() if decision.config is not None else {}

    def _decide(self, study: Study, extra: FrozenTrial | None = None) -> Decision:
        ev = read(
            self.prior.request, study, self._scope, extra,
            transient_retries=self.settings.transient_retries,
        )  # fmt: skip
        if self._last is not None and self._last[0] == ev.state:
            return self._last[1]
        # What the failures say, then the posterior, then the decision.
        failures = FailureModel.learn(ev, self.prior.space, self.settings, seed=self._seed)
        a = assess(ev, self.prior, self.settings, seed=self._seed, failures=failures)
        decision = self.planner.decide(ev, a)
        self._last = (ev.state, decision)
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
        if state == TrialState.PRUNED:
            return
        with self._lock:
            if worker_choosing(study.get_trials(deepcopy=False), exclude=trial.number):
                return  # a worker choosing (or waiting) decides whether to stop
            decision = self._decide(study, trial)
        if decision.stop is not None:
            record(study, decision.stop)

    def reseed_rng(self) -> None:
        self._fallback.reseed_rng()


class SkipRuledOut(BaseSampler):
    """Wraps a sampler so that it only proposes candidates (see the module doc).

    Args:
        base: Optuna's sampler.
        prior: The space's predictions and fixed facts.
        settings: The search's constants.
        distributions: The configuration parameters (the pool's with several pools).
        scope: Whose `error` trials count (evidence.Scope; None: every run's).
        seed: For the values drawn in place of a proposal that breaks the rule.
        pool: The one GPU pool this worker measures on ("": every pool of the space).
    """

    def __init__(
        self,
        base: BaseSampler,
        prior: Prior,
        settings: SearchSettings,
        distributions: dict[str, BaseDistribution],
        *,
        scope: Scope | None = None,
        seed: int = 0,
        pool: str = "",
    ) -> None:
        self._base = base
        self._pool = pool
        self.prior = prior
        self.settings = settings
        self.max_trials = prior.request.tuning.max_trials
        self._scope = scope
        self._rng = random.Random(seed)
        self._keys = tuple(distributions)  # a proposal is whole once it has every one of them
        self._last: tuple[object, frozenset[TrialConfig]] | None = None
        # Parameters with a single choice are never part of a relative proposal: Optuna fixes
        # them. They still belong to the configuration a proposal stands for.
        self._fixed = {
            k: d.choices[0]
            for k, d in distributions.items()
            if isinstance(d, CategoricalDistribution) and len(d.choices) == 1
        }

    def _evidence(self, study: Study, extra: FrozenTrial | None = None) -> Evidence:
        return read(
            self.prior.request, study, self._scope, extra,
            transient_retries=self.settings.transient_retries,
        )  # fmt: skip

    def admissible(self, study: Study) -> frozenset[TrialConfig]:
        """The candidates of the study's evidence, read once per study state (every parameter
        of a trial asks again)."""
        ev = self._evidence(study)
        if self._last is not None and self._last[0] == ev.state:
            return self._last[1]
        allowed = frozenset(
            c for c, v in verdicts(ev, self.prior, self.settings).items() if v is None
        )
        self._last = (ev.state, allowed)
        return allowed

    def proposable(self, study: Study) -> frozenset[TrialConfig]:
        """The candidates this worker may propose: those of its pool, when it has one."""
        allowed = self.admissible(study)
        return frozenset(c for c in allowed if c.gpu == self._pool) if self._pool else allowed

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return self._base.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not _retried(trial):
            ev = self._evidence(study)
            exhausted = StopReason(
                StopKind.EXHAUSTED,
                "every configuration was measured, is being measured, or is ruled out",
            )
            why = stop_reason(
                ev, space=self.prior.space, max_trials=self.max_trials, settings=self.settings,
                wants_trial=True, verdict=None if self.admissible(study) else exhausted,
            )  # fmt: skip
            if why is not None:
                stopping = Decision(None, stop=why).as_attr()
                study._storage.set_trial_system_attr(trial._trial_id, DECISION_ATTR, stopping)
                record(study, why)
                return {}
        params = self._base.sample_relative(study, trial, search_space)
        full = {**self._fixed, **params}
        if set(self._keys) <= set(full) and config_of(full) not in self.proposable(study):
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
        allowed = self.proposable(study)

        def extends(v: Any) -> bool:
            partial = {**trial.params, param_name: v}
            return any(
                all(getattr(c, k) == val for k, val in partial.items() if k in PARAM_KEYS)
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
        if state == TrialState.PRUNED:
            return
        ev = self._evidence(study, trial)
        why = stop_reason(
            ev, space=self.prior.space, max_trials=self.max_trials, settings=self.settings,
            wants_trial=False,
        )  # fmt: skip
        if why is not None:
            record(study, why)

    def reseed_rng(self) -> None:
        self._base.reseed_rng()


def make_base_sampler(
    name: str, distributions: dict[str, BaseDistribution], seed: int, settings: SearchSettings
) -> BaseSampler:
    """Optuna's own sampler for `tpe`, `random` or `grid`."""
    if name == "tpe":
        # Constraint-aware: each SLO bound is recorded with Trial.set_constraint (<= 0 = met).
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, n_startup_trials=settings.tpe_startup_trials
        )
    if name == "grid":
        grid = {
            k: list(v.choices)  # type: ignore[attr-defined]
            for k, v in distributions.items()
        }
        return optuna.samplers.GridSampler(grid, seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)


def make_sampler(
    prior: Prior,
    settings: SearchSettings,
    *,
    scope: Scope | None,
    seed: int,
    planner: PlannerFactory = Planner,
    pool: str = "",
) -> BaseSampler:
    """The study's sampler for `request.tuning.sampler`: `auto`, or Optuna's own wrapped so that
    it proposes candidates only. It is handed to `optuna.create_study`.

    Args:
        prior: The space's predictions and fixed facts.
        settings: The search's constants.
        scope: Whose `error` trials count (evidence.Scope; None: every worker's, on a shared
            study).
        seed: The sampler's seed.
        planner: `auto`'s planner factory (the benchmark's oracle builds its own).
        pool: The one GPU pool this worker measures on ("": every pool of the space).
    """
    name = prior.request.tuning.sampler
    if name == "auto":
        return AutoSampler(prior, settings, seed=seed, scope=scope, planner=planner, pool=pool)
    dists = distributions(prior.space)
    base = make_base_sampler(name, dists, seed, settings)
    return SkipRuledOut(base, prior, settings, dists, scope=scope, seed=seed, pool=pool)
