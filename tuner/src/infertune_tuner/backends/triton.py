"""The real backend: one server per trial, launched and rendered by a serving runtime.

For each configuration: the runtime (`infertune_tuner.runtime`, Triton + TensorRT-LLM by
default) renders the model repository into the trial's folder and gives the launch command;
the trial starts it on free ports, waits for readiness, drives the closed-loop load generator at
concurrency = max batch size, tears the process group down, and turns the outcome into a
Measurement (`oom` when the logs show CUDA out-of-memory, `error` with the log tail otherwise).
The serving Deployment renders the same files and the same launch command from the same runtime,
so a configuration runs in its trial exactly as it is later served.

`runtime=SimulatedRuntime(...)` runs the same trial machinery against the simulated server (the
tests do). `server_command` replaces the launch with a template instead (placeholders `{port}`,
`{http_port}`, `{metrics_port}`, `{tp}`, `{max_batch_size}`, `{quantization}`,
`{kv_cache_dtype}`, `{model}`, `{gpu}`, `{model_repo}`, `{served_model}`, `{model_path}`).

Environment: INFERTUNE_TRITON_LAUNCHER (default /app/scripts/launch_triton_server.py) and
INFERTUNE_LLMAPI_MODEL_DIR (default /app/all_models/llmapi/tensorrt_llm/1, where model.py and
helpers.py of the LLM-API model are copied from). The server inherits the tuner's environment
(HF_TOKEN, HF_HOME); nothing of it is written to the trial's log or the report.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import string
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path

from infertune_tuner.backends.base import OnPhase
from infertune_tuner.config import TrialConfig
from infertune_tuner.errors import InputError
from infertune_tuner.harness.loadgen import LoadSpec
from infertune_tuner.harness.runner import TrialPlan, free_ports, run_trial
from infertune_tuner.measurement import Measurement, TrialPhase, trial_requests
from infertune_tuner.packing import GpuSet, Lease
from infertune_tuner.request import TuningRequest
from infertune_tuner.runtime import SERVED_MODEL, Ports, TrialRuntime, TritonRuntime
from infertune_tuner.runtime.weights import (
    SIXTEEN_BIT,
    MissingCheckpoint,
    checkpoint_kv_dtype,
    fetch_argv,
    model_path_for,
    weights_uri,
)

PLACEHOLDERS = frozenset({
    "port", "http_port", "metrics_port", "tp", "max_batch_size", "quantization",
    "kv_cache_dtype", "model", "gpu", "model_repo", "served_model", "model_path",
})  # fmt: skip
MAX_WARMUP = 256


# TP > 1 trials start through TensorRT-LLM's `trtllm-llmapi-launch`, which picks its proxy's
# port by binding the first free one from 10012, closing it, and exporting it (no way to pass
# one in: NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/trtllm-llmapi-launch L28-43); the proxy binds
# it seconds later, after Python and TensorRT-LLM import (tensorrt_llm/llmapi/mgmn_leader_node.py
# -> mpi_session.py, ZeroMqQueue). Two such launches in that window in one pod pick the same
# port and one trial fails. So they start one at a time: each holds this lock until its server
# is ready (or failed), when the port is bound. TP-1 trials (`--no-mpi`) never take it.
LAUNCH_LOCK = Path(tempfile.gettempdir()) / "infertune-llmapi-launch.lock"


class WeightsUnavailable(RuntimeError):
    """The weights a trial's server loads could not be downloaded (the message says why)."""


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
        runtime: TrialRuntime | None = None,
        server_command: str | None = None,
        workdir: Path | None = None,
        startup_timeout_s: float | None = None,
        requests_per_trial: int | None = None,
        warmup: int | None = None,
        on_phase: OnPhase | None = None,
        gpus: GpuSet | None = None,
    ) -> None:
        if server_command is not None:
            check_template(server_command)
            if runtime is not None:
                raise InputError("give a serving runtime or a server command template, not both")
        if requests_per_trial is not None and requests_per_trial < 1:
            raise InputError("requests per trial must be at least 1")
        self.request = request
        self.runtime: TrialRuntime = runtime if runtime is not None else TritonRuntime.from_env()
        self.speedup = 1.0 / self.runtime.time_scale
        self.server_command = server_command
        self.startup_timeout_s = (
            startup_timeout_s
            if startup_timeout_s is not None
            else request.tuning.startup_timeout_minutes * 60.0
        )
        self.requests_per_trial = requests_per_trial
        self.warmup = warmup
        self.on_phase = on_phase
        self._owns_workdir = workdir is None
        self.workdir = (
            Path(tempfile.mkdtemp(prefix="infertune-triton-")) if workdir is None else workdir
        )
        self.gpus = gpus  # shared by the worker's threads: each trial leases its block
        self._trials = 0
        self._fp8_kv: dict[str, bool] = {}
        self._fetched: set[str] = set()  # repositories downloaded by this tuner
        self._fetch_lock = threading.Lock()  # one download at a time: they share the bandwidth

    def preflight(self) -> None:
        """InputError naming every reason no trial can run on this machine, before the first
        trial (the runtime checks; a server command template is the user's to check)."""
        if self.server_command is not None:
            return
        problems = self.runtime.problems(self.request)
        if problems:
            raise InputError(f"backend {self.runtime.name} cannot run trials here", problems)

    # ------------------------------------------------------------------ pieces, testable alone
    def weights_for(self, config: TrialConfig) -> str:
        """model.yaml's `model` for this config (raises MissingCheckpoint)."""
        return model_path_for(weights_uri(self.request, config))

    def plan(self, config: TrialConfig, trial_dir: Path, lease: Lease | None = None) -> TrialPlan:
        """Render the repository into `trial_dir` and build the command and load spec
        (`lease`: the GPUs and ports of a packed trial; else any free ports, every GPU)."""
        repo = trial_dir / "model_repo"
        for rel, text in self.runtime.model_files(self.request, config).items():
            path = repo / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        if lease is None:
            port, http_port, metrics_port = free_ports(3)
        else:
            port, http_port, metrics_port = lease.grpc, lease.http, lease.metrics
        ports = Ports(grpc=port, http=http_port, metrics=metrics_port)
        if self.server_command is None:
            self.runtime.assemble(repo)
            command = self.runtime.launch_argv(
                self.request, config, repo_dir=str(repo), ports=ports, host="127.0.0.1"
            )
        else:
            values = {
                "port": port, "http_port": http_port, "metrics_port": metrics_port,
                "tp": config.tp, "max_batch_size": config.max_batch_size,
                "quantization": config.quantization, "kv_cache_dtype": config.kv_cache_dtype,
                "model": self.request.model.name, "gpu": self.request.gpu.product,
                "model_repo": str(repo), "served_model": SERVED_MODEL,
                "model_path": self.weights_for(config),
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

        extra = self.runtime.launch_env() if self.server_command is None else {}
        if lease is not None:
            extra["CUDA_VISIBLE_DEVICES"] = lease.visible
        env = {**os.environ, **extra} if extra else None
        serial = self.server_command is None and self.runtime.serial_launch(config)
        return TrialPlan(
            command=command, load=load, log_path=trial_dir / "server.log",
            startup_timeout_s=self.startup_timeout_s, on_phase=phase, env=env,
            launch_lock=LAUNCH_LOCK if serial else None,
        )  # fmt: skip

    # ------------------------------------------------------------------ the interface
    def run(self, config: TrialConfig, *, repeat: int = 0) -> Measurement:
        if self.gpus is None:
            return self._run(config, None)
        with self.gpus.lease(config.tp) as lease:
            return self._run(config, lease)

    def fetch_weights(self, config: TrialConfig) -> None:
        """Download what the server of `config` loads from the Hugging Face Hub, once per
        repository, before its server starts (weights.fetch_argv; the serving pod's init
        container runs the same command). Raises WeightsUnavailable with the reason."""
        if self.server_command is not None:
            return  # a command template decides what it loads
        target = self.runtime.fetch(self.request, config)
        if target is None:
            return
        repo, dest = target
        with self._fetch_lock:
            if repo in self._fetched:
                return
            if self.on_phase is not None:
                self.on_phase(config, "downloading weights")
            done = subprocess.run(
                fetch_argv(repo, dest, python=sys.executable),
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
                raise WeightsUnavailable(f"cannot download {repo}: {lines[-1] if lines else ''}")
            self._fetched.add(repo)

    def _run(self, config: TrialConfig, lease: Lease | None) -> Measurement:
        self._trials += 1
        label = re.sub(r"[^A-Za-z0-9._-]+", "-", config.label())
        trial_dir = self.workdir / f"trial-{self._trials:03d}-{label}"
        try:
            plan = self.plan(config, trial_dir, lease)
            self.fetch_weights(config)
        except (MissingCheckpoint, WeightsUnavailable) as exc:
            return Measurement.failed("error", str(exc), "downloading weights")
        except (OSError, ValueError) as exc:
            return Measurement.failed(
                "error", f"cannot prepare the trial: {exc}", "starting server"
            )
        outcome = run_trial(plan)
        r = outcome.result
        if outcome.status != "ok" or r is None:
            return Measurement(
                status=outcome.status,
                reason=outcome.reason or "the trial failed",
                requests=r.requests if r is not None else 0,
                errors=r.errors if r is not None else 0,
                duration_s=r.duration_s if r is not None else 0.0,
                phase=outcome.phase,
            )
        notes = [*r.error_samples]  # an ok trial may still have lost a few requests
        notes += [str(r.settings[k]) for k in ("warning", "stopped") if k in r.settings]
        notes += [n for n in (r.short_output_note(), self._kv_note(config)) if n]
        return Measurement.ok(
            {k: (s.percentiles() if s else None) for k, s in r.workload_latency().items()},
            output_tokens_per_s_per_gpu=r.output_tokens_per_s / config.tp,
            requests=r.requests,
            errors=r.errors,
            reason="; ".join(notes) or None,
            duration_s=r.duration_s,
            concurrency=r.peak_decoding,
            output_tokens_mean=r.output_tokens_mean,  # the search's short-output check reads it
        )

    def _kv_note(self, config: TrialConfig) -> str | None:
        """Says so when kv "auto" ran an FP8 KV cache because the checkpoint declares one."""
        if config.kv_cache_dtype != "auto" or config.quantization in SIXTEEN_BIT:
            return None
        if config.quantization not in self._fp8_kv:
            try:
                declared = checkpoint_kv_dtype(self.weights_for(config))
            except MissingCheckpoint:  # a runtime that loads no weights ran it: none declared
                declared = None
            self._fp8_kv[config.quantization] = declared == "fp8"
        if not self._fp8_kv[config.quantization]:
            return None
        return "kv-auto ran an FP8 KV cache: the checkpoint's hf_quant_config.json declares one"

    def close(self) -> None:
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
