"""Triton Python-backend entry point of infertune's model (copied into the repository as model.py).

Runs inside Triton's Python stub, whose interpreter is the system's libpython and does not read
the launching process's PYTHONPATH: the runtime passes the tuner's package folders in
INFERTUNE_STUB_PATH and they are added (with their .pth files: editable installs) before
anything else is imported. Inputs are the LLM-API model's (config.pbtxt as rendered for
TensorRT-LLM): `text_input` (its words count as tokens, as the simulated server counts them),
`sampling_param_max_tokens`, `streaming`; one response per generated token (per
`stream_interval` tokens, model.yaml) carries the text so far in `text_output` (the LLM-API model
streams cumulative text), the last one flagged final. With `streaming` false only the final
response is sent. A request whose `return_num_output_tokens` input is true (where a test's
config.pbtxt declares it, with the `num_output_tokens` output, as TensorRT-LLM's engine model
does) gets each response's token count. body.json may make it stop early, end requests as other
servers do, or stream delta text (spec.py, responses.py).
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
from infertune_tuner.triton_model.responses import ResponsePlan, Send
from infertune_tuner.triton_model.serve import build_loop
from infertune_tuner.triton_model.spec import Served, read

DEFAULT_MAX_TOKENS = 128  # as the simulated server: a request that names no output length
TOKEN = b" tok"  # the text of one generated token
CANCEL_POLL_S = 0.05  # how often requests the model never completes are checked for cancellation


@dataclass
class _Request:
    sender: Any
    plan: ResponsePlan
    counts: bool = False  # send num_output_tokens with each response
    closed: bool = False  # its final (or error) response went out


class _Outbox:
    """Sends responses from a thread of its own, in order: a send through the stub's shared
    memory costs ~0.3 ms of CPU, and sending 256 of them inside the engine's step would add
    ~80 ms to every step (measured on a 2-core machine: ITL 185 ms where the body's steps took
    108 ms). The step clock runs on; if sending falls behind, responses queue, as a server's
    would. Requests the model never completes (`stop_signal: none`) are held until Triton says
    their client cancelled them, then closed with the final flag."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[_Request, int, bool, str | None] | None] = (
            queue.SimpleQueue()
        )
        self._held: list[_Request] = []
        self._thread = threading.Thread(target=self._run, name="infertune-send", daemon=True)
        self._thread.start()

    def token(self, handle: _Request, generated: int, final: bool) -> None:
        self._queue.put((handle, generated, final, None))

    def error(self, handle: _Request, message: str) -> None:
        self._queue.put((handle, 0, True, message))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(10)
        for handle in self._held:  # unloading: nothing may stay open
            with contextlib.suppress(Exception):
                handle.sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=CANCEL_POLL_S if self._held else None)
            except queue.Empty:
                self._release_cancelled()
                continue
            if item is None:
                return
            handle, generated, final, message = item
            if handle.closed:
                continue
            try:
                if message is not None:
                    _error(handle, message)
                else:
                    for send in handle.plan.on_token(generated, final):
                        _send(handle, send)
                    if final and handle.plan.holds_open:
                        self._held.append(handle)
                        continue
            except Exception as exc:  # the client must hear why, not hang
                if message is None:
                    with contextlib.suppress(Exception):
                        _error(handle, f"cannot send the response: {exc}")
                handle.closed = True
            if final:
                handle.closed = True

    def _release_cancelled(self) -> None:
        for handle in list(self._held):
            with contextlib.suppress(Exception):
                if handle.sender.is_cancelled():
                    self._held.remove(handle)
                    handle.closed = True
                    handle.sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def _error(handle: _Request, message: str) -> None:
    response = pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
    handle.sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def _send(handle: _Request, send: Send) -> None:
    flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if send.final else 0
    if send.tokens == 0:  # the final flag alone: Triton's "empty final response"
        handle.sender.send(flags=flags)
        return
    text = np.array([TOKEN * (send.text_to - send.text_from)], dtype=np.object_)
    outputs = [pb_utils.Tensor("text_output", text)]
    if handle.counts:
        count = np.array([send.tokens], dtype=np.int32)
        outputs.append(pb_utils.Tensor("num_output_tokens", count))
    handle.sender.send(pb_utils.InferenceResponse(outputs), flags=flags)


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
        self.served: Served = read(version)
        self.outbox = _Outbox()
        self.loop = build_loop(self.served, self._token, self._error).start()

    def execute(self, requests: list[Any]) -> None:
        spec = self.served.spec
        for request in requests:
            sender = request.get_response_sender()
            try:
                tokens = _text_tokens(request)
                max_tokens = int(_scalar(request, "sampling_param_max_tokens", DEFAULT_MAX_TOKENS))
                streaming = bool(_scalar(request, "streaming", True))
                counts = bool(_scalar(request, "return_num_output_tokens", False))
            except (ValueError, TypeError) as exc:
                self._error(_Request(sender, ResponsePlan()), str(exc))
                continue
            if spec.stop_after is not None:  # an early end-of-sequence
                max_tokens = min(max_tokens, spec.stop_after)
            plan = ResponsePlan(
                streaming, self.served.stream_interval, spec.stop_signal, spec.text_mode
            )
            self.loop.submit(_Request(sender, plan, counts), tokens, max_tokens)
        return None

    def _token(self, seq: Sequence, final: bool) -> None:
        handle: _Request = seq.handle
        if final or handle.plan.streaming:
            self.outbox.token(handle, seq.generated, final)

    def _error(self, handle: _Request, message: str) -> None:
        self.outbox.error(handle, message)

    def finalize(self) -> None:
        self.loop.stop()
        self.outbox.close()
