"""Benchmark backends: `simulated`, `replay:PATH`, `triton` (see base.BenchmarkBackend)."""

from __future__ import annotations

from pathlib import Path

from infertune_tuner.backends.base import BenchmarkBackend, OnPhase
from infertune_tuner.errors import InputError
from infertune_tuner.packing import GpuSet
from infertune_tuner.request import TuningRequest

BACKEND_HELP = "simulated | simulated:perturbed | world:FAMILY | replay:PATH | triton"


def make_backend(
    spec: str,
    request: TuningRequest,
    *,
    seed: int = 0,
    server_command: str | None = None,
    workdir: Path | None = None,
    on_phase: OnPhase | None = None,
    gpus: GpuSet | None = None,
) -> BenchmarkBackend:
    """Build the backend a `--backend` string names (``on_phase``: see ``base.Phase``;
    ``gpus``: the worker's GPU set the triton backend's trials are packed into)."""
    if spec == "simulated":
        from infertune_tuner.backends.simulated import SimulatedBackend

        return SimulatedBackend(request, seed=seed)
    if spec == "simulated:perturbed":
        # A pool whose efficiency differs from the prior's: shows the model being corrected.
        from infertune_tuner.backends.simulated import SimulatedBackend

        return SimulatedBackend.perturbed(request, seed=seed)
    if spec.startswith("world:"):
        # A pool whose behaviour differs in form from the model (see infertune_tuner.backends.worlds).
        from infertune_tuner.backends.worlds import WorldBackend

        return WorldBackend(request, spec.removeprefix("world:"), seed=seed)
    if spec.startswith("replay:"):
        from infertune_tuner.backends.replay import ReplayBackend

        path = spec.removeprefix("replay:")
        if not path:
            raise InputError("replay backend needs a table: --backend replay:PATH.csv")
        return ReplayBackend(Path(path))
    if spec == "triton":
        from infertune_tuner.backends.triton import TritonBackend

        return TritonBackend(
            request, server_command=server_command, workdir=workdir, on_phase=on_phase, gpus=gpus
        )
    raise InputError(f"unknown backend {spec!r}; use {BACKEND_HELP}")


__all__ = ["BACKEND_HELP", "BenchmarkBackend", "OnPhase", "make_backend"]
