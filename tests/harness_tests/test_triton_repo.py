"""Rendering of the Triton model repository for TensorRT-LLM's LLM-API model (pure)."""

from __future__ import annotations

import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from infertune_tuner.config import TrialConfig
from infertune_tuner.harness.triton_repo import (
    MissingCheckpoint,
    checkpoint_uri,
    config_pbtxt,
    default_model_id,
    launcher_command,
    model_path_for,
    render_model_repository,
)

# The keys of NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/1/model.yaml:
# `model`, `backend`, `tensor_parallel_size`, `pipeline_parallel_size` (LLM() arguments) and
# `triton_config` {`max_batch_size`, `decoupled`} (read by that directory's model.py); plus the
# LLM() arguments a tuned configuration sets.
UPSTREAM_KEYS = {
    "model",
    "backend",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "triton_config",
}
TUNED_KEYS = {"max_batch_size", "max_num_tokens", "kv_cache_config"}

CFG = TrialConfig(4, 128, "fp8", "fp8")


def test_model_yaml_loads_with_the_keys_the_llmapi_model_reads() -> None:
    files = render_model_repository(CFG, "/models/llama-fp8")
    assert set(files) == {"llm/config.pbtxt", "llm/1/model.yaml"}
    doc = yaml.safe_load(files["llm/1/model.yaml"])
    assert set(doc) == UPSTREAM_KEYS | TUNED_KEYS
    assert doc["model"] == "/models/llama-fp8"
    assert doc["backend"] == "pytorch"
    assert doc["tensor_parallel_size"] == 4
    assert doc["pipeline_parallel_size"] == 1
    assert doc["max_batch_size"] == 128
    assert doc["max_num_tokens"] == 8192
    assert doc["kv_cache_config"] == {"free_gpu_memory_fraction": 0.9, "dtype": "fp8"}
    # model.py reads triton_config["decoupled"] and ["max_batch_size"]; 0 = no Triton batching
    assert doc["triton_config"] == {"max_batch_size": 0, "decoupled": True}


def test_config_pbtxt_parses_as_a_triton_model_config() -> None:
    cfg = text_format.Parse(config_pbtxt("llm"), mc.ModelConfig())
    assert cfg.name == "llm" and cfg.backend == "python"
    assert cfg.max_batch_size == 0
    assert cfg.model_transaction_policy.decoupled
    inputs = {i.name: i for i in cfg.input}
    assert not inputs["text_input"].optional
    assert inputs["text_input"].data_type == mc.TYPE_STRING
    assert inputs["sampling_param_max_tokens"].data_type == mc.TYPE_INT32
    assert inputs["streaming"].optional
    assert "text_output" in {o.name for o in cfg.output}
    assert cfg.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU


def test_checkpoint_choice() -> None:
    ck = {"fp8": "hf://org/llama-fp8"}
    assert checkpoint_uri("fp8", ck, "hf://org/llama", "x") == "hf://org/llama-fp8"
    assert checkpoint_uri("bf16", ck, "hf://org/llama", "x") == "hf://org/llama"
    assert checkpoint_uri("fp16", {}, None, "org/fallback") == "org/fallback"
    with pytest.raises(MissingCheckpoint, match=r"checkpoints\.w4a16_awq"):
        checkpoint_uri("w4a16_awq", ck, "hf://org/llama", "x")


@pytest.mark.parametrize(
    ("uri", "path"),
    [
        ("pvc://models/llama/70b", "/models/llama/70b"),
        ("pvc://models", "/models"),
        ("hf://meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-70b-hf"),
        ("file:///data/llama", "/data/llama"),
        ("s3://bucket/llama", "s3://bucket/llama"),
    ],
)
def test_model_path_for(uri: str, path: str) -> None:
    assert model_path_for(uri) == path


def test_default_model_id() -> None:
    assert default_model_id("meta-llama/Llama-2-7b-hf", ("x/y",)) == "meta-llama/Llama-2-7b-hf"
    assert (
        default_model_id("llama-2-7b", ("meta-llama/Llama-2-7b-hf",)) == "meta-llama/Llama-2-7b-hf"
    )
    assert default_model_id("custom") == "custom"


def test_launcher_command() -> None:
    cmd = launcher_command(8, "/repo", grpc_port=1, http_port=2, metrics_port=3)
    assert cmd[:3] == ["python3", "/app/scripts/launch_triton_server.py", "--world_size=8"]
    assert "--model_repo=/repo" in cmd and "--tensorrt_llm_model_name=llm" in cmd
    assert {"--grpc_port=1", "--http_port=2", "--metrics_port=3"} <= set(cmd)
