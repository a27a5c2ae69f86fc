"""Before the first real trial: does this machine have what a Triton + TensorRT-LLM trial needs?

Without the check, a tuner outside the image (or on a node without GPUs) fails its first trials
the same way, one after the other, and the search gives up after three; with it, `infertune
tune --backend triton` (and the tuner Job) stops at once with every missing piece named.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from infertune_tuner.request import TuningRequest
from infertune_tuner.runtime.weights import hub_repo, served_path, trial_weights, unloadable

if TYPE_CHECKING:
    from infertune_tuner.runtime.triton import TritonRuntime


def gpu_count() -> int | None:
    """GPUs this container sees (`nvidia-smi -L`, one line each), or None without a driver."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return sum(1 for line in done.stdout.splitlines() if line.startswith("GPU "))


def preflight_problems(runtime: TritonRuntime, request: TuningRequest) -> list[str]:
    """Every reason no Triton + TensorRT-LLM trial of `request` can run here, found before the
    first trial (otherwise each trial would fail the same way, three times, before the search
    gave up): the image's launcher and LLM-API model, `tritonserver` and, for TP > 1, `mpirun`
    on PATH, as many GPUs as the largest TP searched, mounted weights that exist, and the
    download library for weights from the Hub."""
    out: list[str] = []
    image = "run in the Triton TRT-LLM image (nvcr.io/nvidia/tritonserver:*-trtllm-python-py3)"
    if not Path(runtime.launcher).is_file():
        out.append(f"the launcher {runtime.launcher} is missing: {image} or set "
                   "INFERTUNE_TRITON_LAUNCHER")  # fmt: skip
    if not (Path(runtime.llmapi_model_dir) / "model.py").is_file():
        out.append(f"the TensorRT-LLM LLM-API Triton model (model.py) is not in "
                   f"{runtime.llmapi_model_dir}: {image} or set INFERTUNE_LLMAPI_MODEL_DIR")  # fmt: skip
    if shutil.which("tritonserver") is None:
        out.append(f"tritonserver is not on PATH: {image}")
    largest = max(request.search.tensor_parallel)
    if largest > 1 and shutil.which("mpirun") is None:
        out.append(f"mpirun is not on PATH (TP {largest} trials are launched through it): {image}")
    gpus = gpu_count()
    if gpus is None:
        out.append("no GPU is visible: nvidia-smi is missing or fails (request nvidia.com/gpu "
                   "and run on a GPU node with the NVIDIA container runtime)")  # fmt: skip
    elif gpus < largest:
        out.append(f"{gpus} GPU(s) visible, fewer than the largest tensorParallel searched "
                   f"({largest}): request {largest} GPUs or search smaller TP sizes")  # fmt: skip
    hub = False
    if (nothing := unloadable(request)) is not None:
        return [*out, nothing]
    for uri in trial_weights(request):
        if hub_repo(uri) is not None:
            hub = True
        elif not Path(path := served_path(uri, runtime.cache_root)).is_dir():
            out.append(f"the weights of {uri} are not at {path} (is the volume mounted?)")
    if hub and importlib.util.find_spec("huggingface_hub") is None:
        out.append("huggingface_hub is not installed: weights from the Hugging Face Hub cannot "
                   "be downloaded (it ships with TensorRT-LLM)")  # fmt: skip
    return out
