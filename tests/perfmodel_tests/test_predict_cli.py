"""`infertune predict | gpus | models`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from infertune_operator.cli import app

BASE = ["predict", "--model", "llama-2-70b", "--gpu", "H100-SXM-80GB", "--tp", "2",
        "--batch", "128", "--quant", "fp8", "--kv-dtype", "auto", "--isl", "1024", "--osl", "512"]  # fmt: skip


def test_json_has_the_contract_keys(cli: CliRunner) -> None:
    result = cli.invoke(app, [*BASE, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for key in ("fits", "weights_gib_per_gpu", "kv_cache_gib_per_gpu", "max_concurrent_sequences",
                "ttft_ms", "itl_ms", "e2e_ms", "output_tokens_per_s_per_gpu"):  # fmt: skip
        assert key in data
    assert data["fits"] is True and data["stack"] == "trtllm-1.2"
    # The published 767 tok/s/GPU was measured on TensorRT-LLM v0.5: predict it for that stack.
    old = json.loads(cli.invoke(app, [*BASE, "--stack", "trtllm-0.5", "--json"]).output)
    assert old["stack"] == "trtllm-0.5"
    assert 575 < old["output_tokens_per_s_per_gpu"] < 960  # published: 767
    assert data["output_tokens_per_s_per_gpu"] > old["output_tokens_per_s_per_gpu"]


def test_table_shows_memory_breakdown(cli: CliRunner) -> None:
    result = cli.invoke(app, BASE)
    assert result.exit_code == 0
    assert "weights / GPU" in result.output and "max concurrent sequences" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "gpt-17"], "unknown model"),
        (["--gpu", "RTX-9999"], "unknown GPU"),
        (["--quant", "int3"], "unknown quantization"),
        (["--gpu", "A100-SXM-80GB"], "does not support fp8"),
        (["--tp", "3"], "must divide"),
        (["--isl", "-1"], "must be positive"),
    ],
)
def test_bad_input_exits_2_with_a_message(cli: CliRunner, args: list[str], message: str) -> None:
    argv = list(BASE)
    for flag, value in zip(args[::2], args[1::2], strict=True):
        argv[argv.index(flag) + 1] = value
    result = cli.invoke(app, argv)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_unknown_stack_exits_2_with_the_known_ones(cli: CliRunner) -> None:
    result = cli.invoke(app, [*BASE, "--stack", "vllm-0.9"])
    assert result.exit_code == 2
    assert "unknown stack 'vllm-0.9'" in result.output and "trtllm-1.2" in result.output
    assert "Traceback" not in result.output


def test_catalog_listings(cli: CliRunner) -> None:
    gpus = json.loads(cli.invoke(app, ["gpus", "--json"]).output)
    assert len(gpus) == 11 and {g["key"] for g in gpus} >= {"T4-16GB", "B200-SXM-192GB"}
    models = json.loads(cli.invoke(app, ["models", "--json"]).output)
    assert any(m["key"] == "mixtral-8x7b" and m["experts"] == 8 for m in models)
    assert cli.invoke(app, ["gpus"]).exit_code == 0
    assert cli.invoke(app, ["models"]).exit_code == 0


def test_any_model_from_a_config_json(cli: CliRunner, tmp_path) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "num_hidden_layers": 24, "hidden_size": 2048, "num_attention_heads": 16,
        "num_key_value_heads": 4, "intermediate_size": 5632, "vocab_size": 32000,
    }))  # fmt: skip
    for ref in (folder, folder / "config.json"):
        result = cli.invoke(app, ["predict", "--model", str(ref), "--gpu", "L4-24GB", "--json"])
        assert result.exit_code == 0, result.output
        data = json.loads(result.output)
        assert data["model"] == "my-model" and data["fits"] is True
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    result = cli.invoke(app, ["predict", "--model", str(bad), "--gpu", "L4-24GB"])
    assert result.exit_code == 2 and "config.json" in result.output
