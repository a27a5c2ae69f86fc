"""Triton Inference Server + TensorRT-LLM's LLM-API model: the runtime infertune tunes and serves.

Targets the NGC image `nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3` (TensorRT-LLM
1.2.1), which ships `triton_backend/all_models/llmapi/tensorrt_llm` at
`/app/all_models/llmapi/tensorrt_llm` and `triton_backend/scripts/launch_triton_server.py` at
`/app/scripts/launch_triton_server.py` (docs/serving-runtime.md: how to check an image).

The repository (NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm):

    <repo>/llm/config.pbtxt     backend "python", decoupled, the model's inputs and outputs
    <repo>/llm/1/model.yaml     LLM() arguments + `triton_config` (rendered here)
    <repo>/llm/1/model.py       copied from the image, with helpers.py

model.yaml: every key but `triton_config` is an argument of `tensorrt_llm.LLM()` (model.py passes
them through `update_llm_args_with_extra_dict`; NVIDIA/TensorRT-LLM
tensorrt_llm/llmapi/llm_args.py): `model`, `backend`, `tensor_parallel_size`,
`pipeline_parallel_size`, `dtype`, `max_batch_size`, `max_num_tokens`, `kv_cache_config`
{`free_gpu_memory_fraction`, `dtype`}, `cuda_graph_config` {`enable_padding`,
`max_batch_size`}, `stream_interval`. Decisions:

- **dtype**: bf16 renders `dtype: bfloat16`, fp16 `dtype: float16` (the LLM API casts the
  weights), so the two are different servers; a pre-quantized checkpoint keeps `auto` (its
  unquantized layers stay in the checkpoint's dtype).
- **CUDA graphs**: `cuda_graph_config: {enable_padding: true, max_batch_size: B}`. Without it the
  LLM API captures graphs only for batch sizes 1-31, 32, 64, 128 (CudaGraphConfig's generated
  list without padding, max 128), so 48, 96, 192, 256 would run eagerly and measure slower than
  a tuned server; with padding a batch rounds up to the next captured size (1, 2, 4, 8, 16, 24,
  ... 128, then steps of 64) and the trial's max batch itself is always captured.
- **stream_interval: 1**: one streamed response per generated token, which is how the load
  generator counts output tokens (it never tokenizes the cumulative `text_output`).
- **triton_config.max_batch_size: 0** as upstream ships it: the model takes one prompt per
  request and batches in flight inside the engine (top-level `max_batch_size`).
- config.pbtxt states `max_batch_size: 0` and the decoupled policy itself: the launcher starts
  tritonserver with `--disable-auto-complete-config`, so the model's `auto_complete_config`
  (which would copy `triton_config`) never runs, and streaming needs decoupled mode.

The launch (tensor parallelism): TP lives in model.yaml and the LLM API runs the TP workers;
tritonserver must not be started once per rank, or every rank builds its own TP-wide LLM (model.py
clears the MPI job environment it inherits from mpirun) and the GPUs load the model TP times. We
launch exactly as upstream's Triton LLM-API integration test does
(NVIDIA/TensorRT-LLM tests/integration/defs/triton_server/test_triton_llmapi.py):

- TP 1: `launch_triton_server.py --world_size=1 --no-mpi` (one tritonserver, no mpirun);
- TP > 1: `launch_triton_server.py --world_size=TP --trtllm_llmapi_launch --oversubscribe`: mpirun
  starts TP ranks under `trtllm-llmapi-launch`; rank 0 runs tritonserver (its LLM reaches the
  other ranks through the LLM API's MPI session), ranks 1..TP-1 run the LLM API's worker loop.
  `--oversubscribe` because a pod's CPU quota is not mpirun's slot count.

The image runs as root (the launcher passes mpirun `--allow-run-as-root`); see `pod()`.
"""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from infertune_tuner.config import TrialConfig
from infertune_tuner.perfmodel.memory import DEFAULT_MAX_NUM_TOKENS, FREE_GPU_MEMORY_FRACTION
from infertune_tuner.request import TuningRequest
from infertune_tuner.runtime.base import FILES_DIR, REPO_DIR, SERVED_MODEL, PodShape, Ports
from infertune_tuner.runtime.preflight import preflight_problems
from infertune_tuner.runtime.weights import (
    CACHE_ROOT,
    CACHE_ROOT_ENV,
    fetch_argv,
    hub_repo,
    served_path,
    weights_uri,
)

LAUNCHER = "/app/scripts/launch_triton_server.py"
# A trial's model.py, and the name the image's model.py takes beside it (assemble).
TRIAL_MODEL_PY = Path(__file__).with_name("llmapi_trial_model.py")
TRIAL_UPSTREAM_MODEL = "llmapi_model.py"
LLMAPI_MODEL_DIR = "/app/all_models/llmapi/tensorrt_llm/1"
SHM_SIZE = "16Gi"  # the Python backend's shared memory and the TP ranks' NCCL buffers
# Requests of a serving pod: Triton's frontend and Python stub, the LLM API's executor and one
# worker process per GPU, tokenization; host memory for loading the weights.
CPU_BASE, CPU_PER_GPU = 2, 2
MEMORY_BASE_GIB, MEMORY_PER_GPU_GIB = 16, 16

# No CPU binding by mpirun. Open MPI binds each rank to one core when it starts <= 2 processes
# (v4.1: orte/mca/rmaps/base/rmaps_base_map_job.c, `nprocs <= 2` -> OPAL_BIND_TO_CORE; the
# mpirun man page: "Bind to core: when the number of processes is <= 2"), and upstream's
# launcher passes no --bind-to (triton_backend/scripts/launch_triton_server.py L181-189). Rank 0
# runs tritonserver, the Python stub, detokenisation and the LLM API's proxy: all of them on one
# core, and side-by-side trials on the same cores. The variable is Open MPI 4's MCA parameter
# hwloc_base_binding_policy (`--bind-to none`); Open MPI 5 reads PRRTE's, under PRTE_MCA_. Both
# are set: the image's Open MPI version is not pinned (`mpirun --version` tells). Verify in a
# running pod: `for p in $(pgrep -f 'tritonserver|triton_python_backend_stub'); do taskset -cp
# $p; done` lists every CPU of `cat /sys/fs/cgroup/cpuset.cpus.effective`, not one core each.
MPI_ENV = {
    "OMPI_MCA_hwloc_base_binding_policy": "none",
    "PRTE_MCA_hwloc_default_binding_policy": "none",
}
# Liveness: generate one token. Upstream's LLM-API model keeps the model READY when its engine
# or an MPI rank dies (model.py `# TODO: [JIRA-4040] Add health check here`, in execute), and
# Triton's own readiness sees only the Python stub's death, so /v2/health/live would stay green
# on a server that can no longer answer. One non-streaming request for one token through
# Triton's generate endpoint (the model sends one response, flagged final) proves the whole
# path. A request may wait for a free slot behind a full batch: at most one request's E2E, so
# the timeout is generous (LIVENESS_TIMEOUT_S) and three failures, a minute apart, restart it.
LIVENESS_TIMEOUT_S = 60
LIVENESS_SCRIPT = """import json, sys, urllib.request
url, timeout = sys.argv[1], float(sys.argv[2])
body = json.dumps({"text_input": "ping", "sampling_param_max_tokens": 1}).encode()
request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer = json.loads(response.read())
except Exception as exc:
    sys.exit(f"no token within {timeout:g} s: {exc}")
if "text_output" not in answer:
    sys.exit(f"no text_output in {answer}")
"""


def liveness_argv(http_port: int, served_model: str = SERVED_MODEL,
                  timeout_s: int = LIVENESS_TIMEOUT_S) -> list[str]:  # fmt: skip
    """The exec probe: one token from the served model, within `timeout_s`."""
    url = f"http://127.0.0.1:{http_port}/v2/models/{served_model}/generate"
    return ["python3", "-c", LIVENESS_SCRIPT, url, str(timeout_s)]


# LLM() arguments (NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py) and the Triton model's
# own section (triton_backend/all_models/llmapi/tensorrt_llm/1/model.py reads `triton_config`).
MODEL_YAML_KEYS = (
    "model", "backend", "tensor_parallel_size", "pipeline_parallel_size", "dtype",
    "max_batch_size", "max_num_tokens", "kv_cache_config", "cuda_graph_config",
    "stream_interval", "triton_config",
)  # fmt: skip
WEIGHT_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}  # LLM(dtype=...); "auto" otherwise

# (name, data type, dims, optional) as in upstream's config.pbtxt.
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


def max_num_tokens_for(input_tokens: int | None) -> int:
    """The engine's token budget per step: the default, or a whole prompt when it is longer."""
    return max(DEFAULT_MAX_NUM_TOKENS, input_tokens or 0)


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
        "dtype": WEIGHT_DTYPE.get(config.quantization, "auto"),
        "max_batch_size": config.max_batch_size,
        "max_num_tokens": max_num_tokens,
        "kv_cache_config": {
            "free_gpu_memory_fraction": free_gpu_memory_fraction,
            "dtype": config.kv_cache_dtype,
        },
        "cuda_graph_config": {"enable_padding": True, "max_batch_size": config.max_batch_size},
        "stream_interval": 1,
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


def repository_files(request: TuningRequest, config: TrialConfig, model: str) -> dict[str, str]:
    """The rendered files of the repository serving `config` from the weights at `model`."""
    text = model_yaml_text(
        config, model, max_num_tokens=max_num_tokens_for(request.workload.input_tokens)
    )
    return {
        f"{SERVED_MODEL}/config.pbtxt": config_pbtxt(SERVED_MODEL),
        f"{SERVED_MODEL}/1/model.yaml": text,
    }


def launcher_argv(
    tp: int,
    model_repo: str,
    ports: Ports,
    *,
    served_model: str = SERVED_MODEL,
    launcher: str = LAUNCHER,
) -> list[str]:
    """`launch_triton_server.py` as upstream's LLM-API test runs it (see the module docstring).
    The launcher starts tritonserver (or mpirun) in the background and returns at once.

    `--force`: before it launches, the script runs `pgrep -r R tritonserver` and raises
    RuntimeError when any tritonserver is running unless `--force` is given (NVIDIA/TensorRT-LLM
    triton_backend/scripts/launch_triton_server.py, `__main__`). A tuner pod runs trials side by
    side (packing.py), each with a tritonserver of its own on its own ports: without `--force`
    the second trial's launch would fail whenever the first server happened to be on a CPU."""
    mode = ["--no-mpi"] if tp == 1 else ["--trtllm_llmapi_launch", "--oversubscribe"]
    return [
        "python3", launcher, f"--world_size={tp}", *mode, "--force", f"--model_repo={model_repo}",
        f"--tensorrt_llm_model_name={served_model}", f"--grpc_port={ports.grpc}",
        f"--http_port={ports.http}", f"--metrics_port={ports.metrics}",
    ]  # fmt: skip


def start_script(argv: list[str], *, files_dir: str = FILES_DIR, repo_dir: str = REPO_DIR,
                 llmapi_model_dir: str = LLMAPI_MODEL_DIR) -> str:  # fmt: skip
    """The serving container's command: assemble the repository from the rendered files and the
    image's model.py, launch, and stay while tritonserver runs (the launcher detaches); on
    SIGTERM stop mpirun and tritonserver so the pod ends within its grace period."""
    version_dir = f"{repo_dir}/{SERVED_MODEL}/1"
    return "\n".join([
        "set -euo pipefail",
        f"mkdir -p {version_dir}",
        f"cp {llmapi_model_dir}/*.py {version_dir}/",
        f"cp {files_dir}/model.yaml {version_dir}/model.yaml",
        f"cp {files_dir}/config.pbtxt {repo_dir}/{SERVED_MODEL}/config.pbtxt",
        "trap 'pkill -TERM -x mpirun || true; pkill -TERM -x tritonserver || true' TERM INT",
        shlex.join(argv),
        "# the launcher starts tritonserver (or mpirun) in the background and returns",
        "for _ in $(seq 120); do pgrep -x tritonserver > /dev/null && break; sleep 1; done",
        "while pgrep -x tritonserver > /dev/null; do sleep 5; done",
        'echo "tritonserver exited" >&2',
        "exit 1",
    ])  # fmt: skip


@dataclass(frozen=True)
class TritonRuntime:
    """Triton + TensorRT-LLM (LLM API, PyTorch backend)."""

    name: str = "triton"
    launcher: str = LAUNCHER
    llmapi_model_dir: str = LLMAPI_MODEL_DIR
    cache_root: str = CACHE_ROOT  # where downloaded weights live (the pod's model cache)

    @property
    def time_scale(self) -> float:
        """A real server runs on the GPU's own clock."""
        return 1.0

    @classmethod
    def from_env(cls) -> TritonRuntime:
        """Local trials: INFERTUNE_TRITON_LAUNCHER and INFERTUNE_LLMAPI_MODEL_DIR point at the
        launcher and the LLM-API model outside the NGC image's /app layout."""
        return cls(
            launcher=os.environ.get("INFERTUNE_TRITON_LAUNCHER") or LAUNCHER,
            llmapi_model_dir=os.environ.get("INFERTUNE_LLMAPI_MODEL_DIR") or LLMAPI_MODEL_DIR,
            cache_root=os.environ.get(CACHE_ROOT_ENV) or CACHE_ROOT,
        )

    def model_path(self, request: TuningRequest, config: TrialConfig) -> str:
        """model.yaml's `model` for `config`: a mounted path, or the folder a Hugging Face
        repository is downloaded to (raises MissingCheckpoint)."""
        return served_path(weights_uri(request, config), self.cache_root)

    def fetch(self, request: TuningRequest, config: TrialConfig) -> tuple[str, str] | None:
        """(repository, folder) when `config`'s weights come from the Hugging Face Hub: only what
        the LLM API loads is downloaded (weights.DOWNLOAD_ALLOW), before the server starts."""
        uri = weights_uri(request, config)
        repo = hub_repo(uri)
        return None if repo is None else (repo, served_path(uri, self.cache_root))

    def model_files(self, request: TuningRequest, config: TrialConfig) -> dict[str, str]:
        return repository_files(request, config, self.model_path(request, config))

    def launch_argv(
        self, request: TuningRequest, config: TrialConfig, *, repo_dir: str, ports: Ports,
        host: str = "0.0.0.0",
    ) -> list[str]:  # fmt: skip
        return launcher_argv(config.tp, repo_dir, ports, launcher=self.launcher)

    def launch_env(self) -> dict[str, str]:
        """No MPI CPU binding (MPI_ENV)."""
        return dict(MPI_ENV)

    def serial_launch(self, config: TrialConfig) -> bool:
        """TP > 1 starts through trtllm-llmapi-launch, whose proxy port is picked racily
        (backends/triton.py, LAUNCH_LOCK)."""
        return config.tp > 1

    def problems(self, request: TuningRequest) -> list[str]:
        """What this machine lacks to run a trial of `request` (runtime/preflight.py)."""
        return preflight_problems(self, request)

    def assemble(self, repo_dir: Path) -> None:
        """A trial's repository: the image's LLM-API model as `llmapi_model.py`, its helpers,
        and infertune's `model.py` around it, which makes every request generate exactly the
        tokens it asks for (llmapi_trial_model.py; the serving pod runs the stock model)."""
        source = Path(self.llmapi_model_dir)
        files = sorted(source.glob("*.py")) if source.is_dir() else []
        if not any(f.name == "model.py" for f in files):
            raise FileNotFoundError(
                f"the TensorRT-LLM LLM-API Triton model (model.py) is not at {source}; run in the "
                "Triton TRT-LLM image or set INFERTUNE_LLMAPI_MODEL_DIR"
            )
        version = repo_dir / SERVED_MODEL / "1"
        version.mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copy2(f, version / (TRIAL_UPSTREAM_MODEL if f.name == "model.py" else f.name))
        shutil.copy2(TRIAL_MODEL_PY, version / "model.py")

    def pod(self, request: TuningRequest, config: TrialConfig, ports: Ports) -> PodShape:
        """Runs as root: the NGC Triton image's user is root, its launcher passes mpirun
        `--allow-run-as-root`, and TensorRT-LLM writes kernel and compile caches under the
        user's home; a non-root user is not something the image is built or tested for."""
        argv = self.launch_argv(request, config, repo_dir=REPO_DIR, ports=ports)
        script = start_script(argv, llmapi_model_dir=self.llmapi_model_dir)
        fetch = self.fetch(request, config)
        return PodShape(
            image="triton",
            command=["/bin/bash", "-c", script],
            gpus=config.tp,
            cpu_m=1000 * (CPU_BASE + CPU_PER_GPU * config.tp),
            memory_mi=1024 * (MEMORY_BASE_GIB + MEMORY_PER_GPU_GIB * config.tp),
            memory_limit_mi=None,
            shm=SHM_SIZE,
            runs_as_root=True,
            loads_weights=True,
            fetch_command=fetch_argv(*fetch) if fetch is not None else None,
            env=self.launch_env(),
            liveness_command=liveness_argv(ports.http),
            liveness_timeout_s=LIVENESS_TIMEOUT_S,
        )
