"""Lower rungs: a trial's server is also measured at a few lower max batches of its
configuration (backends/base.py), and those measurements cost no launch and no budget."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import optuna

from infertune_tuner.backends.base import Rung, Sweep, Sweeps, sweep_each
from infertune_tuner.backends.simulated import SimulatedBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement
from infertune_tuner.perfmodel.latency import Percentiles
from infertune_tuner.report.view import plan
from infertune_tuner.request import TuningRequest
from infertune_tuner.run import prior_predictions, tune, write_report
from infertune_tuner.search.confirm import confirmations
from infertune_tuner.search.evidence import Known
from infertune_tuner.search.planner import Planner
from infertune_tuner.search.records import ATTR_CONFIG, ATTR_RUNGS, claimed
from infertune_tuner.search.settings import SearchSettings
from infertune_tuner.space import build_space

from .helpers import CountingBackend, request


class Launches:
    """A sweeping backend that records each launch: its configuration and the rungs asked."""

    def __init__(self, inner: SimulatedBackend) -> None:
        self.inner = inner
        self.name = inner.name
        self.speedup = inner.speedup
        self.launches: list[tuple[TrialConfig, list[int]]] = []

    def run(self, config: TrialConfig, *, repeat: int = 0) -> Measurement:
        return self.sweep(config, repeat=repeat).first

    def sweep(self, config: TrialConfig, *, repeat: int = 0, lower: Sequence[Rung] = ()) -> Sweep:
        self.launches.append((config, [r.batch for r in lower]))
        return self.inner.sweep(config, repeat=repeat, lower=lower)

    def close(self) -> None:
        self.inner.close()


def _planner(req: TuningRequest, **settings: object) -> Planner:
    space = build_space(req, req.resolve_model(), req.resolve_gpu())
    return Planner(
        req, space, prior_predictions(req, space), settings=SearchSettings(**settings),  # type: ignore[arg-type]
        sweeps=True,
    )  # fmt: skip


def test_a_launch_asks_for_the_next_candidate_batches_down_to_a_quarter() -> None:
    p = _planner(request())
    top = TrialConfig(2, 256, "fp8", "fp8")
    assert [r.batch for r in p.rungs(top, Known())] == [192, 128, 96]
    # A rung already measured is no candidate: the next one down takes its place.
    measured = replace(top, max_batch_size=128)
    known = Known.build(request(), {measured: [SimulatedBackend(request()).run(measured)]})
    assert [r.batch for r in p.rungs(top, known)] == [192, 96, 64]
    # Nothing below a quarter of the launched batch (8 -> 2: batch 1 is too far down).
    assert p.rungs(TrialConfig(2, 8, "fp8", "fp8"), Known()) == []
    assert _planner(request(), rungs=0).rungs(top, Known()) == []


def test_rungs_are_measured_on_their_launch_and_cost_no_budget(tmp_path: Path) -> None:
    req = request(max_trials=4)
    pool = Launches(SimulatedBackend.perturbed(req, seed=3))
    report = tune(req, backend=pool, out_dir=tmp_path)  # type: ignore[arg-type]
    assert report is not None
    assert report.executed_trials == len(pool.launches) == 4  # the budget counts launches
    done = [t for t in report.trials if t.executed]
    rungs = [t for t in done if t.purpose == "rung"]
    assert report.rung_measurements == len(rungs) == sum(len(r) for _, r in pool.launches) > 0
    by_number = {t.number: t for t in done}
    for t in rungs:
        launch = by_number[t.launch]  # type: ignore[index]
        assert launch.purpose != "rung"
        same = ("tp", "quantization", "kv_cache_dtype")
        assert all(getattr(t.config, k) == getattr(launch.config, k) for k in same)
        assert launch.config.max_batch_size / 4 <= t.config.max_batch_size
        assert t.config.max_batch_size < launch.config.max_batch_size
    # What the report says: trials counted as launches, the rungs beside them.
    write_report(report, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert f"4 trials executed (and {len(rungs)} lower max batches measured on their servers)" in md
    assert f"on trial {rungs[0].launch}'s server" in md
    assert f"{len(rungs)} rung" in plan(report)
    assert plan(report).endswith(" of 4")


def test_a_resumed_study_keeps_its_rungs_and_counts_only_launches(tmp_path: Path) -> None:
    req = request(max_trials=3)
    first = tune(req, backend=Launches(SimulatedBackend.perturbed(req, seed=1)), out_dir=tmp_path)  # type: ignore[arg-type]
    assert first is not None and first.rung_measurements > 0
    measured = {t.config.to_config() for t in first.trials if t.executed}
    bigger = request(max_trials=6)
    pool = Launches(SimulatedBackend.perturbed(bigger, seed=1))
    again = tune(bigger, backend=pool, out_dir=tmp_path)  # type: ignore[arg-type]
    assert again is not None
    assert again.resumed_trials == 3  # launches: the first run's rungs are no trials
    assert again.executed_trials == 3 + len(pool.launches)
    old = [t.number for t in first.trials if t.purpose == "rung"]
    assert old and all(
        any(t.number == n and t.purpose == "rung" for t in again.trials) for n in old
    )
    # No rung is asked for twice: what the first run measured is no candidate for a rung.
    asked = {replace(c, max_batch_size=b) for c, rungs in pool.launches for b in rungs}
    assert not asked & measured


def test_a_backend_that_cannot_sweep_measures_one_configuration_per_launch(
    tmp_path: Path,
) -> None:
    req = request(max_trials=4)
    counting = CountingBackend(SimulatedBackend.perturbed(req, seed=3))
    assert not isinstance(counting, Sweeps)
    report = tune(req, backend=counting, out_dir=tmp_path)  # type: ignore[arg-type]
    assert report is not None and report.rung_measurements == 0
    assert all(t.purpose != "rung" for t in report.trials)
    assert len(counting.calls) == report.executed_trials == 4


def test_a_failed_launch_measures_no_rung() -> None:
    class Oom:
        name, speedup = "oom", 1.0

        def run(self, config: TrialConfig, *, repeat: int = 0) -> Measurement:
            return Measurement.failed("oom", "CUDA out of memory")

        def close(self) -> None:
            return None

    swept = sweep_each(Oom(), TrialConfig(1, 64, "fp8", "auto"), 0, [Rung(32), Rung(16)])
    assert swept.first.status == "oom" and swept.lower == {}


def test_the_report_json_names_each_rungs_launch(tmp_path: Path) -> None:
    req = request(max_trials=2)
    report = tune(req, backend=Launches(SimulatedBackend.perturbed(req, seed=2)), out_dir=tmp_path)  # type: ignore[arg-type]
    assert report is not None
    write_report(report, tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    launches = {t["number"] for t in data["trials"] if t["executed"] and t["purpose"] != "rung"}
    rungs = [t for t in data["trials"] if t["purpose"] == "rung"]
    assert rungs and all(t["launch"] in launches for t in rungs)
    assert data["executed_trials"] == 2 and data["rung_measurements"] == len(rungs)


def _ok(tps: float) -> Measurement:
    return Measurement.ok(
        {"e2e_ms": Percentiles(1000.0, 1100.0, 1200.0)}, output_tokens_per_s_per_gpu=tps
    )


def test_a_finalist_measured_once_gets_its_second_run_as_a_rung() -> None:
    req = request(e2e_p95=10_000_000)
    p = _planner(req)
    top, finalist = TrialConfig(4, 256, "fp8", "fp8"), TrialConfig(4, 192, "fp8", "fp8")
    far = TrialConfig(4, 128, "fp8", "fp8")
    known = Known.build(req, {top: [_ok(1000.0)], finalist: [_ok(995.0)], far: [_ok(700.0)]})
    rungs = p.rungs(top, known)
    # The finalist (within 2 % of the best) is measured again; the far one, once, is not.
    assert Rung(192, 1) in rungs and all(r.batch != 128 for r in rungs)
    twice = Known.build(req, {top: [_ok(1000.0)], finalist: [_ok(995.0)] * 2})
    assert all(r.batch != 192 for r in p.rungs(top, twice))


def test_a_rival_the_posterior_prefers_is_measured_until_three_runs_each() -> None:
    req = request(e2e_p95=10_000_000)
    best, rival = TrialConfig(4, 192, "fp8", "fp8"), TrialConfig(4, 256, "fp8", "fp8")
    s = SearchSettings()
    two = Known.build(req, {best: [_ok(1010.0)] * 2, rival: [_ok(1000.0)] * 2})
    # Each measured twice: without doubt nothing is measured again ...
    assert confirmations(req, two, best, {rival}, s) == []
    # ... but when the posterior holds the rival more likely than not the better one, both are.
    assert confirmations(req, two, best, {rival}, s, doubted={rival}) == [best, rival]
    three = Known.build(req, {best: [_ok(1010.0)] * 3, rival: [_ok(1000.0)] * 3})
    assert confirmations(req, three, best, {rival}, s, doubted={rival}) == []


def test_a_running_trials_rungs_are_in_flight_with_it() -> None:
    """Another worker must not claim a configuration a running trial will measure as a rung."""
    study = optuna.create_study()
    trial = study.ask()
    launch = TrialConfig(2, 256, "fp8", "fp8")
    trial.set_user_attr(ATTR_CONFIG, launch.as_dict())
    trial.set_user_attr(ATTR_RUNGS, [[192, 0], [128, 0]])
    flying = claimed(study.get_trials(deepcopy=False))
    assert flying == {
        launch,
        replace(launch, max_batch_size=192),
        replace(launch, max_batch_size=128),
    }
