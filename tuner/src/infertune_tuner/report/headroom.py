"""What the chosen configuration's room inside each SLO bound means to a reader (slo.room
computes it; the report, the CLI and the operator's Tuned condition say it from here).

A typical run that meets a bound by less than two run-to-run standard deviations is a choice no
few runs settle: a fresh run of the same configuration misses the bound a fair share of the time.
The report says how often, and what to ask for when the bound is hard: the same bound two
run-to-run SDs tighter, so that the search chooses a configuration with room.
"""

from __future__ import annotations

import math

from infertune_tuner.metrics import OBJECTIVE, latency_metric
from infertune_tuner.result import Headroom, Report, Trial
from infertune_tuner.slo import SETTLED_SDS, room


def unsettled(report: Report) -> list[Headroom]:
    """The bounds the chosen configuration meets by less than two run-to-run SDs (slo.room)."""
    return [h for h in report.best.headroom if not h.settled] if report.best else []


def _quantity(h: Headroom) -> str:
    """'TTFT p95', or 'tok/s/GPU' for the floor."""
    if h.metric == OBJECTIVE.key:
        return OBJECTIVE.label
    return f"{latency_metric(h.metric).label} {h.percentile}"


def _tighter(h: Headroom) -> str:
    """The bound moved two run-to-run SDs of one run inwards."""
    if h.metric == OBJECTIVE.key:
        return f"{OBJECTIVE.label} >= {h.limit_ms * math.exp(SETTLED_SDS * h.noise):.0f}"
    return f"{_quantity(h)} <= {h.limit_ms * math.exp(-SETTLED_SDS * h.noise):.0f} ms"


def _part(h: Headroom) -> str:
    side = "over" if h.metric == OBJECTIVE.key else "under"
    return (
        f"{_quantity(h)} {h.headroom:.1%} {side} its bound (a fresh run meets it "
        f"{h.p_meets:.0%} of the time)"
    )


def headroom_line(report: Report) -> str | None:
    """The room the chosen configuration's typical run leaves inside each bound and the chance
    a fresh run of it meets the bound; when some bound is met within run-to-run noise, only
    those, with what to ask for if such a bound is hard (None: nothing chosen)."""
    if report.best is None or not report.best.headroom:
        return None
    close = unsettled(report)
    if not close:
        return "SLO headroom: " + "; ".join(_part(h) for h in report.best.headroom) + "."
    said = f"SLO headroom within run-to-run noise: {'; '.join(_part(h) for h in close)}."
    rerun = f"re-run with {', '.join(_tighter(h) for h in close)} (two run-to-run SDs tighter)"
    # Followed, that advice must end here: a tighter bound has configurations at its own edge
    # too, so the advice says which bound the next report's headroom is to be read against.
    if (other := roomy_alternative(report)) is not None and other.metrics is not None:
        c = other.config
        return (
            f"{said} If the bound is hard: the best measured configuration with room in every "
            f"bound is TP{c.tp}, max batch {c.max_batch_size}, {c.quantization}, KV "
            f"{c.kv_cache_dtype} ({other.metrics.output_tokens_per_s_per_gpu:.0f} tok/s/GPU, "
            f"trial {other.number}); {rerun} to have it or better chosen, and read that run's "
            "headroom against this bound, not the tighter one."
        )
    return (
        f"{said} If the bound is hard, {rerun}: what that run chooses has room inside this "
        "bound, whatever its report says of the tighter one."
    )


def roomy_alternative(report: Report) -> Trial | None:
    """The measured configuration with the most tok/s/GPU whose run meets every bound with room
    (two run-to-run SDs of the pool's noise of that bound, as the chosen one's headroom is
    weighed), other than the chosen one; None when no such run was measured."""
    if report.best is None:
        return None
    noise = {h.bound: h.noise for h in report.best.headroom}
    roomy = [
        t for t in report.trials
        if t.executed and t.state == "complete" and t.metrics is not None and t.slo_checks
        and t.config != report.best.config
        and all(c.ok and c.bound in noise and room(c, noise[c.bound], 1).settled
                for c in t.slo_checks)
    ]  # fmt: skip
    return max(roomy, key=lambda t: t.metrics.output_tokens_per_s_per_gpu if t.metrics else 0.0,
               default=None)  # fmt: skip


def headroom_note(report: Report) -> str | None:
    """The same warning in a clause, for a one-line status (None when every bound is settled)."""
    close = unsettled(report)
    if not close:
        return None
    return "met within run-to-run noise: " + ", ".join(
        f"{_quantity(h)} (a fresh run meets it {h.p_meets:.0%} of the time)" for h in close
    )
