"""The report of a study: what the study holds, turned into a `Report` (nothing is written).

Every trial the study started has a row: the measured ones (complete, oom, failed, invalid),
the one a Ctrl-C or a dead worker stopped before it measured anything (`interrupted`: trial
numbers never jump), and the configurations the memory model rules out without GPU time. The
confidence is split into its two parts: P(an untried configuration beats the best), the
search's stop rule, and the measured near-ties, the rest of the doubt.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState as OptunaState

from infertune_tuner import __version__, pools, slo
from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement
from infertune_tuner.metrics import LATENCY_METRICS, OBJECTIVE, latency_metric
from infertune_tuner.perfmodel.latency import Prediction
from infertune_tuner.request import TuningRequest
from infertune_tuner.result import (
    Best,
    ConfigOut,
    Excluded,
    FailedStructure,
    Headroom,
    MeasuredConfig,
    Metrics,
    NearMiss,
    NearTie,
    PoolOutcome,
    Predicted,
    Report,
    Trial,
    TrialState,
    UntriedConfig,
    UntriedGroup,
    UntriedKind,
)
from infertune_tuner.search.evidence import (
    ATTR_CONFIG,
    ATTR_MEASUREMENT,
    Decision,
    Evidence,
    ExecutedTrial,
    Scope,
    config_of,
    current_trials,
    failure_signature,
    read,
)
from infertune_tuner.search.planner import gaps
from infertune_tuner.search.posterior import (
    Assessment,
    Exclusion,
    Prior,
    QuantityKey,
    Residuals,
    assess,
    learned_noise,
)
from infertune_tuner.search.settings import SearchSettings
from infertune_tuner.space import SearchSpace
from infertune_tuner.stop import StopKind, StopReason
from infertune_tuner.storage import mask_url

# A measured configuration is named as a near-tie of the best when the posterior gives it at
# least this chance of being more than 2 % faster (smaller chances round to nothing a reader
# could act on); at most NEAR_TIES_SHOWN of them, the likeliest first.
NEAR_TIE_MIN_P = 0.01
NEAR_TIES_SHOWN = 3


def trial_metrics(m: Measurement) -> Metrics | None:
    """A measurement's metrics as the report shows them (None: it measured no latency)."""
    if m.status != "ok" or not all(m.percentiles(x.key) for x in LATENCY_METRICS):
        return None
    return Metrics(
        **Metrics.latency_fields(m),
        output_tokens_per_s_per_gpu=round(m.output_tokens_per_s_per_gpu or 0.0, 3),
    )


def _state(m: Measurement) -> TrialState:
    states: dict[str, TrialState] = {"ok": "complete", "oom": "oom", "invalid": "invalid"}
    return states.get(m.status, "failed")


def _noise(runs: list[Measurement], request: TuningRequest) -> dict[str, float]:
    """Relative spread (max - min) / mean between a configuration's repeats."""
    ok = [m for m in runs if m.status == "ok"]
    if len(ok) < 2:
        return {}

    def spread(xs: list[float]) -> float:
        mean = sum(xs) / len(xs)
        return round((max(xs) - min(xs)) / mean, 4) if mean else 0.0

    out = {OBJECTIVE.label: spread([OBJECTIVE.of(m) or 0.0 for m in ok])}
    for b in request.slo:
        vals = [p.get(b.percentile) for m in ok if (p := m.percentiles(b.metric))]
        if len(vals) == len(ok):
            out[f"{latency_metric(b.metric).label} {b.percentile}"] = spread(vals)
    return out


def headroom(
    ev: Evidence, r: Residuals, cfg: TrialConfig, settings: SearchSettings
) -> list[Headroom]:
    """The room `cfg`'s typical run leaves inside each bound, weighed against the run-to-run
    noise the search learned for that quantity from every repeat of the study
    (posterior.learned_noise: the prior noise, or more where the repeats showed more)."""
    out = []
    for c in ev.checks.get(cfg, []):
        key = QuantityKey.of_check(c)
        noise = learned_noise(
            key, r.repeats.get(key, []), settings.run_noise, settings.noise_prior_weight
        )
        out.append(slo.room(c, noise, ev.counts.get(cfg, 0)))
    return out


def interrupted_trials(
    study: optuna.Study, priors: Mapping[TrialConfig, Prediction], measured: list[Trial]
) -> list[Trial]:
    """Trials that claimed a configuration and ended without a measurement: Ctrl-C stopped
    them, or their worker died (a later run, or another worker, re-runs the configuration)."""
    out = []
    for t in study.get_trials(deepcopy=False, states=(OptunaState.FAIL,)):
        if ATTR_CONFIG not in t.user_attrs or ATTR_MEASUREMENT in t.user_attrs:
            continue
        cfg = config_of(t.user_attrs[ATTR_CONFIG])
        again = next(
            (m.number for m in measured if m.number > t.number and m.config.to_config() == cfg),
            None,
        )
        retried = (
            f"measured again as trial {again}"
            if again is not None
            else "its configuration counts as untried"
        )
        p = priors.get(cfg)
        out.append(
            Trial(
                number=t.number,
                config=ConfigOut.of(cfg),
                state="interrupted",
                executed=False,
                predicted=Predicted.of(p) if p else None,
                reason=f"interrupted{_after(t)} before it measured anything; {retried}",
                duration_s=_duration(t),
                purpose=d.purpose if (d := Decision.of(t)) is not None else "explore",
                chances=d.chances if d is not None else None,
            )
        )
    return out


def _duration(t: FrozenTrial) -> float | None:
    if t.datetime_start is None or t.datetime_complete is None:
        return None
    return round((t.datetime_complete - t.datetime_start).total_seconds(), 3)


def _after(t: FrozenTrial) -> str:
    seconds = _duration(t)
    return f" after {seconds:.0f} s" if seconds is not None else ""


def measured_configs(ev: Evidence, executed: list[ExecutedTrial]) -> list[MeasuredConfig]:
    """Every measured configuration once, at its typical run, in the order first measured."""
    out = []
    for cfg, m in ev.measured.items():
        checks = ev.checks.get(cfg) or []
        out.append(
            MeasuredConfig(
                config=ConfigOut.of(cfg),
                trials=[e.number for e in executed if e.config == cfg],
                state=_state(m),
                slo_ok=all(c.ok for c in checks) if m.status == "ok" and checks else None,
                metrics=trial_metrics(m),
                concurrency=m.concurrency,
            )
        )
    return sorted(out, key=lambda c: c.trials[0] if c.trials else -1)


def near_ties(a: Assessment) -> list[NearTie]:
    """Measured SLO-meeting configurations with a real chance to beat the best by > 2 %."""
    ties = []
    for cfg, m in a.evidence.feasible.items():
        i = a.index.get(cfg)
        if cfg == a.best or i is None or float(a.p_beat[i]) < NEAR_TIE_MIN_P:
            continue
        ties.append(
            NearTie(
                config=ConfigOut.of(cfg),
                output_tokens_per_s_per_gpu=round(m.output_tokens_per_s_per_gpu or 0.0, 3),
                p_beat=round(float(a.p_beat[i]), 4),
            )
        )
    ties.sort(key=lambda t: -t.p_beat)
    return ties[:NEAR_TIES_SHOWN]


def build_report(
    prior: Prior,
    settings: SearchSettings,
    study: optuna.Study,
    *,
    backend: str,
    stop: StopReason,
    duration_s: float,
    run: Scope | str | None = None,
    seed: int = 0,
    run_id: str | None = None,
) -> Report:
    request, space, priors = prior.request, prior.space, prior.predictions
    executed = current_trials(study, run)
    known = read(  # the report: what was measured
        request, study, run, in_flight=False, transient_retries=settings.transient_retries
    )
    assessment = assess(known, prior, settings, seed=seed, include_in_flight=False)
    trials: list[Trial] = []
    resumed = 0  # trials an earlier run of the same study executed
    for e in executed:
        this = run_id or (run.run if isinstance(run, Scope) else run)
        if this is not None and e.run != this:
            resumed += 1
        p = priors.get(e.config)
        trials.append(
            Trial(
                number=e.number,
                config=ConfigOut.of(e.config),
                state=_state(e.measurement),
                executed=True,
                slo_ok=all(c.ok for c in e.checks) if e.checks else None,
                metrics=trial_metrics(e.measurement),
                predicted=Predicted.of(p) if p else None,
                reason=e.measurement.reason,
                phase=e.measurement.phase if e.measurement.status != "ok" else None,
                slo_checks=e.checks,
                duration_s=round(e.measurement.duration_s, 3) or None,
                purpose=e.purpose,
                chances=e.chances,
            )
        )
    trials = sorted(trials + interrupted_trials(study, priors, trials), key=lambda t: t.number)
    number = max((t.number for t in trials), default=-1) + 1
    for cfg, ruling in assessment.verdicts.items():
        if ruling is None or not ruling.predicted_infeasible:
            continue  # a candidate the search did not need, measured, or covered by its twin
        trials.append(
            Trial(
                number=number,
                config=ConfigOut.of(cfg),
                state="infeasible_predicted",
                executed=False,
                predicted=Predicted.of(priors[cfg]),
                reason=ruling.text(),
            )
        )
        number += 1

    best = None
    top = known.best
    if top is not None:
        metrics = trial_metrics(known.measured[top])
        assert metrics is not None
        last = max(e.number for e in executed if e.config == top)
        best = Best(
            config=ConfigOut.of(top),
            metrics=metrics,
            trial=last,
            repeats=known.counts[top],
            noise=_noise(list(known.runs[top]), request),
            headroom=headroom(known, assessment.residuals, top, settings),
            gpu=top.gpu or None,
            cost_per_million_output_tokens=_cost(
                request, top, known.measured[top].output_tokens_per_s_per_gpu
            ),
        )
    misses: list[NearMiss] = []
    if best is None:
        measured = [
            (c, m) for c, m in known.measured.items() if trial_metrics(m) and known.checks.get(c)
        ]
        for cfg, m in sorted(
            measured, key=lambda cm: max(slo.constraint_values(known.checks[cm[0]]))
        )[:3]:
            misses.append(
                NearMiss(
                    trial=max(e.number for e in executed if e.config == cfg),
                    config=ConfigOut.of(cfg),
                    output_tokens_per_s_per_gpu=round(m.output_tokens_per_s_per_gpu or 0.0, 3),
                    violations=slo.describe_violations(known.checks[cfg]),
                    missed=[c for c in known.checks[cfg] if not c.ok],
                )
            )
    converged = stop.kind == StopKind.CONVERGED
    uncovered = (
        [g.structure.label() for g in gaps(assessment, prior, settings)]
        if top is not None and not converged and request.tuning.sampler == "auto"
        else []
    )
    claimed = top is not None and not uncovered
    dumped = request.dump()
    if request.tuning.storage:  # a report never shows the password of the study's database
        dumped["tuning"]["storage"] = mask_url(request.tuning.storage)
    return Report(
        request=dumped,
        backend=backend,
        sampler=request.tuning.sampler,
        space_size=len(space),
        excluded=[Excluded(field=e.field, value=e.value, reason=e.reason) for e in space.excluded],
        trials=trials,
        measured=measured_configs(known, executed),
        best=best,
        executed_trials=len(executed),
        resumed_trials=resumed,
        nearest_misses=misses,
        stop=stop.kind,
        stopped_reason=str(stop),
        # A structure that could still hold the optimum was never measured (the budget or the
        # clock ran out first): the posterior's number would rest on the model alone there.
        confidence=None if uncovered else round(assessment.confidence, 4),
        p_untried_beats=round(assessment.p_untried, 4) if claimed else None,
        near_ties=near_ties(assessment) if claimed else [],
        uncovered=uncovered,
        untried=untried_groups(assessment, prior, settings, converged=converged),
        # An aborted run's failures are the set-up's, not any structure's.
        could_not_run=[]
        if stop.kind == StopKind.ABORTED
        else could_not_run(assessment, executed, space),
        pools=pool_outcomes(
            known,
            assessment,
            prior,
            executed,
            decided=stop.kind in DECIDED,
        ),
        duration_s=round(duration_s, 3),
        generated_at=datetime.now(UTC).isoformat(timespec="seconds"),
        infertune_version=__version__,
    )


# ------------------------------------------------------------------ the pools


def _cost(request: TuningRequest, cfg: TrialConfig, tps: float | None) -> float | None:
    cost = pools.cost_per_million(pools.price_of(request, cfg.gpu), tps or 0.0)
    return round(cost, 4) if cost is not None else None


# The search stopped by its own rule: a pool it never measured was ruled out, not left unreached.
DECIDED = (StopKind.CONVERGED, StopKind.INFEASIBLE, StopKind.RULED_OUT, StopKind.EXHAUSTED)


def pool_outcomes(
    known: Evidence,
    a: Assessment,
    prior: Prior,
    executed: list[ExecutedTrial],
    *,
    decided: bool,
) -> list[PoolOutcome]:
    """Per pool of a several-pool request, its best measured configuration and why it won or
    lost: the cheapest per million output tokens wins; a pool is costlier, or nothing measured
    on it met the SLO, or it was never measured because the posterior gave its configurations
    no real chance (the model ruled it out; `decided`: the search stopped by its own rule, not
    on a budget, a deadline or a Ctrl-C, which leave a pool not reached), or nothing of the
    space can run on it."""
    request = prior.request
    chosen = known.best
    excluded = {e.value: e.reason for e in prior.space.excluded if e.field == "gpu"}
    out = []
    for pool in request.gpu.pools:
        product, price = pool.product, pool.price_per_gpu_hour or 0.0
        runs = sum(1 for e in executed if e.config.gpu == product)
        mine = [c for c in known.feasible if c.gpu == product]
        top = max(mine, key=lambda c: (known.values[c], -c.tp, c), default=None)
        untried = [
            float(a.p_beat[i]) for c in a.candidates if c.gpu == product
            if (i := a.index.get(c)) is not None
        ]  # fmt: skip
        p_beat = round(max(untried), 4) if untried and chosen is not None else None
        tps = known.feasible[top].output_tokens_per_s_per_gpu if top is not None else None
        cost = _cost(request, top, tps) if top is not None else None
        if product in excluded:
            verdict, reason = "excluded", excluded[product]
        elif top is not None and top == chosen:
            verdict, reason = "chosen", "the cheapest per million output tokens within the SLO"
        elif top is not None and chosen is not None:
            best_cost = _cost(request, chosen, known.feasible[chosen].output_tokens_per_s_per_gpu)
            more = (cost or 0.0) / best_cost - 1 if best_cost else 0.0
            verdict, reason = (
                "costlier",
                f"costs {more:.0%} more per output token than {chosen.gpu}",
            )
        elif runs:
            verdict = "missed_slo"
            reason = f"nothing of the {runs} trial(s) measured on it met the SLO" + (
                f"; P = {p_beat:.1%} that an untried one beats the chosen one"
                if p_beat is not None else ""
            )  # fmt: skip
        elif not decided:
            verdict = "not_reached"
            reason = "never measured: the search stopped before it" + (
                f" (the likeliest beats the chosen one with P = {p_beat:.1%})"
                if p_beat is not None else ""
            )  # fmt: skip
        else:
            verdict = "ruled_out"
            reason = "never measured: the model gives none of its configurations a real chance" + (
                f" (the likeliest beats the chosen one with P = {p_beat:.1%})"
                if p_beat is not None else ""
            )  # fmt: skip
        out.append(PoolOutcome(
            product=product, price_per_gpu_hour=price, verdict=verdict, reason=reason,
            executed_trials=runs, best=ConfigOut.of(top) if top is not None else None,
            output_tokens_per_s_per_gpu=round(tps, 3) if tps is not None else None,
            cost_per_million_output_tokens=cost, p_beat=p_beat,
        ))  # fmt: skip
    return out


# ------------------------------------------------------------------ what could not run


def could_not_run(
    a: Assessment, executed: list[ExecutedTrial], space: SearchSpace
) -> list[FailedStructure]:
    """The failed trials, by what they share (search/failures.py): each structure that more
    likely than not explains two or more failures of one signature, with the configurations
    it excluded; each other failure on its own; each transient failure that was re-run."""
    ev, fm = a.evidence, a.failures
    numbers: dict[TrialConfig, list[int]] = defaultdict(list)
    for e in executed:
        if e.measurement.status == "error":
            numbers[e.config].append(e.number)
    by: Counter[TrialConfig] = Counter(
        r.by for r in a.verdicts.values()
        if r is not None and r.exclusion == Exclusion.FAILED and r.by is not None
    )  # fmt: skip
    ran = [c for c, m in ev.measured.items() if m.status != "error"]
    out: list[FailedStructure] = []
    explained: set[TrialConfig] = set()
    for cause in fm.causes(0.5):
        if explained & set(cause.failed):
            continue  # a failure is told once, under its likeliest structure
        explained |= set(cause.failed)
        out.append(
            FailedStructure(
                kind="structure", structure=cause.structure, signature=cause.signature.label(),
                trials=sorted(n for c in cause.failed for n in numbers[c]),
                excluded=sum(by[c] for c in cause.failed), probability=cause.probability,
                never_ran=never_ran(cause.failed, ran, space),
            )
        )  # fmt: skip
    for cfg, sig in sorted(ev.failures.items()):
        if cfg not in explained:
            out.append(
                FailedStructure(
                    kind="isolated", structure=cfg.label(), signature=sig.label(),
                    trials=numbers[cfg], excluded=by[cfg],
                )
            )  # fmt: skip
    for e in executed:
        once = failure_signature(e.measurement)
        if once is not None and once.is_transient and e.config not in ev.failures:
            out.append(
                FailedStructure(
                    kind="transient", structure=e.config.label(), signature=once.label(),
                    trials=[e.number],
                )
            )  # fmt: skip
    return out


def never_ran(
    failed: tuple[TrialConfig, ...], ran: list[TrialConfig], space: SearchSpace
) -> list[str]:
    """The values of the space (quantization, KV cache dtype, TP) the failed configurations
    share and no configuration that ran has: what the user asked for and could not run."""
    out = []
    for dim, name in (("quantization", "quantization"), ("kv_cache_dtype", "kvCacheDtype"),
                      ("tp", "tensorParallel")):  # fmt: skip
        values = {getattr(c, dim) for c in failed}
        if len(values) != 1 or len({getattr(c, dim) for c in space.configs}) < 2:
            continue
        (value,) = values
        if not any(getattr(c, dim) == value for c in ran):
            out.append(f"{name}={value}")
    return out


# ------------------------------------------------------------------ untried configurations

_GROUP: dict[Exclusion, UntriedKind] = {
    Exclusion.MEMORY: "memory",
    Exclusion.OUT_OF_MEMORY: "neighbour",
    Exclusion.KV_CAPPED: "neighbour",
    Exclusion.SLO_MISS: "neighbour",
    Exclusion.TWIN: "twin",
    Exclusion.FAILED: "failed",
}


def _reasons(s: SearchSettings) -> dict[UntriedKind, str]:
    return {
        "memory": (
            f"the memory model rules it out by a wide margin (needs more than "
            f"{(math.exp(s.wide_margin) - 1):.0%} more memory than the GPU has)"
        ),
        "neighbour": "ruled out by a measured neighbour (out of memory, or a clear SLO miss)",
        "twin": "the performance model cannot tell it from a measured configuration",
        "failed": "of a structure that failed to run (see what could not run)",
        "fit": f"unlikely to fit in memory (P(fit) < {s.unlikely:.0%})",
        "slo": f"unlikely to meet the SLO (P < {s.unlikely:.0%})",
        "stopped": "a real chance to beat the best, not reached before the search stopped",
        "posterior": f"unlikely to beat the best by more than {s.improvement:.0%}",
    }


def untried_groups(
    a: Assessment, prior: Prior, st: SearchSettings, *, converged: bool
) -> list[UntriedGroup]:
    """Every configuration of the space that was never measured, grouped by why: the verdict
    (posterior.verdicts: memory, a measured neighbour, a measured twin), or for a candidate
    what the posterior gave it (unlikely to fit, unlikely to meet the SLO, a real chance the
    search did not reach before it stopped, unlikely to beat the best)."""
    members: dict[UntriedKind, list[tuple[TrialConfig, str | None, float | None]]] = defaultdict(
        list
    )
    index = {c: i for i, c in enumerate(a.candidates)}  # candidates lead the pool
    for cfg, ruling in a.verdicts.items():
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
