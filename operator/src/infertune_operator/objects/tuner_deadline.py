"""How long a tuner Job may run (pure): its ``activeDeadlineSeconds`` and why.

Nothing runs forever: a hung tuner would hold its GPUs until someone noticed. Every tuner Job gets
a deadline, and the Job carries how it was derived (annotation ``infertune.io/deadline``) so that
a Job that ends on it can say so in the status (``TuningDeadlineExceeded``).

* ``spec.tuning.timeoutMinutes`` set: that, plus :data:`REPORT_GRACE_S`. The tuner stops itself at
  ``timeoutMinutes`` and reports the best configuration so far; the grace is for the report.
* unset: the trial budget times the per-trial bound, plus the same grace:
  ``maxTrials x (spec.serving.startupTimeoutMinutes + INFERTUNE_TRIAL_BENCHMARK_MINUTES)``.
  A trial's server must be ready within ``startupTimeoutMinutes`` (the harness gives up on it
  then: that is where the first part of the per-trial bound comes from); the benchmark that
  follows is bounded by the operator setting (default 30 min: the warm-up and up to 2048
  measured requests, several turns of the batch; docs/operator.md has the arithmetic).
  Trials of a parallel tuning share the budget, so the bound only gets looser with workers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infertune_operator.api.types import InferenceDeployment
from infertune_operator.naming import ANNOTATION_DEADLINE
from infertune_operator.settings import Settings

REPORT_GRACE_S = 600  # the tuner has stopped (or hung); time to write the report ConfigMap


@dataclass(frozen=True)
class Deadline:
    seconds: int
    derivation: str  # how it was computed, in words (the Job's annotation)


def job_deadline(obj: InferenceDeployment, settings: Settings) -> Deadline:
    """The tuner Job's activeDeadlineSeconds for this spec, and how it was derived."""
    grace = f"{REPORT_GRACE_S // 60} min to write the report"
    timeout = obj.spec.tuning.timeout_minutes
    if timeout:
        return Deadline(
            timeout * 60 + REPORT_GRACE_S, f"spec.tuning.timeoutMinutes {timeout} min + {grace}"
        )
    trials = obj.spec.tuning.effective_max_trials(settings.default_max_trials)
    startup = obj.spec.serving.startup_timeout_minutes
    bench = settings.trial_benchmark_minutes
    return Deadline(
        trials * (startup + bench) * 60 + REPORT_GRACE_S,
        f"{trials} trials x {startup + bench} min per trial ({startup} min server start-up, "
        f"spec.serving.startupTimeoutMinutes, + {bench} min benchmark, the operator's "
        f"INFERTUNE_TRIAL_BENCHMARK_MINUTES) + {grace}; spec.tuning.timeoutMinutes is unset",
    )


def human(seconds: int) -> str:
    """``195000`` -> ``54 h 10 min``; ``2400`` -> ``40 min``."""
    hours, rest = divmod(int(seconds), 3600)
    minutes = rest // 60
    if hours and minutes:
        return f"{hours} h {minutes} min"
    return f"{hours} h" if hours else f"{minutes} min"


def deadline_text(job: Mapping[str, Any]) -> str | None:
    """What a Job's deadline was and how it was derived (None: it has none)."""
    seconds = (job.get("spec") or {}).get("activeDeadlineSeconds")
    if not seconds:
        return None
    how = ((job.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_DEADLINE)
    text = f"{human(int(seconds))} (activeDeadlineSeconds {int(seconds)}"
    return text + (f" = {how})" if how else ")")
