"""What `infertune tune` shows while it runs (stderr), fed by the tuner's hooks.

A resumed study says so before anything runs. The bar counts executed trials against the
budget; beside it, the trial that is running, its phase (starting server, loading model,
warm-up, measuring) and how long that phase has taken, then the verdict of the last trial and
the best feasible tok/s/GPU so far. When the search stops, the bar goes: what the run found
and why it stopped is the result, printed once on stdout by the command (a search that
converged after 4 of 40 trials must not end with a bar at 4/40 on stderr and the same summary
again on stdout).
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TaskID, TextColumn
from rich.text import Text

from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement, TrialPhase
from infertune_tuner.result import Check
from infertune_tuner.run import StudyStart
from infertune_tuner.search.evidence import Evidence


class _PhaseColumn(ProgressColumn):
    """The running trial's phase and its elapsed seconds (refreshed live)."""

    def render(self, task: Task) -> Text:
        phase, since = task.fields.get("phase"), task.fields.get("since")
        if not phase or since is None:
            return Text("")
        return Text(f"{phase} {time.monotonic() - since:.0f} s", style="cyan")


class TuneProgress:
    """The hooks `tune()` calls (``on_start``, ``on_phase``, ``on_trial``), shown on stderr."""

    def __init__(self, out_dir: Path, *, bar: bool = True, console: Console | None = None):
        self.out_dir = out_dir
        self.console = console or Console(stderr=True)
        self.show_bar = bar
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._budget = 0
        self._done = 0

    def start(self, study: StudyStart) -> None:
        for note in study.notes:
            self.console.print(
                f"[yellow]repaired:[/yellow] {note}", highlight=False, soft_wrap=True
            )
        if study.resumed_trials:
            self.console.print(
                f"Resuming the study in {self.out_dir}: {study.resumed_trials} trial"
                f"{'s' * (study.resumed_trials != 1)} from an earlier run count toward the "
                f"budget of {study.max_trials} (use another --out to start afresh)",
                highlight=False,
            )
        if not self.show_bar:
            return
        self._budget, self._done = study.max_trials, study.resumed_trials
        self._progress = Progress(
            TextColumn("[bold]tuning"),
            BarColumn(bar_width=24),
            TextColumn("{task.fields[count]}"),
            TextColumn("{task.description}"),
            _PhaseColumn(),
            console=self.console,
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task(
            "", total=study.max_trials, completed=self._done, count=self._count(), phase=None
        )

    def _count(self) -> str:
        return f"{self._done}/{self._budget}"

    def phase(self, config: TrialConfig, phase: TrialPhase) -> None:
        if self._progress is None or self._task is None:
            return
        self._progress.update(
            self._task, description=config.label(), phase=phase, since=time.monotonic()
        )

    def trial(
        self, config: TrialConfig, m: Measurement, checks: list[Check], known: Evidence
    ) -> None:
        if self._progress is None or self._task is None:
            return
        self._done += 1
        verdict = m.status if m.status != "ok" else (
            "SLO ok" if all(c.ok for c in checks) else "SLO miss"
        )  # fmt: skip
        desc = f"{config.label()}: {verdict}"
        best = known.best_tps
        if best:
            desc += f" | best {best:.0f} tok/s/GPU"
        self._progress.update(
            self._task, advance=1, description=desc, count=self._count(), phase=None
        )

    def finish(self) -> None:
        """Take the bar away (the command prints the result on stdout)."""
        if self._progress is None or self._task is None:
            return
        self._progress.update(self._task, visible=False)
        self._progress.stop()
        self._progress = None
