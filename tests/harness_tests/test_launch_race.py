"""TP > 1 trials side by side in one tuner pod must not race for trtllm-llmapi-launch's port.

NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/trtllm-llmapi-launch L28-43 picks the proxy's port by
binding the first free one from 10012 and closing it again (`s.bind(("", port))` ...
`print(port); s.close()`), exports it in TLLM_SPAWN_PROXY_PROCESS_IPC_ADDR unconditionally, and
the proxy binds it only after Python and TensorRT-LLM have imported (mgmn_leader_node ->
mpi_session.RemoteMpiCommSessionServer -> ZeroMqQueue). `LAUNCHER` below does exactly that,
with a scan base of its own, then starts the (simulated) server. Two such launches at once pick
the same port and one fails; infertune starts them one at a time (backends/triton.py,
LAUNCH_LOCK), so both trials succeed.

The import time is modelled by a rendezvous, not a fixed sleep: a launcher binds its proxy once
every launch of the test has picked its port, or after `wait` seconds. A fixed 3 s sleep let a
loaded machine start the second launcher after the first had bound, so the race did not happen
and the test that shows it failed; real imports take 10 s and more, far longer than the gap.
The port probes take turns (a file lock): two launchers started in the same instant could
otherwise probe at once and step apart (the second finding the first's probe bound), which
real launches seconds apart do not do, and the race again would not happen.
"""

from __future__ import annotations

import random
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infertune_tuner.backends.triton import TritonBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement
from infertune_tuner.request import TuningRequest
from infertune_tuner.runtime.base import Ports
from infertune_tuner.runtime.simulated import SimulatedRuntime

LAUNCHER = """\
import fcntl, os, socket, subprocess, sys, time
base, rendezvous, launches, wait = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
# The probe below holds its port for microseconds; two launchers started in the same instant
# could probe at once and step apart, which no real pair of launches (seconds apart) does.
with open(rendezvous + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    s = socket.socket()
    port = base
    while True:  # trtllm-llmapi-launch L30-38: the first port that binds, then closed again
        try:
            s.bind(("", port))
            break
        except OSError:
            port += 1
    s.close()
# Python and TensorRT-LLM import (10 s and more) before the proxy binds: meanwhile every
# launch started alongside has picked its port
open(os.path.join(rendezvous, str(os.getpid())), "w").close()
deadline = time.monotonic() + wait
while len(os.listdir(rendezvous)) < launches and time.monotonic() < deadline:
    time.sleep(0.05)
proxy = socket.socket()
try:
    proxy.bind(("", port))  # the ZeroMQ PAIR socket of RemoteMpiCommSessionServer
except OSError as exc:
    sys.exit(f"proxy cannot bind tcp://127.0.0.1:{port}: {exc}")
proxy.listen()
proxy.set_inheritable(True)  # kept open (bound) across the exec, as the live proxy keeps it
os.execvp(sys.argv[5], sys.argv[5:])
"""


@dataclass(frozen=True)
class LlmapiLaunched(SimulatedRuntime):
    """The simulated server, started through a launcher that behaves like
    trtllm-llmapi-launch; `serial` is what the runtime says of TP > 1 starts."""

    launcher: str = ""
    base_port: int = 0
    rendezvous: str = ""
    serial: bool = True

    def launch_argv(
        self, request: TuningRequest, config: TrialConfig, *, repo_dir: str, ports: Ports,
        host: str = "0.0.0.0",
    ) -> list[str]:  # fmt: skip
        argv = super().launch_argv(request, config, repo_dir=repo_dir, ports=ports, host=host)
        # serial starts never meet (the second waits for the first to be ready): the import
        # time alone (3 s) passes before the proxy binds
        wait = "3" if self.serial else "60"
        rendezvous = [self.rendezvous, "2", wait]
        return [sys.executable, self.launcher, str(self.base_port), *rendezvous, *argv]

    def serial_launch(self, config: TrialConfig) -> bool:
        return self.serial and config.tp > 1


def side_by_side(tmp_path: Path, request: TuningRequest, serial: bool) -> list[Measurement]:
    """Two TP-2 trials started at the same moment, as a tuner pod packing them does."""
    launcher = tmp_path / "llmapi_launch.py"
    launcher.write_text(LAUNCHER)
    rendezvous = tmp_path / "picked"
    rendezvous.mkdir()
    runtime = LlmapiLaunched(
        program=(sys.executable, "-m", "infertune_tuner.cli.simserver"), time_scale=0.05,
        launcher=str(launcher), base_port=random.randint(11000, 30000), rendezvous=str(rendezvous),
        serial=serial,
    )  # fmt: skip
    backend = TritonBackend(
        request, runtime=runtime, workdir=tmp_path / "trials", requests_per_trial=8,
        warmup=0, startup_timeout_s=60,
    )  # fmt: skip
    results: list[Measurement] = []
    go = threading.Barrier(2)

    def trial(batch: int) -> None:
        go.wait()
        results.append(backend.run(TrialConfig(2, batch, "bf16", "auto")))

    threads = [threading.Thread(target=trial, args=(b,)) for b in (4, 8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def test_the_race_is_real_without_the_launch_lock(tmp_path: Path, trial_request: Any) -> None:
    statuses = sorted(m.status for m in side_by_side(tmp_path, trial_request(), serial=False))
    assert statuses == ["error", "ok"]


def test_tp2_trials_side_by_side_both_start(tmp_path: Path, trial_request: Any) -> None:
    results = side_by_side(tmp_path, trial_request(), serial=True)
    assert [m.status for m in results] == ["ok", "ok"], [m.reason for m in results]
