"""Render the Triton model repository for TensorRT-LLM's LLM-API model (pure: dicts and strings).

Mirrors `triton_backend/all_models/llmapi/tensorrt_llm` of NVIDIA/TensorRT-LLM (the Triton image
ships it; 26.07 carries TensorRT-LLM 1.2.1):

    <repo>/<served>/config.pbtxt     backend "python", decoupled, the model's inputs and outputs
    <repo>/<served>/1/model.yaml     LLM() arguments + `triton_config`
    <repo>/<served>/1/model.py       copied from the image (with helpers.py), not rendered here

model.yaml keys (each maps to a `tensorrt_llm.LLM()` argument, except `triton_config`, which the
Triton model reads itself): `model`, `backend`, `tensor_parallel_size`,
`pipeline_parallel_size`, `max_batch_size`, `max_num_tokens`, `kv_cache_config`
{`free_gpu_memory_fraction`, `dtype`}, `triton_config` {`max_batch_size`, `decoupled`}.

Two deliberate choices:

- `triton_config.max_batch_size` is 0, as upstream ships it: the LLM-API model takes one prompt
  per request (a 1-D `text_input`) and batches in flight inside the engine, whose own limit is the
  top-level `max_batch_size`. A Triton-level batch size > 0 would add a batch dimension the model
  rejects.
- config.pbtxt also states `max_batch_size: 0` and the decoupled transaction policy, although
  upstream leaves them to model.yaml: `launch_triton_server.py` starts tritonserver with
  `--disable-auto-complete-config`, so the model's `auto_complete_config` (which copies
  `triton_config` into the Triton config) never runs, and streaming needs decoupled mode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from infertune_tuner.config import TrialConfig
from infertune_tuner.perfmodel.memory import DEFAULT_MAX_NUM_TOKENS, FREE_GPU_MEMORY_FRACTION

SERVED_MODEL = "llm"
MODELS_ROOT = "/models"
LLMAPI_MODEL_DIR = "/app/all_models/llmapi/tensorrt_llm/1"
LAUNCHER = "/app/scripts/launch_triton_server.py"
SIXTEEN_BIT = frozenset({"bf16", "fp16"})

# The keys the TRT-LLM LLM-API Triton model (model.py) and LLM() read from model.yaml.
MODEL_YAML_KEYS = (
    "model", "backend", "tensor_parallel_size", "pipeline_parallel_size", "max_batch_size",
    "max_num_tokens", "kv_cache_config", "triton_config",
)  # fmt: skip

# (name, data type, dims, optional) as in the upstream config.pbtxt.
LLMAPI_INPUTS: tuple[tuple[str, str, str, bool], ...] = (
    ("text_input", "TYPE_STRING", "-1", False),
    ("streaming", "TYPE_BOOL", "1", True),
    ("sampling_param_best_of", "TYPE_INT32", "1", True),
    ("sampling_param_temperature", "TYPE_FP32", "1", True),
    ("sampling_param_top_k", "TYPE_INT32", "1", True),
    ("sampling_param_top_p", "TYPE_FP32", "1", True),
    ("sampling_param_frequency_penalty", "TYPE_FP32", "1", True),
    ("sampling_param_presence_penalty", "TYPE_FP32", "1", True),
    ("sampling_param_max_tokens", "TYPE_INT32", "1", True),
    ("sampling_param_stop", "TYPE_STRING", "-1", True),
    ("sampling_param_seed", "TYPE_UINT64", "1", True),
    ("sampling_param_exclude_input_from_output", "TYPE_BOOL", "1", True),
    ("sampling_param_return_perf_metrics", "TYPE_BOOL", "1", True),
    ("return_finish_reason", "TYPE_BOOL", "1", True),
    ("return_stop_reason", "TYPE_BOOL", "1", True),
    ("return_cumulative_logprob", "TYPE_BOOL", "1", True),
)
LLMAPI_OUTPUTS: tuple[tuple[str, str, str], ...] = (
    ("text_output", "TYPE_STRING", "-1"),
    ("finish_reason", "TYPE_STRING", "-1"),
    ("stop_reason", "TYPE_STRING", "-1"),
    ("cumulative_logprob", "TYPE_FP32", "-1"),
)


class MissingCheckpoint(ValueError):
    """A quantized configuration needs a pre-quantized checkpoint the request does not name."""


def checkpoint_uri(
    quantization: str, checkpoints: Mapping[str, str], base_uri: str | None, fallback: str
) -> str:
    """The weights a configuration loads: the checkpoint for its quantization; the base model for
    16-bit; `fallback` (a Hugging Face id) when no base URI is given."""
    if quantization in checkpoints:
        return checkpoints[quantization]
    if quantization in SIXTEEN_BIT:
        return base_uri or fallback
    raise MissingCheckpoint(
        f"{quantization} needs a pre-quantized (ModelOpt) checkpoint, and none is given: set "
        f"spec.model.checkpoints.{quantization} (TensorRT-LLM's PyTorch backend does not "
        "quantize at load time)"
    )


def default_model_id(name: str, hf_ids: Sequence[str] = ()) -> str:
    """The Hugging Face id to load when no URI is given: the name itself when it is one (has a
    slash), else the catalog entry's first id, else the name."""
    if "/" in name:
        return name.removeprefix("hf://")
    return hf_ids[0] if hf_ids else name


def split_pvc(uri: str) -> tuple[str, str] | None:
    """`pvc://claim/some/path` -> ("claim", "some/path"); None for other schemes."""
    if not uri.startswith("pvc://"):
        return None
    claim, _, path = uri.removeprefix("pvc://").partition("/")
    return claim, path.strip("/")


def model_path_for(uri: str, models_root: str = MODELS_ROOT) -> str:
    """What model.yaml's `model` holds for a URI: a local path or a Hugging Face id.

    pvc://claim/path -> <models_root>/path (the claim is mounted there); hf://org/name ->
    org/name; file:///abs -> /abs; anything else (s3://, gs://, a bare id or path) unchanged,
    for a loader or init step that understands it.
    """
    pvc = split_pvc(uri)
    if pvc is not None:
        return f"{models_root.rstrip('/')}/{pvc[1]}" if pvc[1] else models_root
    if uri.startswith("hf://"):
        return uri.removeprefix("hf://")
    if uri.startswith("file://"):
        return uri.removeprefix("file://")
    return uri


def model_yaml(
    config: TrialConfig,
    model: str,
    *,
    max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS,
    free_gpu_memory_fraction: float = FREE_GPU_MEMORY_FRACTION,
) -> dict[str, Any]:
    """model.yaml as a dict (`model` is a path or Hugging Face id, see `model_path_for`)."""
    return {
        "model": model,
        "backend": "pytorch",
        "tensor_parallel_size": config.tp,
        "pipeline_parallel_size": 1,
        "max_batch_size": config.max_batch_size,
        "max_num_tokens": max_num_tokens,
        "kv_cache_config": {
            "free_gpu_memory_fraction": free_gpu_memory_fraction,
            "dtype": config.kv_cache_dtype,
        },
        "triton_config": {"max_batch_size": 0, "decoupled": True},
    }


def model_yaml_text(config: TrialConfig, model: str, **kwargs: Any) -> str:
    header = f"# Rendered by infertune for {config.label()}\n"
    return header + yaml.safe_dump(model_yaml(config, model, **kwargs), sort_keys=False)


def config_pbtxt(served_model: str = SERVED_MODEL) -> str:
    def block(fields: list[str]) -> str:
        return "  {\n" + "\n".join(f"    {f}" for f in fields) + "\n  }"

    inputs = [
        block(
            [f'name: "{n}"', f"data_type: {t}", f"dims: [ {d} ]"]
            + (["optional: true"] if o else [])
        )
        for n, t, d, o in LLMAPI_INPUTS
    ]
    outputs = [
        block([f'name: "{n}"', f"data_type: {t}", f"dims: [ {d} ]"]) for n, t, d in LLMAPI_OUTPUTS
    ]
    return (
        "# Rendered by infertune: TensorRT-LLM LLM-API model (triton_backend/all_models/llmapi).\n"
        f'name: "{served_model}"\n'
        'backend: "python"\n'
        "max_batch_size: 0\n"
        "model_transaction_policy {\n  decoupled: true\n}\n"
        "instance_group [\n  {\n    count: 1\n    kind: KIND_CPU\n  }\n]\n"
        "input [\n" + ",\n".join(inputs) + "\n]\n"
        "output [\n" + ",\n".join(outputs) + "\n]\n"
    )


def render_model_repository(
    config: TrialConfig,
    model: str,
    *,
    served_model: str = SERVED_MODEL,
    max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS,
    free_gpu_memory_fraction: float = FREE_GPU_MEMORY_FRACTION,
) -> dict[str, str]:
    """Relative path -> file content of the repository's rendered files."""
    return {
        f"{served_model}/config.pbtxt": config_pbtxt(served_model),
        f"{served_model}/1/model.yaml": model_yaml_text(
            config,
            model,
            max_num_tokens=max_num_tokens,
            free_gpu_memory_fraction=free_gpu_memory_fraction,
        ),
    }


def max_num_tokens_for(input_tokens: int | None) -> int:
    """The engine's token budget per step: the default, or a whole prompt when it is longer."""
    return max(DEFAULT_MAX_NUM_TOKENS, input_tokens or 0)


def launcher_command(
    tp: int,
    model_repo: str,
    *,
    served_model: str = SERVED_MODEL,
    grpc_port: int = 8001,
    http_port: int = 8000,
    metrics_port: int = 8002,
    launcher: str = LAUNCHER,
) -> list[str]:
    """`launch_triton_server.py --world_size TP`: one tritonserver MPI rank per GPU; rank 0
    serves and drives the LLM API, the others wait in the LLM-API model's MPI executor. Note that
    the launcher starts mpirun in the background and returns at once."""
    return [
        "python3", launcher, f"--world_size={tp}", f"--model_repo={model_repo}",
        f"--tensorrt_llm_model_name={served_model}", f"--grpc_port={grpc_port}",
        f"--http_port={http_port}", f"--metrics_port={metrics_port}",
    ]  # fmt: skip
