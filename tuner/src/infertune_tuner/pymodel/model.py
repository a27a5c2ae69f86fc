"""Triton Python-backend entry point of infertune's model (copied into the repository as model.py).

Runs inside Triton's Python stub, whose interpreter is the system's libpython and does not read
the launching process's PYTHONPATH: the runtime passes the tuner's package folders in
INFERTUNE_STUB_PATH and they are added (with their .pth files: editable installs) before
anything else is imported. Inputs are the LLM-API model's (config.pbtxt as rendered for
TensorRT-LLM): `text_input` (its words count as tokens, as the simulated server counts them),
`sampling_param_max_tokens`, `streaming`; one response per generated token carries the text so
far in `text_output` (the LLM-API model streams cumulative text), the last one flagged final.
With `streaming` false only the final response is sent.
"""

# ruff: noqa: E402
from __future__ import annotations

import os
import site
import sys
import time

# First on the path, in the tuner's order (site.addsitedir appends; the system's own
# dist-packages must not shadow the tuner's numpy).
_before = list(sys.path)
for _path in os.environ.get("INFERTUNE_STUB_PATH", "").split(os.pathsep):
    if _path:
        site.addsitedir(_path)
sys.path[:] = [p for p in sys.path if p not in _before] + _before

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from infertune_tuner.harness.engine import Sequence
from infertune_tuner.pymodel.serve import build_loop

DEFAULT_MAX_TOKENS = 128  # as the simulated server: a request that names no output length
TOKEN = b" tok"  # the text of one generated token


@dataclass
class _Request:
    sender: Any
    streaming: bool


def _scalar(request: Any, name: str, default: Any) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    values = tensor.as_numpy().reshape(-1)
    return values[0].item() if values.size else default


def _text_tokens(request: Any) -> int:
    tensor = pb_utils.get_input_tensor_by_name(request, "text_input")
    if tensor is None:
        raise ValueError("expected input 'text_input'")
    texts = tensor.as_numpy().reshape(-1)
    words = sum(len(t.split()) if isinstance(t, bytes) else len(str(t).split()) for t in texts)
    return max(words, 1)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        version = Path(args["model_repository"]) / args["model_version"]
        self.loop = build_loop(version, self._token, self._error).start()

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                tokens = _text_tokens(request)
                max_tokens = int(_scalar(request, "sampling_param_max_tokens", DEFAULT_MAX_TOKENS))
                streaming = bool(_scalar(request, "streaming", True))
            except (ValueError, TypeError) as exc:
                self._error(_Request(sender, True), str(exc))
                continue
            self.loop.submit(_Request(sender, streaming), tokens, max_tokens)
        return None

    def _token(self, seq: Sequence, final: bool) -> None:
        handle: _Request = seq.handle
        if not (final or handle.streaming):
            return
        text = np.array([TOKEN * seq.generated], dtype=np.object_)
        outputs = [pb_utils.Tensor("text_output", text)]
        if not final:
            handle.sender.send(pb_utils.InferenceResponse(outputs))
            return
        # The server's own timestamps (CLOCK_MONOTONIC ns, as the simulated server sends them):
        # the load generator reports the latency it adds on top of them.
        times = {
            "infertune_received_ns": int(seq.received_s * 1e9),
            "infertune_first_token_ns": int((seq.first_token_s or 0.0) * 1e9),
            "infertune_last_token_ns": time.monotonic_ns(),
        }
        response = pb_utils.InferenceResponse(outputs, parameters=times)
        handle.sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _error(self, handle: _Request, message: str) -> None:
        response = pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
        handle.sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self) -> None:
        self.loop.stop()
