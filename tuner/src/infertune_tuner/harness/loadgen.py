"""Load generator on Triton's bi-directional gRPC streaming (decoupled responses): KServe v2
`ModelStreamInfer` with the protobuf stubs tritonclient ships (protocol.py); tritonclient's aio
client checks liveness and reads the model's metadata.

Modes:

- closed loop (default): `concurrency` workers, each with exactly one request in flight, sending
  the next one the moment the previous one finishes (the tuner drives it at concurrency = max
  batch size);
- request rate: Poisson arrivals at `request_rate` requests/s (exponential gaps, seeded); then
  `concurrency`, when given, caps the requests in flight.

Warm-up requests run first, as a separate phase at the same concurrency, and are left out of
every statistic. A closed-loop worker keeps one stream open and sends its requests on it one at a
time (a request-rate request gets a stream of its own, closed only after its final response); a
request ends with the response flagged `triton_final_response` (every request opts in to
Triton's empty final response), with the requested number of tokens, or, when its stream goes
silent after some tokens, as a short stalled request (stream.py).

Inputs are negotiated from the model's metadata, because Triton rejects inputs a model does not
declare: synthetic prompts go out as a `text_input` string of `input_tokens` words (one token
each, near enough) and, where declared, as `input_ids` INT32 token ids; the output length is
pinned through whichever of `sampling_param_max_tokens` (LLM-API model), `max_tokens` (ensemble)
or `request_output_len` (engine model) exists; `streaming`/`stream` is set to true and
`sampling_param_exclude_input_from_output` too. A model whose metadata cannot be read (unknown
name) gets `text_input` + `max_tokens`, and its requests fail and are counted as errors.

Output tokens are counted from what each response says (tokens.py: `num_output_tokens` or
`output_ids` where the model declares them, else one per response carrying output, and the
result says so). The text is never tokenized: the LLM-API model's `text_output` is cumulative
(model.py sends `output.text`), so tokenizing each response, as GenAI-Perf does for delta
streams, would count the whole text again every time.

Errors are counted and sampled, never dropped; a request that errors is not completed. An
unreachable server raises `ServerUnreachable` before any request is sent. A frozen server costs
at most one per-request timeout: the first request that times out stops the run (no request is
sent after it; those in flight keep their own timeouts), and `deadline_s` bounds the whole run
(requests still in flight then fail with "deadline"). `settings["stopped"]` says why a run
stopped early.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable
from typing import Any, Literal

import grpc
from tritonclient.grpc.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException

from infertune_tuner.errors import InputError
from infertune_tuner.harness.load_spec import LoadSpec, clock
from infertune_tuner.harness.prompts import RequestTemplate
from infertune_tuner.harness.protocol import open_channel
from infertune_tuner.harness.stats import BenchResult, StreamFacts, compute
from infertune_tuner.harness.stream import RunState, Worker, message, one_request
from infertune_tuner.harness.trace import RequestTrace

__all__ = ["LoadSpec", "ServerUnreachable", "negotiate", "one_request", "run_load"]

CLIENT_SATURATED = 0.7  # CPU share above which client queueing starts to show in latencies


class ServerUnreachable(InputError):
    """The server did not answer a liveness check."""


# ------------------------------------------------------------------------------ the run


async def _closed_loop(
    workers: list[Worker],
    spec: LoadSpec,
    template: RequestTemplate,
    first: int,
    count: int,
) -> list[RequestTrace]:
    traces: list[RequestTrace] = []
    next_index = first
    end = first + count

    def build(i: int) -> Any:
        return template.build(i, spec.seed, spec.input_tokens, spec.output_tokens, spec.model)

    async def work(worker: Worker) -> None:
        nonlocal next_index
        if next_index >= end or worker.run.stopped:
            return
        i, next_index = next_index, next_index + 1
        inputs = build(i)
        while True:
            pending = asyncio.ensure_future(worker.send(inputs))
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
    channel: grpc.aio.Channel,
    spec: LoadSpec,
    template: RequestTemplate,
    first: int,
    count: int,
    run: RunState,
) -> list[RequestTrace]:
    assert spec.request_rate is not None
    rng = random.Random(f"arrivals:{spec.seed}:{first}")
    cap = asyncio.Semaphore(spec.concurrency) if spec.concurrency else None
    loop = asyncio.get_running_loop()
    t = loop.time()
    tasks: list[asyncio.Task[RequestTrace]] = []

    async def send(i: int) -> RequestTrace:
        if cap is None:
            return await one_request(channel, spec, template, i, run)
        async with cap:
            return await one_request(channel, spec, template, i, run)

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
        return RequestTemplate.fallback(message(exc))
    return RequestTemplate.from_metadata(metadata, int(config.config.max_batch_size))


async def check_live(client: InferenceServerClient, spec: LoadSpec) -> None:
    try:
        live = await client.is_server_live(client_timeout=spec.connect_timeout_s)
    except Exception as exc:
        raise ServerUnreachable(f"cannot reach Triton at {spec.url}: {message(exc)}") from None
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
    run = RunState(
        deadline=wall0 + spec.deadline_s if spec.deadline_s is not None else None,
        stall_gaps=spec.stall_gaps, stall_ttfts=spec.stall_ttfts, stall_floor_s=spec.stall_floor_s,
    )  # fmt: skip
    async with InferenceServerClient(spec.url) as client:
        await check_live(client, spec)
        template = await negotiate(client, spec.model)
    channel = open_channel(spec.url)
    try:
        traces = await _drive(channel, spec, template, run, hook)
    finally:
        await channel.close()
    settings = spec.settings()
    cpu = time.process_time() - cpu0  # the whole process's: a trial's generator has its own
    settings["client_cpu_s"] = cpu
    settings["client_pid"] = os.getpid()
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
    facts = StreamFacts(
        token_source=template.token_source, tokens_assumed=run.tokens_assumed,
        streams_cancelled=run.streams_cancelled, stall_bound_s=run.stall_bound(),
    )  # fmt: skip
    return compute(traces, settings, facts)


async def _drive(
    channel: grpc.aio.Channel, spec: LoadSpec, template: RequestTemplate, run: RunState,
    hook: Callable[[Literal["warm-up", "measuring"]], None],
) -> list[RequestTrace]:  # fmt: skip
    """Warm-up, then the measured requests (their traces)."""
    if spec.request_rate is not None:
        if spec.warmup:
            hook("warm-up")
            await _request_rate(channel, spec, template, 0, spec.warmup, run)
        hook("measuring")
        return await _request_rate(channel, spec, template, spec.warmup, spec.requests, run)
    # The workers and their streams live across warm-up and measurement, so opening streams is
    # never part of a measured request.
    workers = [
        Worker(channel, spec, run, template.token_source) for _ in range(spec.concurrency or 1)
    ]
    for w in workers:
        w.open()
    try:
        if spec.warmup:
            hook("warm-up")
            await _closed_loop(workers, spec, template, 0, spec.warmup)
        hook("measuring")
        return await _closed_loop(workers, spec, template, spec.warmup, spec.requests)
    finally:
        await asyncio.gather(*(w.close() for w in workers))


def run_load_sync(spec: LoadSpec) -> BenchResult:
    return asyncio.run(run_load(spec))
