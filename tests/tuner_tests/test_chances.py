"""Every trial `auto` chose carries the chances it was chosen with, and the report sets them
beside what came true: the search's reasoning can be audited, run by run."""

from __future__ import annotations

from pathlib import Path

import pytest

from infertune_tuner.report import render_html, render_markdown
from infertune_tuner.report.view import track_record
from infertune_tuner.result import Chances, ConfigOut, Report, Trial
from infertune_tuner.run import tune
from infertune_tuner.search.settings import SearchSettings

from .helpers import request


def _tuned(tmp_path: Path, **kw: object) -> Report:
    report = tune(request(**kw), backend="simulated", out_dir=tmp_path)  # type: ignore[arg-type]
    assert report is not None
    return report


def _best_before(trials: list[Trial], n: int) -> tuple[ConfigOut | None, float]:
    """The SLO-meeting configuration measured before trial `n` with the best typical tok/s/GPU
    (the mean over its runs), and that tok/s/GPU; (None, 0) while none met the SLO."""
    runs: dict[ConfigOut, list[float]] = {}
    ok: dict[ConfigOut, bool] = {}
    for t in trials:
        if t.number < n and t.executed and t.metrics is not None:
            runs.setdefault(t.config, []).append(t.metrics.output_tokens_per_s_per_gpu)
            ok[t.config] = bool(t.slo_ok)
    typical = {c: sum(v) / len(v) for c, v in runs.items() if ok[c]}
    best = max(typical, key=lambda c: typical[c], default=None)
    return best, typical.get(best, 0.0) if best is not None else 0.0


def test_every_trial_auto_chose_records_the_chances_it_was_chosen_with(tmp_path: Path) -> None:
    report = _tuned(tmp_path)
    executed = [t for t in report.trials if t.executed]
    assert len(executed) >= 4
    improvement = SearchSettings().improvement
    for t in executed:
        c = t.chances
        assert c is not None, t
        assert 0.0 <= c.p_beat <= c.p_success <= 1.0, t
        # What it had to beat: the best measured before it, 2 % up (0 while nothing met the SLO).
        incumbent, tps = _best_before(executed, t.number)
        assert c.incumbent == incumbent, t.number
        assert c.to_beat_tps == pytest.approx(tps * (1 + improvement), rel=1e-4), t.number
        if t.purpose == "confirm":
            assert c.p_success == 1.0  # a confirmation re-measures a configuration that met it
    first, last = executed[0].chances, executed[-1].chances
    assert first is not None and last is not None and first.confidence is not None
    assert last.confidence is not None and last.confidence > first.confidence
    assert report.confidence is not None and report.confidence >= 0.95


def test_the_chances_survive_a_resume(tmp_path: Path) -> None:
    """They live in the study: a re-run that resumes it reports the earlier trials' chances."""
    before = _tuned(tmp_path, max_trials=3)
    after = _tuned(tmp_path, max_trials=40)
    earlier = {t.number: t.chances for t in before.trials if t.executed}
    assert len(earlier) == 3 and all(c is not None for c in earlier.values())
    assert {t.number: t.chances for t in after.trials if t.number in earlier} == earlier
    assert after.executed_trials > 3


def test_other_samplers_record_no_chances(tmp_path: Path) -> None:
    report = _tuned(tmp_path, sampler="random", max_trials=5)
    assert all(t.chances is None for t in report.trials)
    assert "Chances as the search saw them" not in render_markdown(report)


def test_the_report_sets_the_chances_beside_what_came_true(tmp_path: Path) -> None:
    report = _tuned(tmp_path)
    ok, oom = [t for t in report.trials if t.executed and t.state == "complete"][:2], "oom"

    def trial(like: Trial, n: int, purpose: str, p: float, beat: float, **kw: object) -> Trial:
        chances = Chances(p_success=p, p_beat=beat, to_beat_tps=1000.0, estimate_tps=1100.0)
        return like.model_copy(update={"number": n, "purpose": purpose, "chances": chances, **kw})

    fast = ok[0].metrics.model_copy(update={"output_tokens_per_s_per_gpu": 1500.0})  # type: ignore[union-attr]
    slow = ok[0].metrics.model_copy(update={"output_tokens_per_s_per_gpu": 900.0})  # type: ignore[union-attr]
    trials = [
        trial(ok[0], 0, "explore", 0.5, 0.25, slo_ok=True, metrics=fast),  # met and beat
        trial(ok[0], 1, "cover", 0.3, 0.1, slo_ok=False, metrics=fast),  # missed the SLO
        trial(ok[0], 2, "explore", 0.2, 0.2, slo_ok=True, metrics=slow),  # met, did not beat
        trial(ok[1], 3, "explore", 0.2, 0.2, state=oom, slo_ok=None, metrics=None),  # a miss
        trial(ok[0], 4, "confirm", 1.0, 0.0, slo_ok=True, metrics=fast),  # re-measured: not counted
        trial(ok[0], 5, "explore", 0.9, 0.9, state="invalid", slo_ok=None),  # not evidence
    ]
    crafted = report.model_copy(update={"trials": trials})
    line = track_record(crafted)
    assert line == (
        "of the 4 trials chosen to explore, cover or probe, the search expected 1.2 to meet the "
        "SLO (2 did) and 0.8 to beat the best of their time by more than 2 % (1 did)"
    )
    md = render_markdown(crafted)
    assert f"- Chances as the search saw them: {line}" in md
    row = next(x for x in md.splitlines() if x.startswith("| 0 |"))
    assert "| 50% / 25% |" in row
    html = render_html(crafted)
    assert "<td>50% / 25%</td>" in html and line in html


def test_nothing_chosen_by_chance_says_nothing(tmp_path: Path) -> None:
    report = _tuned(tmp_path)
    confirms = [t.model_copy(update={"purpose": "confirm"}) for t in report.trials]
    assert track_record(report.model_copy(update={"trials": confirms})) is None


def test_parallel_workers_record_the_chances_they_proposed_with(tmp_path: Path) -> None:
    """Two workers: each trial keeps the chances its worker chose it with; an incumbent may be
    a trial the other worker still ran (believed at its posterior mean, search/posterior.py)."""
    report = _tuned(tmp_path, parallelism=2)
    executed = [t for t in report.trials if t.executed]
    assert len(executed) >= 4
    measured = {t.config for t in executed}
    for t in executed:
        c = t.chances
        assert c is not None, t
        assert 0.0 <= c.p_beat <= c.p_success <= 1.0, t
        assert c.incumbent is None or c.incumbent in measured, t
