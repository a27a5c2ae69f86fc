"""The serving runtime: one seam between "a configuration" and "a running server" (see `base`).

`runtime_for(backend)` picks the runtime a backend serves with: the simulated server for
`simulated`, Triton + TensorRT-LLM otherwise. The tuner's triton backend and the operator's
serving Deployment both render and launch through it.
"""

from __future__ import annotations

from infertune_tuner.runtime.base import (
    SERVED_MODEL,
    PodShape,
    Ports,
    ServingRuntime,
    TrialRuntime,
)
from infertune_tuner.runtime.simulated import SimulatedRuntime
from infertune_tuner.runtime.triton import TritonRuntime


def runtime_for(backend: str) -> ServingRuntime:
    """The runtime that serves what `backend` tunes."""
    return SimulatedRuntime() if backend == "simulated" else TritonRuntime()


__all__ = [
    "SERVED_MODEL",
    "PodShape",
    "Ports",
    "ServingRuntime",
    "SimulatedRuntime",
    "TrialRuntime",
    "TritonRuntime",
    "runtime_for",
]
