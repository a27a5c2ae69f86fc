"""No trial server outlives `infertune tune`, however the tuner ends (item 7 of the real path).

The simulated server stands in for Triton. The hard case is upstream's launcher,
NVIDIA/TensorRT-LLM triton_backend/scripts/launch_triton_server.py, which starts the server with
`subprocess.Popen(cmd, env=env)` and returns at once: its server is orphaned from the first
second. `LAUNCHER` does the same (and, harder still, puts the server in a session of its own, as
a daemonising mpirun may). The tuner is killed with SIGTERM and with SIGKILL mid-trial; every
process that carries the test's marker in its environment must be gone soon after.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/environ").exists(), reason="finds processes through /proc (Linux)"
)

SIM = (
    f"{sys.executable} -m infertune_tuner.cli.simserver --host 127.0.0.1 --port {{port}}"
    " --http-port {http_port} --model {model} --gpu {gpu} --tp {tp}"
    " --max-batch {max_batch_size} --quant {quantization} --kv-dtype {kv_cache_dtype}"
    " --served-model {served_model}"
)
LAUNCHER = textwrap.dedent(
    """
    import subprocess, sys
    # Like launch_triton_server.py: start the server in the background and return at once.
    subprocess.Popen(sys.argv[1:], start_new_session=True)
    """
)


def manifest(tmp_path: Path) -> Path:
    doc = {
        "apiVersion": "infertune.io/v1alpha1",
        "kind": "InferenceDeployment",
        "metadata": {"name": "lifetime"},
        "spec": {
            "model": {"name": "llama-3-8b"},
            "gpu": {"product": "H100-SXM-80GB"},
            "workload": {"inputTokens": 64, "outputTokens": 512},
            "slo": {"e2eLatencyMs": {"p95": 600000}},
            "search": {
                "tensorParallel": [1],
                "maxBatchSize": [4],
                "quantization": ["bf16"],
                "kvCacheDtype": ["auto"],
            },
            "tuning": {"maxTrials": 1, "backend": "triton"},
        },
    }
    path = tmp_path / "lifetime.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def marked(marker: str) -> dict[int, str]:
    """pid -> command line of every process whose environment carries the marker."""
    found: dict[int, str] = {}
    needle = f"INFERTUNE_LIFETIME_TEST={marker}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found[int(entry)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return found


def wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize(
    ("launch", "sig"),
    [("direct", signal.SIGKILL), ("detached", signal.SIGKILL), ("detached", signal.SIGTERM)],
)
def test_the_server_dies_with_the_tuner(tmp_path: Path, launch: str, sig: int) -> None:
    marker = uuid.uuid4().hex
    command = SIM
    if launch == "detached":
        launcher = tmp_path / "launcher.py"
        launcher.write_text(LAUNCHER)
        command = f"{sys.executable} {launcher} {SIM}"
    infertune = Path(sys.executable).parent / "infertune"
    tuner = subprocess.Popen(
        [str(infertune), "tune", str(manifest(tmp_path)), "--backend", "triton",
         "--server-command", command, "--out", str(tmp_path / "out"), "--no-progress"],
        env={**os.environ, "INFERTUNE_LIFETIME_TEST": marker},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        server = f"{sys.executable} -m infertune_tuner.cli.simserver "
        wait_for(
            lambda: any(c.startswith(server) for c in marked(marker).values()),
            timeout=60, what="the trial's server to start",
        )  # fmt: skip
        time.sleep(1.0)  # serving requests, mid-trial
        os.kill(tuner.pid, sig)
        tuner.wait(timeout=30)
        try:
            wait_for(lambda: not marked(marker), timeout=30, what="every server process to end")
        except AssertionError:
            raise AssertionError(f"survivors: {marked(marker)}") from None
    finally:
        for pid in marked(marker):  # never leave anything behind, whatever failed
            os.kill(pid, signal.SIGKILL)
        if tuner.poll() is None:
            tuner.kill()
