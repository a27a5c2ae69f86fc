"""The serving-runtime seam: what a server needs to serve one configuration.

A runtime answers four questions, and both the tuner's real trials (`backends/triton.py`, one
server process per trial) and the operator's serving Deployment (`infertune_operator.objects.serving`)
ask the same runtime, so a configuration is measured exactly as it is later served:

- **model files**: the rendered files of the model repository (relative path -> text);
- **launch argv**: the command that starts the server on a model repository and ports;
- **pod shape**: the container in a pod (image, command, GPUs, CPU and memory requests,
  /dev/shm, whether the image runs as root, whether it loads weights);
- **health**: the readiness and liveness endpoints (KServe v2 over HTTP) and the ports.

Two implementations: `triton.TritonRuntime` (Triton + TensorRT-LLM's LLM-API model) and
`simulated.SimulatedRuntime` (`infertune simserver`, the performance model behind the same
protocol and probes, no GPU). A third serves local trials only (`TrialRuntime`: no pod):
`local_triton.LocalTritonRuntime`, a real tritonserver from the nvidia-pytriton wheel with
infertune's own Python-backend model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from infertune_tuner.config import TrialConfig
from infertune_tuner.request import TuningRequest

SERVED_MODEL = "llm"  # the Triton model name clients address
READY_PATH = "/v2/health/ready"
LIVE_PATH = "/v2/health/live"

# Where a pod keeps the repository: the rendered files arrive read-only (a ConfigMap) in
# FILES_DIR, and the start command assembles the repository in REPO_DIR (an emptyDir).
FILES_DIR = "/etc/infertune/model-repo"
REPO_DIR = "/model-repo"


@dataclass(frozen=True)
class Ports:
    """Triton's three ports (the simulated server keeps them)."""

    grpc: int = 8001
    http: int = 8000
    metrics: int = 8002

    def named(self) -> dict[str, int]:
        return {"http": self.http, "grpc": self.grpc, "metrics": self.metrics}


@dataclass(frozen=True)
class PodShape:
    """How the server runs as a container; the operator turns it into Kubernetes objects."""

    image: Literal["triton", "operator"]  # which of the operator's configured images
    command: list[str]
    gpus: int
    cpu_m: int  # CPU request, millicores
    memory_mi: int  # memory request, MiB
    memory_limit_mi: int | None
    shm: str  # size of the memory-backed /dev/shm
    runs_as_root: bool  # the image's user: root (Triton) or a numeric non-root user
    loads_weights: bool  # mounts the model storage (PVC or download cache)
    # Run first, in the same image with the same mounts and environment (an init container):
    # downloads the weights the server loads (weights.fetch_argv); None: nothing to download.
    fetch_command: list[str] | None = None
    # The server's environment beyond the pod's (the runtime's `launch_env`).
    env: dict[str, str] = field(default_factory=dict)
    # Liveness: a command that succeeds while the server can still generate (an exec probe),
    # and how long one try may take; None: the KServe v2 live endpoint (LIVE_PATH).
    liveness_command: list[str] | None = None
    liveness_timeout_s: int = 5


class TrialRuntime(Protocol):
    """What a local trial needs of a runtime: the files, the launch, the repository's assembly."""

    @property
    def name(self) -> str:
        """ "triton", "simulated", or "triton:BODY" (the local Triton server)."""
        ...

    @property
    def time_scale(self) -> float:
        """How long the server's modelled durations take relative to the GPU's (1.0 real; 0.02:
        a simulated server running 50x faster)."""
        ...

    def model_files(self, request: TuningRequest, config: TrialConfig) -> dict[str, str]:
        """Repository-relative path -> text of the rendered model repository."""
        ...

    def launch_argv(
        self, request: TuningRequest, config: TrialConfig, *, repo_dir: str, ports: Ports,
        host: str = "0.0.0.0",
    ) -> list[str]:  # fmt: skip
        """The command that starts the server on `repo_dir` (already assembled)."""
        ...

    def assemble(self, repo_dir: Path) -> None:
        """Add what the image provides to a local repository whose rendered files are written
        (a local trial; in a pod the start command does it)."""
        ...

    def fetch(self, request: TuningRequest, config: TrialConfig) -> tuple[str, str] | None:
        """(Hugging Face repository, folder) to download before the server starts, or None."""
        ...

    def launch_env(self) -> dict[str, str]:
        """Environment the server needs beyond the caller's (a trial adds it to the tuner's;
        the serving pod has it in its container)."""
        ...

    def serial_launch(self, config: TrialConfig) -> bool:
        """Whether the server of `config` must not start while another such start is under way
        on the machine (until it is ready): a launcher that races for a resource."""
        ...

    def problems(self, request: TuningRequest) -> list[str]:
        """Why no trial of `request` can run on this machine (checked once, before the first
        trial): each a sentence naming what is missing and how to fix it; [] when none."""
        ...


class PlainServer:
    """What a runtime whose server loads no weights and starts plainly says (the simulated
    server, the local Triton server with infertune's model): nothing to download, no extra
    environment, no start that races with another."""

    def fetch(self, request: TuningRequest, config: TrialConfig) -> tuple[str, str] | None:
        return None

    def launch_env(self) -> dict[str, str]:
        return {}

    def serial_launch(self, config: TrialConfig) -> bool:
        return False


class ServingRuntime(TrialRuntime, Protocol):
    """One way to serve a configuration (see the module docstring): a trial's, and a pod's."""

    def pod(self, request: TuningRequest, config: TrialConfig, ports: Ports) -> PodShape:
        """The container that serves `config` in a pod (files in FILES_DIR, repo in REPO_DIR)."""
        ...
