"""What every rendering of a report shows (Markdown, HTML, the CLI's last lines), computed once:
the headline and its next step, the confidence and why it differs from the stop rule's number,
the Pareto plots' points and fronts, the rows of the trial tables."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from infertune_tuner import defaults, pools
from infertune_tuner.metrics import latency_metric
from infertune_tuner.report.headroom import headroom_line, unsettled
from infertune_tuner.request import SloBound, TuningRequest
from infertune_tuner.result import (
    ConfigOut,
    FailedStructure,
    MeasuredConfig,
    Metrics,
    PoolOutcome,
    Report,
    Trial,
)
from infertune_tuner.stop import StopKind


class Outcome(StrEnum):
    """What the run ended with, as the headline says it."""

    FOUND = "found"  # a configuration meets every bound, and the search finished
    FOUND_SO_FAR = "found-so-far"  # interrupted, with a best so far
    INTERRUPTED = "interrupted"  # interrupted before any configuration met the SLO
    ABORTED = "aborted"  # the first trials all failed: the set-up, not the configurations
    NOT_FOUND = "not-found"  # the search ended and nothing measured meets the SLO


@dataclass(frozen=True)
class Headline:
    outcome: Outcome
    text: str
    next_step: str | None  # what to do now (None: nothing needed)

    @property
    def tone(self) -> str:
        """ok | warn | bad: the colour the HTML report gives it."""
        return {Outcome.FOUND: "ok", Outcome.FOUND_SO_FAR: "warn", Outcome.INTERRUPTED: "warn"}.get(
            self.outcome, "bad"
        )


@dataclass(frozen=True)
class Point:
    """One measured configuration on a plot (its repeats combined into the typical run)."""

    config: ConfigOut
    label: str  # unique on the plot: the full configuration
    latency_ms: float
    tps: float
    slo_ok: bool
    chosen: bool
    # Where the request lists several pools: what a million output tokens cost on it.
    cost: float | None = None

    @property
    def merit(self) -> float:
        """Higher is better: tok/s/GPU, or the negated cost where pools are compared."""
        return -self.cost if self.cost is not None else self.tps


@dataclass(frozen=True)
class Plot:
    """Throughput against one bounded latency percentile, with that bound's line."""

    bound: SloBound
    points: list[Point]
    front: list[Point]  # SLO-meeting points no other SLO-meeting point dominates, by latency

    @property
    def axis_label(self) -> str:
        return f"{latency_metric(self.bound.metric).label} {self.bound.percentile} (ms)"

    @property
    def by_cost(self) -> bool:
        """Cost per token against latency (several pools), else tok/s/GPU against latency."""
        return any(p.cost is not None for p in self.points)

    def y(self, p: Point) -> float:
        return p.cost if p.cost is not None else p.tps

    @property
    def y_label(self) -> str:
        return "cost per 1M output tokens" if self.by_cost else "output tokens/s per GPU"


@dataclass(frozen=True)
class View:
    report: Report
    request: TuningRequest
    headline: Headline
    plots: list[Plot]  # one per SLO bound
    rows: list[Trial]  # the trials that ran (measured or interrupted), in trial order
    ruled_out: list[Trial]  # configurations ruled out without GPU time
    confidence: str | None  # the confidence line, with why it differs from the stop rule
    plan: str  # why the executed trials ran, e.g. "6 explore, 2 cover, 2 confirm"
    track: str | None  # how often the chances the search acted on came true (track_record)
    headroom: str | None  # the room the chosen configuration leaves inside each bound
    headroom_warn: bool  # some bound is met only within run-to-run noise (headroom.unsettled)
    failures: list[str]  # what could not run, one line per structure or failure
    pool: str | None  # what measured: said when it was not GPUs (the simulated pool)
    pools: list[str]  # per pool of a several-pool request: its best and why it won or lost


def _config(c: ConfigOut) -> str:
    own = f"TP{c.tp}, max batch {c.max_batch_size}, {c.quantization}, KV {c.kv_cache_dtype}"
    return f"{c.gpu}, {own}" if c.gpu else own


def headline(report: Report) -> Headline:
    """The one sentence a reader sees first, and the next step."""
    n = report.executed_trials
    trials = f"{n} trial{'s' * (n != 1)}"
    resume = "Re-run the same command to resume the study where it stopped."
    if report.best is not None:
        c, m = report.best.config, report.best.metrics
        found = (
            f"{_config(c)} -> {m.output_tokens_per_s_per_gpu:.0f} output tok/s/GPU, meeting "
            "every SLO bound"
        )
        if (cost := report.best.cost_per_million_output_tokens) is not None:
            found = (
                f"{_config(c)} -> {m.output_tokens_per_s_per_gpu:.0f} output tok/s/GPU, "
                f"{_money(cost)} per 1M output tokens: the cheapest of {len(report.pools)} pools "
                "meeting every SLO bound"
            )
        if report.stop == StopKind.INTERRUPTED:
            return Headline(
                Outcome.FOUND_SO_FAR,
                f"Interrupted (Ctrl-C) after {trials}, before the search finished. Best so far: "
                f"{found}.",
                resume,
            )
        more = (
            "Not every TP size / quantization that could hold the optimum was measured: raise "
            "maxTrials (or timeoutMinutes) and re-run the same command; the study resumes."
            if report.uncovered
            else None
        )
        return Headline(Outcome.FOUND, f"Best: {found}", more)
    if report.stop == StopKind.INTERRUPTED:
        return Headline(
            Outcome.INTERRUPTED,
            f"Interrupted (Ctrl-C) after {trials}, before any configuration met the SLO: no "
            "verdict yet.",
            resume,
        )
    if report.stop == StopKind.ABORTED:
        failed = [t for t in report.trials if t.executed and t.state == "failed"]
        reason = "; ".join((failed[-1].reason or "").split("\n")) if failed else ""
        last = f" Last error: {reason}" if reason else ""
        return Headline(
            Outcome.ABORTED,
            f"Aborted: the first {len(failed)} trials all failed, so the set-up is broken, not "
            f"the configurations.{last}",
            "Fix what the failed trials report (docs/troubleshooting.md), then re-run the same "
            "command: the study resumes and retries them.",
        )
    return Headline(Outcome.NOT_FOUND, _not_found(report, trials), _not_found_next(report))


def _not_found(report: Report, trials: str) -> str:
    if report.stop == StopKind.RULED_OUT:
        return "No configuration met the SLO: none of the search space fits in GPU memory."
    if report.stop in (StopKind.BUDGET, StopKind.TIMEOUT):
        why = "maxTrials" if report.stop == StopKind.BUDGET else "timeoutMinutes"
        return (
            f"No configuration met the SLO in the {trials} executed; the search stopped at "
            f"{why}, before it could rule the rest out."
        )
    return f"No configuration met the SLO: {trials} executed, and nothing untried plausibly can."


def _wider(report: Report) -> str:
    """Where more GPUs per replica would come from: the search's tensorParallel values when they
    stop below the replica's limit, else the limit itself."""
    request = report.request or {}
    tps = (request.get("search") or {}).get("tensor_parallel") or []
    limit = (request.get("gpu") or {}).get("max_gpus_per_replica")
    if tps and limit and max(tps) < limit:
        return "a larger tensorParallel (spec.search.tensorParallel)"
    return "more GPUs per replica (spec.gpu.maxGpusPerReplica)"


def _not_found_next(report: Report) -> str:
    if report.stop == StopKind.RULED_OUT:
        return (
            f"Allow {_wider(report)}, a lower-precision quantization (raise "
            "maxAccuracyLossPercent), or a GPU with more memory."
        )
    misses = " (see the nearest misses)" if report.nearest_misses else ""
    if report.stop in (StopKind.BUDGET, StopKind.TIMEOUT):
        return (
            "Raise maxTrials (or timeoutMinutes) and re-run the same command: the study "
            f"resumes. Or relax the bound missed by the least{misses}."
        )
    return (
        f"Relax the bound missed by the least{misses}, allow more GPUs per replica, a "
        "lower-precision quantization (raise maxAccuracyLossPercent), or a faster GPU."
    )


def confidence_line(report: Report) -> str | None:
    """The confidence, and in the same sentence why it is lower than 1 - P(an untried
    configuration beats the best), the number the search stops on: near-ties among measured
    configurations, which more trials of untried ones would not resolve."""
    if report.best is None or report.confidence is None:
        return None
    line = (
        f"Confidence the optimum was found: {report.confidence:.1%} (the posterior probability "
        f"that no configuration{can_run_clause(report)} beats the chosen one by more than 2 %)"
    )
    why = confidence_gap(report)
    if why is None:
        return line + "."
    return line + (
        f". It is lower than the search's stop rule suggests because of near-ties, not untried "
        f"configurations: an untried one beats the chosen one with "
        f"{report.p_untried_beats or 0.0:.1%} probability (why the search stopped), while {why} "
        "Either serves about as well; more trials of untried configurations would not raise "
        "this number."
    )


def confidence_gap(report: Report, *, short: bool = False) -> str | None:
    """Why the confidence is below 1 - P(an untried configuration beats the best): the
    measured near-ties (None when the two numbers agree at the 0.1 % shown)."""
    p, conf = report.p_untried_beats, report.confidence
    if p is None or conf is None or (1 - p) - conf < 0.0005:
        return None
    if short:
        names = ", ".join(t.config.label() for t in report.near_ties)
        tied = f"measured {names}" if names else "other measured configurations"
        return (
            f"lower than 1 - {p:.1%} because of near-ties: {tied} within measurement noise of "
            "the best"
        )
    if not report.near_ties:
        return "several measured configurations lie within measurement noise of it."
    ties = "; ".join(
        f"{t.config.label()} ({t.output_tokens_per_s_per_gpu:.0f} tok/s/GPU, {t.p_beat:.1%} "
        "chance it is more than 2 % faster)"
        for t in report.near_ties
    )
    return f"these measured configurations lie within measurement noise of it: {ties}."


def _points(report: Report, bound: SloBound) -> list[Point]:
    chosen = report.best.config if report.best else None
    measured = report.measured or _measured_from_trials(report)
    request = report.parsed_request()
    return [
        Point(
            c.config,
            c.config.label() + (f" \u00d7{len(c.trials)}" if len(c.trials) > 1 else ""),
            c.metrics.latency(bound.metric, bound.percentile),
            c.metrics.output_tokens_per_s_per_gpu,
            bool(c.slo_ok),
            c.config == chosen,
            pools.cost_per_million(
                pools.price_of(request, c.config.gpu or ""), c.metrics.output_tokens_per_s_per_gpu
            ),
        )
        for c in measured
        if c.metrics is not None
    ]


def _measured_from_trials(report: Report) -> list[MeasuredConfig]:
    """A report written before `measured`: each configuration at its last measured run (the
    best at the metrics it was chosen by)."""
    last: dict[ConfigOut, Trial] = {}
    for t in report.trials:
        if t.executed and t.metrics is not None:
            last[t.config] = t
    out = []
    for cfg, t in last.items():
        best = report.best if report.best and report.best.config == cfg else None
        metrics: Metrics | None = best.metrics if best else t.metrics
        out.append(MeasuredConfig(config=cfg, trials=[t.number], state=t.state,
                                  slo_ok=t.slo_ok, metrics=metrics))  # fmt: skip
    return out


def pareto_front(points: list[Point]) -> list[Point]:
    """SLO-meeting points that no other SLO-meeting point beats on both axes (lower latency,
    higher throughput, or lower cost where pools are compared), by latency: a point that misses
    the SLO is no trade-off on offer."""
    ok = [p for p in points if p.slo_ok]
    front = [
        p
        for p in ok
        if not any(
            q.latency_ms <= p.latency_ms
            and q.merit >= p.merit
            and (q.latency_ms < p.latency_ms or q.merit > p.merit)
            for q in ok
        )
    ]
    return sorted(front, key=lambda p: (p.latency_ms, -p.merit))


PURPOSES = {
    "probe": "probe (most likely to meet the SLO while nothing had)",
    "explore": "explore (the largest expected gain)",
    "cover": "cover (a TP size or quantization the model could be wrong about)",
    "confirm": "confirm (a finalist measured again)",
}


def plan(report: Report) -> str:
    """How many executed trials the planner spent on each purpose (in PURPOSES order), and
    which executed trial first measured the best: the trials after it made sure of it (what a
    lower `tuning.confidence` would have saved)."""
    counts = {k: 0 for k in PURPOSES}
    executed = [t for t in report.trials if t.executed]
    for t in executed:
        if t.purpose in counts:
            counts[t.purpose] += 1
    out = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
    if out and (trials := best_trials(report)):
        out += f"; the best first measured in trial {trials[0]}"
    return out


def best_trials(report: Report) -> list[int]:
    """The numbers of the executed trials that measured the chosen configuration (as the
    report's tables number trials; ``best.trial`` is the last of them)."""
    if report.best is None:
        return []
    return [t.number for t in report.trials if t.executed and t.config == report.best.config]


def measured_times(report: Report) -> str:
    """ "Measured 2 times (trials 1, 4)": how often the chosen configuration ran, and where."""
    assert report.best is not None
    n, numbers = report.best.repeats, best_trials(report)
    where = f" ({_trials(numbers)})" if numbers else ""
    return f"Measured {n} time{'s' * (n != 1)}{where}"


def chances_cell(t: Trial) -> str:
    """What the search gave a trial when it chose it: "P(meets SLO) / P(beats the best)"."""
    c = t.chances
    return "" if c is None else f"{c.p_success:.0%} / {c.p_beat:.0%}"


def chosen_by_chance(report: Report) -> list[Trial]:
    """The executed trials `auto` chose for their chances (to explore, cover or probe; a
    confirmation re-measures what is known) whose run is an outcome: it completed, or ran out of
    memory (a chance includes fitting). Invalid and failed runs count for nothing."""
    return [
        t for t in report.trials
        if t.executed and t.chances is not None and t.purpose != "confirm"
        and t.state in ("complete", "oom")
    ]  # fmt: skip


def track_record(report: Report) -> str | None:
    """How often the chances the search acted on came true in this run.

    Over the trials it chose to explore, cover or probe (a confirmation re-measures what is
    known), the sum of their chances is the number it expected to meet the SLO and to beat the
    best of their time; beside it, how many did on their own run. A model that is surprised by
    the pool shows here first: far fewer (or more) than expected (`chosen_by_chance` says which
    trials count)."""
    chosen = chosen_by_chance(report)
    if not chosen:
        return None
    met = [t for t in chosen if t.state == "complete" and t.slo_ok is not False]
    beat = [
        t for t in met
        if t.metrics and t.chances and t.metrics.output_tokens_per_s_per_gpu > t.chances.to_beat_tps
    ]  # fmt: skip
    p_met = sum(t.chances.p_success for t in chosen if t.chances)
    p_beat = sum(t.chances.p_beat for t in chosen if t.chances)
    return (
        f"of the {len(chosen)} trials chosen to explore, cover or probe, the search expected "
        f"{p_met:.1f} to meet the SLO ({len(met)} did) and {p_beat:.1f} to beat the best of "
        f"their time by more than 2 % ({len(beat)} did)"
    )


def build_view(report: Report) -> View:
    request = report.parsed_request()
    plots = []
    for bound in request.slo:
        points = _points(report, bound)
        plots.append(Plot(bound, points, pareto_front(points)))
    return View(
        report=report,
        request=request,
        headline=headline(report),
        plots=plots if any(p.points for p in plots) else [],
        rows=[t for t in report.trials if t.executed or t.state == "interrupted"],
        ruled_out=[t for t in report.trials if t.state == "infeasible_predicted"],
        confidence=confidence_line(report),
        plan=plan(report),
        track=track_record(report),
        headroom=headroom_line(report),
        headroom_warn=bool(unsettled(report)),
        failures=[failure_line(f) for f in report.could_not_run],
        pool=pool_line(report),
        pools=[pool_outcome_line(p) for p in report.pools],
    )


def _money(cost: float) -> str:
    return f"${cost:.3g}"


VERDICTS = {
    "chosen": "chosen", "costlier": "costlier", "missed_slo": "missed the SLO",
    "ruled_out": "ruled out", "not_reached": "not reached", "excluded": "excluded",
}  # fmt: skip


def pool_outcome_line(p: PoolOutcome) -> str:
    """One pool: its price, its best and its cost, and why it won or lost."""
    n = p.executed_trials
    head = f"{p.product} at {_money(p.price_per_gpu_hour)}/GPU-hour ({n} trial{'s' * (n != 1)})"
    if p.best is not None and p.cost_per_million_output_tokens is not None:
        head += (
            f": best {_config(p.best)[len(p.product) + 2 :]}, "
            f"{p.output_tokens_per_s_per_gpu or 0:.0f} tok/s/GPU, "
            f"{_money(p.cost_per_million_output_tokens)} per 1M output tokens"
        )
    return f"{head} - {VERDICTS[p.verdict]}: {p.reason}"


def pool_line(report: Report) -> str | None:
    """Where the numbers come from, when that is not GPUs: the simulated pool is the performance
    model with measurement noise, and a reader must not take it for a measurement."""
    if report.backend != defaults.LOCAL_BACKEND:
        return None
    return (
        f"Measured on the simulated GPU pool (the performance model with measurement noise), not "
        f"on {products_label(report.parsed_request())} GPUs; --backend triton measures real ones."
    )


def products_label(request: TuningRequest) -> str:
    return " / ".join(pools.products(request)) or request.gpu.product


def _trials(numbers: list[int]) -> str:
    return f"trial{'s' * (len(numbers) != 1)} {', '.join(map(str, numbers))}"


def failure_line(f: FailedStructure) -> str:
    """One failure group as a person reads it (the report, the CLI and the operator's
    condition say the same)."""
    n = len(f.trials)
    if f.kind == "structure":
        rest = (
            f"not tried further ({f.excluded} untried configuration{'s' * (f.excluded != 1)} "
            "excluded)"
            if f.excluded
            else "nothing else of it was left to try"
        )
        never = f"; none of {', '.join(f.never_ran)} ran" if f.never_ran else ""
        return f"{f.structure}: {n} of {n} trials failed ({_trials(f.trials)}) - {f.signature}; {rest}{never}"
    if f.kind == "isolated":
        return (
            f"{f.structure} failed ({_trials(f.trials)}) - {f.signature}; an isolated failure: "
            "its structure was not excluded"
        )
    return f"{f.structure}: a transient failure ({_trials(f.trials)}) - {f.signature}; re-run"


def never_ran_note(report: Report) -> str | None:
    """What the user asked for that could not run at all (a quantization, KV cache dtype or TP
    none of whose trials ran), as the report says it; None when everything asked for ran."""
    lines = [failure_line(f) for f in report.could_not_run if f.kind == "structure" and f.never_ran]
    return "could not run: " + "; ".join(lines) if lines else None


def can_run_clause(report: Report) -> str:
    """' that can run' when a structure was excluded because it could not run: the confidence
    speaks of the configurations that can."""
    return " that can run" if any(f.kind == "structure" for f in report.could_not_run) else ""


def error_pct(predicted: float | None, measured: float | None) -> str:
    if not predicted or measured is None:
        return ""
    return f"{(predicted / measured - 1) * 100:+.0f}%"
