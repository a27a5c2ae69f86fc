"""What a run ended with, as a reader sees it: the headline and its next step (CLI, report.md,
report.html), the exit status, every started trial's row, and a confidence that says why it
differs from the stop rule's number."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml
from typer.testing import CliRunner

from infertune_operator.cli import app
from infertune_tuner.backends.simulated import SimulatedBackend
from infertune_tuner.run import tune, write_report

from .helpers import CountingBackend, request

REPO = Path(__file__).resolve().parents[2]
INFERTUNE = str(Path(sys.executable).parent / "infertune")
NOT_MET = "No configuration met the SLO"


def _spec(tmp_path: Path, **tuning: object) -> Path:
    doc = yaml.safe_load((REPO / "examples" / "llama2-70b-h100.yaml").read_text())
    doc["spec"]["tuning"].update(tuning)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _text(s: str) -> str:
    return " ".join(s.split())


def test_ctrl_c_before_any_trial_says_interrupted_not_infeasible(
    tmp_path: Path, ctrl_c_reaches: Callable[[list[str]], list[str]]
) -> None:
    """A real Ctrl-C (SIGINT) during the first trial: exit 130, the headline says interrupted
    and how to go on, in the CLI and both reports; the trial it stopped has its row."""
    out = tmp_path / "out"
    tuner = subprocess.Popen(
        ctrl_c_reaches([INFERTUNE, "tune", str(_spec(tmp_path)), "--out", str(out),
                        "--no-progress"]),
        env={**os.environ, "INFERTUNE_SIMULATED_TIME_SCALE": "1"},  # a trial takes minutes
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        journal = out / "study.journal"
        while not (journal.exists() and '"config"' in journal.read_text()):
            assert time.monotonic() < deadline and tuner.poll() is None, "no trial started"
            time.sleep(0.2)
        tuner.send_signal(signal.SIGINT)
        stdout, stderr = tuner.communicate(timeout=60)
    finally:
        if tuner.poll() is None:
            tuner.kill()
    assert tuner.returncode == 130, stderr
    assert "Traceback" not in stdout + stderr
    said = _text(stdout)
    assert said.startswith(
        "Interrupted (Ctrl-C) after 0 trials, before any configuration met the SLO: no verdict"
    ), said
    assert "Next: Re-run the same command to resume the study where it stopped." in said
    assert NOT_MET not in said
    md = (out / "report.md").read_text()
    assert "**Interrupted (Ctrl-C) after 0 trials" in md and NOT_MET not in md
    html = (out / "report.html").read_text()
    assert 'class="verdict warn">Interrupted (Ctrl-C)' in html and NOT_MET not in html
    rows = json.loads((out / "report.json").read_text())["trials"]
    assert [(t["number"], t["state"]) for t in rows if t["state"] == "interrupted"] == [
        (0, "interrupted")
    ], ([(t["number"], t["state"], t.get("reason")) for t in rows if t["number"] < 3],
        (out / "study.journal").read_text()[-3000:], stderr)  # fmt: skip
    assert re.search(r"\| 0 \| TP\d+ / bs\d+ / \w+ / KV \w+ \| interrupted \|", md), md


def test_aborted_says_the_set_up_is_broken_and_what_to_fix(tmp_path: Path) -> None:
    """A server that never starts: exit 4 and a headline naming the failure, not 'no feasible
    configuration'."""
    spec = _spec(tmp_path, backend="triton", maxTrials=6)
    doc = yaml.safe_load(spec.read_text())
    doc["spec"]["search"].update(quantization=["fp16"], tensorParallel=[4, 8])
    spec.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["tune", str(spec), "--backend", "triton", "--server-command", "false",
              "--out", str(out), "--no-progress"],
    )  # fmt: skip
    assert result.exit_code == 4, result.output
    said = _text(result.stdout)
    # Failures that share a structure could be that structure's: the search stops once they
    # share none, or nothing is left.
    assert re.match(
        r"Aborted: the first [345] trials all failed, so the set-up is broken, not the "
        r"configurations\. Last error: the server exited before it was ready \(exit code 1\)",
        said,
    ), said
    assert "Next: Fix what the failed trials report" in said and NOT_MET not in said
    assert "aborted" not in result.stderr  # said once, on stdout
    md = (out / "report.md").read_text()
    assert re.search(r"\*\*Aborted: the first [345] trials all failed", md) and NOT_MET not in md
    # The set-up's failures, not a structure's.
    assert "could not run:" not in said and "## What could not run" not in md
    assert 'class="verdict bad">Aborted:' in (out / "report.html").read_text()


def test_nothing_feasible_says_so_with_the_next_step(tmp_path: Path) -> None:
    doc = yaml.safe_load(_spec(tmp_path).read_text())
    doc["spec"]["slo"] = {"e2eLatencyMs": {"p95": 500}}
    spec = tmp_path / "tight.yaml"
    spec.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(app, ["tune", str(spec), "--out", str(tmp_path / "o"),
                                      "--no-progress"])  # fmt: skip
    assert result.exit_code == 3, result.output
    said = _text(result.stdout)
    assert said.startswith(f"{NOT_MET}:"), said
    assert "Next: Relax the bound missed by the least (see the nearest misses)" in said
    assert "nearest miss" in said
    md = (tmp_path / "o" / "report.md").read_text()
    assert f"**{NOT_MET}:" in md and "Next: Relax the bound" in md


def test_the_interrupted_trial_keeps_its_number_and_its_rerun_is_named(tmp_path: Path) -> None:
    """Trial numbers never jump: the trial Ctrl-C stopped is a row ('interrupted'), and after
    the re-run it names the trial that measured its configuration."""
    req = request(max_trials=10, seed=0)
    first = CountingBackend(SimulatedBackend(req, seed=0), fail_after=2)  # Ctrl-C in trial 2
    stopped = tune(req, backend=first, out_dir=tmp_path)
    assert stopped is not None
    rows = [(t.number, t.state) for t in stopped.trials if t.executed or t.state == "interrupted"]
    assert [n for n, _ in rows] == [0, 1, 2]
    assert [state == "interrupted" for _, state in rows] == [False, False, True]
    assert stopped.trials[2].reason == (
        "interrupted after 0 s before it measured anything; its configuration counts as untried"
    )
    resumed = tune(req, backend=CountingBackend(SimulatedBackend(req, seed=0)), out_dir=tmp_path)
    assert resumed is not None
    write_report(resumed, tmp_path)
    numbers = [t.number for t in resumed.trials if t.executed or t.state == "interrupted"]
    assert numbers == list(range(len(numbers))), numbers  # no gap
    gone = next(t for t in resumed.trials if t.state == "interrupted")
    assert gone.number == 2
    again = re.search(r"measured again as trial (\d+)", gone.reason or "")
    assert again, gone.reason
    rerun = next(t for t in resumed.trials if t.number == int(again.group(1)))
    assert rerun.executed and rerun.config == gone.config
    md = (tmp_path / "report.md").read_text()
    assert re.search(r"\| 2 \| TP\d+ / bs\d+ / \w+ / KV \w+ \| interrupted \| ", md), md
    assert f"measured again as trial {rerun.number}" in md
    assert ">interrupted<" in (tmp_path / "report.html").read_text()


def test_the_confidence_says_why_it_is_below_the_stop_rule(tmp_path: Path) -> None:
    """The L4 example: P(an untried configuration beats the best) is small, the confidence
    much lower; the same line says why (near-ties among measured configurations)."""
    example = REPO / "examples" / "llama3-8b-l4.yaml"
    result = CliRunner().invoke(app, ["tune", str(example), "--out", str(tmp_path),
                                      "--no-progress"])  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "report.json").read_text())
    untried, conf = report["p_untried_beats"], report["confidence"]
    assert 1 - untried - conf > 0.05, (untried, conf)  # the two numbers this is about
    assert report["near_ties"], report
    tie = report["near_ties"][0]["config"]
    label = (
        f"tp{tie['tp']}/bs{tie['max_batch_size']}/{tie['quantization']}/kv-{tie['kv_cache_dtype']}"
    )
    stop_line = next(line for line in result.stdout.splitlines() if "stopped:" in line)
    assert f"confidence the optimum was found: {conf:.1%}" in stop_line
    assert f"lower than 1 - {untried:.1%} because of near-ties: measured {label}" in stop_line
    md = (tmp_path / "report.md").read_text()
    line = next(x for x in md.splitlines() if x.startswith("- Confidence the optimum was found"))
    assert f"{conf:.1%}" in line and f"{untried:.1%} probability" in line
    assert "near-ties, not untried configurations" in line and label in line
    html = (tmp_path / "report.html").read_text()
    assert "near-ties, not untried configurations" in html


def test_the_confidence_needs_no_excuse_when_the_numbers_agree(tmp_path: Path) -> None:
    """The quick start: the two numbers add up, and the report says what a repeat is."""
    result = CliRunner().invoke(app, ["tune", str(REPO / "examples" / "llama2-70b-h100.yaml"),
                                      "--out", str(tmp_path), "--no-progress"])  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "report.json").read_text())
    assert abs(1 - report["p_untried_beats"] - report["confidence"]) < 0.0005
    md = (tmp_path / "report.md").read_text()
    assert "near-ties" not in result.stdout + md
    assert f"- Confidence the optimum was found: {report['confidence']:.1%}" in md
    assert report["best"]["repeats"] == 2
    assert "each latency percentile the geometric mean of the repeats" in md
    assert "worse repeat" not in md + (tmp_path / "report.html").read_text()


def test_what_could_not_run_is_said_alike_by_the_cli_and_the_report(tmp_path: Path) -> None:
    """A recorded pool where fp8 weights never loaded (its rows carry the reason): the CLI's
    summary and report.md say the same line, and the chosen configuration is one that runs."""
    from infertune_operator.api.manifest import load_deployment
    from infertune_operator.api.to_request import to_request
    from infertune_tuner.backends.replay import write_table
    from infertune_tuner.measurement import Measurement
    from infertune_tuner.report.view import failure_line
    from infertune_tuner.result import Report
    from infertune_tuner.space import build_space

    spec = _spec(tmp_path, backend="simulated", maxTrials=30)
    req = to_request(load_deployment(spec), default_backend="simulated")
    pool = SimulatedBackend(req, seed=0)
    why = "[TensorRT-LLM][ERROR] Assertion failed: no FP8 GEMM tactic for SM90 (gemm.cpp:231)"
    rows = {
        c: Measurement.failed("error", why, "loading model") if c.quantization == "fp8"
        else pool.run(c)
        for c in build_space(req, req.resolve_model(), req.resolve_gpu()).configs
    }  # fmt: skip
    table = tmp_path / "pool.csv"
    write_table(table, rows)
    result = CliRunner().invoke(
        app, ["tune", str(spec), "--backend", f"replay:{table}", "--out", str(tmp_path / "o"),
              "--no-progress"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = Report.model_validate_json((tmp_path / "o" / "report.json").read_text())
    assert report.best is not None and report.best.config.quantization == "fp16"
    (row,) = [f for f in report.could_not_run if f.kind == "structure"]
    line = failure_line(row)
    assert f"could not run: {line}" in result.stdout
    assert f"- {line}" in (tmp_path / "o" / "report.md").read_text()
    assert "no FP8 GEMM tactic for SM90" in line and "none of quantization=fp8 ran" in line
    assert len(row.trials) <= 3
    assert [f for f in report.could_not_run if f.kind != "structure"] == []  # nothing else failed
