"""A tuning report cut down to fit a ConfigMap, whatever the study (pure).

A report lists every configuration of the space (measured or ruled out) with its predictions,
SLO checks and failure text: the largest study the CRD allows (1000 trials over 7 x 64 x 6 x 2
configurations) makes several megabytes of JSON, and a ConfigMap holds 1 MiB. ``store``
stores the complete report when it fits (plain, or gzipped beside this summary); the summary is
what is always there, and it is bounded by construction:

* only the executed trials are listed (the configurations ruled out by prediction are counted in
  the report's ``untried`` groups and listed in the complete report);
* each trial keeps its configuration, state, metrics, duration and purpose; its predictions go,
  its SLO checks are folded into the reason ("E2E p95 <= 25600 ms missed"), and the reason is cut
  to :data:`REASON_CHARS` characters (a failed trial's reason can be a long log tail);
* each ``untried`` group keeps its count and its first :data:`UNTRIED_CONFIGS` configurations;
* if that is still over the budget (a resumed study with more trials than any one run may
  execute), trials are dropped, the best one and the nearest misses last, the fastest kept
  longest, until it fits.

It is still a valid report (``Report``), so everything that reads one (the operator's status,
``infertune report``) works on it.
"""

from __future__ import annotations

import json
from typing import Any

from infertune_tuner.result import Report, Trial

REASON_CHARS = 200  # a sentence and the gist of a log tail; the complete report has the rest
UNTRIED_CONFIGS = 12  # per group: the most promising first (as the tuner orders them)


def compact(data: Any) -> str:
    """JSON without indentation: what the ConfigMap stores (``infertune report`` indents)."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def size(text: str) -> int:
    """Bytes a value takes in a ConfigMap (the API server counts UTF-8 bytes)."""
    return len(text.encode("utf-8"))


def _clip(text: str | None) -> str | None:
    if text is None or len(text) <= REASON_CHARS:
        return text
    return text[: REASON_CHARS - 1] + "…"


def _trimmed(trial: Trial) -> Trial:
    """The trial with its SLO checks folded into its reason, and the reason cut short (its
    predictions and checks themselves are left out when it is written, see :data:`_DROPPED`)."""
    missed = [c.bound for c in trial.slo_checks if not c.ok]
    reason = trial.reason
    if missed and not reason:
        reason = "; ".join(missed) + " missed"
    return trial.model_copy(update={"reason": _clip(reason)})


_DROPPED = {"predicted", "slo_checks"}  # a summarised trial's fields that are not written


def _objective(trial: Trial) -> float:
    return trial.metrics.output_tokens_per_s_per_gpu if trial.metrics is not None else -1.0


def summarize(report: Report, budget: int) -> str:
    """The summary's compact JSON, at most ``budget`` bytes.

    Args:
        report: The complete report.
        budget: Bytes the summary may take.

    Returns:
        The JSON of a valid report: the executed trials, trimmed (see the module docstring).
        ValueError when even a report without trials would not fit (a budget far below any
        report's own size: the request, the best configuration and the verdict).
    """
    trials = [_trimmed(t) for t in report.trials if t.executed]
    untried = [
        g.model_copy(update={"configs": g.configs[:UNTRIED_CONFIGS]}) for g in report.untried
    ]
    protected = {m.trial for m in report.nearest_misses}
    if report.best is not None:
        protected.add(report.best.trial)
    # Least likely to go first: the best and the nearest misses, then by tok/s/GPU.
    ranked = sorted(trials, key=lambda t: (t.number not in protected, -_objective(t), t.number))
    # Each part is written once; a candidate summary only joins them.
    data = report.model_copy(update={"trials": [], "untried": untried}).model_dump(
        mode="json", by_alias=True
    )
    written = [t.model_dump(mode="json", by_alias=True, exclude=_DROPPED) for t in ranked]

    def render(keep: int) -> str:
        kept = sorted(range(keep), key=lambda i: ranked[i].number)
        return compact({**data, "trials": [written[i] for i in kept]})

    text = render(len(ranked))
    if size(text) <= budget:
        return text
    lo, hi = 0, len(ranked)  # render(lo) fits (checked below); render(hi) does not
    if size(render(0)) > budget:
        raise ValueError(
            f"even without its trials the report takes {size(render(0))} bytes (budget {budget})"
        )
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if size(render(mid)) <= budget:
            lo = mid
        else:
            hi = mid
    return render(lo)
