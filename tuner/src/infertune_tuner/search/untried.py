"""Every configuration that was never measured, grouped by why (for the report).

A reviewer should be able to see that, say, TP8 was considered and why it was not worth a GPU
trial. The groups, in the order they are decided:

- memory: the memory model rules it out by a wide margin (never a candidate);
- neighbour: a measured configuration rules it out (out of memory, KV-capped, SLO miss);
- twin: the model cannot tell it from a measured configuration (bf16 vs fp16);
- fit: a candidate, but unlikely to fit in memory (P(fit) < 5 %);
- slo: a candidate, but unlikely to meet the SLO (P < 5 %);
- stopped: a candidate with a real chance (P(beats the best) >= 1 %) that the search did not
  reach before it stopped (budget, timeout, set-up errors);
- posterior: a candidate unlikely to beat the best measured configuration by more than 2 %.

Why a configuration is no candidate is classify.py's ruling (the same one the search and the
samplers obey); this module only maps it to a group.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

from infertune_tuner.config import TrialConfig
from infertune_tuner.result import UntriedConfig, UntriedGroup, UntriedKind
from infertune_tuner.search.classify import Exclusion
from infertune_tuner.search.evidence import Known
from infertune_tuner.search.memory_fit import WIDE_MARGIN
from infertune_tuner.search.planner import Assessment, Planner
from infertune_tuner.search.settings import SearchSettings

_GROUP: dict[Exclusion, UntriedKind] = {
    Exclusion.MEMORY: "memory",
    Exclusion.OUT_OF_MEMORY: "neighbour",
    Exclusion.KV_CAPPED: "neighbour",
    Exclusion.SLO_MISS: "neighbour",
    Exclusion.TWIN: "twin",
}


def _reasons(s: SearchSettings) -> dict[UntriedKind, str]:
    return {
        "memory": (
            f"the memory model rules it out by a wide margin (needs more than "
            f"{(math.exp(WIDE_MARGIN) - 1):.0%} more memory than the GPU has)"
        ),
        "neighbour": "ruled out by a measured neighbour (out of memory, or a clear SLO miss)",
        "twin": "the performance model cannot tell it from a measured configuration",
        "fit": f"unlikely to fit in memory (P(fit) < {s.unlikely:.0%})",
        "slo": f"unlikely to meet the SLO (P < {s.unlikely:.0%})",
        "stopped": "a real chance to beat the best, not reached before the search stopped",
        "posterior": f"unlikely to beat the best by more than {s.improvement:.0%}",
    }


def untried_groups(
    planner: Planner, known: Known, a: Assessment, *, converged: bool
) -> list[UntriedGroup]:
    """Group every unmeasured configuration of the planner's space by why it was not measured."""
    members: dict[UntriedKind, list[tuple[TrialConfig, str | None, float | None]]] = defaultdict(
        list
    )
    st = planner.settings
    index = {c: i for i, c in enumerate(a.candidates)}  # candidates lead the pool
    for cfg in planner.margin:
        ruling = planner.ruling(cfg, known)
        if ruling is not None and (group := _GROUP.get(ruling.exclusion)) is not None:
            members[group].append((cfg, ruling.text(), None))
        elif cfg in index:
            i = index[cfg]
            p_beat = float(a.p_beat[i])
            kind: UntriedKind
            if a.p_fit[i] < st.unlikely:
                kind = "fit"
            elif a.p_success[i] < st.unlikely:
                kind = "slo"
            elif not converged and p_beat >= st.real_chance:
                kind = "stopped"
            else:
                kind = "posterior"
            members[kind].append((cfg, None, round(p_beat, 4)))
    out = []
    reasons = _reasons(st)
    for kind in reasons:
        rows = members.get(kind)
        if not rows:
            continue
        probs = [p for _, _, p in rows if p is not None]
        rows.sort(key=lambda r: (-(r[2] or 0.0), r[0]))
        out.append(
            UntriedGroup(
                kind=kind,
                reason=reasons[kind],
                count=len(rows),
                by_tp={f"TP{tp}": n for tp, n in sorted(Counter(c.tp for c, _, _ in rows).items())},
                max_p_beat=max(probs) if probs else None,
                configs=[UntriedConfig(config=c.label(), detail=d, p_beat=p) for c, d, p in rows],
            )
        )
    return out
