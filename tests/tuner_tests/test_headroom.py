"""The chosen configuration's room inside each SLO bound: a choice that meets a bound within
run-to-run noise says so (report, CLI, the operator's Tuned condition), with how often a fresh
run meets the bound and the tighter bound that gets a configuration with room."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infertune_operator.cli import app
from infertune_operator.policy.serving import tuned_message
from infertune_tuner import slo
from infertune_tuner.report import render_html, render_markdown
from infertune_tuner.result import FloorCheck, Report, SloCheck

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llama3-8b-l4.yaml"


def _check(value: float, limit: float) -> SloCheck:
    return SloCheck(
        bound="E2E p95", metric="e2e_ms", percentile="p95", limit_ms=limit, value_ms=value,
        ok=value <= limit,
    )  # fmt: skip


def test_the_chance_a_fresh_run_meets_a_bound_follows_the_room_and_the_noise() -> None:
    at_the_edge = slo.room(_check(998.0, 1000.0), noise=0.06, repeats=2)
    assert at_the_edge.headroom == pytest.approx(0.002)
    assert 0.5 < at_the_edge.p_meets < 0.55 and not at_the_edge.settled
    # Two SDs of a two-run typical (0.06 x sqrt(1.5)) is 14.7 % in log terms.
    inside = slo.room(_check(1000.0 * math.exp(-0.15), 1000.0), noise=0.06, repeats=2)
    assert inside.settled and inside.p_meets > 0.977
    # More repeats make the typical run surer, a noisier pool less so.
    assert (
        slo.room(_check(950.0, 1000.0), noise=0.06, repeats=3).p_meets
        > slo.room(_check(950.0, 1000.0), noise=0.06, repeats=1).p_meets
    )
    assert slo.room(_check(950.0, 1000.0), noise=0.12, repeats=2).p_meets < 0.70
    # A tok/s/GPU floor has its room above the bound.
    tps = FloorCheck(bound="tok/s/GPU >= 1000", limit_tps=1000.0, value_tps=1100.0, ok=True)
    floor = slo.room(tps, noise=0.03, repeats=2)
    assert floor.headroom == pytest.approx(0.1) and floor.settled


def _spec(tmp_path: Path, e2e_p95: int) -> Path:
    text = EXAMPLE.read_text(encoding="utf-8")
    assert "p95: 20000" in text
    spec = tmp_path / f"l4-{e2e_p95}.yaml"
    spec.write_text(text.replace("p95: 20000", f"p95: {e2e_p95}"), encoding="utf-8")
    return spec


def _tuned(cli: CliRunner, spec: Path, out: Path) -> tuple[str, Report]:
    """`infertune tune SPEC --out OUT` as a user runs it: what it printed, and its report."""
    result = cli.invoke(app, ["tune", str(spec), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return result.stdout, Report.model_validate_json((out / "report.json").read_text())


def test_a_choice_at_the_edge_of_its_bound_says_so_and_the_advice_gets_room(
    tmp_path: Path, cli: CliRunner
) -> None:
    # The example's optimum runs its E2E p95 at about 16.95 s: a 17.2 s bound leaves it no room.
    printed, report = _tuned(cli, _spec(tmp_path, 17200), tmp_path / "edge")
    line = next(x for x in printed.splitlines() if x.startswith("SLO headroom"))
    assert "within run-to-run noise" in line
    assert report.best is not None
    (h,) = report.best.headroom
    p95 = report.best.metrics.latency("e2e_ms", "p95")
    assert h.value_ms == pytest.approx(p95) and h.headroom == pytest.approx(
        1 - p95 / 17200, abs=1e-4
    )
    assert not h.settled and h.p_meets < 0.9
    assert f"a fresh run meets it {h.p_meets:.0%} of the time" in line
    assert line in render_markdown(report)
    assert '<dd class="warn">SLO headroom within run-to-run noise' in render_html(report)
    assert "met within run-to-run noise: E2E p95" in tuned_message(report)

    # The advice names the best measured configuration that has room in every bound ...
    named = re.search(r"room in every bound is (.+?) \((\d+) tok/s/GPU, trial (\d+)\)", line)
    assert named, line
    other = next(t for t in report.trials if t.number == int(named.group(3)))
    assert other.metrics is not None and other.config != report.best.config
    assert f"{other.metrics.output_tokens_per_s_per_gpu:.0f}" == named.group(2)
    assert all(slo.room(c, h.noise, 1).settled for c in other.slo_checks)
    assert "read that run's headroom against this bound" in line  # where following it ends
    # ... and the bound two run-to-run SDs tighter. Tuned with it, the choice has room inside
    # the bound the user actually has.
    tighter = int(re.search(r"E2E p95 <= (\d+) ms", line).group(1))  # type: ignore[union-attr]
    assert tighter == round(17200 * math.exp(-2 * h.noise))
    printed, again = _tuned(cli, _spec(tmp_path, tighter), tmp_path / "tighter")
    assert again.best is not None
    room = slo.room(
        _check(again.best.metrics.latency("e2e_ms", "p95"), 17200.0), h.noise, again.best.repeats
    )
    assert room.settled


def test_a_choice_with_room_states_it_and_raises_no_warning(tmp_path: Path, cli: CliRunner) -> None:
    printed, report = _tuned(cli, EXAMPLE, tmp_path)
    assert "SLO headroom" not in printed
    assert report.best is not None
    (h,) = report.best.headroom
    assert h.settled and h.headroom > 0.1
    assert f"SLO headroom: E2E p95 {h.headroom:.1%} under its bound" in render_markdown(report)
    assert "<dd>SLO headroom: E2E p95" in render_html(report)
    assert "within run-to-run noise" not in tuned_message(report)


def test_the_floor_is_read_from_studies_and_reports_that_kept_it_in_milliseconds() -> None:
    """Earlier versions recorded the tok/s/GPU floor as a latency-shaped check: a resumed study
    and a stored report still read it as the floor it was."""
    from infertune_tuner.result import checks_of

    legacy = {
        "bound": "tok/s/GPU >= 400", "metric": "output_tokens_per_s_per_gpu",
        "percentile": "mean", "limit_ms": 400.0, "value_ms": 380.0, "ok": False,
    }  # fmt: skip
    latency = _check(900.0, 1000.0).model_dump()
    [floor, bound] = checks_of([legacy, latency])
    assert isinstance(floor, FloorCheck) and (floor.limit_tps, floor.value_tps) == (400.0, 380.0)
    assert floor.miss() == "tok/s/GPU 380 < 400" and floor.violation > 0
    assert isinstance(bound, SloCheck) and bound.ok
    assert checks_of([floor.model_dump()]) == [floor]  # and its own form round-trips
