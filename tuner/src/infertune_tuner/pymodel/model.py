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

# First on the path, in the tuner's order (site.addsitedir appends; the system's own
# dist-packages must not shadow the tuner's numpy).
_before = list(sys.path)
for _path in os.environ.get("INFERTUNE_STUB_PATH", "").split(os.pathsep):
    if _path:
        site.addsitedir(_path)
sys.path[:] = [p for p in sys.path if p not in _before] + _before

import contextlib
import queue
import threading
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
    closed: bool = False  # its final (or error) response went out


class _Outbox:
    """Sends responses from a thread of its own, in order: a send through the stub's shared
    memory costs ~0.3 ms of CPU, and sending 256 of them inside the engine's step would add
    ~80 ms to every step (measured on a 2-core machine: ITL 185 ms where the body's steps took
    108 ms). The step clock runs on; if sending falls behind, responses queue, as a server's
    would."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[_Request, int, bool, str | None] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._run, name="infertune-send", daemon=True)
        self._thread.start()

    def token(self, handle: _Request, generated: int, final: bool) -> None:
        self._queue.put((handle, generated, final, None))

    def error(self, handle: _Request, message: str) -> None:
        self._queue.put((handle, 0, True, message))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(10)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            handle, generated, final, message = item
            if handle.closed:
                continue
            try:
                _send(handle, generated, final, message)
            except Exception as exc:  # the client must hear why, not hang
                if message is None:
                    with contextlib.suppress(Exception):
                        _send(handle, 0, True, f"cannot send the response: {exc}")
                handle.closed = True
            if final:
                handle.closed = True


def _send(handle: _Request, generated: int, final: bool, message: str | None) -> None:
    flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
    if message is not None:
        response = pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
    else:
        text = np.array([TOKEN * generated], dtype=np.object_)
        response = pb_utils.InferenceResponse([pb_utils.Tensor("text_output", text)])
    handle.sender.send(response, flags=flags)


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
        self.outbox = _Outbox()
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
        if final or handle.streaming:
            self.outbox.token(handle, seq.generated, final)

    def _error(self, handle: _Request, message: str) -> None:
        self.outbox.error(handle, message)

    def finalize(self) -> None:
        self.loop.stop()
        self.outbox.close()
