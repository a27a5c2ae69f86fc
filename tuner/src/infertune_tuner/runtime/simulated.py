"""The simulated server as a runtime: `infertune simserver` (KServe v2 gRPC, the performance model
behind it) in place of Triton, with Triton's ports and health endpoints and no GPU.

It stands in for Triton wherever one cannot run: the operator's `simulated` backend serves with
it, and the harness's tests run real trials (process group, readiness, load, teardown) against
it. Its repository files are Triton's (the simulated Deployment carries the repository the real
one would load); the server itself reads none of them. It runs on the operator image, whose user
is the numeric non-root 10001.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from infertune_tuner.config import TrialConfig
from infertune_tuner.request import TuningRequest
from infertune_tuner.runtime.base import SERVED_MODEL, PlainServer, PodShape, Ports
from infertune_tuner.runtime.triton import repository_files
from infertune_tuner.runtime.weights import unloaded_path


@dataclass(frozen=True)
class SimulatedRuntime(PlainServer):
    """`infertune simserver` for one configuration.

    `program` is how to start it (tests use ``[sys.executable, "-m",
    "infertune_tuner.cli.simserver"]``), `time_scale` multiplies every modelled duration.
    """

    name: str = "simulated"
    program: tuple[str, ...] = ("infertune", "simserver")
    time_scale: float = 1.0

    def problems(self, request: TuningRequest) -> list[str]:
        """None: the simulated server is infertune itself."""
        return []

    def model_files(self, request: TuningRequest, config: TrialConfig) -> dict[str, str]:
        """Triton's files; a quantization without a checkpoint points at the base model (the
        simulated server loads no weights)."""
        return repository_files(request, config, unloaded_path(request, config))

    def launch_argv(
        self, request: TuningRequest, config: TrialConfig, *, repo_dir: str, ports: Ports,
        host: str = "0.0.0.0",
    ) -> list[str]:  # fmt: skip
        argv = [
            *self.program, "--host", host, "--port", str(ports.grpc),
            "--http-port", str(ports.http), "--metrics-port", str(ports.metrics),
            "--model", request.model.name,
            "--gpu", request.gpu.product, "--tp", str(config.tp),
            "--max-batch", str(config.max_batch_size), "--quant", config.quantization,
            "--kv-dtype", config.kv_cache_dtype, "--served-model", SERVED_MODEL,
        ]  # fmt: skip
        if request.model.architecture is not None:
            arch = request.model.architecture.model_dump()
            argv += ["--architecture", json.dumps(arch, sort_keys=True)]
        if self.time_scale != 1.0:
            argv += ["--time-scale", f"{self.time_scale:g}"]
        return argv

    def assemble(self, repo_dir: Path) -> None:
        """Nothing to add: the simulated server reads no repository."""

    def pod(self, request: TuningRequest, config: TrialConfig, ports: Ports) -> PodShape:
        return PodShape(
            image="operator",
            command=self.launch_argv(request, config, repo_dir="", ports=ports),
            gpus=0,
            cpu_m=100,
            memory_mi=256,
            memory_limit_mi=512,
            shm="64Mi",
            runs_as_root=False,
            loads_weights=False,
        )
