"""The model's maximum context bounds input + output: catalog, config.json, predict, space, validate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infertune_operator.api.manifest import validate_document
from infertune_operator.cli import app
from infertune_tuner.catalog.gpus import get_gpu
from infertune_tuner.catalog.llms import MODELS, get_model, model_from_hf_config
from infertune_tuner.config import TrialConfig, Workload
from infertune_tuner.errors import InputError
from infertune_tuner.perfmodel import predict
from infertune_tuner.request import TuningRequest
from infertune_tuner.space import build_space

# max_position_embeddings of the models' Hugging Face config.json files.
PUBLISHED_CONTEXT = {
    "llama-2-70b": 4096, "llama-3-8b": 8192, "llama-3.1-8b": 131072, "llama-3.1-70b": 131072,
    "llama-3.1-405b": 131072, "mistral-7b": 32768, "qwen3-30b-a3b": 40960, "qwen3-8b": 40960,
    "qwen3-14b": 40960, "qwen3-32b": 40960, "qwen2.5-7b": 32768, "qwen2.5-32b": 32768,
    "qwen2.5-72b": 32768, "mistral-small-24b": 32768, "gemma-3-27b": 131072,
}  # fmt: skip

# Qwen/Qwen3-30B-A3B config.json (the fields infertune reads).
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "head_dim": 128,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_attention_heads": 32,
    "num_key_value_heads": 4, "num_hidden_layers": 48, "num_experts": 128,
    "num_experts_per_tok": 8, "max_position_embeddings": 40960, "vocab_size": 151936,
}  # fmt: skip


def test_every_catalog_model_knows_its_context() -> None:
    assert all(m.max_context for m in MODELS.values())
    for key, ctx in PUBLISHED_CONTEXT.items():
        assert get_model(key).max_context == ctx
    # Llama 3.3 70B is Llama 3.1 70B's shape with its 128K context, not Llama 3's 8K.
    assert get_model("meta-llama/Llama-3.3-70B-Instruct").max_context == 131072


def test_config_json_gives_context_head_dim_and_expert_width() -> None:
    arch, ref = model_from_hf_config(QWEN3_30B_A3B, key="qwen3"), get_model("qwen3-30b-a3b")
    fields = ("layers", "hidden_size", "heads", "kv_heads", "ffn_size", "vocab_size", "experts",
              "experts_active", "max_context", "head_dim")  # fmt: skip
    assert {f: getattr(arch, f) for f in fields} == {f: getattr(ref, f) for f in fields}
    assert arch.params == pytest.approx(30.5e9, rel=0.01)
    assert arch.active_params == pytest.approx(3.3e9, rel=0.03)
    no_ctx = {k: v for k, v in QWEN3_30B_A3B.items() if k != "max_position_embeddings"}
    assert model_from_hf_config(no_ctx).max_context is None  # unknown: never checked


def test_predict_says_why_a_too_long_request_does_not_fit() -> None:
    m, g = get_model("llama-3-8b"), get_gpu("H100-SXM-80GB")
    p = predict(m, g, TrialConfig(1, 8, "fp8", "auto"), Workload(8000, 1000))
    assert not p.fits
    assert p.memory.reason == (
        "8000 input + 1000 output = 9000 tokens exceed llama-3-8b's maximum context of 8192 "
        "tokens (max_position_embeddings)"
    )
    assert predict(m, g, TrialConfig(1, 8, "fp8", "auto"), Workload(7000, 1000)).fits


def test_predict_cli_prints_the_reason(cli: CliRunner) -> None:
    argv = ["predict", "--model", "llama-2-7b", "--gpu", "A10-24GB", "--isl", "4000",
            "--osl", "200"]  # fmt: skip
    table = cli.invoke(app, argv)
    assert table.exit_code == 0, table.output
    assert "NO:" in table.output and "maximum context of 4096" in table.output
    data = json.loads(cli.invoke(app, [*argv, "--json"]).output)
    assert data["fits"] is False and data["max_context"] == 4096
    assert "4200 tokens exceed" in data["reason"]


def _request(model: str, isl: int, osl: int) -> TuningRequest:
    return TuningRequest.model_validate({
        "name": "ctx", "model": {"name": model}, "gpu": {"product": "H100-SXM-80GB"},
        "workload": {"input_tokens": isl, "output_tokens": osl},
        "slo": [{"metric": "e2e_ms", "percentile": "p95", "max_ms": 60000}],
    })  # fmt: skip


def test_space_excludes_requests_beyond_the_context() -> None:
    ok = _request("llama-2-70b", 3000, 1000)
    assert len(build_space(ok, ok.resolve_model(), ok.resolve_gpu())) > 0
    long = _request("llama-2-70b", 3500, 1000)
    with pytest.raises(InputError, match=r"workload=3500\+1000: .*maximum context of 4096"):
        build_space(long, long.resolve_model(), long.resolve_gpu())


def test_tune_cli_stops_with_the_reason(tmp_path: Path, cli: CliRunner) -> None:
    manifest = _manifest("llama-2-7b", 4000, 500)
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(manifest))
    for argv in (["validate", str(path)], ["tune", str(path), "--out", str(tmp_path / "out")]):
        result = cli.invoke(app, argv)
        assert result.exit_code == 2, result.output
        assert "spec.workload" in result.output and "maximum context of 4096" in result.output
        assert "Traceback" not in result.output


def _manifest(model: str, isl: int, osl: int) -> dict[str, object]:
    return {
        "apiVersion": "infertune.io/v1alpha1", "kind": "InferenceDeployment",
        "metadata": {"name": "demo"},
        "spec": {"model": {"name": model}, "gpu": {"product": "A10-24GB"},
                 "workload": {"inputTokens": isl, "outputTokens": osl},
                 "slo": {"e2eLatencyMs": {"p95": 10000}}},
    }  # fmt: skip


def test_validate_accepts_a_request_that_fits_the_context() -> None:
    obj, problems = validate_document(_manifest("llama-2-7b", 3000, 1096))
    assert obj is not None and problems == []
    obj, problems = validate_document(_manifest("llama-2-7b", 3000, 1097))
    assert obj is None
    assert [p.path for p in problems] == ["spec.workload"]
