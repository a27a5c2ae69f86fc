"""The real backend: Triton Inference Server + TensorRT-LLM (LLM-API model), one server per trial.

For each configuration: render the model repository (`harness.triton_repo`), launch Triton on
free ports, wait for readiness, drive the closed-loop load generator at concurrency = max batch
size, tear the process group down, and turn the outcome into a Measurement (`oom` when the logs
show CUDA out-of-memory, `error` with the log tail otherwise).

Triton is started with `launch_triton_server.py --world_size TP` (one tritonserver MPI rank per
GPU; the LLM-API model's rank 0 drives the engine, the other ranks serve it through MPI), the
documented multi-GPU launcher of the Triton TRT-LLM image, so trials run Triton exactly as the
serving Deployment does. `server_command` replaces it with a template (placeholders `{port}`,
`{http_port}`, `{metrics_port}`, `{tp}`, `{max_batch_size}`, `{quantization}`,
`{kv_cache_dtype}`, `{model}`, `{gpu}`, `{model_repo}`, `{served_model}`, `{model_path}`), e.g. the
simulated server for tests:

    infertune simserver --port {port} --http-port {http_port} --model {model} --gpu {gpu}
        --tp {tp} --max-batch {max_batch_size} --quant {quantization} --kv-dtype {kv_cache_dtype}

Environment: INFERTUNE_TRITON_LAUNCHER (default /app/scripts/launch_triton_server.py) and
INFERTUNE_LLMAPI_MODEL_DIR (default /app/all_models/llmapi/tensorrt_llm/1, where model.py and
helpers.py of the LLM-API model are copied from).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import string
import tempfile
from collections.abc import Iterable
from pathlib import Path

from infertune_tuner.backends.base import OnPhase
from infertune_tuner.config import TrialConfig
from infertune_tuner.errors import InputError
from infertune_tuner.harness.loadgen import LoadSpec
from infertune_tuner.harness.runner import TrialPlan, free_ports, run_trial
from infertune_tuner.harness.triton_repo import (
    LAUNCHER,
    LLMAPI_MODEL_DIR,
    SERVED_MODEL,
    MissingCheckpoint,
    checkpoint_uri,
    default_model_id,
    launcher_command,
    max_num_tokens_for,
    model_path_for,
    render_model_repository,
)
from infertune_tuner.measurement import Measurement, TrialPhase, trial_requests
from infertune_tuner.metrics import LATENCY_METRICS
from infertune_tuner.request import TuningRequest

PLACEHOLDERS = frozenset({
    "port", "http_port", "metrics_port", "tp", "max_batch_size", "quantization",
    "kv_cache_dtype", "model", "gpu", "model_repo", "served_model", "model_path",
})  # fmt: skip
MAX_WARMUP = 256


def default_requests(max_batch_size: int, percentiles: Iterable[str] = ()) -> int:
    """4 x max batch (at least 64): several full turns of the batch; more when a tail
    percentile is bounded (see measurement.trial_requests)."""
    return trial_requests(max_batch_size, percentiles)


def default_warmup(max_batch_size: int) -> int:
    """One full batch: the first wave arrives all at once and queues behind its own prefills,
    which says nothing about the steady state the SLO is about."""
    return min(max_batch_size, MAX_WARMUP)


def check_template(template: str) -> None:
    """InputError for a placeholder the backend does not fill (or a malformed template)."""
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as exc:
        raise InputError(f"server command template: {exc}") from None
    unknown = sorted(f for f in fields if f not in PLACEHOLDERS)
    if unknown:
        raise InputError(
            f"server command template: unknown placeholder(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(PLACEHOLDERS))}"
        )


class TritonBackend:
    name = "triton"

    def __init__(
        self,
        request: TuningRequest,
        *,
        server_command: str | None = None,
        workdir: Path | None = None,
        startup_timeout_s: float = 1800,
        requests_per_trial: int | None = None,
        warmup: int | None = None,
        on_phase: OnPhase | None = None,
    ) -> None:
        if server_command is not None:
            check_template(server_command)
        if requests_per_trial is not None and requests_per_trial < 1:
            raise InputError("requests per trial must be at least 1")
        self.request = request
        self.server_command = server_command
        self.startup_timeout_s = startup_timeout_s
        self.requests_per_trial = requests_per_trial
        self.warmup = warmup
        self.on_phase = on_phase
        self._owns_workdir = workdir is None
        self.workdir = (
            Path(tempfile.mkdtemp(prefix="infertune-triton-")) if workdir is None else workdir
        )
        self._trials = 0
        self._fallback_id = default_model_id(request.model.name, request.resolve_model().hf_ids)

    # ------------------------------------------------------------------ pieces, testable alone
    def weights_for(self, config: TrialConfig) -> str:
        """model.yaml's `model` for this config (raises MissingCheckpoint)."""
        m = self.request.model
        uri = checkpoint_uri(config.quantization, m.checkpoints, m.uri, self._fallback_id)
        return model_path_for(uri)

    def plan(self, config: TrialConfig, trial_dir: Path) -> TrialPlan:
        """Render the repository into `trial_dir` and build the command and load spec."""
        model_path = self.weights_for(config)
        repo = trial_dir / "model_repo"
        files = render_model_repository(
            config, model_path, served_model=SERVED_MODEL,
            max_num_tokens=max_num_tokens_for(self.request.workload.input_tokens),
        )  # fmt: skip
        for rel, text in files.items():
            path = repo / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        port, http_port, metrics_port = free_ports(3)
        if self.server_command is None:
            self._copy_llmapi_model(repo / SERVED_MODEL / "1")
            command = launcher_command(
                config.tp, str(repo), served_model=SERVED_MODEL, grpc_port=port,
                http_port=http_port, metrics_port=metrics_port,
                launcher=os.environ.get("INFERTUNE_TRITON_LAUNCHER", LAUNCHER),
            )  # fmt: skip
        else:
            values = {
                "port": port, "http_port": http_port, "metrics_port": metrics_port,
                "tp": config.tp, "max_batch_size": config.max_batch_size,
                "quantization": config.quantization, "kv_cache_dtype": config.kv_cache_dtype,
                "model": self.request.model.name, "gpu": self.request.gpu.product,
                "model_repo": str(repo), "served_model": SERVED_MODEL, "model_path": model_path,
            }  # fmt: skip
            quoted = {k: shlex.quote(str(v)) for k, v in values.items()}
            command = shlex.split(self.server_command.format(**quoted))
        b = config.max_batch_size
        load = LoadSpec(
            url=f"127.0.0.1:{port}",
            model=SERVED_MODEL,
            concurrency=b,
            requests=self.requests_per_trial
            or default_requests(b, [s.percentile for s in self.request.slo]),
            warmup=self.warmup if self.warmup is not None else default_warmup(b),
            input_tokens=self.request.workload.input_tokens,
            output_tokens=self.request.workload.output_tokens,
            seed=self.request.tuning.seed or 0,
        )
        hook = self.on_phase

        def phase(name: TrialPhase) -> None:
            if hook is not None:
                hook(config, name)

        return TrialPlan(
            command=command, load=load, log_path=trial_dir / "server.log",
            startup_timeout_s=self.startup_timeout_s, on_phase=phase,
        )  # fmt: skip

    @staticmethod
    def _copy_llmapi_model(version_dir: Path) -> None:
        source = Path(os.environ.get("INFERTUNE_LLMAPI_MODEL_DIR", LLMAPI_MODEL_DIR))
        files = sorted(source.glob("*.py")) if source.is_dir() else []
        if not any(f.name == "model.py" for f in files):
            raise FileNotFoundError(
                f"the TensorRT-LLM LLM-API Triton model (model.py) is not at {source}; run in the "
                "Triton TRT-LLM image or set INFERTUNE_LLMAPI_MODEL_DIR"
            )
        for f in files:
            shutil.copy2(f, version_dir / f.name)

    # ------------------------------------------------------------------ the interface
    def run(self, config: TrialConfig) -> Measurement:
        self._trials += 1
        label = re.sub(r"[^A-Za-z0-9._-]+", "-", config.label())
        trial_dir = self.workdir / f"trial-{self._trials:03d}-{label}"
        try:
            plan = self.plan(config, trial_dir)
        except MissingCheckpoint as exc:
            return Measurement.failed("error", str(exc))
        except (OSError, ValueError) as exc:
            return Measurement.failed("error", f"cannot prepare the trial: {exc}")
        outcome = run_trial(plan)
        r = outcome.result
        if outcome.status != "ok" or r is None:
            return Measurement(
                status=outcome.status,
                reason=outcome.reason or "the trial failed",
                requests=r.requests if r is not None else 0,
                errors=r.errors if r is not None else 0,
                duration_s=r.duration_s if r is not None else 0.0,
            )
        notes = [*r.error_samples]  # an ok trial may still have lost a few requests
        if "warning" in r.settings:
            notes.append(str(r.settings["warning"]))
        return Measurement.ok(
            {m.key: (s.percentiles() if (s := m.of(r)) else None) for m in LATENCY_METRICS},
            output_tokens_per_s_per_gpu=r.output_tokens_per_s / config.tp,
            requests=r.requests,
            errors=r.errors,
            reason="; ".join(notes) or None,
            duration_s=r.duration_s,
            concurrency=r.peak_decoding,
        )

    def close(self) -> None:
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
