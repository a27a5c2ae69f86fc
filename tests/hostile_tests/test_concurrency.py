"""Concurrent runs and signals (classes 1 and 2), with real processes: one study, one run.

A second `tune` on a study in use refuses (exit 2) naming the holder; a killed holder's lock
is taken over at once; Ctrl-C writes the report of the trials done, ends the trial's server and
releases the lock.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from infertune_tuner.journal import LOCK

from .corpus import check, invoke, manifest, put

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/environ").exists(), reason="finds processes through /proc (Linux)"
)
INFERTUNE = str(Path(sys.executable).parent / "infertune")
HOLD = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from infertune_tuner.journal import lock_study\n"
    "lock = lock_study(Path(sys.argv[1]))\n"
    "print('locked', flush=True)\n"
    "time.sleep(300)\n"
)


def wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def marked(marker: str) -> list[int]:
    needle = f"INFERTUNE_HOSTILE_TEST={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def _serving(marker: str) -> bool:
    """Whether the never-ready trial server of the run marked `marker` is running."""
    for pid in marked(marker):
        try:
            # Its own argument (the tuner's --server-command holds the whole command line).
            if b"import time; time.sleep(300)" in Path(f"/proc/{pid}/cmdline").read_bytes().split(
                b"\0"
            ):
                return True
        except OSError:
            continue
    return False


def test_a_held_study_is_refused_naming_the_holder_and_taken_over_once_it_dies(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        spec = manifest(tmp_path)
        result = invoke(["tune", spec, "--out", out, "--no-progress"])
        check(result, 2, f"in use by pid {holder.pid} on {socket.gethostname()}, started 20")
        assert "another --out" in result.output
        assert not (out / "study.journal").exists()  # the refused run touched nothing
    finally:
        holder.kill()  # SIGKILL: no chance to clean up, its lock file stays behind
        holder.wait(10)
    assert json.loads((out / LOCK).read_text())["pid"] == holder.pid  # stale, not held
    check(invoke(["tune", spec, "--out", out, "--no-progress"]), 0, "3 trials executed")


def test_ctrl_c_mid_trial_writes_the_report_ends_the_server_and_frees_the_study(
    tmp_path: Path, ctrl_c_reaches: Callable[[list[str]], list[str]]
) -> None:
    marker = uuid.uuid4().hex
    spec = manifest(
        tmp_path,
        put("spec.search", {"tensorParallel": [1], "maxBatchSize": [4, 8],
                            "quantization": ["bf16"], "kvCacheDtype": ["auto"]}),
        put("spec.tuning.backend", "triton"),
    )  # fmt: skip
    out = tmp_path / "out"
    never_ready = f"{sys.executable} -c 'import time; time.sleep(300)'"
    tuner = subprocess.Popen(
        ctrl_c_reaches([INFERTUNE, "tune", str(spec), "--backend", "triton", "--server-command",
                        never_ready, "--out", str(out), "--no-progress"]),
        env={**os.environ, "INFERTUNE_HOSTILE_TEST": marker},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        # The trial's server runs: the first run is mid-trial.
        # The server itself, not any marked process: the tuner is marked before it holds the
        # study's lock, and a busy machine may let the check run in between.
        wait_for(lambda: _serving(marker), timeout=60, what="the trial's server")
        second = invoke(["tune", spec, "--backend", "triton", "--server-command", never_ready,
                         "--out", out, "--no-progress"])  # fmt: skip
        check(second, 2, f"in use by pid {tuner.pid}")
        tuner.send_signal(signal.SIGINT)
        stdout, stderr = tuner.communicate(timeout=60)
    finally:
        if tuner.poll() is None:
            tuner.kill()
        for pid in marked(marker):
            os.kill(pid, signal.SIGKILL)
    assert tuner.returncode == 130, stderr
    assert "Traceback" not in stdout + stderr
    assert "report:" in stdout
    report = json.loads((out / "report.json").read_text())
    assert report["stopped_reason"].startswith("interrupted")
    wait_for(lambda: not marked(marker), timeout=30, what="the trial's server to end")
    assert (out / LOCK).read_text() == ""  # released
    # The study is free at once: a run of another study is refused for being another study
    # (the earlier report stays), not for a lock; the interrupted trial has its row.
    check(invoke(["tune", spec, "--backend", "simulated", "--out", out, "--no-progress"]), 2,
          "spec.tuning.backend (--backend): triton before, simulated now")  # fmt: skip
    assert json.loads((out / "report.json").read_text()) == report
    assert [t["state"] for t in report["trials"] if t["number"] == 0] == ["interrupted"]
