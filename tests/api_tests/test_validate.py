"""`infertune validate` and the API models: every problem named with its path, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infertune_operator.api.manifest import validate_document
from infertune_operator.cli import app

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))

GOOD = {
    "apiVersion": "infertune.io/v1alpha1",
    "kind": "InferenceDeployment",
    "metadata": {"name": "demo"},
    "spec": {
        "model": {"name": "llama-2-7b"},
        "gpu": {"product": "A10-24GB"},
        "workload": {"inputTokens": 512, "outputTokens": 128},
        "slo": {"e2eLatencyMs": {"p95": 10000}},
    },
}


def _write(tmp_path: Path, doc: object, name: str = "m.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc))
    return p


def test_stdlib_operator_is_not_shadowed() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import operator; print(operator.__file__)"],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "site-packages" not in out.stdout
    assert not out.stdout.strip().startswith(str(REPO))
    assert out.stdout.strip().endswith("operator.py")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate(path: Path, cli: CliRunner) -> None:
    result = cli.invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "valid InferenceDeployment" in result.output
    assert "warning" not in result.stderr  # e.g. a gated model must name its token


def test_one_run_names_every_bad_field(tmp_path: Path, cli: CliRunner) -> None:
    doc = yaml.safe_load(yaml.safe_dump(GOOD))
    doc["spec"]["workload"]["inputTokens"] = -5
    doc["spec"]["search"] = {"tensorParallel": [3], "maxBatchSize": [0], "quantization": ["fp9"]}
    result = cli.invoke(app, ["validate", str(_write(tmp_path, doc))])
    assert result.exit_code == 2
    for path in (
        "spec.workload.inputTokens",
        "spec.search.tensorParallel[0]",
        "spec.search.maxBatchSize[0]",
        "spec.search.quantization[0]",
    ):
        assert path in result.output, result.output
    assert "4 problems" in result.output
    assert "Traceback" not in result.output


def test_slo_needs_a_latency_bound() -> None:
    doc = yaml.safe_load(yaml.safe_dump(GOOD))
    doc["spec"]["slo"] = {"minOutputTokensPerSecondPerGpu": 100}
    obj, problems = validate_document(doc)
    assert obj is None
    assert any(p.path == "spec.slo" and "latency bound" in p.message for p in problems)


def test_unknown_field_and_wrong_kind_are_reported(tmp_path: Path, cli: CliRunner) -> None:
    doc = yaml.safe_load(yaml.safe_dump(GOOD))
    doc["kind"] = "Deployment"
    doc["spec"]["gpu"]["prodcut"] = "H100"
    result = cli.invoke(app, ["validate", str(_write(tmp_path, doc))])
    assert result.exit_code == 2
    assert "kind: must be InferenceDeployment" in result.output
    assert "spec.gpu.prodcut: unknown field" in result.output


def test_unknown_catalog_entries_are_problems() -> None:
    doc = yaml.safe_load(yaml.safe_dump(GOOD))
    doc["spec"]["gpu"]["product"] = "RTX-9999"
    doc["spec"]["model"]["name"] = "gpt-17"
    obj, problems = validate_document(doc)
    assert obj is None
    paths = {p.path for p in problems}
    assert {"spec.gpu.product", "spec.model.name"} <= paths


def test_architecture_override_allows_unknown_model() -> None:
    doc = yaml.safe_load(yaml.safe_dump(GOOD))
    doc["spec"]["model"] = {
        "name": "my-model",
        "architecture": {"layers": 24, "hiddenSize": 2048, "heads": 16, "kvHeads": 4,
                         "ffnSize": 5632, "vocabSize": 32000},
    }  # fmt: skip
    obj, problems = validate_document(doc)
    assert problems == [] and obj is not None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("spec: [unclosed", "not valid YAML"),
        ("- a\n- b\n", "not a mapping"),
    ],
)
def test_unreadable_files_get_one_line_errors(
    tmp_path: Path, cli: CliRunner, content: str | None, message: str
) -> None:
    p = tmp_path / "x.yaml"
    if content is not None:
        p.write_text(content)
    result = cli.invoke(app, ["validate", str(p)])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_json_manifest(tmp_path: Path, cli: CliRunner) -> None:
    import json

    p = tmp_path / "m.json"
    p.write_text(json.dumps(GOOD))
    assert cli.invoke(app, ["validate", str(p)]).exit_code == 0


def test_defaults_fill_the_search_space() -> None:
    obj, _ = validate_document(GOOD)
    assert obj is not None
    s = obj.spec.search
    assert s.tensor_parallel == [1, 2, 4, 8] and s.max_accuracy_loss_percent == 1.0
    assert obj.spec.tuning.effective_max_trials() == 40
    assert obj.spec.tuning.effective_backend() == "triton"


def test_duplicate_values_and_tp_beyond_gpu_budget() -> None:
    doc = yaml.safe_load(yaml.safe_dump(GOOD))
    doc["spec"]["gpu"]["maxGpusPerReplica"] = 1
    doc["spec"]["search"] = {"tensorParallel": [2, 4], "maxBatchSize": [8, 8]}
    obj, problems = validate_document(doc)
    assert obj is None
    text = " ".join(str(p) for p in problems)
    assert "listed twice" in text or "exceeds gpu.maxGpusPerReplica" in text
