"""One `auto` decision reads top-down: from Optuna's `sample_relative` to the chosen configuration
it enters the search's modules in the order a decision flows, each once (docs/architecture.md,
"One decision"), also while another worker's trial is in flight (the believer's path)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import optuna

from infertune_tuner import search
from infertune_tuner.backends.simulated import SimulatedBackend
from infertune_tuner.search.evidence import Decision
from infertune_tuner.search.sampler import AutoSampler

from .helpers import Core, request
from .test_sampler import _record

SEARCH = Path(search.__file__).parent
# Building a value of a module's type (its dataclass __init__ / __post_init__, and what they
# call) is not a visit of the module: the value is put down there, no decision is made there.
CONSTRUCTION = {"__init__", "__post_init__", "__new__"}


@contextmanager
def modules_entered() -> Iterator[list[str]]:
    """The search modules whose functions are entered while the block runs, in order, each
    consecutive run of one module counted once; recording ends when `Planner.decide` returns
    (the chosen configuration)."""
    order: list[str] = []
    done = False
    building = 0  # constructions under way

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal done, building
        if done:
            return
        path = Path(frame.f_code.co_filename)
        if path.parent == SEARCH and frame.f_code.co_name in CONSTRUCTION:
            building += {"call": 1, "return": -1}.get(event, 0)
            return
        if path.parent != SEARCH or building:
            return
        if event == "call" and (not order or order[-1] != path.stem):
            order.append(path.stem)
        if event == "return" and frame.f_code.co_qualname == "Planner.decide":
            done = True

    sys.setprofile(profile)
    try:
        yield order
    finally:
        sys.setprofile(None)


def _study_with_two_trials() -> tuple[optuna.Study, AutoSampler]:
    req = request(max_trials=40)
    core = Core(req)
    sampler = AutoSampler(core.prior, core.settings, seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    backend = SimulatedBackend(req, seed=0)
    for _ in range(2):
        trial = study.ask()
        _ = trial.relative_params
        decision = Decision.of(study.trials[trial.number])
        assert decision is not None and decision.config is not None
        m = backend.run(decision.config)
        _record(trial, req, decision.config, m)
        study.tell(trial, m.output_tokens_per_s_per_gpu)
    return study, sampler


def _decide(study: optuna.Study, after: AutoSampler) -> list[str]:
    """The modules a fresh worker's first decision enters (`after` decided already for this
    evidence and reuses that decision: a decision is made once per state of the study)."""
    sampler = AutoSampler(after.prior, after.settings, seed=0)
    study = optuna.load_study(study_name=study.study_name, storage=study._storage, sampler=sampler)
    trial = study.ask()
    frozen = study.trials[trial.number]
    with modules_entered() as order:
        params = sampler.sample_relative(
            study, frozen, sampler.infer_relative_search_space(study, frozen)
        )
    assert params, "it chose a configuration"
    return order


def test_one_decision_enters_each_search_module_once_in_the_order_a_decision_flows() -> None:
    study, sampler = _study_with_two_trials()
    assert _decide(study, sampler) == ["sampler", "evidence", "failures", "posterior", "planner"]


def test_a_decision_beside_a_trial_in_flight_takes_the_same_path() -> None:
    study, sampler = _study_with_two_trials()
    flying = study.ask()
    _ = flying.relative_params  # another worker's trial, decided and running
    assert _decide(study, sampler) == ["sampler", "evidence", "failures", "posterior", "planner"]
