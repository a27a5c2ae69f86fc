"""The tuner end to end on the simulated and replay backends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infertune_tuner.backends.replay import ReplayBackend, write_table
from infertune_tuner.backends.simulated import SimulatedBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.errors import InputError
from infertune_tuner.run import prior_predictions, tune, write_report
from infertune_tuner.search.posterior import memory_margin
from infertune_tuner.search.settings import SearchSettings
from infertune_tuner.space import build_space
from infertune_tuner.stop import INTERRUPTED, StopKind

from .helpers import CountingBackend, request


def _space_and_priors(req):  # type: ignore[no-untyped-def]
    space = build_space(req, req.resolve_model(), req.resolve_gpu())
    return space, prior_predictions(req, space)


def test_space_excludes_what_the_gpu_or_accuracy_rule_out() -> None:
    req = request(quants=["fp16", "fp8", "nvfp4", "w4a16_awq"])
    space, _ = _space_and_priors(req)
    assert {c.quantization for c in space.configs} == {"fp16", "fp8"}
    reasons = {e.value: e.reason for e in space.excluded}
    assert "no kernels" in reasons["nvfp4"]  # H100 has no FP4 tensor cores
    assert "accuracy" in reasons["w4a16_awq"]  # 2 % > the default 1 % allowance


def test_empty_space_is_an_input_error() -> None:
    req = request(quants=["nvfp4"])
    with pytest.raises(InputError, match="search space is empty"):
        build_space(req, req.resolve_model(), req.resolve_gpu())


@pytest.mark.parametrize("sampler", ["auto", "tpe", "random", "grid"])
def test_never_executes_what_the_memory_model_rules_out(tmp_path: Path, sampler: str) -> None:
    req = request(sampler=sampler, max_trials=12)
    _, priors = _space_and_priors(req)
    backend = CountingBackend(SimulatedBackend(req, seed=0))
    report = tune(req, backend=backend, out_dir=tmp_path)
    assert backend.calls, "something must run"
    gpu_mem = req.resolve_gpu().memory_gib
    wide = SearchSettings().wide_margin
    assert not any(memory_margin(priors[c], gpu_mem) < -wide for c in backend.calls)
    repeated = {c for c in backend.calls if backend.calls.count(c) > 1}
    confirmed = {t.config.to_config() for t in report.trials if t.purpose == "confirm"}
    assert repeated <= confirmed, "only a confirmation measures a configuration twice"
    if sampler != "auto":
        assert not repeated
    assert report.executed_trials == len(backend.calls) <= 12
    pruned = [t for t in report.trials if t.state == "infeasible_predicted"]
    assert pruned and all(not t.executed and t.reason for t in pruned)


def test_auto_finds_the_true_optimum_on_a_perturbed_pool_in_few_trials(tmp_path: Path) -> None:
    req = request()
    truth = SimulatedBackend.perturbed(req, seed=3)
    space, _ = _space_and_priors(req)

    def true_value(cfg: TrialConfig) -> tuple[float, float]:
        m = truth.typical(cfg)  # what the configuration really does: a typical run
        if m.status != "ok" or m.e2e_ms is None:
            return 0.0, float("inf")
        return m.output_tokens_per_s_per_gpu or 0.0, m.e2e_ms.p95

    best_true = max(tps for tps, e2e in map(true_value, space.configs) if e2e <= 25600)
    report = tune(req, backend=SimulatedBackend.perturbed(req, seed=3), out_dir=tmp_path)
    assert report.best is not None
    tps, e2e = true_value(report.best.config.to_config())
    assert tps >= 0.98 * best_true
    assert e2e <= 25600 * 1.02  # truly meets the SLO (within what noise can tell)
    assert report.executed_trials <= 14
    assert report.stopped_reason.startswith("converged")
    assert report.best.repeats >= 2, "the winner is confirmed before it is declared"
    assert report.confidence is not None and 0.0 < report.confidence <= 1.0


def test_resume_after_interruption_repeats_no_trial(tmp_path: Path) -> None:
    req = request(sampler="random", max_trials=10, seed=5)
    first = CountingBackend(SimulatedBackend(req, seed=5), fail_after=4)
    interrupted = tune(req, backend=first, out_dir=tmp_path)  # Ctrl-C during the 5th trial
    assert interrupted.stop == StopKind.INTERRUPTED
    assert interrupted.stopped_reason == str(INTERRUPTED)
    assert interrupted.executed_trials == 4  # the report of the trials done
    assert len(first.calls) == 4
    second = CountingBackend(SimulatedBackend(req, seed=5))
    report = tune(req, backend=second, out_dir=tmp_path)
    assert not set(first.calls) & set(second.calls), "a completed trial was repeated"
    assert report.executed_trials == 10
    executed = {t.config.to_config() for t in report.trials if t.executed}
    assert set(first.calls) <= executed
    # Running again changes nothing: the study is complete.
    third = CountingBackend(SimulatedBackend(req, seed=5))
    again = tune(req, backend=third, out_dir=tmp_path)
    assert third.calls == [] and again.executed_trials == 10


def test_all_infeasible_slo_reports_nearest_misses(tmp_path: Path) -> None:
    req = request(e2e_p95=500, max_trials=6)
    report = tune(req, backend="simulated", out_dir=tmp_path)
    assert report.best is None
    assert report.nearest_misses
    assert all("E2E p95" in v for nm in report.nearest_misses for v in nm.violations)


def test_replay_reproduces_the_same_best(tmp_path: Path) -> None:
    req = request(seed=2)
    space, priors = _space_and_priors(req)
    sim = SimulatedBackend.perturbed(req, seed=2)
    table = tmp_path / "table.csv"
    write_table(table, {c: sim.run(c) for c in space.configs if priors[c].fits})
    live = tune(req, backend=SimulatedBackend.perturbed(req, seed=2), out_dir=tmp_path / "a")
    r1 = tune(req, backend=f"replay:{table}", out_dir=tmp_path / "b")
    r2 = tune(req, backend=f"replay:{table}", out_dir=tmp_path / "c")
    assert r1.best and r2.best and live.best
    assert r1.best.config == r2.best.config == live.best.config
    assert [t.config for t in r1.trials if t.executed] == [
        t.config for t in r2.trials if t.executed
    ]


def test_replay_missing_config_is_a_failed_trial(tmp_path: Path) -> None:
    table = tmp_path / "t.csv"
    write_table(table, {})
    m = ReplayBackend(table).run(TrialConfig(2, 8, "fp8", "auto"))
    assert m.status == "error" and m.reason and "not in table" in m.reason


def test_replay_bad_tables_are_input_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("tp,max_batch_size\n1,2\n")
    with pytest.raises(InputError, match="missing columns"):
        ReplayBackend(bad)
    with pytest.raises(InputError):
        ReplayBackend(tmp_path / "absent.csv")


def test_parallel_workers_share_the_study(tmp_path: Path) -> None:
    req = request(sampler="random", max_trials=8, parallelism=2, seed=1)
    report = tune(req, backend="simulated", out_dir=tmp_path)
    executed = [t.config.to_config() for t in report.trials if t.executed]
    assert len(executed) == len(set(executed)) == report.executed_trials
    assert 7 <= report.executed_trials <= 8


def test_report_files_and_json_contract(tmp_path: Path) -> None:
    report = tune(request(max_trials=8), backend="simulated", out_dir=tmp_path)
    paths = write_report(report, tmp_path)
    assert [p.name for p in paths] == ["report.json", "report.md", "report.html"]
    data = json.loads(paths[0].read_text())
    assert data["schema"] == "infertune.report/v1"
    assert {"request", "space_size", "trials", "best", "executed_trials"} <= data.keys()
    t = data["trials"][0]
    assert {
        "number",
        "config",
        "state",
        "executed",
        "slo_ok",
        "metrics",
        "predicted",
        "reason",
    } <= t.keys()
    assert set(t["config"]) == {"tp", "max_batch_size", "quantization", "kv_cache_dtype"}
    assert set(t["metrics"]["e2e_ms"]) == {"p50", "p95", "p99"}
    assert data["best"]["metrics"]["output_tokens_per_s_per_gpu"] > 0
    html = paths[2].read_text()
    assert "<svg" in html and "Pareto" in html
    assert 'src="http' not in html and 'href="http' not in html  # self-contained
    md = paths[1].read_text()
    assert "Chosen configuration" in md and "Ruled out without GPU time" in md


class _BrokenThenFixed:
    """A backend whose set-up is broken (every trial errors) until `fixed` is set."""

    name = "flaky"
    speedup = 1.0

    def __init__(self, inner: SimulatedBackend) -> None:
        self.inner = inner
        self.fixed = False
        self.calls: list[TrialConfig] = []

    def run(self, config: TrialConfig, *, repeat: int = 0):  # type: ignore[no-untyped-def]
        from infertune_tuner.measurement import Measurement

        self.calls.append(config)
        if not self.fixed:
            return Measurement.failed("error", "cannot start 'tritonserver': not found")
        return self.inner.run(config, repeat=repeat)

    def close(self) -> None:
        pass


def test_broken_setup_aborts_early_and_a_fixed_rerun_retries(tmp_path: Path) -> None:
    req = request(max_trials=20)
    backend = _BrokenThenFixed(SimulatedBackend(req, seed=0))
    report = tune(req, backend=backend, out_dir=tmp_path)
    assert report.best is None
    assert report.stop == StopKind.ABORTED
    assert "cannot start" in report.stopped_reason
    # It stops once the failures share no structure (one that did could be the structure's),
    # or nothing is left: far from the budget.
    assert 3 <= len(backend.calls) <= 5, "stops after a few errors, not at the budget"
    backend.fixed = True
    backend.calls.clear()
    again = tune(req, backend=backend, out_dir=tmp_path)
    assert again.best is not None, "errors of an earlier run are retried once the set-up works"
    assert all(t.state == "complete" for t in again.trials if t.executed)


def test_a_space_of_one_configuration_is_measured(tmp_path: Path) -> None:
    # Optuna never asks a sampler for parameters that have a single choice each.
    req = request(tps=[2], batches=[64], quants=["fp8"], max_trials=5)
    req = req.model_copy(
        update={"search": req.search.model_copy(update={"kv_cache_dtype": ["fp8"]})}
    )
    report = tune(req, backend="simulated", out_dir=tmp_path)
    assert report.best is not None and report.best.config.tp == 2
    assert 1 <= report.executed_trials <= 2
