"""One streaming request on Triton's decoupled gRPC API (`tritonclient.grpc.aio`).

A closed-loop `Worker` keeps one stream open and sends its requests on it one at a time;
`one_request` opens a stream for a single request (request-rate mode). Responses are read until
the one flagged `triton_final_response` (or, from a server that never flags it, the requested
number of tokens); every response that carries output counts as one token. A broken stream, an
error response or a timeout fails the request (counted, never raised); the run's shared
`RunState` carries its deadline and why it stopped early.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException

from infertune_tuner.harness.load_spec import LoadSpec, clock
from infertune_tuner.harness.prompts import RequestTemplate
from infertune_tuner.harness.stats import RequestTrace


@dataclass
class RunState:
    """What every request of one run shares: the deadline, and why the run stopped early."""

    deadline: float | None = None  # clock() time
    stopped: str | None = None

    def timeout(self, per_request: float) -> tuple[float, bool]:
        """(seconds this request may take, whether the run's deadline is what limits it)."""
        if self.deadline is None:
            return per_request, False
        left = max(self.deadline - clock(), 0.0)
        return (left, True) if left < per_request else (per_request, False)


def _server_times(params: Any) -> tuple[float, float, float] | None:
    if "infertune_received_ns" not in params:
        return None
    return (
        params["infertune_received_ns"].int64_param / 1e9,
        params["infertune_first_token_ns"].int64_param / 1e9,
        params["infertune_last_token_ns"].int64_param / 1e9,
    )


class _StreamBroken(Exception):
    pass


async def _collect(
    responses: AsyncIterator[tuple[Any, Any]],
    request_id: str,
    spec: LoadSpec,
    send: float,
    run: RunState,
) -> RequestTrace:
    """Read one request's responses off a stream: until the final flag, an error, or (for servers
    that never flag the last response) the requested number of tokens."""
    times: list[float] = []
    limit, by_deadline = run.timeout(spec.request_timeout_s)
    try:
        async with asyncio.timeout(limit):
            while True:
                try:
                    result, err = await anext(responses)
                except StopAsyncIteration:
                    raise _StreamBroken("stream closed before the last response") from None
                now = clock()
                if err is not None:
                    return _failed(send, times, message(err))
                response = result.get_response()
                if response.id and response.id != request_id:
                    continue  # a late response of an earlier request on this stream
                if response.outputs:
                    times.append(now)
                params = response.parameters
                if "triton_final_response" in params and params["triton_final_response"].bool_param:
                    return RequestTrace(
                        send_s=send, responses=tuple(times), server=_server_times(params)
                    )
                if len(times) >= spec.output_tokens:
                    return RequestTrace(send_s=send, responses=tuple(times))
    except TimeoutError:
        if by_deadline:
            run.stopped = run.stopped or f"the run's deadline ({spec.deadline_s:g} s) passed"
            raise _StreamBroken(f"deadline reached ({len(times)} tokens received)") from None
        run.stopped = run.stopped or (
            f"a request timed out after {spec.request_timeout_s:g} s: the server stopped "
            "answering, no further request was sent"
        )
        raise _StreamBroken(
            f"timeout after {spec.request_timeout_s:g} s ({len(times)} tokens received)"
        ) from None
    except _StreamBroken:
        raise
    except Exception as exc:  # grpc.aio.AioRpcError and friends: count, never crash the run
        raise _StreamBroken(message(exc)) from None


def _failed(send: float, times: list[float], error: str) -> RequestTrace:
    return RequestTrace(send_s=send, responses=tuple(times), error=error, end_s=clock())


class Worker:
    """One closed-loop worker: one long-lived stream, one request in flight at a time. Reusing
    the stream keeps per-request client work (and so measurement overhead) small; a broken
    stream fails the request in flight and is reopened for the next."""

    def __init__(self, client: InferenceServerClient, spec: LoadSpec, run: RunState) -> None:
        self.client = client
        self.spec = spec
        self.run = run
        self._queue: asyncio.Queue[dict[str, Any] | None] | None = None
        self._call: Any = None
        self._responses: AsyncIterator[tuple[Any, Any]] | None = None

    def open(self) -> tuple[asyncio.Queue[dict[str, Any] | None], AsyncIterator[Any]]:
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

        async def requests() -> AsyncIterator[dict[str, Any]]:
            while (item := await queue.get()) is not None:
                yield item

        self._call = self.client.stream_infer(requests())
        self._queue, self._responses = queue, aiter(self._call)
        return queue, self._responses

    async def send(self, index: int, inputs: list[Any]) -> RequestTrace:
        if self._queue is None or self._responses is None:
            queue, responses = self.open()
        else:
            queue, responses = self._queue, self._responses
        rid = str(index)
        send = clock()
        queue.put_nowait({"model_name": self.spec.model, "inputs": inputs, "request_id": rid})
        try:
            return await _collect(responses, rid, self.spec, send, self.run)
        except _StreamBroken as exc:
            self.close()
            return _failed(send, [], str(exc))

    def close(self) -> None:
        if self._queue is not None:
            self._queue.put_nowait(None)
        if self._call is not None:
            with contextlib.suppress(Exception):
                self._call.cancel()
        self._queue = self._call = self._responses = None


async def one_request(
    client: InferenceServerClient,
    spec: LoadSpec,
    template: RequestTemplate,
    index: int,
    run: RunState | None = None,
) -> RequestTrace:
    """One request on a stream of its own (request-rate mode, where requests overlap)."""
    inputs = template.build(index, spec.seed, spec.input_tokens, spec.output_tokens)
    worker = Worker(client, spec, run or RunState())
    try:
        return await worker.send(index, inputs)
    finally:
        worker.close()


def message(exc: BaseException) -> str:
    if isinstance(exc, InferenceServerException):
        text = exc.message() or str(exc)
    else:
        details = getattr(exc, "details", None)
        text = details() if callable(details) else str(exc)
        code = getattr(exc, "code", None)
        if callable(code):
            with contextlib.suppress(Exception):
                text = f"{code().name}: {text}"
    return " ".join(str(text).split())[:300] or type(exc).__name__
