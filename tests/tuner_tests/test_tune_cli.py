"""`infertune tune`: exit codes, outputs, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from infertune_operator.cli import app

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llama2-70b-h100.yaml"


def test_readme_demo_writes_the_report(tmp_path: Path, cli: CliRunner) -> None:
    result = cli.invoke(app, ["tune", str(EXAMPLE), "--out", str(tmp_path), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "Best: TP" in result.output
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["best"]["config"]["quantization"] == "fp8"
    assert report["best"]["metrics"]["e2e_ms"]["p95"] <= 25600


def test_nothing_meets_the_slo_exits_3_with_nearest_misses(tmp_path: Path, cli: CliRunner) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["slo"] = {"e2eLatencyMs": {"p95": 300}}
    spec = tmp_path / "tight.yaml"
    spec.write_text(yaml.safe_dump(doc))
    result = cli.invoke(app, ["tune", str(spec), "--out", str(tmp_path / "o"), "--no-progress",
                              "--max-trials", "5"])  # fmt: skip
    assert result.exit_code == 3, result.output
    assert "nearest miss" in result.output
    assert (tmp_path / "o" / "report.html").exists()


def test_bad_input_exits_2(tmp_path: Path, cli: CliRunner) -> None:
    for args, message in (
        (["tune", str(tmp_path / "missing.yaml")], "no such file"),
        (["tune", str(EXAMPLE), "--backend", "gpu-cloud"], "unknown backend"),
        # The benchmark's world families are benchmark code (benchmarks/worlds), not a backend.
        (["tune", str(EXAMPLE), "--backend", "world:mixed"], "unknown backend"),
        (["tune", str(EXAMPLE), "--backend", f"replay:{tmp_path / 'none.csv'}"], "replay table"),
        (["tune", str(EXAMPLE), "--sampler", "bayes"], "--sampler"),
    ):
        result = cli.invoke(app, [*args, "--out", str(tmp_path / "x"), "--no-progress"])
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output
        assert "Traceback" not in result.output
