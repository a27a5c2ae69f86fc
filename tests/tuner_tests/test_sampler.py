"""The search's Optuna pieces: the auto sampler is a sampler like Optuna's own (handed to
create_study, reading what it decides from from the study's storage, stopping the study), the
wrapper keeps samplers off ruled-out configurations, the budget is a callback."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.study import Study
from optuna.trial import TrialState

from infertune_tuner import slo
from infertune_tuner.backends.simulated import SimulatedBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement
from infertune_tuner.request import TuningRequest
from infertune_tuner.run import prior_predictions
from infertune_tuner.search.driver import distributions, make_sampler
from infertune_tuner.search.planner import Planner
from infertune_tuner.search.records import (
    ATTR_CHECKS,
    ATTR_CONFIG,
    ATTR_MEASUREMENT,
    config_of,
    measurement_to_attr,
)
from infertune_tuner.search.samplers import (
    AutoSampler,
    BudgetCallback,
    SkipRuledOut,
    make_base_sampler,
    stopped,
)
from infertune_tuner.space import SearchSpace, build_space
from infertune_tuner.stop import StopKind, StopReason

from .helpers import request

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


# -- the auto sampler on its own: handed to create_study, reading everything from storage


def _auto(req: TuningRequest) -> tuple[AutoSampler, SearchSpace]:
    space = build_space(req, req.resolve_model(), req.resolve_gpu())
    planner = Planner(req, space, prior_predictions(req, space), seed=0)
    sampler = make_sampler(req, space, planner, scope=None, seed=0)
    assert isinstance(sampler, AutoSampler)
    return sampler, space


def _record(trial: optuna.Trial, req: TuningRequest, cfg: TrialConfig, m: Measurement) -> None:
    """What a worker writes on its trial (the driver does the same)."""
    trial.set_user_attr(ATTR_CONFIG, cfg.as_dict())
    trial.set_user_attr(ATTR_MEASUREMENT, measurement_to_attr(m))
    trial.set_user_attr(ATTR_CHECKS, [c.model_dump() for c in slo.check(req, m)])


def test_the_auto_sampler_drives_a_plain_optuna_study_to_its_own_stop() -> None:
    req = request(max_trials=40)
    sampler, space = _auto(req)
    backend = SimulatedBackend(req, seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    runs: list[TrialConfig] = []

    def objective(trial: optuna.Trial) -> float:
        dists = distributions(space)
        cfg = config_of({k: trial.suggest_categorical(k, d.choices) for k, d in dists.items()})  # type: ignore[attr-defined]
        m = backend.run(cfg, repeat=runs.count(cfg))
        runs.append(cfg)
        _record(trial, req, cfg, m)
        return m.output_tokens_per_s_per_gpu or 0.0

    study.optimize(objective, n_trials=40)
    why = stopped(study)
    # No driver told it anything: it read the measurements from the trials, and stopped the
    # study itself once its stop rule held, well inside the 40 trials Optuna would have run.
    assert why is not None and why.kind == StopKind.CONVERGED, why
    assert len(runs) < 40
    repeated = {c for c in runs if runs.count(c) > 1}
    assert len(repeated) <= 3, "only finalists are measured twice"


def test_the_auto_sampler_counts_another_workers_running_trial_as_in_flight() -> None:
    req = request(max_trials=40)
    storage = optuna.storages.InMemoryStorage()
    mine, _ = _auto(req)
    study = optuna.create_study(study_name="s", storage=storage, sampler=mine)
    first = study.ask()
    claimed = mine.decision_for(study, first.number).config
    assert claimed is not None
    # Another worker (a process of its own: a fresh sampler on the same storage) sees the
    # running trial's configuration, once its worker recorded it, and chooses another one.
    first.set_user_attr(ATTR_CONFIG, claimed.as_dict())
    theirs, _ = _auto(req)
    other = optuna.load_study(study_name="s", storage=storage, sampler=theirs)
    second = other.ask()
    assert claimed in theirs.known(other).in_flight
    assert theirs.decision_for(other, second.number).config not in (None, claimed)
    # Within one process, a choice is in flight from the moment it is made.
    third = study.ask()
    chosen = mine.decision_for(study, third.number).config
    assert chosen is not None and chosen != claimed
    fourth = study.ask()
    assert mine.decision_for(study, fourth.number).config not in (claimed, chosen)
