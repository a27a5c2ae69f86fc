"""One real benchmark trial: start a server, wait until it is ready, drive load, tear it down.

The server runs under `guard` in a process group of its own (`start_new_session`, the guard
leads it), so teardown reaches every process it spawned: `launch_triton_server.py` starts
tritonserver (or mpirun) in the background and exits at once, which is why liveness is "does the
group still have a member", not "is my child running". The guard also ends the server when the
tuner itself dies (SIGKILL included): no trial server, and none of its GPUs, outlives the tuner. Its stdout and stderr go to one log file, which failure
classification reads: CUDA out-of-memory messages make a trial `oom`, anything else `error` with
the last 40 log lines as the reason. A trial whose streams stalled (requests that went silent
after some tokens without a final response, stream.py) is `invalid`: it measured short requests,
and a server that leaves requests open is not one to deploy.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

from tritonclient.grpc.aio import InferenceServerClient

from infertune_tuner.harness.load_process import run_load_isolated
from infertune_tuner.harness.loadgen import LoadSpec, ServerUnreachable
from infertune_tuner.harness.stats import BenchResult
from infertune_tuner.measurement import TrialPhase, TrialStatus

PhaseHook = Callable[[TrialPhase], None]

LOG_TAIL_LINES = 40
MAX_ERROR_FRACTION = 0.05  # more failed requests than this and the trial is an error
STOP_GRACE_S = 30.0

OOM_PATTERN = re.compile(
    r"CUDA out of memory|OutOfMemoryError|OutOfMemory|cudaErrorMemoryAllocation"
    r"|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED|out of memory",
    re.IGNORECASE,
)

# Triton's warning that its host pinned-memory pool could not be allocated: host memory, not the
# GPU's, and not fatal (seen on an H100 machine after a real CUDA OOM: the first matching line
# then named the wrong cause).
HOST_MEMORY_NOTE = re.compile(r"pinned (system )?memory", re.IGNORECASE)


def classify_failure(log_text: str, context: str = "") -> tuple[TrialStatus, str]:
    """(`oom`, the first OOM line) when the log shows CUDA out-of-memory, else (`error`, the
    context line followed by the last 40 log lines)."""
    lines = log_text.splitlines()
    for line in lines:
        if OOM_PATTERN.search(line) and not HOST_MEMORY_NOTE.search(line):
            return "oom", line.strip()[:1000]
    tail = "\n".join(lines[-LOG_TAIL_LINES:]).strip()
    parts = [p for p in (context, tail or "(the server wrote no output)") if p]
    return "error", "\n".join(parts)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    ports: list[int] = []
    while len(ports) < n:
        p = free_port(host)
        if p not in ports:
            ports.append(p)
    return ports


def guarded(parent: int) -> list[str]:
    """The guard's command line before a server command (see `guard`)."""
    return [sys.executable, "-m", "infertune_tuner.harness.guard", "--parent", str(parent), "--"]


class ServerProcess:
    """A server command (under its guard) in its own process group, output to a log file."""

    def __init__(self, popen: subprocess.Popen[bytes], log_path: Path, log: IO[bytes]) -> None:
        self.popen = popen
        self.log_path = log_path
        self._log = log

    @classmethod
    def start(
        cls, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None
    ) -> ServerProcess:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = [*guarded(os.getpid()), *_resolve_own_script(argv)]
        log = open(log_path, "wb")  # noqa: SIM115 -- closed in stop()
        try:
            popen = subprocess.Popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, env=dict(env) if env is not None else None,
            )  # fmt: skip
        except OSError:
            log.close()
            raise
        return cls(popen, log_path, log)

    @property
    def pgid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        self.popen.poll()  # reap the direct child so an exited group reads as gone
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def log_text(self) -> str:
        try:
            self._log.flush()
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            if not self.alive():
                break
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and self.alive():
                time.sleep(0.05)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=1)
        self._log.close()


async def wait_ready(
    proc: ServerProcess, url: str, model: str, timeout_s: float, poll_s: float = 0.25
) -> str | None:
    """None once server and model are ready; "exited" when the process group died; "timeout"."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not proc.alive():
            return "exited"
        try:
            # A fresh channel per attempt: a channel that failed to connect backs off for seconds.
            async with InferenceServerClient(url) as client:
                if await client.is_server_ready(client_timeout=2.0) and await client.is_model_ready(
                    model, client_timeout=2.0
                ):
                    return None
        except Exception:  # not listening yet, or still loading
            pass
        if time.monotonic() >= deadline:
            return "timeout"
        await asyncio.sleep(poll_s)
        poll_s = min(poll_s * 1.5, 2.0)


@dataclass(frozen=True)
class TrialPlan:
    command: list[str]
    load: LoadSpec
    log_path: Path
    startup_timeout_s: float = 1800.0
    env: dict[str, str] | None = None
    # Hears each phase as it begins: starting server, loading model, warm-up (when the load has
    # one), measuring.
    on_phase: PhaseHook | None = field(default=None, compare=False, repr=False)
    # A file locked (flock, exclusive) from before the server starts until it is ready or has
    # failed: launches that must not overlap on one machine hold the same file (see
    # backends/triton.py, LAUNCH_LOCK). None: no lock.
    launch_lock: Path | None = None


@dataclass(frozen=True)
class TrialOutcome:
    status: TrialStatus
    result: BenchResult | None
    reason: str | None
    wall_s: float
    phase: TrialPhase | None = None  # where a failed trial died (None: it did not fail)


async def _drive(
    plan: TrialPlan, proc: ServerProcess, on_phase: PhaseHook, started: Callable[[], None]
) -> TrialOutcome:
    """The trial's outcome; its wall time is left to `run_trial`, which also counts teardown.
    `started` is called once the server is ready or has failed to become so."""

    phase: TrialPhase = "loading model"

    def done(status: TrialStatus, result: BenchResult | None, reason: str | None) -> TrialOutcome:
        return TrialOutcome(status, result, reason, 0.0, phase if status != "ok" else None)

    def from_logs(context: str, result: BenchResult | None = None) -> TrialOutcome:
        status, reason = classify_failure(proc.log_text(), context)
        return done(status, result, reason)

    on_phase(phase)
    try:
        ready = await wait_ready(proc, plan.load.url, plan.load.model, plan.startup_timeout_s)
    finally:
        started()
    if ready == "exited":
        code = proc.popen.returncode
        return from_logs(f"the server exited before it was ready (exit code {code})")
    if ready == "timeout":
        return from_logs(f"the server was not ready after {plan.startup_timeout_s:g} s")
    phase = "measuring"
    try:  # in a process of its own: side-by-side trials do not share an interpreter lock
        result = await run_load_isolated(plan.load, on_phase=on_phase)
    except ServerUnreachable as exc:
        return from_logs(str(exc))
    except Exception as exc:  # a trial fails with a reason; it never takes the tuner down
        return from_logs(f"the benchmark failed: {type(exc).__name__}: {exc}")
    sent = result.sent
    if result.errors and not proc.alive():
        return from_logs(f"the server died during the benchmark ({result.errors} failed)", result)
    stalled = result.stall_note()
    if stalled is not None:
        return done("invalid", result, stalled)
    if result.requests == 0:
        status, reason = classify_failure(proc.log_text(), "")
        if status == "oom":
            return done("oom", result, reason)
        return done(
            "error", result, f"all {sent} requests failed: " + "; ".join(result.error_samples)
        )
    if result.errors > MAX_ERROR_FRACTION * sent:
        return done(
            "error", result,
            f"{result.errors} of {sent} requests failed: " + "; ".join(result.error_samples),
        )  # fmt: skip
    return done("ok", result, None)


def _resolve_own_script(argv: Sequence[str]) -> list[str]:
    """`infertune ...` runs this installation's script even when its venv is not on PATH."""
    out = list(argv)
    if out and out[0] == "infertune" and shutil.which("infertune") is None:
        beside = Path(sys.executable).parent / "infertune"
        if beside.exists():
            out[0] = str(beside)
    return out


def run_trial(plan: TrialPlan) -> TrialOutcome:
    """Start the server, benchmark it, and always tear the whole process group down."""
    hook: PhaseHook = plan.on_phase or (lambda _: None)
    t0 = time.monotonic()
    hook("starting server")
    with contextlib.ExitStack() as held:
        if plan.launch_lock is not None:
            held.enter_context(_exclusive(plan.launch_lock))
        try:
            proc = ServerProcess.start(plan.command, plan.log_path, plan.env)
        except OSError as exc:
            return TrialOutcome(
                "error", None, f"cannot start {plan.command[0]!r}: {exc}", 0.0, "starting server"
            )
        try:
            outcome = asyncio.run(_drive(plan, proc, hook, held.close))
        finally:
            held.close()
            proc.stop()
    return replace(outcome, wall_s=time.monotonic() - t0)


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """An exclusive flock on `path` (other threads and processes of the machine wait)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
