"""What a person sees from `infertune`: the version, help, a resumed study, the progress."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from infertune_operator import __version__
from infertune_operator.cli import app
from infertune_tuner.backends import BACKEND_HELP
from infertune_tuner.cli.progress import TuneProgress
from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement
from infertune_tuner.run import StudyStart
from infertune_tuner.search.evidence import Evidence

from .helpers import request

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llama2-70b-h100.yaml"


def test_version(cli: CliRunner) -> None:
    result = cli.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"infertune {__version__}"


def test_help_has_no_placeholders_and_lists_every_backend(cli: CliRunner) -> None:
    for command in ("tune", "render", "validate", "predict", "simserver", "bench", "operator"):
        text = cli.invoke(app, [command, "--help"], env={"COLUMNS": "200"}).stdout
        assert "<bool>" not in text, command
        assert not re.search(r"\{\w+\}", text.split("\n\n")[0] + text), command
    usage = cli.invoke(app, ["tune", "--help"], env={"COLUMNS": "200"}).stdout
    assert "Usage: infertune tune [OPTIONS] SPEC" in usage
    assert BACKEND_HELP in " ".join(usage.split())


def test_a_rerun_says_it_resumes_the_study(tmp_path: Path, cli: CliRunner) -> None:
    args = ["tune", str(EXAMPLE), "--out", str(tmp_path)]
    first = cli.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "Resuming" not in first.stderr
    again = cli.invoke(app, args)
    assert again.exit_code == 0, again.output
    assert f"Resuming the study in {tmp_path}" in " ".join(again.stderr.split())
    executed = re.search(r"(\d+) trials executed, (\d+) of them by an earlier run", again.stdout)
    assert executed and executed.group(1) == executed.group(2)  # nothing ran twice
    assert "Resumed an earlier study" in (tmp_path / "report.md").read_text()


def test_the_stop_summary_is_printed_once_on_stdout(tmp_path: Path, cli: CliRunner) -> None:
    """Results on stdout, progress on stderr: why the search stopped is said once."""
    result = cli.invoke(app, ["tune", str(EXAMPLE), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    stdout, stderr = " ".join(result.stdout.split()), " ".join(result.stderr.split())
    assert stdout.count("converged:") == 1, stdout
    assert "converged" not in stderr and "trials executed" not in stderr, stderr
    assert "report:" in stdout and "report:" not in stderr
    # The summary says what the planner spent its trials on, and the report too.
    plan = re.search(
        r"(\d+) trials executed \((\d+) explore(, \d+ cover)?, (\d+) confirm; the best first "
        r"measured in trial (\d+)\)",
        stdout,
    )
    assert plan, stdout
    report = json.loads((tmp_path / "report.json").read_text())
    executed = {t["number"]: t for t in report["trials"] if t["executed"]}
    first = int(plan.group(5))
    assert executed[first]["config"] == report["best"]["config"]
    assert not any(
        t["config"] == report["best"]["config"] for n, t in executed.items() if n < first
    )
    md = (tmp_path / "report.md").read_text()
    assert f"Trials by purpose: {plan.group(2)} explore" in md
    assert "(budget 40, confidence target 0.95)" in md


def test_the_progress_shows_the_phase_of_a_long_trial_and_its_elapsed_time() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160, color_system=None)
    shown = TuneProgress(Path("out"), console=console)
    shown.start(StudyStart("s", resumed_trials=0, max_trials=40))
    cfg = TrialConfig(2, 64, "fp8", "auto")
    shown.phase(cfg, "loading model")
    assert shown._progress is not None
    shown._progress.refresh()
    assert re.search(r"tp2/bs64/fp8/kv-auto.*loading model \d+ s", out.getvalue())
    shown.trial(cfg, Measurement.failed("oom", "CUDA out of memory"), [], Evidence(request()))
    shown._progress.refresh()
    assert "1/40" in out.getvalue() and "oom" in out.getvalue()
    before = out.getvalue()
    shown.finish()  # the bar goes; the command prints the result on stdout, once
    assert "trial executed" not in out.getvalue()[len(before) :]


def test_the_simulated_pool_is_named_where_the_numbers_are_read(
    tmp_path: Path, cli: CliRunner
) -> None:
    """The example asks for backend triton; locally it runs on the simulated pool, and a
    reader of the console or the report must not take its numbers for GPU measurements."""
    result = cli.invoke(app, ["tune", str(EXAMPLE), "--out", str(tmp_path), "--no-progress"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.stdout.split())
    assert ("Tuning on the simulated GPU pool (the manifest's triton backend needs GPUs; "
            "--backend triton to run it).") in " ".join(result.stderr.split())  # fmt: skip
    pool = "Measured on the simulated GPU pool (the performance model with measurement noise)"
    assert pool in said
    for name in ("report.md", "report.html"):
        assert pool in " ".join((tmp_path / name).read_text().split()), name

    # Replayed measurements are measurements: no such line.
    table = tmp_path / "table.csv"
    exported = cli.invoke(app, ["export-replay", str(tmp_path), "--out", str(table)])
    assert exported.exit_code == 0, exported.output
    replayed = cli.invoke(app, ["tune", str(EXAMPLE), "--out", str(tmp_path / "r"),
                                "--no-progress", "--backend", f"replay:{table}"])  # fmt: skip
    assert "simulated GPU pool" not in replayed.stdout
    assert pool not in (tmp_path / "r" / "report.md").read_text()


def test_one_trial_numbering_from_the_headline_to_report_json(
    tmp_path: Path, cli: CliRunner
) -> None:
    result = cli.invoke(app, ["tune", str(EXAMPLE), "--out", str(tmp_path), "--no-progress"])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "report.json").read_text())
    best = report["best"]
    measured = [t["number"] for t in report["trials"]
                if t["state"] == "complete" and t["config"] == best["config"]]  # fmt: skip
    first = re.search(r"the best first measured in trial (\d+)\)", result.stdout)
    assert first and int(first.group(1)) == measured[0]  # the number the tables show
    assert best["trial"] == measured[-1]
    # The tables' row of that number is the chosen configuration.
    row = next(line for line in (tmp_path / "report.md").read_text().splitlines()
               if line.startswith(f"| {measured[0]} | "))  # fmt: skip
    c = best["config"]
    assert f"TP{c['tp']} / bs{c['max_batch_size']} / {c['quantization']}" in row
    where = ", ".join(map(str, measured))
    trials = "trial" if len(measured) == 1 else "trials"
    for name in ("report.md", "report.html"):
        assert f"({trials} {where})" in (tmp_path / name).read_text(), name
