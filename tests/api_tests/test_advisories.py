"""Warnings for valid manifests that would fail on a cluster (api/advisories.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from infertune_operator.api.advisories import TOKEN_MISSING, advisories
from infertune_operator.api.manifest import validate_document
from infertune_operator.api.types import InferenceDeployment
from infertune_operator.cli import app


def deployment(model: dict[str, Any], backend: str | None = "triton", **search: Any) -> Any:
    doc = {
        "apiVersion": "infertune.io/v1alpha1", "kind": "InferenceDeployment",
        "metadata": {"name": "m"},
        "spec": {
            "model": model, "gpu": {"product": "H100-SXM-80GB"},
            "workload": {"inputTokens": 128, "outputTokens": 64},
            "slo": {"e2eLatencyMs": {"p95": 10000}},
            "search": {"quantization": ["bf16"], **search},
            "tuning": {"backend": backend} if backend else {},
        },
    }  # fmt: skip
    obj, problems = validate_document(doc)
    assert obj is not None, problems
    return obj


def reasons(obj: InferenceDeployment) -> list[str]:
    return [a.reason for a in advisories(obj)]


def test_a_gated_download_without_a_token_is_a_warning() -> None:
    hf = {"name": "llama-3-8b", "source": {"uri": "hf://meta-llama/Meta-Llama-3-8B"}}
    assert reasons(deployment(hf)) == [TOKEN_MISSING]
    [advice] = advisories(deployment(hf))
    assert "meta-llama/Meta-Llama-3-8B is gated" in advice.message
    token = {**hf, "source": {**hf["source"], "tokenSecretRef": {"name": "hf-token"}}}
    assert reasons(deployment(token)) == []


@pytest.mark.parametrize(
    ("model", "backend"),
    [
        ({"name": "llama-3-8b", "source": {"uri": "pvc://models/llama"}}, "triton"),  # mounted
        ({"name": "qwen2-7b"}, "triton"),  # Qwen's repositories are not gated
        ({"name": "llama-3-8b"}, "simulated"),  # nothing is downloaded
    ],
)
def test_nothing_to_warn_about(model: dict[str, Any], backend: str) -> None:
    assert reasons(deployment(model, backend)) == []


def test_the_catalogs_gated_id_without_a_source_says_what_to_add() -> None:
    # No source: the catalog's Hugging Face id (meta-llama/...) is downloaded; the operator's
    # default backend is triton.
    [advice] = advisories(deployment({"name": "llama-3-8b"}, backend=None))
    assert "spec.model.source: {uri: hf://meta-llama/" in advice.message


def test_a_checkpoint_is_checked_like_the_source() -> None:
    model = {"name": "llama-3-8b", "source": {"uri": "pvc://models/llama"},
             "checkpoints": {"fp8": "hf://meta-llama/Llama-3.1-8B-Instruct-FP8"}}  # fmt: skip
    assert reasons(deployment(model, quantization=["bf16", "fp8"])) == [TOKEN_MISSING]


def test_validate_prints_the_warning_and_still_passes(tmp_path: Path, cli: CliRunner) -> None:
    doc = deployment({"name": "llama-3-8b", "source": {"uri": "hf://meta-llama/Meta-Llama-3-8B"}})
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(doc.model_dump(mode="json", by_alias=True, exclude_none=True)))
    result = cli.invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "warning (TokenMissing): meta-llama/Meta-Llama-3-8B is gated" in result.stderr
