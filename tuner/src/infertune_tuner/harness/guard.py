"""A trial server never outlives the tuner: the guard between them.

    python -m infertune_tuner.harness.guard --parent PID [--grace S] -- ARGV...

The runner starts every server through this small process (in a new session, so the guard leads
the server's process group). The guard:

1. asks the kernel for SIGTERM when its parent dies (`prctl(PR_SET_PDEATHSIG)`, Linux), and
   checks that the parent is still the tuner it was started by (no window between the two);
   elsewhere, and as a second line, it notices a changed parent id within 0.2 s;
2. makes itself the child subreaper (`prctl(PR_SET_CHILD_SUBREAPER)`, Linux): a process that
   leaves the tree (`launch_triton_server.py` starts mpirun or tritonserver in the background and
   exits at once) is re-parented to the guard instead of PID 1, and one that leaves the process
   group with `setsid` is still found under it;
3. runs ARGV, reaps whatever ends, and exits once nothing of it is left, with ARGV's exit code;
4. on SIGTERM/SIGINT/SIGHUP (the tuner's teardown, or the tuner's death): SIGTERM to the whole
   group and to every descendant, up to `--grace` seconds for them to go, then SIGKILL.

So `infertune tune` killed with SIGTERM or SIGKILL during a trial takes its server (and the
server's GPUs) with it. This module imports nothing of infertune: it starts fast and alone.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from types import FrameType

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.2
DEFAULT_GRACE_S = 20.0


def _prctl(option: int, value: int) -> bool:
    """prctl(2) through libc; False where there is none (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(option, value, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> list[int]:
    """Every process below `root` (by parent id, from /proc; [] without /proc)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()  # after "pid (comm)": state, ppid, ...
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(entry))
    out: list[int] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def _signal_all(sig: int) -> None:
    for pid in descendants(os.getpid()):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _reap() -> tuple[bool, list[tuple[int, int]]]:
    """(whether any child is left, [(pid, wait status)] of those that ended)."""
    ended: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False, ended
        if pid == 0:
            return True, ended
        ended.append((pid, status))


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _teardown(grace_s: float) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(os.getpgrp(), signal.SIGTERM)  # the guard's own handler only sets a flag
    _signal_all(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        left, _ = _reap()
        if not left:
            return
        time.sleep(0.05)
    _signal_all(signal.SIGKILL)
    while _reap()[0]:
        time.sleep(0.05)


def run(parent: int, argv: list[str], grace_s: float = DEFAULT_GRACE_S) -> int:
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        return 1  # the tuner died before the server could start: start nothing
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    try:
        child = subprocess.Popen(argv)
    except OSError as exc:
        print(f"cannot start {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        return 127
    code = 0
    while True:
        if stopping or os.getppid() != parent:
            _teardown(grace_s)
            return 128 + signal.SIGTERM
        left, ended = _reap()
        for pid, status in ended:
            if pid == child.pid:
                code = _exit_code(status)
        if not left:
            return code
        time.sleep(POLL_S)


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="guard", description=__doc__.split("\n\n")[0])
    parser.add_argument("--parent", type=int, required=True, help="The tuner's process id.")
    parser.add_argument("--grace", type=float, default=DEFAULT_GRACE_S, help="Seconds to stop.")
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- and the server command.")
    a = parser.parse_args(args)
    argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
    if not argv:
        parser.error("no server command after --")
    return run(a.parent, argv, a.grace)


if __name__ == "__main__":
    sys.exit(main())
