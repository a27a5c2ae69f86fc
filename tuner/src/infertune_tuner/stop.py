"""Why a search stopped: a typed value that the report, the CLI and the operator read.

Every worker of a study, and every later run that resumes it, reads the same answer: it is kept
as the study's user attribute `stop` ({"kind", "detail"}). Nothing parses `detail`; it is the
sentence a person reads after the kind. The report carries both (`stop` and `stopped_reason`,
the sentence), the CLI picks its exit status from the kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optuna.study import Study

STOP_ATTR = "stop"


class StopKind(StrEnum):
    CONVERGED = "converged"  # P(an untried configuration beats the best) fell below the bound
    INFEASIBLE = "infeasible"  # no untried configuration plausibly meets the SLO
    RULED_OUT = "ruled-out"  # every configuration that could fit is ruled out
    EXHAUSTED = "exhausted"  # every candidate was measured
    BUDGET = "budget"  # maxTrials executed
    TIMEOUT = "timeout"  # spec.tuning.timeoutMinutes reached
    ABORTED = "aborted"  # the first trials all failed: the set-up is broken
    INTERRUPTED = "interrupted"  # Ctrl-C (SIGINT)


@dataclass(frozen=True)
class StopReason:
    kind: StopKind
    detail: str

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.detail}"

    def as_attr(self) -> dict[str, str]:
        return {"kind": self.kind.value, "detail": self.detail}

    @classmethod
    def from_attr(cls, value: Any) -> StopReason | None:
        """The reason stored on a study (None when there is none, or it is not one)."""
        if not isinstance(value, dict):
            return None
        try:
            return cls(StopKind(value["kind"]), str(value["detail"]))
        except (KeyError, ValueError):
            return None


def budget(max_trials: int) -> StopReason:
    return StopReason(StopKind.BUDGET, f"maxTrials ({max_trials}) executed")


def aborted(trials: int, last: object) -> StopReason:
    return StopReason(StopKind.ABORTED, f"the first {trials} trials all failed; last: {last}")


TIMEOUT = StopReason(StopKind.TIMEOUT, "spec.tuning.timeoutMinutes reached")
INTERRUPTED = StopReason(
    StopKind.INTERRUPTED, "stopped by Ctrl-C (SIGINT); re-run to resume the study"
)


def record(study: Study, reason: StopReason) -> None:
    """Stop the study for `reason` (the first reason given wins), for every worker to read."""
    if why_stopped(study) is None:
        study.set_user_attr(STOP_ATTR, reason.as_attr())
    study.stop()


def why_stopped(study: Study) -> StopReason | None:
    """Why the study stopped, as its workers recorded it (None: it has not)."""
    return StopReason.from_attr(study.user_attrs.get(STOP_ATTR))
