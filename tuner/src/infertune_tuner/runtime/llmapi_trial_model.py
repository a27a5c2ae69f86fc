"""infertune's trial wrapper of TensorRT-LLM's LLM-API Triton model: every request generates
exactly the tokens it asks for (`sampling_param_max_tokens`).

A trial measures throughput and latency at the workload's output length. The stock model
forwards no `ignore_eos` or `min_tokens` (NVIDIA/TensorRT-LLM
triton_backend/all_models/llmapi/tensorrt_llm/1/helpers.py, `get_sampling_params_from_request`:
best_of, temperature, top_k, top_p, frequency/presence penalty, max_tokens, seed,
exclude_input_from_output, return_perf_metrics, stop), so greedy decoding of a synthetic prompt
stops at the first end-of-sequence token and the trial measures shorter outputs than the
workload's. This file is the repository's `model.py` in a trial only (TritonRuntime.assemble);
the image's model.py sits beside it as `llmapi_model.py`, and the serving Deployment runs the
stock model unchanged.

It sets `ignore_eos` and `min_tokens = max_tokens` on what the helper returns, before upstream's
model imports the helper by name (model.py: `from helpers import (...
get_sampling_params_from_request, ...)`, then `SamplingParams(**sampling_params)`;
tensorrt_llm/sampling_params.py: `min_tokens: Optional[int]`, `ignore_eos: bool`).
"""

import helpers  # upstream's, in this folder

_upstream = helpers.get_sampling_params_from_request


def _exact_length(*args, **kwargs):  # type: ignore[no-untyped-def]
    params = _upstream(*args, **kwargs)
    params["ignore_eos"] = True
    if params.get("max_tokens") is not None:
        params["min_tokens"] = params["max_tokens"]
    return params


helpers.get_sampling_params_from_request = _exact_length

from llmapi_model import TritonPythonModel  # noqa: E402 (after the helper is replaced)

__all__ = ["TritonPythonModel"]
