"""The one small interface every benchmark backend implements (think an HTTP transport).

A backend is built for one TuningRequest (model, GPU, workload, checkpoints) and measures one
configuration per `run` call. It never raises for a failed trial: an OOM or a crash is a
Measurement with status `oom`/`error` and a reason. It raises InputError only for bad set-up
(missing replay file, unknown backend).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement, TrialPhase

# Hears each phase of a long trial as it begins (a backend that measures at once reports none).
OnPhase = Callable[[TrialConfig, TrialPhase], None]


@runtime_checkable
class BenchmarkBackend(Protocol):
    name: str
    # How many times faster than the modelled GPU this backend's clock runs: 1.0 for a real
    # server and for modelled numbers; 1 / time scale for a time-scaled simulated server (0.02
    # runs 50x faster). The plausibility guard scales its bound by it (search/plausibility.py).
    speedup: float

    def run(self, config: TrialConfig, *, repeat: int = 0) -> Measurement:
        """Deploy `config`, drive the workload at concurrency = max batch, measure, tear down.

        `repeat` is how many times the study already measured `config` (0: its first run). A
        simulated pool draws that run's noise from it, so a confirmation after a resume or in
        another worker is a new measurement, as on real GPUs; a real backend ignores it (every
        run is new)."""
        ...

    def close(self) -> None:
        """Release what the backend holds (servers, files)."""
        ...


# A server launched for max batch B also shows what every max batch b < B does: TensorRT-LLM's
# in-flight batcher schedules at most the requests in flight, so a closed loop of b clients on
# it is the engine built for b ("set high enough max_batch_size when building the engine ... and
# use runtime max_batch_size to tune it without re-building the engine", TensorRT-LLM's
# performance best practices). A launch (engine build or load, server start: minutes) costs far
# more than a measurement (a workload at one concurrency: tens of seconds), so a trial measures
# a few lower rungs of its batch ladder on the server it already has.


@dataclass(frozen=True, slots=True)
class Rung:
    """A lower max batch to measure on a launched server: a closed loop of `batch` clients.
    `repeat`: how many times the study already measured that configuration (Protocol.run)."""

    batch: int
    repeat: int = 0


@dataclass(frozen=True)
class Sweep:
    """One launch's measurements: the launched configuration at its own concurrency (`first`),
    then each rung's, by batch (none when `first` failed: there was no server to measure)."""

    first: Measurement
    lower: dict[int, Measurement] = field(default_factory=dict)


@runtime_checkable
class Sweeps(Protocol):
    """A backend that measures lower rungs on one launch. A backend without `sweep` measures one
    configuration per launch, and the search asks it for no rungs."""

    def sweep(self, config: TrialConfig, *, repeat: int = 0, lower: Sequence[Rung] = ()) -> Sweep:
        """Deploy `config`, measure it at concurrency = max batch, then on the same server at
        each rung's concurrency (while the server lasts), tear down."""
        ...


def sweep_each(
    backend: BenchmarkBackend, config: TrialConfig, repeat: int, lower: Sequence[Rung]
) -> Sweep:
    """`Sweeps.sweep` for a backend whose every configuration is its own model of the pool
    (modelled, replayed or simulated numbers, no server): a rung is that configuration's run."""
    first = backend.run(config, repeat=repeat)
    if first.status != "ok":
        return Sweep(first)
    return Sweep(
        first,
        {
            r.batch: backend.run(replace(config, max_batch_size=r.batch), repeat=r.repeat)
            for r in lower
        },
    )
