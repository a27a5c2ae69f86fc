"""The simulated engine: continuous (in-flight) batching driven by the performance model (pure).

One engine step, as TensorRT-LLM's scheduler runs it:

1. admit waiting requests (FIFO) while fewer than `max_batch_size` are active, the KV cache
   can reserve their full context (input + max output tokens, whole 32-token pages) and their
   prompts fit the step's token budget (`max_num_tokens` minus one token per decoding
   sequence; a single longer prompt is still admitted, as chunked prefill would); the rest wait,
2. step time = `decode_ms(active, avg context)` + `prefill_ms(input)` of every request admitted
   in this step (their prefill runs inside the step and stalls everyone else's next token), plus
   `context_step_overhead_ms` when it admitted any (such a step runs without CUDA graphs),
3. at the end of the step every active sequence has one more token (an admitted request's first
   token comes out of its prefill); finished sequences leave and free their KV pages.

`time_scale` multiplies every duration (0.1 = ten times faster than the modelled GPU).

The same core drives the simulated Triton server in real time (`simserver`) and, in virtual time,
`modelled_steady_state`, the reference the load generator's accuracy is judged against.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from infertune_tuner.catalog.gpus import Gpu
from infertune_tuner.catalog.llms import ModelArch
from infertune_tuner.config import TrialConfig, Workload
from infertune_tuner.harness.stats import BenchResult, compute
from infertune_tuner.harness.trace import RequestTrace
from infertune_tuner.perfmodel.latency import StepModel
from infertune_tuner.perfmodel.memory import (
    DEFAULT_MAX_NUM_TOKENS,
    GIB,
    KV_PAGE_TOKENS,
    estimate_memory,
)


@dataclass(eq=False, slots=True)
class Sequence:
    """One request inside the engine. `handle` is whatever the caller needs to answer it."""

    input_tokens: int
    max_tokens: int
    handle: Any = None
    received_s: float = 0.0
    generated: int = 0
    reserved_tokens: int = 0
    first_token_s: float | None = None
    cancelled: bool = False

    @property
    def context(self) -> int:
        return self.input_tokens + self.generated

    @property
    def finished(self) -> bool:
        return self.generated >= self.max_tokens


@dataclass(frozen=True, slots=True)
class Emitted:
    seq: Sequence
    final: bool


def _pages(tokens: int) -> int:
    return math.ceil(tokens / KV_PAGE_TOKENS) * KV_PAGE_TOKENS


def kv_capacity_tokens(model: ModelArch, gpu: Gpu, cfg: TrialConfig) -> int:
    """Tokens the KV cache holds per GPU under the memory model (0 when the weights don't fit)."""
    est = estimate_memory(model, gpu, cfg, Workload(1, 1))
    if est.kv_bytes_per_token_per_gpu <= 0:
        return 0
    return int(est.usable_kv_gib_per_gpu * GIB // est.kv_bytes_per_token_per_gpu)


def oom_message(model: ModelArch, gpu: Gpu, cfg: TrialConfig) -> str | None:
    """A CUDA-OOM-like message when the weights (plus activations and reserve) exceed memory."""
    est = estimate_memory(model, gpu, cfg, Workload(1, 1))
    need = est.weights_gib_per_gpu + est.activations_gib_per_gpu + est.reserve_gib_per_gpu
    if need < gpu.memory_gib:
        return None
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        f"{est.weights_gib_per_gpu:.2f} GiB. GPU 0 has a total capacity of {gpu.memory_gib:.2f} "
        f"GiB. (simulated: {model.key} {cfg.quantization} weights need "
        f"{est.weights_gib_per_gpu:.1f} GiB per GPU at tp{cfg.tp}, activations "
        f"{est.activations_gib_per_gpu:.1f} GiB, reserve {est.reserve_gib_per_gpu:.1f} GiB)"
    )


@dataclass
class Engine:
    steps: StepModel
    max_batch_size: int
    kv_capacity: int  # tokens
    time_scale: float = 1.0
    max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS
    waiting: deque[Sequence] = field(default_factory=deque)
    active: list[Sequence] = field(default_factory=list)
    reserved: int = 0
    steps_run: int = 0

    @classmethod
    def for_config(
        cls, model: ModelArch, gpu: Gpu, cfg: TrialConfig, time_scale: float = 1.0
    ) -> Engine:
        return cls(
            steps=StepModel(model, gpu, cfg),
            max_batch_size=cfg.max_batch_size,
            kv_capacity=kv_capacity_tokens(model, gpu, cfg),
            time_scale=time_scale,
        )

    def submit(self, seq: Sequence) -> str | None:
        """Queue a request; returns an error message instead when it can never be served."""
        need = _pages(seq.input_tokens + seq.max_tokens)
        if need > self.kv_capacity:
            return (
                f"request needs {need} KV-cache tokens ({seq.input_tokens} input + "
                f"{seq.max_tokens} output), more than the cache holds ({self.kv_capacity})"
            )
        if seq.max_tokens < 1:
            return "max_tokens must be at least 1"
        seq.reserved_tokens = need
        self.waiting.append(seq)
        return None

    def has_work(self) -> bool:
        return bool(self.active) or any(not s.cancelled for s in self.waiting)

    def _drop_cancelled(self) -> None:
        if any(s.cancelled for s in self.active):
            for s in self.active:
                if s.cancelled:
                    self.reserved -= s.reserved_tokens
            self.active = [s for s in self.active if not s.cancelled]
        if any(s.cancelled for s in self.waiting):
            self.waiting = deque(s for s in self.waiting if not s.cancelled)

    def begin_step(self) -> tuple[float, list[Sequence]]:
        """Admit what fits and return (step duration in seconds, the admitted sequences)."""
        admitted = self.admit()
        if not self.active:
            return 0.0, admitted
        self.steps_run += 1
        return self.modelled_seconds(admitted), admitted

    def admit(self) -> list[Sequence]:
        """Admit what fits (step 1 above) and return the admitted sequences. A server that runs
        real compute (triton_model's PyTorch body) schedules with this and times the step itself."""
        self._drop_cancelled()
        admitted: list[Sequence] = []
        budget = self.max_num_tokens - len(self.active)
        while self.waiting and len(self.active) < self.max_batch_size:
            head = self.waiting[0]
            if self.reserved + head.reserved_tokens > self.kv_capacity:
                break  # FIFO: the head waits for pages, and so does everyone behind it
            if admitted and head.input_tokens > budget:
                break  # this step's token budget is spent: the head goes in the next step
            budget -= head.input_tokens
            self.waiting.popleft()
            self.reserved += head.reserved_tokens
            self.active.append(head)
            admitted.append(head)
        return admitted

    def modelled_seconds(self, admitted: list[Sequence]) -> float:
        """The performance model's duration of the step that runs the active batch (step 2)."""
        if not self.active:
            return 0.0
        avg_ctx = sum(s.context for s in self.active) / len(self.active)
        ms = self.steps.decode_ms(len(self.active), avg_ctx)
        if admitted:
            ms += sum(self.steps.prefill_ms(s.input_tokens) for s in admitted)
            ms += self.steps.context_step_overhead_ms
        return ms / 1e3 * self.time_scale

    def end_step(self, now_s: float) -> list[Emitted]:
        """Every active sequence gets its next token; finished ones leave the batch."""
        out: list[Emitted] = []
        keep: list[Sequence] = []
        for s in self.active:
            if s.cancelled:
                self.reserved -= s.reserved_tokens
                continue
            s.generated += 1
            if s.first_token_s is None:
                s.first_token_s = now_s
            if s.finished:
                self.reserved -= s.reserved_tokens
                out.append(Emitted(s, True))
            else:
                keep.append(s)
                out.append(Emitted(s, False))
        self.active = keep
        return out


CLIENT_TURNAROUND_S = 50e-6  # a fast client on the same host: response in, next request out


def modelled_steady_state(
    model: ModelArch,
    gpu: Gpu,
    cfg: TrialConfig,
    workload: Workload,
    concurrency: int,
    requests: int,
    *,
    warmup: int = 0,
    client_turnaround_s: float = CLIENT_TURNAROUND_S,
    on_step: Callable[[float], None] | None = None,
) -> BenchResult:
    """What a client measures against the simulated server, in virtual time through the same
    engine: a closed loop of `concurrency` clients, each sending its next request
    `client_turnaround_s` after the previous one's last token (the first `warmup` requests are
    left out of the statistics, as the load generator leaves them out). This is the reference the
    load generator's accuracy benchmark judges it against.

    The turnaround matters for TTFT: any delay at all (a real client's round trip) makes a
    returning request miss the step that begins as its predecessor finishes, which is how a real
    engine behaves and what the performance model assumes; with zero turnaround requests would
    rejoin that very step and TTFT would halve."""
    engine = Engine.for_config(model, gpu, cfg)
    now = 0.0
    issued = 0
    traces: list[RequestTrace] = []
    token_times: dict[int, list[float]] = {}
    sends: dict[int, float] = {}
    arrivals: list[tuple[float, int]] = []  # (time, request id), a heap

    def issue(at: float) -> None:
        nonlocal issued
        rid = issued
        issued += 1
        sends[rid] = at
        token_times[rid] = []
        heapq.heappush(arrivals, (at, rid))

    def admit_arrived() -> None:
        while arrivals and arrivals[0][0] <= now:
            at, rid = heapq.heappop(arrivals)
            seq = Sequence(workload.input_tokens, workload.output_tokens, handle=rid, received_s=at)
            err = engine.submit(seq)
            if err is not None:
                traces.append(RequestTrace(send_s=at, error=err, end_s=at))

    for _ in range(min(concurrency, requests + warmup)):
        issue(now)
    while engine.has_work() or arrivals:
        admit_arrived()
        if not engine.has_work():
            now = arrivals[0][0]  # idle until the next request arrives
            continue
        dur, _ = engine.begin_step()
        now += dur
        if on_step is not None:
            on_step(dur)
        for em in engine.end_step(now):
            rid = em.seq.handle
            token_times[rid].append(now)
            if em.final:
                trace = RequestTrace(send_s=sends[rid], responses=tuple(token_times[rid]))
                if rid >= warmup:
                    traces.append(trace)
                if issued < requests + warmup:
                    issue(now + client_turnaround_s)
    settings = {
        "concurrency": concurrency,
        "modelled": True,
        "output_tokens": workload.output_tokens,
    }
    return compute(traces, settings)
