"""What to measure again before a winner is declared.

One run of a configuration is one draw from its distribution. Before the search stops, it
measures a second time: the incumbent; every finalist within `improvement` of it whose SLO
margin is within run-to-run noise (`confirm_margin`); every measured rival the posterior still
gives a real chance (>= `stop_probability`) of beating the incumbent. A contender whose two
runs disagree on an SLO bound (one met it, one missed) is measured a third time: its typical run
(evidence.combine) decides which side it is on. A measured rival the posterior holds more likely
than not to beat the incumbent (`tie_doubt`) is in doubt: its runs and the incumbent's disagree
with what their neighbours say, so both are measured until each has `tie_repeats` runs.
"""

from __future__ import annotations

from infertune_tuner import slo
from infertune_tuner.config import TrialConfig
from infertune_tuner.request import TuningRequest
from infertune_tuner.search.evidence import Known
from infertune_tuner.search.settings import SearchSettings


def confirmations(
    request: TuningRequest,
    known: Known,
    best: TrialConfig,
    rivals: set[TrialConfig],
    settings: SearchSettings,
    doubted: set[TrialConfig] | None = None,
) -> list[TrialConfig]:
    """The configurations to measure again, the incumbent first (see the module doc).

    Args:
        request: The SLO the repeats are checked against.
        known: What the study measured and has in flight.
        best: The incumbent.
        rivals: Measured feasible configurations with a real chance to beat it.
        settings: `improvement`, `confirm_margin`, `tie_repeats`.
        doubted: Measured rivals the posterior holds more likely than not to beat the incumbent
            (its smooth shape disagrees with their runs' order): they and the incumbent are
            measured until each has `tie_repeats` runs.
    """
    best_tps = known.measured[best].output_tokens_per_s_per_gpu or 0.0
    # A configuration another worker is measuring again is confirmed there.
    out = [best] if known.repeats(best) < 2 and best not in known.in_flight else []
    for cfg, m in known.feasible().items():
        if cfg == best or known.repeats(cfg) >= 2 or cfg in known.in_flight:
            continue
        if cfg in rivals:
            out.append(cfg)
            continue
        if (m.output_tokens_per_s_per_gpu or 0.0) * (1 + settings.improvement) < best_tps:
            continue
        margins = [slo.headroom(c) for c in known.checks.get(cfg, [])]
        if margins and min(margins) < settings.confirm_margin:
            out.append(cfg)
    out += [c for c in straddling(request, known, best_tps, settings) if c not in out]
    if doubted:
        for cfg in [best, *sorted(doubted)]:
            short = known.repeats(cfg) < settings.tie_repeats
            if short and cfg not in out and cfg not in known.in_flight:
                out.append(cfg)
    return out


def straddling(
    request: TuningRequest, known: Known, best_tps: float, settings: SearchSettings
) -> list[TrialConfig]:
    """Contenders measured twice whose repeats disagree on an SLO bound: a third run decides."""
    out = []
    for cfg, runs in known.runs.items():
        ok = [m for m in runs if m.status == "ok"]
        if len(runs) != 2 or len(ok) != 2 or cfg in known.in_flight:
            continue
        tps = known.measured[cfg].output_tokens_per_s_per_gpu or 0.0
        if tps * (1 + settings.improvement) < best_tps:
            continue
        if len({all(c.ok for c in slo.check(request, m)) for m in ok}) == 2:
            out.append(cfg)
    return out
