"""`infertune validate` reports catalog problems together with schema problems, in one run."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from infertune_operator.api.manifest import validate_document
from infertune_operator.cli import app

REPO = Path(__file__).resolve().parents[2]


def _doc() -> dict:  # type: ignore[type-arg]
    doc = yaml.safe_load((REPO / "examples" / "llama2-70b-h100.yaml").read_text())
    doc["spec"]["gpu"]["product"] = "RTX-9999"  # catalog: unknown GPU
    doc["spec"]["workload"]["inputTokens"] = 0  # schema: must be >= 1
    return doc  # type: ignore[no-any-return]


def test_catalog_and_schema_problems_come_in_one_list() -> None:
    obj, problems = validate_document(_doc())
    assert obj is None
    paths = [p.path for p in problems]
    assert "spec.workload.inputTokens" in paths and "spec.gpu.product" in paths


def test_the_cli_lists_both(tmp_path: Path, cli: CliRunner) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_doc()))
    result = cli.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert "2 problems" in result.stderr
    assert "spec.gpu.product: unknown GPU" in result.stderr
    assert "spec.workload.inputTokens" in result.stderr


def test_a_field_the_schema_rejects_is_not_looked_up_in_the_catalog() -> None:
    doc = _doc()
    doc["spec"]["gpu"]["product"] = 17  # not a string: the schema's problem, not the catalog's
    _, problems = validate_document(doc)
    assert [p.path for p in problems].count("spec.gpu.product") == 1


def test_validate_and_tune_refuse_a_space_where_nothing_fits_in_the_same_words(
    tmp_path: Path, cli: CliRunner
) -> None:
    doc = yaml.safe_load((REPO / "examples" / "llama2-70b-h100.yaml").read_text())
    doc["spec"]["search"]["tensorParallel"] = [1]  # 70B in fp16 on one 80 GB GPU: never fits
    doc["spec"]["search"]["quantization"] = ["fp16"]
    path = tmp_path / "tp1.yaml"
    path.write_text(yaml.safe_dump(doc))
    validated = cli.invoke(app, ["validate", str(path)])
    tuned = cli.invoke(app, ["tune", str(path), "--out", str(tmp_path / "out")])
    assert validated.exit_code == tuned.exit_code == 2
    problem = "spec.search: no configuration fits in H100-SXM-80GB memory"
    assert problem in validated.stderr and problem in tuned.stderr
    assert "allow a larger tensorParallel" in tuned.stderr
    assert "maxGpusPerReplica" not in tuned.stderr  # already 8: not the advice
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_a_report_where_nothing_fits_advises_what_limits_the_gpus(tmp_path: Path) -> None:
    from infertune_operator.api.to_request import to_request
    from infertune_tuner.report.view import headline
    from infertune_tuner.run import tune

    doc = yaml.safe_load((REPO / "examples" / "llama2-70b-h100.yaml").read_text())
    doc["spec"]["search"].update(tensorParallel=[1], quantization=["fp16"])
    obj, problems = validate_document(doc)
    assert obj is not None, problems
    report = tune(to_request(obj), backend="simulated", out_dir=tmp_path / "study")
    assert report.best is None and report.executed_trials == 0
    advice = str(headline(report).next_step)
    assert "a larger tensorParallel (spec.search.tensorParallel)" in advice
    doc["spec"]["gpu"]["maxGpusPerReplica"] = 1  # now the replica's limit is what limits
    obj, _ = validate_document(doc)
    assert obj is not None
    report = tune(to_request(obj), backend="simulated", out_dir=tmp_path / "study2")
    assert "more GPUs per replica (spec.gpu.maxGpusPerReplica)" in str(headline(report).next_step)
