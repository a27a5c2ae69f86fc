"""The search's Optuna pieces: the auto sampler stops the study, the wrapper keeps samplers off
ruled-out configurations, the budget is a callback."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.study import Study
from optuna.trial import TrialState

from infertune_tuner.config import TrialConfig
from infertune_tuner.search.samplers import (
    BudgetCallback,
    SkipRuledOut,
    config_of,
    make_base_sampler,
    stopped,
)
from infertune_tuner.stop import StopKind, StopReason

DISTS = {
    "tp": CategoricalDistribution([1, 2, 4]),
    "max_batch_size": CategoricalDistribution([8, 16, 32, 64]),
    "quantization": CategoricalDistribution(["bf16", "fp8"]),
    "kv_cache_dtype": CategoricalDistribution(["auto", "fp8"]),
}
ALL = {
    TrialConfig(tp, b, q, kv)
    for tp in (1, 2, 4)
    for b in (8, 16, 32, 64)
    for q in ("bf16", "fp8")
    for kv in ("auto", "fp8")
}
BLOCKED = {c for c in ALL if c.tp == 1 or c.max_batch_size == 64}


def _measured(study: Study) -> set[TrialConfig]:
    return {
        config_of(t.params)
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
        if len(t.params) == 4
    }


def _objective(trial: optuna.Trial) -> float:
    cfg = config_of({k: trial.suggest_categorical(k, d.choices) for k, d in DISTS.items()})
    return float(cfg.tp * cfg.max_batch_size)


def _admissible(study: Study) -> set[TrialConfig]:
    return ALL - BLOCKED - _measured(study)


def test_a_wrapped_sampler_never_proposes_a_ruled_out_or_measured_configuration() -> None:
    for name in ("tpe", "random", "grid"):
        sampler = SkipRuledOut(make_base_sampler(name, DISTS, 0), _admissible, DISTS, seed=0)
        study = optuna.create_study(direction="maximize", sampler=sampler)
        study.optimize(_objective, n_trials=len(ALL - BLOCKED))
        got = [config_of(t.params) for t in study.trials]
        assert not set(got) & BLOCKED, name
        assert len(got) == len(set(got)), f"{name} measured a configuration twice"


def test_the_budget_callback_counts_what_counts_and_records_why_it_stopped() -> None:
    study = optuna.create_study(direction="maximize")
    executed = lambda s: len(s.get_trials(states=(TrialState.COMPLETE,)))  # noqa: E731
    study.optimize(_objective, n_trials=100, callbacks=[BudgetCallback(5, executed)])
    assert len(study.trials) == 5
    assert stopped(study) == StopReason(StopKind.BUDGET, "maxTrials (5) executed")


def test_a_parameter_with_one_choice_still_counts_in_a_relative_proposal() -> None:
    # Optuna leaves single-choice parameters out of TPE's relative proposals.
    dists = {**DISTS, "kv_cache_dtype": CategoricalDistribution(["auto"])}
    space = {c for c in ALL if c.kv_cache_dtype == "auto"}
    blocked = {c for c in space if c.tp == 1}

    def admissible(study: Study) -> set[TrialConfig]:
        return space - blocked - _measured(study)

    def objective(trial: optuna.Trial) -> float:
        cfg = config_of({k: trial.suggest_categorical(k, d.choices) for k, d in dists.items()})
        return float(cfg.tp * cfg.max_batch_size)

    sampler = SkipRuledOut(
        optuna.samplers.TPESampler(seed=0, multivariate=True, n_startup_trials=2),
        admissible, dists, seed=0,
    )  # fmt: skip
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.optimize(objective, n_trials=len(space - blocked))
    got = [config_of(t.params) for t in study.trials]
    assert not set(got) & blocked and len(got) == len(set(got))
