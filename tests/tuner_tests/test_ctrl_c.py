"""Ctrl-C at any moment of `infertune tune` (a real process, a real SIGINT): the run ends with
exit 0 and its full result, or with exit 130 and the interrupted headline; never a traceback,
and its report is all three files or none.

The moments are events of the run, read from what it writes (its study journal, its report,
its result on stdout), so that a busy machine moves the signal with the run, not away from it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from infertune_tuner.journal import LOCK

REPO = Path(__file__).resolve().parents[2]
INFERTUNE = str(Path(sys.executable).parent / "infertune")
SPEC = REPO / "examples" / "llama2-70b-h100.yaml"
REPORTS = {"report.json", "report.md", "report.html"}
AT_ONCE = 4  # runs side by side
WITHIN_S = 180.0  # for one run, however busy the machine (a run alone takes a few seconds)


def _journal(out: Path) -> str:
    try:
        return (out / "study.journal").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


Wrap = Callable[[list[str]], list[str]]  # the ctrl_c_reaches fixture (tests/conftest.py)
Reached = Callable[[Path, str], bool]  # (output folder, stdout so far): has the moment come?


def _nth(pattern: str, n: int) -> Reached:
    """The run's journal holds `n` records matching `pattern`."""
    rx = re.compile(pattern)
    return lambda out, said: len(rx.findall(_journal(out))) >= n


TRIAL_CREATED = r'"op_code":\s*4\b'  # a trial asked for: the search decides what it measures
CLAIMED = r'"user_attr":\s*\{"config":'  # the trial measures its configuration
MEASURED = r'"user_attr":\s*\{"measurement":'  # measured: the search weighs it in (tell)
STOPPED = r'"user_attr":\s*\{"stop":'  # the search decided to stop
# Twelve moments, in the order a run passes them.
MOMENTS: dict[str, Reached] = {
    "planning (the study folder locked)": lambda out, said: (out / LOCK).exists(),
    "the study created": _nth(r'"op_code":\s*0\b', 1),
    "the first decision": _nth(TRIAL_CREATED, 1),
    "the first trial running": _nth(CLAIMED, 1),
    "the first trial told": _nth(MEASURED, 1),
    "the third decision": _nth(TRIAL_CREATED, 3),
    "the third trial told": _nth(MEASURED, 3),
    "the fifth trial running": _nth(CLAIMED, 5),
    "the fifth trial told": _nth(MEASURED, 5),
    "the search stopped": _nth(STOPPED, 1),
    "the report written": lambda out, said: (out / "report.json").exists(),
    "the result printed": lambda out, said: "report:" in said,
}


@dataclass
class Run:
    moment: str
    out: Path
    proc: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)
    signalled: bool = False

    def said(self) -> str:
        return (self.out.parent / f"{self.out.name}.stdout").read_text(errors="replace")

    def err(self) -> str:
        return (self.out.parent / f"{self.out.name}.stderr").read_text(errors="replace")


def _start(tmp_path: Path, i: int, moment: str, ctrl_c_reaches: Wrap) -> Run:
    out = tmp_path / f"run{i}"
    with (
        open(tmp_path / f"run{i}.stdout", "wb") as stdout,
        open(tmp_path / f"run{i}.stderr", "wb") as stderr,
    ):
        proc = subprocess.Popen(
            ctrl_c_reaches([INFERTUNE, "tune", str(SPEC), "--out", str(out), "--no-progress"]),
            # Each trial takes 1/2000 of its time on the pool: a run lasts a few seconds.
            env={**os.environ, "INFERTUNE_SIMULATED_TIME_SCALE": "0.0005"},
            stdout=stdout, stderr=stderr,
        )  # fmt: skip
    return Run(moment, out, proc)


def _sweep(tmp_path: Path, ctrl_c_reaches: Wrap) -> list[Run]:
    """Every moment's run, each sent SIGINT when its moment comes (a run that ended first is
    left alone), until all have ended."""
    waiting = list(enumerate(MOMENTS))
    running: list[Run] = []
    ended: list[Run] = []
    try:
        while waiting or running:
            while waiting and len(running) < AT_ONCE:
                i, moment = waiting.pop(0)
                running.append(_start(tmp_path, i, moment, ctrl_c_reaches))
            for run in list(running):
                if run.proc.poll() is not None:
                    running.remove(run)
                    ended.append(run)
                elif not run.signalled and MOMENTS[run.moment](run.out, run.said()):
                    run.proc.send_signal(signal.SIGINT)
                    run.signalled = True
                else:
                    assert time.monotonic() - run.started < WITHIN_S, f"{run.moment}: hangs"
            time.sleep(0.005)
    finally:
        for run in running:
            run.proc.kill()
            run.proc.wait()
    return sorted(ended, key=lambda r: list(MOMENTS).index(r.moment))


def test_ctrl_c_at_any_moment_ends_with_the_result_or_the_interrupted_headline(
    tmp_path: Path, ctrl_c_reaches: Wrap
) -> None:
    runs = _sweep(tmp_path, ctrl_c_reaches)
    for run in runs:
        said, err = run.said(), run.err()
        what = f"Ctrl-C at {run.moment}: exit {run.proc.returncode}\n{said}\n{err}"
        assert run.proc.returncode in (0, 130), what  # not 1, not killed by the signal
        assert "Traceback" not in said + err, what
        written = {p.name for p in run.out.glob("report.*")}
        assert written in (set(), REPORTS), f"{what}\nwritten: {sorted(written)}"
        if run.proc.returncode == 0:  # it had finished: the full result, once
            assert said.startswith("Best: "), what
            assert "Interrupted" not in said and written == REPORTS, what
            report = json.loads((run.out / "report.json").read_text())
            assert not report["stopped_reason"].startswith("interrupted"), what
        else:
            assert said.startswith("Interrupted (Ctrl-C)"), what
            assert "Best: " not in said, what
            if written:
                report = json.loads((run.out / "report.json").read_text())
                assert report["stopped_reason"].startswith("interrupted"), what
                assert f"report: {run.out / 'report.json'}" in said, what
    # The sweep interrupted runs: every moment before the search stopped came while it ran.
    stopped = list(MOMENTS).index("the search stopped")
    assert all(r.signalled for r in runs[:stopped]), [r.moment for r in runs if not r.signalled]
    assert sum(r.proc.returncode == 130 for r in runs) >= stopped


def test_sigterm_mid_search_exits_143_without_a_traceback(
    tmp_path: Path, ctrl_c_reaches: Wrap
) -> None:
    """SIGTERM (a pod deleted, `kill`) while trials are told: the exit status says so, whatever
    Optuna raised while the SystemExit unwound its trial loop."""
    for i, moment in enumerate(("the first trial told", "the third decision")):
        run = _start(tmp_path, i, moment, ctrl_c_reaches)
        try:
            while run.proc.poll() is None and not MOMENTS[moment](run.out, run.said()):
                assert time.monotonic() - run.started < WITHIN_S, f"{moment}: hangs"
                time.sleep(0.005)
            run.proc.send_signal(signal.SIGTERM)
            run.proc.wait(timeout=WITHIN_S)
        finally:
            if run.proc.poll() is None:
                run.proc.kill()
                run.proc.wait()
        what = f"SIGTERM at {moment}: exit {run.proc.returncode}\n{run.said()}\n{run.err()}"
        assert run.proc.returncode in (0, 143), what
        assert "Traceback" not in run.said() + run.err(), what


def test_an_error_raised_while_sigterm_unwinds_is_the_sigterm() -> None:
    from infertune_tuner.interrupt import exit_behind

    stop = SystemExit(143)
    try:
        try:
            raise stop
        finally:
            raise UnboundLocalError("cannot access local variable 'updated_state'")  # Optuna's
    except UnboundLocalError as exc:
        assert exit_behind(exc) is stop
    assert exit_behind(ValueError("no")) is None
