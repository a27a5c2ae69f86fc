"""How many output tokens one streamed response carries: from what the response says.

A decoupled Triton model streams one response per engine iteration that produced output, and an
iteration may produce several tokens of one sequence: TensorRT-LLM's `stream_interval` > 1 sends
every k-th iteration's tokens together, speculative decoding accepts several draft tokens in one
step, and a model may send deltas of several tokens. Counting one token per response then
undercounts and makes ITL k times too high. So the count comes from the response, in this order:

- `num_output_tokens` (INT32 [1]): the engine model of TensorRT-LLM's Triton backend returns it
  when the request sets the `return_num_output_tokens` input (NVIDIA/TensorRT-LLM
  triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt declares both; its
  1/model.py `convert_response` fills it with the size of the response's `output_ids`, which in
  streaming mode hold the tokens generated since the previous response);
- `output_ids` (INT32 [1, beams, tokens] or [beams, tokens]): the same engine model's token ids;
  the first beam's ids that are not padding (-1) are the response's tokens;
- neither declared: one token per response carrying output (`TokenSource.RESPONSES`), and the
  run says so. TensorRT-LLM's LLM-API model (triton_backend/all_models/llmapi/tensorrt_llm,
  which infertune deploys) declares neither: its outputs are `text_output` (cumulative text),
  `finish_reason`, `stop_reason`, `cumulative_logprob` and perf metrics; with the
  `stream_interval: 1` infertune renders, one response is one token.

A response whose model declares a count output but leaves it out is counted as one token and
tallied (`BenchResult.tokens_assumed`), never dropped.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

# The engine model's input that asks for the count, and the outputs that carry it.
REQUEST_COUNT_INPUT = "return_num_output_tokens"
COUNT_OUTPUT = "num_output_tokens"
IDS_OUTPUT = "output_ids"
PADDING_ID = -1  # convert_response fills beams shorter than the longest with -1


class TokenSource(enum.Enum):
    """Where a run's output-token counts come from."""

    NUM_OUTPUT_TOKENS = "num_output_tokens"
    OUTPUT_IDS = "output_ids"
    RESPONSES = "responses"  # nothing to count: one token per response carrying output

    @classmethod
    def negotiate(cls, inputs: set[str], outputs: set[str]) -> TokenSource:
        """The best source the model's metadata offers (the count needs its request input)."""
        if COUNT_OUTPUT in outputs and REQUEST_COUNT_INPUT in inputs:
            return cls.NUM_OUTPUT_TOKENS
        if IDS_OUTPUT in outputs:
            return cls.OUTPUT_IDS
        return cls.RESPONSES


def _raw(response: Any, name: str) -> tuple[Any, bytes] | None:
    """(the output tensor's metadata, its raw bytes) of output `name`, if the response has it."""
    for i, tensor in enumerate(response.outputs):
        if tensor.name == name:
            raw = response.raw_output_contents
            if i < len(raw):
                return tensor, raw[i]
            return tensor, b""
    return None


def _int32s(tensor: Any, raw: bytes) -> np.ndarray[Any, Any]:
    if raw:
        return np.frombuffer(raw, dtype="<i4")
    return np.asarray(tensor.contents.int_contents, dtype=np.int32)  # not sent as raw bytes


def count(response: Any, source: TokenSource) -> int | None:
    """Output tokens in one KServe v2 `ModelInferResponse` by `source`; None when the response
    carries output but not the count `source` names (the caller counts it as one, and says so).
    A response without outputs (an empty final response) carries none."""
    if not response.outputs:
        return 0
    if source is TokenSource.RESPONSES:
        return 1
    name = COUNT_OUTPUT if source is TokenSource.NUM_OUTPUT_TOKENS else IDS_OUTPUT
    found = _raw(response, name)
    if found is None:
        return None
    tensor, raw = found
    values = _int32s(tensor, raw)
    if source is TokenSource.NUM_OUTPUT_TOKENS:
        return int(values[0]) if values.size else None
    width = int(tensor.shape[-1]) if len(tensor.shape) else values.size
    first_beam = values[:width] if width else values
    return int(np.count_nonzero(first_beam != PADDING_ID))
