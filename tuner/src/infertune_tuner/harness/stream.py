"""One streaming request on Triton's decoupled gRPC API (KServe v2 `ModelStreamInfer`, protocol.py).

A closed-loop `Worker` keeps one stream open and sends its requests on it one at a time;
`one_request` opens a stream for a single request (request-rate mode) and closes it only after
the request's final response: half-closed, read to its end, cancelled only when the end does not
come (`RunState.streams_cancelled` counts those).

A request ends with the response Triton flags `triton_final_response`, which every request
opts in to receive even when the model ends the request with the final flag alone (Triton's
empty final response), or once the requested number of tokens has arrived. Each response's
tokens are counted from what it says (tokens.py). A request that has streamed tokens and then
goes silent **stalls**: once no response has come for `RunState.stall_bound()` (a few times the
longest gap between responses, and twice the median TTFT, seen in the run so far: never less
than a floor) it ends as a short, stalled request, and its stream is cancelled. Before the first token
only the per-request timeout applies: queueing may keep a request waiting for as long as the
server has requests ahead of it. A broken stream, an error response or a timeout fails the
request (counted, never raised); the run's `RunState` carries its deadline, what it learnt about
the server's pace, and why it stopped early.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from dataclasses import dataclass, field
from typing import Any

import grpc
from tritonclient.utils import InferenceServerException

from infertune_tuner.harness.load_spec import (
    STALL_FLOOR_S,
    STALL_GAPS,
    STALL_TTFTS,
    LoadSpec,
    clock,
)
from infertune_tuner.harness.prompts import RequestTemplate
from infertune_tuner.harness.protocol import Stream, is_final
from infertune_tuner.harness.tokens import TokenSource, count
from infertune_tuner.harness.trace import RequestTrace

# The stall bound (LoadSpec.stall_gaps, stall_ttfts, stall_floor_s). A healthy request's longest
# silence is one engine step with other requests' prefills in it. The run has seen such steps as
# gaps (STALL_GAPS = 4 times the longest gap), and every TTFT contains one whole admission step,
# which is such a step (STALL_TTFTS = 2 times the median TTFT: the bound before the run has seen
# a step full of prefills as a gap). STALL_FLOOR_S = 1 s keeps a client or server hiccup of a
# fraction of a second from cutting a healthy request short. TensorRT-LLM's default capacity
# scheduler (GUARANTEED_NO_EVICT) never pauses a running request, so nothing healthy stays
# silent for longer.
RESCHEDULE_SHARE = 0.1  # a silence ends as a stall after 1 to 1.1 times the bound


@dataclass
class RunState:
    """What every request of one run shares: the deadline, the server's pace as seen so far (for
    the stall bound), the stream tallies, and why the run stopped early."""

    deadline: float | None = None  # clock() time
    stopped: str | None = None
    stall_gaps: float = STALL_GAPS
    stall_ttfts: float = STALL_TTFTS
    stall_floor_s: float = STALL_FLOOR_S
    longest_gap_s: float = 0.0  # between two responses carrying tokens, any request
    tokens_assumed: int = 0  # responses counted as one token: the declared count was missing
    streams_cancelled: int = 0  # streams that did not end by themselves after their requests
    _ttfts: list[float] = field(default_factory=list)  # sorted
    _bound: float = field(init=False)

    def timeout(self, per_request: float) -> tuple[float, bool]:
        """(seconds this request may take, whether the run's deadline is what limits it)."""
        if self.deadline is None:
            return per_request, False
        left = max(self.deadline - clock(), 0.0)
        return (left, True) if left < per_request else (per_request, False)

    def __post_init__(self) -> None:
        self._bound = self.stall_floor_s

    def first_token(self, ttft_s: float) -> None:
        bisect.insort(self._ttfts, ttft_s)
        self._update()

    def gap(self, gap_s: float) -> None:
        if gap_s > self.longest_gap_s:
            self.longest_gap_s = gap_s
            self._update()

    def stall_bound(self) -> float:
        """How long a request that has streamed tokens may stay silent (seconds)."""
        return self._bound

    def _update(self) -> None:
        median = self._ttfts[len(self._ttfts) // 2] if self._ttfts else 0.0
        self._bound = max(
            self.stall_gaps * self.longest_gap_s, self.stall_ttfts * median, self.stall_floor_s
        )


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


@dataclass
class _Reading:
    """One request's responses as they arrive."""

    send: float
    times: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    tokens: int = 0

    def trace(self, **kw: Any) -> RequestTrace:
        ones = all(k == 1 for k in self.counts)
        return RequestTrace(
            send_s=self.send, responses=tuple(self.times),
            tokens=None if ones else tuple(self.counts), **kw,
        )  # fmt: skip


async def _collect(
    stream: Stream, request_id: str, spec: LoadSpec, send: float, run: RunState,
    source: TokenSource,
) -> RequestTrace:  # fmt: skip
    """Read one request's responses off a stream: until the final flag, an error, the requested
    number of tokens, a stall or the timeout."""
    r = _Reading(send)
    limit, by_deadline = run.timeout(spec.request_timeout_s)
    loop = asyncio.get_running_loop()
    hard = loop.time() + limit
    stall_due: float | None = None  # the stall deadline the window is set to, once a token came
    try:
        async with asyncio.timeout_at(hard) as window:
            while True:
                message_ = await stream.receive()
                now = clock()
                if message_ is None:
                    raise _StreamBroken("stream closed before the last response")
                response = message_.infer_response
                if response.id and response.id != request_id:
                    continue  # a late response of an earlier request on this stream
                if message_.error_message:
                    return _failed(send, r.times, _text(message_.error_message))
                k = count(response, source)
                if k is None:
                    k = 1
                    run.tokens_assumed += 1
                if k > 0:
                    if r.times:
                        run.gap(now - r.times[-1])
                    else:
                        run.first_token(now - send)
                    r.times.append(now)
                    r.counts.append(k)
                    r.tokens += k
                    # Move the window only when it would close within the bound, then a tenth
                    # beyond it: a timer per response costs more CPU than the response itself.
                    bound = run.stall_bound()
                    at = loop.time()
                    if stall_due is None or at + bound > stall_due:
                        stall_due = min(hard, at + (1 + RESCHEDULE_SHARE) * bound)
                        window.reschedule(stall_due)
                if is_final(response):
                    return r.trace(server=_server_times(response.parameters))
                if r.tokens >= spec.output_tokens:
                    return r.trace()
    except TimeoutError:
        if r.times and stall_due is not None and stall_due < hard:
            return r.trace(stalled=True, end_s=clock())
        if by_deadline:
            run.stopped = run.stopped or f"the run's deadline ({spec.deadline_s:g} s) passed"
            raise _StreamBroken(f"deadline reached ({r.tokens} tokens received)") from None
        run.stopped = run.stopped or (
            f"a request timed out after {spec.request_timeout_s:g} s: the server stopped "
            "answering, no further request was sent"
        )
        raise _StreamBroken(
            f"timeout after {spec.request_timeout_s:g} s ({r.tokens} tokens received)"
        ) from None
    except _StreamBroken:
        raise
    except Exception as exc:  # grpc.aio.AioRpcError and friends: count, never crash the run
        raise _StreamBroken(message(exc)) from None


def _failed(send: float, times: list[float], error: str) -> RequestTrace:
    return RequestTrace(send_s=send, responses=tuple(times), error=error, end_s=clock())


class Worker:
    """One closed-loop worker: one long-lived stream, one request in flight at a time. Reusing
    the stream keeps per-request client work (and so measurement overhead) small; a stream
    whose request failed or stalled is cancelled (abandoning the request) and reopened for the
    next."""

    def __init__(
        self, channel: grpc.aio.Channel, spec: LoadSpec, run: RunState,
        source: TokenSource = TokenSource.RESPONSES,
    ) -> None:  # fmt: skip
        self.channel = channel
        self.spec = spec
        self.run = run
        self.source = source
        self._stream: Stream | None = None

    def open(self) -> Stream:
        if self._stream is None:
            self._stream = Stream(self.channel)
        return self._stream

    async def send(self, request: Any) -> RequestTrace:
        stream = self.open()
        send = clock()
        try:
            await stream.send(request)
            trace = await _collect(stream, request.id, self.spec, send, self.run, self.source)
        except _StreamBroken as exc:
            self.abandon()
            return _failed(send, [], str(exc))
        except Exception as exc:  # the write itself failed: the stream is gone
            self.abandon()
            return _failed(send, [], message(exc))
        if not trace.ok:
            self.abandon()
        return trace

    def abandon(self) -> None:
        """Cancel the stream and every request still on it."""
        if self._stream is not None:
            self._stream.cancel()
        self._stream = None

    async def close(self) -> None:
        """End the stream once every request on it has had its final response (cancelled when
        that does not come within the stall bound)."""
        stream, self._stream = self._stream, None
        if stream is not None and not await stream.close(self.run.stall_bound()):
            self.run.streams_cancelled += 1


async def one_request(
    channel: grpc.aio.Channel,
    spec: LoadSpec,
    template: RequestTemplate,
    index: int,
    run: RunState | None = None,
) -> RequestTrace:
    """One request on a stream of its own (request-rate mode, where requests overlap), closed
    after its final response."""
    request = template.build(index, spec.seed, spec.input_tokens, spec.output_tokens, spec.model)
    worker = Worker(channel, spec, run or RunState(), template.token_source)
    try:
        return await worker.send(request)
    finally:
        await worker.close()


def _text(raw: str) -> str:
    return " ".join(raw.split())[:300] or "error response"


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
    return _text(str(text)) or type(exc).__name__
