"""Lower rungs: what a launch measures besides its own configuration.

A server launched for max batch B is also the server of every max batch b < B (backends/base.py
says why), so a trial measures its configuration and then, on the same server, up to
`SearchSettings.rungs` lower batches of the space: the next ones down, no lower than
`rung_floor` x B, that are still worth a measurement. A launch costs a server start and a weight
load; a rung costs only its warm-up and measured requests. The planner values a launch by the
expected gain of its configuration and of its rungs together (`launch_gain`), and the driver
asks the backend for the rungs this module names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from infertune_tuner.config import TrialConfig
from infertune_tuner.search.evidence import Known
from infertune_tuner.search.settings import SearchSettings


def ladder(
    cfg: TrialConfig,
    batches: Sequence[int],
    settings: SearchSettings,
    worth: Callable[[TrialConfig], bool],
) -> list[TrialConfig]:
    """The rungs of a launch of `cfg`: `cfg` at the next `settings.rungs` lower `batches`
    (largest first), down to `settings.rung_floor` x its batch, that are `worth` measuring.
    The one rule for what a launch measures besides `cfg`."""
    out: list[TrialConfig] = []
    for b in sorted(batches, reverse=True):
        if len(out) >= settings.rungs or b < settings.rung_floor * cfg.max_batch_size:
            break
        if b < cfg.max_batch_size and worth(lower := replace(cfg, max_batch_size=b)):
            out.append(lower)
    return out


def worth_measuring(
    known: Known, settings: SearchSettings, candidate: Callable[[TrialConfig], bool]
) -> Callable[[TrialConfig], bool]:
    """Whether a lower configuration is worth a rung: a `candidate` (untried, not ruled out), or
    a finalist measured once (feasible, within `improvement` of the best): its second run, which
    the search would otherwise spend a launch on, comes with this one."""
    best_tps = known.best_tps()
    feasible = known.feasible()

    def worth(c: TrialConfig) -> bool:
        if c in feasible:
            tps = feasible[c].output_tokens_per_s_per_gpu or 0.0
            return (
                known.repeats(c) < 2
                and c not in known.in_flight
                and tps * (1 + settings.improvement) >= best_tps
            )
        return candidate(c)

    return worth


def launch_gain(
    candidates: list[TrialConfig],
    gain: np.ndarray,
    batches: Sequence[int],
    settings: SearchSettings,
) -> np.ndarray:
    """Per candidate: the expected gain of launching it, its own plus that of the candidates
    among its rungs (a launch measures both)."""
    index = {c: i for i, c in enumerate(candidates)}
    return np.array(
        [
            gain[i] + sum(gain[index[r]] for r in ladder(c, batches, settings, index.__contains__))
            for i, c in enumerate(candidates)
        ]
    )
