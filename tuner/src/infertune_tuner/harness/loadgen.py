"""Load generator on `tritonclient.grpc.aio` bi-directional streaming (decoupled responses).

Modes:

- closed loop (default): `concurrency` workers, each with exactly one request in flight, sending
  the next one the moment the previous one finishes (the tuner drives it at concurrency = max
  batch size);
- request rate: Poisson arrivals at `request_rate` requests/s (exponential gaps, seeded); then
  `concurrency`, when given, caps the requests in flight.

Warm-up requests run first, as a separate phase at the same concurrency, and are left out of
every statistic. A closed-loop worker keeps one stream open and sends its requests on it one at a
time (a request-rate request gets a stream of its own); a request ends with the response flagged
`triton_final_response` (or, from a server that never flags it, the requested number of tokens);
every response that carries output counts as one token.

Inputs are negotiated from the model's metadata, because Triton rejects inputs a model does not
declare: synthetic prompts go out as a `text_input` string of `input_tokens` words (one token
each, near enough) and, where declared, as `input_ids` INT32 token ids; the output length is
pinned through whichever of `sampling_param_max_tokens` (LLM-API model), `max_tokens` (ensemble)
or `request_output_len` (engine model) exists; `streaming`/`stream` is set to true and
`sampling_param_exclude_input_from_output` too. A model whose metadata cannot be read (unknown
name) gets `text_input` + `max_tokens`, and its requests fail and are counted as errors.

Output tokens are counted as responses carrying output, one per engine iteration (the LLM-API
model streams each iteration's RequestOutput, `stream_interval: 1`). The text is never tokenized:
the LLM-API model's `text_output` is cumulative (model.py sends `output.text`), so tokenizing each
response, as GenAI-Perf does for delta streams, would count the whole text again every time.

Errors are counted and sampled, never dropped; a request that errors is not completed. An
unreachable server raises `ServerUnreachable` before any request is sent. A frozen server costs
at most one per-request timeout: the first request that times out stops the run (no request is
sent after it; those in flight keep their own timeouts), and `deadline_s` bounds the whole run
(requests still in flight then fail with "deadline"). `settings["stopped"]` says why a run
stopped early.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal

from tritonclient.grpc.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException

from infertune_tuner.errors import InputError
from infertune_tuner.harness.prompts import RequestTemplate
from infertune_tuner.harness.stats import BenchResult, RequestTrace, compute

clock = time.monotonic  # CLOCK_MONOTONIC on Linux: the simulated server's clock too

CLIENT_SATURATED = 0.7  # CPU share above which client queueing starts to show in latencies


class ServerUnreachable(InputError):
    """The server did not answer a liveness check."""


@dataclass(frozen=True)
class LoadSpec:
    url: str
    model: str
    concurrency: int | None = 1  # closed loop: workers; request rate: cap (None = no cap)
    requests: int = 100
    input_tokens: int = 128
    output_tokens: int = 128
    warmup: int = 0
    request_rate: float | None = None
    seed: int = 0
    request_timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    deadline_s: float | None = None  # the whole run, warm-up included

    def validate(self) -> None:
        if self.requests < 1:
            raise InputError("requests must be at least 1")
        if self.concurrency is not None and self.concurrency < 1:
            raise InputError("concurrency must be at least 1")
        if self.request_rate is None and self.concurrency is None:
            raise InputError("closed-loop mode needs a concurrency")
        if self.input_tokens < 1 or self.output_tokens < 1:
            raise InputError("input and output tokens must be at least 1")
        if self.warmup < 0:
            raise InputError("warmup must not be negative")
        if self.request_rate is not None and self.request_rate <= 0:
            raise InputError("request rate must be positive")
        if self.deadline_s is not None and self.deadline_s <= 0:
            raise InputError("the deadline must be positive")

    def settings(self) -> dict[str, Any]:
        return {
            "url": self.url, "model": self.model, "concurrency": self.concurrency,
            "request_rate": self.request_rate, "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens, "warmup": self.warmup,
            "deadline_s": self.deadline_s,
        }  # fmt: skip


# ------------------------------------------------------------------------------ one request


@dataclass
class _Run:
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
    run: _Run,
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
                    return _failed(send, times, _message(err))
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
        raise _StreamBroken(_message(exc)) from None


def _failed(send: float, times: list[float], error: str) -> RequestTrace:
    return RequestTrace(send_s=send, responses=tuple(times), error=error, end_s=clock())


class _Worker:
    """One closed-loop worker: one long-lived stream, one request in flight at a time. Reusing
    the stream keeps per-request client work (and so measurement overhead) small; a broken
    stream fails the request in flight and is reopened for the next."""

    def __init__(self, client: InferenceServerClient, spec: LoadSpec, run: _Run) -> None:
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
    run: _Run | None = None,
) -> RequestTrace:
    """One request on a stream of its own (request-rate mode, where requests overlap)."""
    inputs = template.build(index, spec.seed, spec.input_tokens, spec.output_tokens)
    worker = _Worker(client, spec, run or _Run())
    try:
        return await worker.send(index, inputs)
    finally:
        worker.close()


def _message(exc: BaseException) -> str:
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


# ------------------------------------------------------------------------------ the run


async def _closed_loop(
    workers: list[_Worker],
    spec: LoadSpec,
    template: RequestTemplate,
    first: int,
    count: int,
) -> list[RequestTrace]:
    traces: list[RequestTrace] = []
    next_index = first
    end = first + count

    def build(i: int) -> list[Any]:
        return template.build(i, spec.seed, spec.input_tokens, spec.output_tokens)

    async def work(worker: _Worker) -> None:
        nonlocal next_index
        if next_index >= end or worker.run.stopped:
            return
        i, next_index = next_index, next_index + 1
        inputs = build(i)
        while True:
            pending = asyncio.ensure_future(worker.send(i, inputs))
            # Build the next request while this one is in flight, off the critical path.
            nxt = None
            if next_index < end:
                nxt, next_index = next_index, next_index + 1
                await asyncio.sleep(0)
                next_inputs = build(nxt)
            traces.append(await pending)
            if nxt is None or worker.run.stopped:
                return
            i, inputs = nxt, next_inputs

    await asyncio.gather(*(work(w) for w in workers[: max(1, count)]))
    return traces


async def _request_rate(
    client: InferenceServerClient,
    spec: LoadSpec,
    template: RequestTemplate,
    first: int,
    count: int,
    run: _Run,
) -> list[RequestTrace]:
    assert spec.request_rate is not None
    rng = random.Random(f"arrivals:{spec.seed}:{first}")
    cap = asyncio.Semaphore(spec.concurrency) if spec.concurrency else None
    loop = asyncio.get_running_loop()
    t = loop.time()
    tasks: list[asyncio.Task[RequestTrace]] = []

    async def send(i: int) -> RequestTrace:
        if cap is None:
            return await one_request(client, spec, template, i, run)
        async with cap:
            return await one_request(client, spec, template, i, run)

    for i in range(first, first + count):
        if run.stopped or (run.deadline is not None and clock() >= run.deadline):
            break
        delay = t - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(i)))
        t += rng.expovariate(spec.request_rate)
    return list(await asyncio.gather(*tasks))


async def negotiate(client: InferenceServerClient, model: str) -> RequestTemplate:
    try:
        metadata = await client.get_model_metadata(model)
        config = await client.get_model_config(model)
    except InferenceServerException as exc:
        return RequestTemplate.fallback(_message(exc))
    return RequestTemplate.from_metadata(metadata, int(config.config.max_batch_size))


async def check_live(client: InferenceServerClient, spec: LoadSpec) -> None:
    try:
        live = await client.is_server_live(client_timeout=spec.connect_timeout_s)
    except Exception as exc:
        raise ServerUnreachable(f"cannot reach Triton at {spec.url}: {_message(exc)}") from None
    if not live:
        raise ServerUnreachable(f"Triton at {spec.url} reports it is not live")


async def run_load(
    spec: LoadSpec, on_phase: Callable[[Literal["warm-up", "measuring"]], None] | None = None
) -> BenchResult:
    """Warm up, then drive the measured requests; statistics over the measured ones only.

    ``on_phase`` hears "warm-up" (when there is one) and "measuring" as they begin.
    """
    spec.validate()
    hook = on_phase or (lambda _: None)
    cpu0, wall0 = time.process_time(), clock()
    run = _Run(deadline=wall0 + spec.deadline_s if spec.deadline_s is not None else None)
    async with InferenceServerClient(spec.url) as client:
        await check_live(client, spec)
        template = await negotiate(client, spec.model)
        if spec.request_rate is not None:
            if spec.warmup:
                hook("warm-up")
                await _request_rate(client, spec, template, 0, spec.warmup, run)
            hook("measuring")
            traces = await _request_rate(client, spec, template, spec.warmup, spec.requests, run)
        else:
            # The workers and their streams live across warm-up and measurement, so opening
            # streams is never part of a measured request.
            workers = [_Worker(client, spec, run) for _ in range(spec.concurrency or 1)]
            for w in workers:
                w.open()
            try:
                if spec.warmup:
                    hook("warm-up")
                    await _closed_loop(workers, spec, template, 0, spec.warmup)
                hook("measuring")
                traces = await _closed_loop(workers, spec, template, spec.warmup, spec.requests)
            finally:
                for w in workers:
                    w.close()
    settings = spec.settings()
    cpu = time.process_time() - cpu0
    settings["client_cpu_s"] = cpu
    share = cpu / max(clock() - wall0, 1e-9)
    settings["client_cpu_share"] = share
    if share > CLIENT_SATURATED:
        settings["warning"] = (
            f"the load generator kept a CPU core {share:.0%} busy: latencies may include "
            "client-side queueing (use fewer requests in flight or a faster client machine)"
        )
    if template.metadata_error:
        settings["metadata_error"] = template.metadata_error
    if run.stopped:
        settings["stopped"] = run.stopped
    return compute(traces, settings)


def run_load_sync(spec: LoadSpec) -> BenchResult:
    return asyncio.run(run_load(spec))
