"""Each trial's load generator in a process of its own.

A tuner pod runs several trials side by side (packing.py: one per GPU block), as threads of one
Python process. Their load generators would share that process's interpreter lock: one busy
generator (tens of thousands of streamed responses per second at large batches) delays the
others' receive timestamps, and the ITL they measure grows with the number of neighbours, not
with the server. So a trial's load generator runs in a fresh interpreter (`spawn`: nothing of
the parent's threads or gRPC state is inherited), reports its phases back as they begin and
returns its BenchResult; the trial's thread only waits.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import pickle
import queue
from collections.abc import Callable
from typing import Any, Literal

from infertune_tuner.harness.load_spec import LoadSpec
from infertune_tuner.harness.loadgen import run_load
from infertune_tuner.harness.stats import BenchResult

LoadPhase = Literal["warm-up", "measuring"]
_POLL_S = 0.05


class LoadGeneratorDied(RuntimeError):
    """The load generator's process ended without a result."""


def _portable(exc: BaseException) -> BaseException:
    """`exc` if it survives the trip between processes, else a RuntimeError with its text
    (tritonclient's InferenceServerException pickles but cannot be rebuilt)."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def _child(spec: LoadSpec, phases: Any, results: Any) -> None:
    try:
        result = asyncio.run(run_load(spec, on_phase=phases.put))
    except BaseException as exc:  # handed to the trial as it would have been raised there
        results.put(("error", _portable(exc)))
        return
    results.put(("ok", result))


async def run_load_isolated(
    spec: LoadSpec, on_phase: Callable[[LoadPhase], None] | None = None
) -> BenchResult:
    """`run_load(spec)` in a process of its own (see the module doc); raises what it raised."""
    ctx = multiprocessing.get_context("spawn")
    phases, results = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_child, args=(spec, phases, results), daemon=True)
    proc.start()
    try:
        while True:
            _drain(phases, on_phase)
            try:
                kind, value = results.get_nowait()
            except queue.Empty:
                if not proc.is_alive():
                    try:  # it may have put its result just before ending
                        kind, value = results.get(timeout=1.0)
                    except queue.Empty:
                        raise LoadGeneratorDied(
                            f"the load generator exited with code {proc.exitcode} and no result"
                        ) from None
                else:
                    await asyncio.sleep(_POLL_S)
                    continue
            _drain(phases, on_phase)
            if kind == "error":
                raise value
            assert isinstance(value, BenchResult)
            return value
    finally:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)


def _drain(phases: Any, on_phase: Callable[[LoadPhase], None] | None) -> None:
    while True:
        try:
            phase = phases.get_nowait()
        except queue.Empty:
            return
        if on_phase is not None:
            on_phase(phase)
