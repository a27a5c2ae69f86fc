"""Benchmark backends: `simulated`, `replay:PATH`, `triton` (see base.BenchmarkBackend)."""

from __future__ import annotations

from pathlib import Path

from infertune_tuner.backends.base import BenchmarkBackend, OnPhase
from infertune_tuner.errors import InputError
from infertune_tuner.packing import GpuSet
from infertune_tuner.request import TuningRequest

BACKEND_HELP = (
    "simulated | simulated:perturbed | replay:PATH | triton | triton:simulated | triton:torch"
    " (several pools: replay:PRODUCT=PATH,PRODUCT=PATH)"
)


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
    if request.gpu.pools:  # several pools: a backend per pool (backends/per_pool.py)
        from infertune_tuner.backends.per_pool import per_pool

        return per_pool(spec, request, lambda s, r, i: make_backend(s, r, seed=i), seed)
    if spec == "simulated":
        from infertune_tuner.backends.simulated import SimulatedBackend

        return SimulatedBackend(request, seed=seed)
    if spec == "simulated:perturbed":
        # A pool whose efficiency differs from the prior's: shows the model being corrected.
        from infertune_tuner.backends.simulated import SimulatedBackend

        return SimulatedBackend.perturbed(request, seed=seed)
    if spec.startswith("replay:"):
        from infertune_tuner.backends.replay import ReplayBackend

        path = spec.removeprefix("replay:")
        if not path:
            raise InputError("replay backend needs a table: --backend replay:PATH.csv")
        return ReplayBackend(Path(path))
    if spec == "triton":
        from infertune_tuner.backends.triton import TritonBackend

        backend = TritonBackend(
            request, server_command=server_command, workdir=workdir, on_phase=on_phase, gpus=gpus
        )
        backend.preflight()  # one clear error before the first trial, not three failed trials
        return backend
    if spec.startswith("triton:"):
        # A real tritonserver on this machine (the nvidia-pytriton wheel) serving infertune's
        # Python-backend model with the body named after the colon (runtime/local_triton.py).
        from infertune_tuner.backends.triton import TritonBackend
        from infertune_tuner.runtime.local_triton import LocalTritonRuntime
        from infertune_tuner.triton_model.spec import BODIES

        body = spec.removeprefix("triton:")
        if body not in BODIES:
            raise InputError(f"unknown model body {body!r} in {spec!r}; use {BACKEND_HELP}")
        if server_command is not None:
            raise InputError(f"--server-command replaces the server; {spec} brings its own")
        if body == "torch":
            runtime = LocalTritonRuntime(body="torch")
        else:  # the simulated backend's clock knob (INFERTUNE_SIMULATED_TIME_SCALE) applies
            from infertune_tuner.backends.simulated import time_scale_from_env

            scale = time_scale_from_env()
            runtime = LocalTritonRuntime(body="simulated", time_scale=scale if scale > 0 else 1.0)
        backend = TritonBackend(
            request, runtime=runtime, workdir=workdir, on_phase=on_phase, gpus=gpus
        )
        backend.preflight()
        return backend
    raise InputError(f"unknown backend {spec!r}; use {BACKEND_HELP}")


__all__ = ["BACKEND_HELP", "BenchmarkBackend", "OnPhase", "make_backend"]
