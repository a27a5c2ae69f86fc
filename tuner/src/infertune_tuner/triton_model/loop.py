"""The continuous-batching loop of infertune's Python-backend model (no Triton import: testable).

One thread runs engine steps, as TensorRT-LLM's executor does: admit what fits (the simulated
engine's rules: max batch, KV-cache pages, the step's token budget), run the step on the body,
hand every active sequence its next token. Requests arrive from Triton's `execute` threads
through `submit`; tokens leave through the `on_token` / `on_error` callbacks, called from the
loop thread (decoupled Python-backend models may send from any thread).
"""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from infertune_tuner.harness.engine import Engine, Sequence


class Body(Protocol):
    """What runs one engine step (see `bodies`)."""

    def step(self, engine: Engine, admitted: list[Sequence]) -> None:
        """Run the step over `engine.active` (`admitted`: the sequences that entered it, whose
        prompts are prefilled in it); returns when the step's tokens exist."""
        ...

    def release(self, seq: Sequence) -> None:
        """`seq` left the batch (finished or failed): free what it held."""
        ...


OnToken = Callable[[Sequence, bool], None]  # (the sequence, its handle and counts; final)
OnError = Callable[[Any, str], None]


@dataclass
class _Incoming:
    handle: Any
    input_tokens: int
    max_tokens: int
    received_s: float  # when Triton handed it over (time.monotonic: the client's clock too)


class ServingLoop:
    """The engine, its body and the thread that steps them."""

    def __init__(self, engine: Engine, body: Body, on_token: OnToken, on_error: OnError) -> None:
        self.engine, self.body = engine, body
        self.on_token, self.on_error = on_token, on_error
        self._incoming: list[_Incoming] = []
        self._open: dict[int, Any] = {}  # id(handle) -> handle: submitted, not yet answered
        self._cv = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="infertune-engine", daemon=True)
        self.failure: BaseException | None = None

    def start(self) -> ServingLoop:
        self._thread.start()
        return self

    def submit(self, handle: Any, input_tokens: int, max_tokens: int) -> None:
        with self._cv:
            if self.failure is not None:  # nothing steps any more: answer at once
                failure = self.failure
                self.on_error(handle, f"the model's engine stopped: {type(failure).__name__}: "
                                      f"{failure}")  # fmt: skip
                return
            self._incoming.append(_Incoming(handle, input_tokens, max_tokens, time.monotonic()))
            self._open[id(handle)] = handle
            self._cv.notify()

    def stop(self, timeout_s: float = 10.0) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join(timeout_s)

    def _take_incoming(self) -> bool:
        """Move arrived requests into the engine; False when the loop should end."""
        with self._cv:
            while not self._stopping and not self._incoming and not self.engine.has_work():
                self._cv.wait()
            if self._stopping:
                return False
            arrived, self._incoming = self._incoming, []
        for r in arrived:
            seq = Sequence(r.input_tokens, r.max_tokens, handle=r.handle, received_s=r.received_s)
            error = self.engine.submit(seq)
            if error is not None:
                self._open.pop(id(r.handle), None)
                self.on_error(r.handle, error)
        return True

    def _run(self) -> None:
        try:
            while self._take_incoming():
                admitted = self.engine.admit()
                if not self.engine.active:
                    continue
                self.body.step(self.engine, admitted)
                self.engine.steps_run += 1
                for emitted in self.engine.end_step(time.monotonic()):
                    if emitted.final:
                        self.body.release(emitted.seq)
                    self.on_token(emitted.seq, emitted.final)
                    if emitted.final:  # answered only once its last response went out
                        self._open.pop(id(emitted.seq.handle), None)
        except BaseException as exc:  # the body broke: fail what is in flight, say why
            with self._cv:
                self.failure = exc
            message = f"the model's engine stopped: {type(exc).__name__}: {exc}"
            with self._cv:  # every request not yet answered, wherever it was, gets the reason
                unanswered, self._open, self._incoming = list(self._open.values()), {}, []
            for handle in unanswered:
                with contextlib.suppress(Exception):  # the sender itself may be what broke
                    self.on_error(handle, message)
            traceback.print_exc()  # into the server's log, with the stub's other output


class SimulatedBody:
    """A step lasts what the performance model says (the engine's `modelled_seconds`), kept on a
    running deadline so that sleeping late once does not slow every later step. A step that
    follows an idle engine (every sequence in it was admitted in it) starts its clock when it
    starts, as a real engine's would: catching up would shorten the TTFT of a request that
    arrives soon after the previous batch drained by however late it came (the same modelled
    server would then answer a slower client faster), and the engine's own virtual-time run
    (`engine.modelled_steady_state`) idles until the next arrival too."""

    RESYNC_S = 0.05  # a step that starts this late restarts the clock instead of catching up

    def __init__(self) -> None:
        self._due = 0.0

    def step(self, engine: Engine, admitted: list[Sequence]) -> None:
        now = time.monotonic()
        if now - self._due > self.RESYNC_S or len(admitted) == len(engine.active):
            self._due = now
        self._due += engine.modelled_seconds(admitted)
        delay = self._due - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def release(self, seq: Sequence) -> None:
        """Nothing held beyond the engine's own KV accounting."""
