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
