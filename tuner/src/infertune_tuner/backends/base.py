"""The one small interface every benchmark backend implements (think an HTTP transport).

A backend is built for one TuningRequest (model, GPU, workload, checkpoints) and measures one
configuration per `run` call. It never raises for a failed trial: an OOM or a crash is a
Measurement with status `oom`/`error` and a reason. It raises InputError only for bad set-up
(missing replay file, unknown backend).
"""

from __future__ import annotations

from collections.abc import Callable
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
    # runs 50x faster). The plausibility guard scales its bound by it (search/evidence.py, judge).
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
