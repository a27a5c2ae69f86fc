"""The Triton runtime's files and launch against the upstream contract they must meet.

Upstream files (NVIDIA/TensorRT-LLM), transcribed here only as far as the test needs them:

- triton_backend/all_models/llmapi/tensorrt_llm/1/model.yaml: top-level keys `model`, `backend`,
  `tensor_parallel_size`, `pipeline_parallel_size`, `triton_config` {`max_batch_size`,
  `decoupled`}; every key but `triton_config` goes to `tensorrt_llm.LLM()` (model.py:
  `update_llm_args_with_extra_dict(..., exclude_keys=["triton_config"])`).
- tensorrt_llm/llmapi/llm_args.py: the LLM() arguments we add: `dtype` (str, "auto"),
  `max_batch_size`, `max_num_tokens`, `kv_cache_config` (KvCacheConfig: `free_gpu_memory_fraction`,
  `dtype` "auto" = follow the checkpoint), `cuda_graph_config` (CudaGraphConfig, a StrictBaseModel,
  extra="forbid": `batch_sizes`, `max_batch_size`, `enable_padding`), `stream_interval` (int).
- triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt: inputs and outputs.
- triton_backend/scripts/launch_triton_server.py: the launcher's options (transcribed into
  `LAUNCHER_OPTIONS`), and `get_cmd`'s rule that `--no-mpi` needs world size 1.
- tests/integration/defs/triton_server/test_triton_llmapi.py: the launch upstream tests for the
  LLM-API model, `--world_size=TP` plus `--no-mpi` at TP 1, `--trtllm_llmapi_launch
  --oversubscribe` at TP 4.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from infertune_tuner.config import TrialConfig
from infertune_tuner.request import TuningRequest
from infertune_tuner.runtime import Ports, TritonRuntime
from infertune_tuner.runtime.triton import MODEL_YAML_KEYS, config_pbtxt
from infertune_tuner.runtime.weights import (
    MissingCheckpoint,
    checkpoint_kv_dtype,
    checkpoint_uri,
    default_model_id,
    kv_dtype_from_quant_config,
    model_path_for,
    uri_problem,
)

UPSTREAM_MODEL_YAML = {"model", "backend", "tensor_parallel_size", "pipeline_parallel_size",
                       "triton_config"}  # fmt: skip
LLM_ARGS_ADDED = {"dtype", "max_batch_size", "max_num_tokens", "kv_cache_config",
                  "cuda_graph_config", "stream_interval"}  # fmt: skip
KV_CACHE_CONFIG_FIELDS = {"free_gpu_memory_fraction", "dtype"}  # a subset of KvCacheConfig's
CUDA_GRAPH_CONFIG_FIELDS = {"batch_sizes", "max_batch_size", "enable_padding"}  # all of them
# llm_args.py: "dtype: The data type to use for the model" -- torch dtype names (or "auto").
LLM_DTYPES = {"auto", "float16", "bfloat16", "float32"}
# Upstream's config.pbtxt: (name, data type, dims) of the inputs infertune renders.
UPSTREAM_INPUTS = {
    "text_input": ("TYPE_STRING", [-1], False),
    "streaming": ("TYPE_BOOL", [1], True),
    "sampling_param_max_tokens": ("TYPE_INT32", [1], True),
    "sampling_param_temperature": ("TYPE_FP32", [1], True),
    "sampling_param_exclude_input_from_output": ("TYPE_BOOL", [1], True),
    "sampling_param_seed": ("TYPE_UINT64", [1], True),
    "return_finish_reason": ("TYPE_BOOL", [1], True),
}


def launcher_parser() -> argparse.ArgumentParser:
    """The options of launch_triton_server.py's parse_arguments() that infertune passes."""
    p = argparse.ArgumentParser(exit_on_error=False)
    p.add_argument("--world_size", type=int, default=1)
    p.add_argument("--grpc_port", type=str, default="8001")
    p.add_argument("--http_port", type=str, default="8000")
    p.add_argument("--metrics_port", type=str, default="8002")
    p.add_argument("--no-mpi", action="store_true", default=False)
    p.add_argument("--model_repo", type=str)
    p.add_argument("--tensorrt_llm_model_name", type=str, default="tensorrt_llm")
    p.add_argument("--oversubscribe", action="store_true")
    p.add_argument("--trtllm_llmapi_launch", action="store_true", default=False)
    p.add_argument("--force", "-f", action="store_true")
    return p


def request(**model: object) -> TuningRequest:
    return TuningRequest.model_validate({
        "name": "t", "model": {"name": "llama-2-70b", **model},
        "gpu": {"product": "H100-SXM-80GB"}, "workload": {"input_tokens": 1024, "output_tokens": 512},
        "slo": [{"metric": "e2e_ms", "percentile": "p95", "max_ms": 25600}],
    })  # fmt: skip


def model_yaml(config: TrialConfig, req: TuningRequest | None = None) -> dict[str, object]:
    files = TritonRuntime().model_files(req or request(), config)
    assert set(files) == {"llm/config.pbtxt", "llm/1/model.yaml"}
    doc = yaml.safe_load(files["llm/1/model.yaml"])
    assert isinstance(doc, dict)
    return doc


def test_model_yaml_has_upstreams_keys_and_only_llm_arguments_besides() -> None:
    doc = model_yaml(TrialConfig(4, 128, "fp8", "fp8"), request(checkpoints={"fp8": "hf://a/b"}))
    assert set(doc) == set(MODEL_YAML_KEYS) == UPSTREAM_MODEL_YAML | LLM_ARGS_ADDED
    assert (doc["backend"], doc["tensor_parallel_size"], doc["pipeline_parallel_size"]) == (
        "pytorch", 4, 1,
    )  # fmt: skip
    assert doc["model"] == "/model-cache/weights/a/b"  # downloaded there before the server starts
    assert (doc["max_batch_size"], doc["max_num_tokens"]) == (128, 8192)
    kv = doc["kv_cache_config"]
    assert isinstance(kv, dict) and set(kv) <= KV_CACHE_CONFIG_FIELDS
    assert kv == {"free_gpu_memory_fraction": 0.9, "dtype": "fp8"}
    # model.py reads triton_config["decoupled"] and ["max_batch_size"]; 0 = no Triton batching
    assert doc["triton_config"] == {"max_batch_size": 0, "decoupled": True}
    assert doc["stream_interval"] == 1  # one streamed response per token: how tokens are counted


def test_bf16_and_fp16_are_different_servers() -> None:
    """Item 2: the weight dtype is rendered, so the two never measure one server twice."""
    bf16 = model_yaml(TrialConfig(2, 64, "bf16", "auto"))
    fp16 = model_yaml(TrialConfig(2, 64, "fp16", "auto"))
    assert (bf16["dtype"], fp16["dtype"]) == ("bfloat16", "float16")
    assert {k: v for k, v in bf16.items() if k != "dtype"} == {
        k: v for k, v in fp16.items() if k != "dtype"
    }
    quantized = model_yaml(TrialConfig(2, 64, "fp8", "auto"), request(checkpoints={"fp8": "x/y"}))
    assert quantized["dtype"] == "auto"  # a ModelOpt checkpoint keeps its own 16-bit layers
    assert {bf16["dtype"], fp16["dtype"], quantized["dtype"]} <= LLM_DTYPES


@pytest.mark.parametrize("batch", [1, 48, 96, 128, 192, 256])
def test_cuda_graphs_are_captured_up_to_the_trials_max_batch(batch: int) -> None:
    """Item 3. Upstream (llm_args.py, CudaGraphConfig._generate_cuda_graph_batch_sizes) captures,
    without padding and by default (max_batch_size 128), only 1..31, 32, 64, 128: 48, 96, 192
    and 256 would run eagerly. With enable_padding a batch rounds up to a captured size, and the
    config's max_batch_size is always among them."""
    graphs = model_yaml(TrialConfig(1, batch, "bf16", "auto"))["cuda_graph_config"]
    assert isinstance(graphs, dict) and set(graphs) <= CUDA_GRAPH_CONFIG_FIELDS
    assert graphs == {"enable_padding": True, "max_batch_size": batch}


def test_config_pbtxt_parses_and_declares_upstreams_inputs() -> None:
    cfg = text_format.Parse(config_pbtxt("llm"), mc.ModelConfig())
    assert cfg.name == "llm" and cfg.backend == "python"
    assert cfg.max_batch_size == 0
    assert cfg.model_transaction_policy.decoupled  # streaming needs decoupled mode
    inputs = {i.name: i for i in cfg.input}
    for name, (dtype, dims, optional) in UPSTREAM_INPUTS.items():
        i = inputs[name]
        assert (mc.DataType.Name(i.data_type), list(i.dims), i.optional) == (dtype, dims, optional)
    assert "text_output" in {o.name for o in cfg.output}
    assert cfg.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_launch_is_upstreams_llmapi_launch(tp: int) -> None:
    """Item 1: one TP-wide LLM, never one per rank. Upstream's LLM-API test launches
    `--world_size=TP` with `--no-mpi` at TP 1 and `--trtllm_llmapi_launch --oversubscribe` at
    TP 4 (only rank 0 runs tritonserver under trtllm-llmapi-launch; the others are the LLM API's
    MPI workers). A plain `--world_size=TP` under mpirun would start TP tritonservers, each of
    which builds its own TP-wide LLM (model.py clears the MPI job environment)."""
    argv = TritonRuntime().launch_argv(
        request(), TrialConfig(tp, 8, "bf16", "auto"), repo_dir="/repo", ports=Ports(1, 2, 3)
    )
    assert argv[:2] == ["python3", "/app/scripts/launch_triton_server.py"]
    a = launcher_parser().parse_args(argv[2:])  # every option is one the launcher defines
    assert a.world_size == tp
    if tp == 1:
        assert a.no_mpi and not a.trtllm_llmapi_launch  # get_cmd: no-mpi needs world size 1
    else:
        assert a.trtllm_llmapi_launch and a.oversubscribe and not a.no_mpi
    assert (a.model_repo, a.tensorrt_llm_model_name) == ("/repo", "llm")
    assert (a.grpc_port, a.http_port, a.metrics_port) == ("1", "2", "3")
    # Upstream's __main__ refuses to launch while any tritonserver is running (`pgrep -r R
    # tritonserver`) unless --force: side-by-side trials in one tuner pod each run their own.
    assert a.force


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
        ("nvidia/Llama-3.1-8B-Instruct-FP8", "nvidia/Llama-3.1-8B-Instruct-FP8"),
    ],
)
def test_model_path_for(uri: str, path: str) -> None:
    assert model_path_for(uri) == path


@pytest.mark.parametrize("uri", ["s3://bucket/llama", "gs://bucket/llama", "https://x/y", "llama"])
def test_a_source_the_runtime_cannot_open_is_never_rendered(uri: str) -> None:
    # TensorRT-LLM's LLM API treats any string that is not a directory as a Hugging Face id
    # (NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/utils.py, download_hf_model): s3:// would be sent
    # to the Hub. infertune refuses it instead of rendering a model.yaml that cannot load.
    assert uri_problem(uri) is not None
    with pytest.raises(ValueError, match="pvc://"):
        model_path_for(uri)


def test_default_model_id() -> None:
    assert default_model_id("meta-llama/Llama-2-7b-hf", ("x/y",)) == "meta-llama/Llama-2-7b-hf"
    assert (
        default_model_id("llama-2-7b", ("meta-llama/Llama-2-7b-hf",)) == "meta-llama/Llama-2-7b-hf"
    )
    assert default_model_id("custom") == "custom"


# ModelOpt's unified Hugging Face export, as TensorRT-LLM reads it
# (NVIDIA/TensorRT-LLM tensorrt_llm/_torch/model_config.py, load_modelopt_quant_config:
# quant_config_dict["quantization"]["quant_algo"] and ["kv_cache_quant_algo"]).
FP8_WITH_FP8_KV = {
    "producer": {"name": "modelopt", "version": "0.29.0"},
    "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"},
}


def test_hf_quant_config_declares_the_kv_cache_dtype(tmp_path: Path) -> None:
    assert kv_dtype_from_quant_config(FP8_WITH_FP8_KV) == "fp8"
    assert kv_dtype_from_quant_config({"quantization": {"quant_algo": "FP8"}}) is None
    assert kv_dtype_from_quant_config({"quantization": {"kv_cache_quant_algo": None}}) is None
    assert kv_dtype_from_quant_config({}) is None
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(FP8_WITH_FP8_KV))
    assert checkpoint_kv_dtype(str(tmp_path)) == "fp8"
    assert checkpoint_kv_dtype(str(tmp_path / "missing")) is None
