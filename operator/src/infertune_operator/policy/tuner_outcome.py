"""What a tuner Job and its pods say (pure): where it stands, why its pods wait, and a failure
message a person can act on.

A parallel tuning is an Indexed Job of several workers: it succeeds when every worker has
(``completions``), not when the first one does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class JobOutcome:
    state: Literal["pending", "running", "succeeded", "failed"]
    reason: str = ""
    message: str = ""


def _true_condition(obj: Mapping[str, Any], ctype: str) -> Mapping[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype and c.get("status") == "True":
            return c
    return None


def job_outcome(job: Mapping[str, Any]) -> JobOutcome:
    """Where a tuner Job stands.

    Args:
        job: The Job as read.

    Returns:
        succeeded (Complete, or as many succeeded pods as completions: every worker of a
        parallel tuning), failed (the Failed condition with its reason,
        or more failed pods than backoffLimit), running (its pod runs) or pending (no pod runs
        yet: scheduling, GPUs, image pull).
    """
    status = job.get("status") or {}
    completions = int((job.get("spec") or {}).get("completions") or 1)  # workers of an Indexed Job
    if _true_condition(job, "Complete") or int(status.get("succeeded") or 0) >= completions:
        return JobOutcome("succeeded")
    failed = _true_condition(job, "Failed")
    if failed:
        return JobOutcome("failed", str(failed.get("reason") or "Failed"),
                          str(failed.get("message") or ""))  # fmt: skip
    backoff = int((job.get("spec") or {}).get("backoffLimit", 6))
    if int(status.get("failed") or 0) > backoff:
        return JobOutcome("failed", "BackoffLimitExceeded",
                          f"{status.get('failed')} failed pods (backoffLimit {backoff})")  # fmt: skip
    # A tuner pod without readiness probe is ready once its container runs. Clusters without
    # Job .status.ready (before 1.24) fall back to "a pod exists".
    ready = status.get("ready")
    running = int(ready) >= 1 if ready is not None else int(status.get("active") or 0) >= 1
    return JobOutcome("running" if running else "pending")


_WAITING_REASONS = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
    "CreateContainerError", "RunContainerError",
})  # fmt: skip


def pod_waiting_reason(pods: Iterable[Mapping[str, Any]]) -> str | None:
    """Why the tuner pod does not run yet, when Kubernetes says (unschedulable, image pull...)."""
    newest = sorted(pods, key=lambda p: str(p.get("metadata", {}).get("creationTimestamp", "")))
    for pod in reversed(newest):
        name = pod.get("metadata", {}).get("name", "?")
        status = pod.get("status") or {}
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                why = cond.get("message") or cond.get("reason") or "unschedulable"
                return f"pod {name} cannot be scheduled: {_clip(str(why), 300)}"
        for cs in status.get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in _WAITING_REASONS:
                detail = (
                    f": {_clip(str(waiting['message']), 300)}" if waiting.get("message") else ""
                )
                return f"pod {name}: {waiting['reason']}{detail}"
    return None


@dataclass(frozen=True)
class PodFailure:
    pod: str
    container: str
    reason: str
    exit_code: int | None
    message: str


def pod_failure(pods: Iterable[Mapping[str, Any]]) -> PodFailure | None:
    """Why the tuner's pods failed, as Kubernetes recorded it.

    Args:
        pods: The pods of the tuner Job.

    Returns:
        The most recent failure: a container that terminated with a non-zero exit code (its
        reason, e.g. OOMKilled, exit code and message), or a pod the node failed (Evicted and
        the like); None when no pod failed.
    """
    found: list[tuple[str, PodFailure]] = []
    for pod in pods:
        name = pod.get("metadata", {}).get("name", "?")
        status = pod.get("status") or {}
        for cs in status.get("containerStatuses") or []:
            for key in ("state", "lastState"):
                term = (cs.get(key) or {}).get("terminated")
                if not term or term.get("exitCode") == 0:
                    continue
                when = str(term.get("finishedAt") or "")
                found.append((when, PodFailure(
                    pod=name, container=str(cs.get("name") or ""),
                    reason=str(term.get("reason") or "Error"),
                    exit_code=term.get("exitCode"), message=str(term.get("message") or "").strip(),
                )))  # fmt: skip
        if status.get("phase") == "Failed" and status.get("reason"):  # Evicted and the like
            found.append((str(status.get("startTime") or ""), PodFailure(
                pod=name, container="", reason=str(status["reason"]), exit_code=None,
                message=str(status.get("message") or ""),
            )))  # fmt: skip
    if not found:
        return None
    return max(found, key=lambda pair: pair[0])[1]


_ADVICE = {
    "OOMKilled": "the tuner ran out of memory: give the tuner more memory or narrow "
    "spec.search (fewer large maxBatchSize values)",
    "DeadlineExceeded": "set spec.tuning.timeoutMinutes (the tuner then stops itself in time and "
    "reports the best configuration so far), raise it, or lower spec.tuning.maxTrials",
    "BackoffLimitExceeded": "the tuner crashed on every attempt",
    "Evicted": "the node evicted the tuner pod (resource pressure)",
}


def ended_on_deadline(outcome: JobOutcome) -> bool:
    """The Job controller stopped the Job at its activeDeadlineSeconds."""
    return outcome.state == "failed" and outcome.reason == "DeadlineExceeded"


def job_failure_message(
    job: str, outcome: JobOutcome, pod: PodFailure | None, logs: str, deadline: str | None = None
) -> str:
    """What a person needs to act on a failed tuner Job, in one line.

    Args:
        job: The Job's name.
        outcome: Its failed outcome (reason and message from the Job).
        pod: The pods' failure, when one was found.
        logs: The last log lines of the failed container ("" when not read).
        deadline: The Job's deadline and how it was derived (``tuner_deadline.deadline_text``),
            said when the Job ended on it.

    Returns:
        The Job's reason, the pod's (with exit code and message), the last log lines, advice
        for the known reasons (OOMKilled, DeadlineExceeded ...) and how to retry.
    """
    parts = [f"tuner Job {job} failed ({outcome.reason}"
             + (f": {outcome.message}" if outcome.message else "") + ")"]  # fmt: skip
    if deadline and ended_on_deadline(outcome):
        parts.append(f"; it ran into its deadline of {deadline}")
    if pod is not None:
        exit_code = f", exit code {pod.exit_code}" if pod.exit_code is not None else ""
        where = f"container {pod.container} of pod {pod.pod}" if pod.container else f"pod {pod.pod}"
        detail = f"; {where}: {pod.reason}{exit_code}"
        if pod.message:
            detail += f": {_clip(pod.message, 300)}"
        parts.append(detail)
    if logs.strip():
        parts.append(f"; last log lines: {_clip(' | '.join(logs.strip().splitlines()[-3:]), 400)}")
    reason = pod.reason if pod is not None and pod.reason in _ADVICE else outcome.reason
    advice = _ADVICE.get(reason, "")
    parts.append(f". {advice[:1].upper() + advice[1:]}." if advice else ".")
    parts.append(f" See `kubectl logs job/{job}`; delete the Job to retry, or change the spec.")
    return "".join(parts)


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
