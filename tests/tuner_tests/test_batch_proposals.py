"""Batch proposals: parallel workers of `auto` propose jointly. Each proposal treats the trials in
flight as measured at their posterior mean (posterior.py), so it looks for what could beat them
instead of their near twins."""

from __future__ import annotations

from infertune_tuner.config import TrialConfig
from infertune_tuner.search.posterior import BELIEVED
from infertune_tuner.search.settings import SearchSettings

from .helpers import Core, request


def _planner() -> tuple[Core, dict[TrialConfig, float]]:
    core = Core(request(quants=["fp16", "fp8"]))
    return core, dict(core.prior.tps)


def _batch(planner: Core, k: int) -> list[TrialConfig]:
    """k proposals, each made while the earlier ones are in flight (as k workers would)."""
    flying: list[TrialConfig] = []
    for _ in range(k):
        d = planner.decide(planner.evidence({}, flying))
        assert d.config is not None, d
        flying.append(d.config)
    return flying


def test_a_proposal_beside_a_trial_in_flight_must_be_able_to_beat_it() -> None:
    planner, tps = _planner()
    flying = TrialConfig(4, 128, "fp8", "fp8")  # predicted to meet the SLO with room to spare
    assert planner.prior.predictions[flying].e2e_ms.p95 < 0.7 * planner.request.slo[0].max_ms
    d = planner.decide(planner.evidence({}, [flying]))
    assert d.config is not None and d.config != flying
    # The trial in flight is believed feasible at its predicted tok/s/GPU: it is the incumbent
    # the next worker must beat, so it does not spend a GPU set on a slower neighbour.
    assert tps[d.config] > tps[flying] * (1 + SearchSettings().improvement)


def test_four_workers_propose_four_distinct_configurations() -> None:
    planner, _ = _planner()
    batch = _batch(planner, 4)
    assert len(set(batch)) == 4


def test_beliefs_steer_proposals_but_are_never_results() -> None:
    planner, _ = _planner()
    [first] = _batch(planner, 1)
    known = planner.evidence({}, [first])
    believed = planner.assess(known).evidence
    assert believed.runs[first][0].reason == BELIEVED
    assert known.runs == {} and known.executed == 0  # what the study knows is untouched
    assert first in believed.in_flight  # still in flight: nobody proposes it again
