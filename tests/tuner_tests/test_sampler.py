"""The search's Optuna pieces: the auto sampler is a sampler like Optuna's own (handed to
create_study, deciding from the study's storage alone, recording each decision on its trial,
stopping the study); Optuna's own samplers, guarded, never propose what is no candidate and stop
by the same rule."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from infertune_tuner import slo
from infertune_tuner.backends.simulated import SimulatedBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement
from infertune_tuner.request import TuningRequest
from infertune_tuner.run import tune
from infertune_tuner.search.evidence import (
    ATTR_CHECKS,
    ATTR_CONFIG,
    ATTR_MEASUREMENT,
    Decision,
    config_of,
    measurement_to_attr,
    read,
)
from infertune_tuner.search.sampler import AutoSampler, distributions
from infertune_tuner.stop import StopKind, why_stopped

from .helpers import Core, CountingBackend, request


@pytest.mark.parametrize("name", ["tpe", "random", "grid"])
def test_a_guarded_sampler_never_measures_twice_or_what_the_memory_model_rules_out(
    name: str, tmp_path: Path
) -> None:
    req = request(sampler=name, max_trials=25, tps=[1, 2, 4], batches=[16, 64, 256])
    backend = CountingBackend(SimulatedBackend(req, seed=0))
    report = tune(req, backend=backend, out_dir=tmp_path)
    assert report is not None
    assert len(backend.calls) == len(set(backend.calls)), "a configuration measured twice"
    prior, wide = Core(req).prior, Core(req).settings.wide_margin
    assert not [c for c in backend.calls if prior.margin[c] < -wide]
    assert any(m < -wide for m in prior.margin.values()), "the space has such configurations"


def test_the_budget_stops_every_sampler_by_the_same_rule(tmp_path: Path) -> None:
    for name in ("auto", "random"):
        req = request(sampler=name, max_trials=3)
        report = tune(req, backend=SimulatedBackend(req, seed=0), out_dir=tmp_path / name)
        assert report is not None and report.executed_trials == 3
        assert report.stop == StopKind.BUDGET, name


def test_a_parameter_with_one_choice_still_counts_in_a_relative_proposal(tmp_path: Path) -> None:
    # Optuna leaves single-choice parameters out of TPE's relative proposals.
    base = request(sampler="tpe", max_trials=12, tps=[1, 2, 4], batches=[16, 64, 256])
    req = base.model_copy(
        update={"search": base.search.model_copy(update={"kv_cache_dtype": ["auto"]})}
    )
    backend = CountingBackend(SimulatedBackend(req, seed=0))
    tune(req, backend=backend, out_dir=tmp_path)
    assert backend.calls and len(backend.calls) == len(set(backend.calls))
    assert {c.kv_cache_dtype for c in backend.calls} == {"auto"}


# -- the auto sampler on its own: handed to create_study, reading everything from storage


def _auto(req: TuningRequest) -> AutoSampler:
    core = Core(req)
    return AutoSampler(core.prior, core.settings, seed=0)


def _record(trial: optuna.Trial, req: TuningRequest, cfg: TrialConfig, m: Measurement) -> None:
    """What a worker writes on its trial (the driver does the same)."""
    trial.set_user_attr(ATTR_CONFIG, cfg.as_dict())
    trial.set_user_attr(ATTR_MEASUREMENT, measurement_to_attr(m))
    trial.set_user_attr(ATTR_CHECKS, [c.model_dump() for c in slo.check(req, m)])


def test_the_auto_sampler_drives_a_plain_optuna_study_to_its_own_stop() -> None:
    req = request(max_trials=40)
    sampler = _auto(req)
    backend = SimulatedBackend(req, seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    runs: list[TrialConfig] = []
    dists = distributions(sampler.prior.space)

    def objective(trial: optuna.Trial) -> float:
        cfg = config_of({k: trial.suggest_categorical(k, d.choices) for k, d in dists.items()})  # type: ignore[attr-defined]
        m = backend.run(cfg, repeat=runs.count(cfg))
        runs.append(cfg)
        _record(trial, req, cfg, m)
        return m.output_tokens_per_s_per_gpu or 0.0

    study.optimize(objective, n_trials=40)
    why = why_stopped(study)
    # No driver told it anything: it read the measurements from the trials, and stopped the
    # study itself once its stop rule held, well inside the 40 trials Optuna would have run.
    assert why is not None and why.kind == StopKind.CONVERGED, why
    assert len(runs) < 40
    repeated = {c for c in runs if runs.count(c) > 1}
    assert len(repeated) <= 3, "only finalists are measured twice"
    # Each decision is recorded on its trial, with its purpose and the chances it was made with.
    decisions = [Decision.of(t) for t in study.trials]
    assert all(d is not None for d in decisions)
    measured = [d for d in decisions if d is not None and d.config is not None]
    assert {d.purpose for d in measured} >= {"explore", "confirm"}
    assert all(d.chances is not None for d in measured if d.purpose == "explore")


def test_the_auto_sampler_counts_another_workers_running_trial_as_in_flight() -> None:
    req = request(max_trials=40)
    storage = optuna.storages.InMemoryStorage()
    mine = _auto(req)
    study = optuna.create_study(study_name="s", storage=storage, sampler=mine)
    first = study.ask()
    _ = first.relative_params  # the sampler decides for the trial and records it there
    claimed = Decision.of(study.trials[first.number])
    assert claimed is not None and claimed.config is not None
    # Another worker (a process of its own: a fresh sampler on the same storage) reads the
    # running trial's decision from the storage and chooses another configuration.
    other = optuna.load_study(study_name="s", storage=storage, sampler=_auto(req))
    assert claimed.config in read(req, other).in_flight
    second = other.ask()
    _ = second.relative_params
    theirs = Decision.of(other.trials[second.number])
    assert theirs is not None and theirs.config not in (None, claimed.config)
    # Within one process too: a decision is in flight from the moment it is recorded.
    third = study.ask()
    _ = third.relative_params
    chosen = Decision.of(study.trials[third.number])
    assert chosen is not None and chosen.config not in (None, claimed.config, theirs.config)


def test_a_study_of_an_earlier_version_resumes_with_its_purposes_and_chances() -> None:
    """Studies written before decisions were system attributes kept purpose and chances as user
    attributes: their covers still count as covers and their reports keep the chances."""
    req = request(max_trials=40)
    study = optuna.create_study(direction="maximize")
    cfg = TrialConfig(4, 64, "fp8", "fp8")
    trial = study.ask()
    m = SimulatedBackend(req, seed=0).run(cfg)
    _record(trial, req, cfg, m)
    chances = {"p_success": 0.9, "p_beat": 0.4, "to_beat_tps": 100.0, "estimate_tps": 120.0}
    trial.set_user_attr("purpose", "cover")
    trial.set_user_attr("chances", chances)
    study.tell(trial, m.output_tokens_per_s_per_gpu)
    assert read(req, study).covers == (cfg,)
    decision = Decision.of(study.trials[0])
    assert decision is not None and decision.purpose == "cover" and decision.config == cfg
    assert decision.chances is not None and decision.chances.p_beat == 0.4
