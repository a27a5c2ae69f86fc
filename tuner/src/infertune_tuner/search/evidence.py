"""What the study holds: every measurement per configuration, and what is in flight.

Every executed trial carries, as user attributes written by the driver, its configuration,
measurement and SLO checks; the `auto` sampler records each decision on the trial it made it for
(system attribute `DECISION_ATTR`: the configuration, its purpose and chances, or the stop), as
Optuna's own samplers keep their state. A configuration is *in flight* while a trial that claimed
it runs (or waits to be re-run after its worker died): claimed by the sampler's decision or by
the driver's record, whichever came first. So every worker, a thread here or a process on shared
storage, reads the same evidence from the storage alone.

A configuration may be measured more than once (finalists are confirmed before one is
declared). Repeats combine into the *typical* run (`combine`): the mean tok/s/GPU and the
geometric mean of each latency percentile; an out-of-memory in any repeat makes the
configuration out of memory (production must not OOM now and then). `Evidence` computes, once,
everything a decision reads of it: typical runs, their SLO checks, the feasible configurations
and the best.

Measurements that cannot be true are not evidence (`judge`): a tok/s/GPU above what streaming
the weights once per decode step at the GPU's peak bandwidth allows (published tables hold such
rows: 38k tok/s/GPU for a 7B model at batch 16 on an H100, ten times the bound), or responses
well short of the requested length (the model stopped early). Such a trial is `invalid`:
recorded and reported, never the best, never a point of the posterior, never a reason to rule
a neighbour out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from typing import Any

from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from infertune_tuner import pools, slo
from infertune_tuner.catalog.gpus import Gpu
from infertune_tuner.catalog.llms import ModelArch
from infertune_tuner.catalog.quantization import QUANTIZATIONS
from infertune_tuner.config import GPU_KEY, TrialConfig
from infertune_tuner.measurement import Measurement
from infertune_tuner.metrics import LATENCY_METRICS, PERCENTILES
from infertune_tuner.perfmodel.latency import Percentiles
from infertune_tuner.request import TuningRequest
from infertune_tuner.result import Chances, Check, checks_of
from infertune_tuner.signatures import Signature, signature
from infertune_tuner.stop import StopReason

# What the driver records on a trial it runs (user attributes).
ATTR_CONFIG = "config"
ATTR_MEASUREMENT = "measurement"
ATTR_CHECKS = "slo_checks"
ATTR_CONSTRAINTS = "constraints"
ATTR_SKIP = "skipped"
ATTR_RUN = "run"
ATTR_SETUP = "setup"  # the set-up fingerprint of the run (run.setup_fingerprint)
# What the `auto` sampler decided for a trial (a system attribute, `Decision.as_attr`).
DECISION_ATTR = "infertune:decision"
# Studies written before decisions were system attributes kept these two as user attributes.
_LEGACY_PURPOSE, _LEGACY_CHANCES = "purpose", "chances"
CLAIMED = (TrialState.RUNNING, TrialState.WAITING)
# What a decision from some evidence depends on: runs per configuration, what is in flight, and
# the trials executed (a transient failure changes nothing else).
State = tuple[frozenset[tuple[TrialConfig, int]], frozenset[TrialConfig], int]
DONE = (TrialState.COMPLETE, TrialState.FAIL)


def config_of(params: Mapping[str, Any]) -> TrialConfig:
    """The configuration a trial's parameters (or its recorded configuration) stand for."""
    return TrialConfig(
        int(params["tp"]),
        int(params["max_batch_size"]),
        str(params["quantization"]),
        str(params["kv_cache_dtype"]),
        str(params.get(GPU_KEY, "")),
    )


@dataclass(frozen=True)
class Decision:
    """What the sampler decided for a trial: measure `config` (for `purpose`), or stop
    (`stop`), or neither (wait: only trials in flight may still change the answer)."""

    config: TrialConfig | None
    purpose: str = "explore"  # explore | confirm | probe | cover
    stop: StopReason | None = None
    confidence: float | None = None
    chances: Chances | None = None  # what the posterior gave `config`, recorded on its trial

    @property
    def waits(self) -> bool:
        return self.config is None and self.stop is None

    def as_attr(self) -> dict[str, Any]:
        return {
            "config": self.config.as_dict() if self.config is not None else None,
            "purpose": self.purpose,
            "stop": self.stop.as_attr() if self.stop is not None else None,
            "chances": self.chances.model_dump() if self.chances is not None else None,
        }

    @classmethod
    def of(cls, t: FrozenTrial) -> Decision | None:
        """The decision recorded on a trial (studies of earlier versions: their user
        attributes), or None when no `auto` sampler decided for it."""
        d = t.system_attrs.get(DECISION_ATTR)
        if isinstance(d, dict):
            chances = d.get("chances")
            return cls(
                config_of(d["config"]) if d.get("config") else None,
                str(d.get("purpose") or "explore"),
                StopReason.from_attr(d.get("stop")),
                chances=Chances.model_validate(chances) if chances is not None else None,
            )
        if _LEGACY_PURPOSE in t.user_attrs or _LEGACY_CHANCES in t.user_attrs:
            chances = t.user_attrs.get(_LEGACY_CHANCES)
            config = t.user_attrs.get(ATTR_CONFIG)
            return cls(
                config_of(config) if config is not None else None,
                str(t.user_attrs.get(_LEGACY_PURPOSE, "explore")),
                chances=Chances.model_validate(chances) if chances is not None else None,
            )
        return None


def measurement_to_attr(m: Measurement) -> dict[str, Any]:
    def pct(p: Percentiles | None) -> dict[str, float] | None:
        return p.as_dict() if p else None

    return {
        "status": m.status,
        **{x.key: pct(m.percentiles(x.key)) for x in LATENCY_METRICS},
        "output_tokens_per_s_per_gpu": m.output_tokens_per_s_per_gpu,
        "requests": m.requests,
        "errors": m.errors,
        "reason": m.reason,
        "duration_s": m.duration_s,
        "concurrency": m.concurrency,
        **({"phase": m.phase} if m.phase is not None else {}),
    }


def measurement_from_attr(d: dict[str, Any]) -> Measurement:
    def pct(v: dict[str, float] | None) -> Percentiles | None:
        return Percentiles(v["p50"], v["p95"], v["p99"]) if v else None

    latency: dict[str, Any] = {x.key: pct(d.get(x.key)) for x in LATENCY_METRICS}
    return Measurement(
        status=d["status"],
        **latency,
        output_tokens_per_s_per_gpu=d.get("output_tokens_per_s_per_gpu"),
        requests=d.get("requests", 0),
        errors=d.get("errors", 0),
        reason=d.get("reason"),
        duration_s=d.get("duration_s", 0.0),
        concurrency=d.get("concurrency"),
        phase=d.get("phase"),
    )


@dataclass
class ExecutedTrial:
    number: int
    config: TrialConfig
    measurement: Measurement
    checks: list[Check]
    run: str | None = None
    purpose: str = "explore"
    chances: Chances | None = None
    setup: str | None = None


def _executed(t: FrozenTrial) -> ExecutedTrial | None:
    if ATTR_MEASUREMENT not in t.user_attrs or ATTR_CONFIG not in t.user_attrs:
        return None
    decision = Decision.of(t)
    return ExecutedTrial(
        t.number,
        config_of(t.user_attrs[ATTR_CONFIG]),
        measurement_from_attr(t.user_attrs[ATTR_MEASUREMENT]),
        checks_of(t.user_attrs.get(ATTR_CHECKS, [])),
        t.user_attrs.get(ATTR_RUN),
        decision.purpose if decision is not None else "explore",
        decision.chances if decision is not None else None,
        t.user_attrs.get(ATTR_SETUP),
    )


def executed_trials(study: Study, trials: list[FrozenTrial] | None = None) -> list[ExecutedTrial]:
    """Every trial that measured something (`trials`: the study's trials, when already read)."""
    if trials is None:
        trials = study.get_trials(deepcopy=False, states=DONE)
    return [e for t in trials if t.state in DONE and (e := _executed(t)) is not None]


@dataclass(frozen=True)
class Scope:
    """Whose `error` trials count as evidence, for a run that is not a worker of a shared
    study (there every worker's count): the run's own; and, unless `retry_failed`, those of
    earlier runs on the same set-up (`setup`: run.setup_fingerprint) in which something ran.
    So a resumed study keeps what could not run excluded; a re-run after the set-up changed
    (server command, image, replay table), after a run in which nothing ran (the set-up was
    broken, not the configurations), or with `--retry-failed` tries it afresh."""

    run: str
    setup: str | None = None
    retry_failed: bool = False

    def counts(self, e: ExecutedTrial, proven: frozenset[str | None]) -> bool:
        """Whether failed trial `e` counts (`proven`: the runs in which something ran)."""
        if e.run == self.run:
            return True
        return not self.retry_failed and e.setup == self.setup and e.run in proven


def current_trials(
    study: Study,
    run: Scope | str | None = None,
    extra: FrozenTrial | None = None,
    trials: list[FrozenTrial] | None = None,
) -> list[ExecutedTrial]:
    """The executed trials that count, in trial order (repeats of a configuration included):
    every measurement and out-of-memory (the study keeps everything), and the `error` trials
    of `run`'s scope (a run id: that run's; None: every run's, as for the workers of a shared
    study). `extra`: a trial just measured but not yet told."""
    done = executed_trials(study, trials)
    if extra is not None and (e := _executed(extra)) is not None:
        done = [t for t in done if t.number != e.number] + [e]
    if run is None:
        return sorted(done, key=lambda e: e.number)
    scope = Scope(run) if isinstance(run, str) else run
    proven = frozenset(e.run for e in done if e.measurement.status != "error")
    out = [e for e in done if e.measurement.status != "error" or scope.counts(e, proven)]
    return sorted(out, key=lambda e: e.number)


def configs_in_flight(
    trials: Sequence[FrozenTrial], exclude: int | None = None
) -> frozenset[TrialConfig]:
    """Configurations in flight: claimed by a running trial (its decision, or the driver's
    record) or waiting to be re-run."""
    out = set()
    for t in trials:
        if t.state not in CLAIMED or t.number == exclude:
            continue
        if ATTR_CONFIG in t.user_attrs:
            out.add(config_of(t.user_attrs[ATTR_CONFIG]))
        elif (d := t.system_attrs.get(DECISION_ATTR)) is not None and d.get("config"):
            out.add(config_of(d["config"]))
    return frozenset(out)


def worker_choosing(trials: Sequence[FrozenTrial], exclude: int | None = None) -> bool:
    """Whether some running trial has no configuration yet: a worker is choosing one, or is
    waiting for trials in flight before it can."""
    return any(
        t.state == TrialState.RUNNING
        and ATTR_CONFIG not in t.user_attrs
        and not (t.system_attrs.get(DECISION_ATTR) or {}).get("config")
        and t.number != exclude
        for t in trials
    )


def read(
    request: TuningRequest,
    study: Study,
    run: Scope | str | None = None,
    extra: FrozenTrial | None = None,
    *,
    in_flight: bool = True,
    transient_retries: int = 1,
) -> Evidence:
    """What the study knows: every current measurement and the configurations in flight.

    Args:
        request: The tuning request (its SLO judges each measurement).
        study: The study; its storage is read once.
        run: The run whose `error` trials count (None: every run's, as for shared workers).
        extra: A trial just measured but not yet told (it is not in flight).
        in_flight: Whether to read what is in flight (a report speaks of what was measured).
        transient_retries: SearchSettings.transient_retries.
    """
    trials = study.get_trials(deepcopy=False)  # one read of the storage
    runs: dict[TrialConfig, tuple[Measurement, ...]] = {}
    covers = []
    for e in current_trials(study, run, extra, trials):
        runs[e.config] = (*runs.get(e.config, ()), e.measurement)
        if e.purpose == "cover":
            covers.append(e.config)
    exclude = extra.number if extra else None
    flying = configs_in_flight(trials, exclude) if in_flight else frozenset()
    return Evidence(request, runs, flying, tuple(covers), transient_retries)


def failure_signature(m: Measurement) -> Signature | None:
    """The signature of a failed run (None: it did not fail with `error`)."""
    return signature(m.reason, m.phase) if m.status == "error" else None


def is_transient(m: Measurement) -> bool:
    """Whether `m` failed transiently (signatures.py): a load that timed out, a lost
    connection, an evicted pod; it says nothing about the configuration."""
    return (s := failure_signature(m)) is not None and s.is_transient


def counted(runs: Sequence[Measurement], retries: int) -> tuple[Measurement, ...]:
    """The runs of one configuration that count as evidence: a transient failure (a load that
    timed out, a reset connection, an evicted pod: signatures.py) says nothing about the
    configuration, so it counts only once the configuration failed transiently `retries` + 1
    times and never otherwise ran; until then the configuration is re-run."""
    transient = [m for m in runs if is_transient(m)]
    if not transient:
        return tuple(runs)
    others = tuple(m for m in runs if m not in transient)
    if others:
        return others
    return tuple(runs) if len(transient) > retries else ()


# ------------------------------------------------------------------ typical runs


def _typical(ps: list[Percentiles]) -> Percentiles:
    """Each percentile's geometric mean over runs (latency noise is multiplicative)."""
    return Percentiles(*(math.exp(statistics.fmean(math.log(max(p.get(q), 1e-9)) for p in ps))
                         for q in PERCENTILES))  # fmt: skip


def combine(runs: Sequence[Measurement]) -> Measurement:
    """What a configuration's repeats say together: its typical run.

    The mean tok/s/GPU and, per latency percentile, the geometric mean over the repeats: the
    estimate of what a typical run shows, which is what production sees and what the SLO is
    checked against (a repeat that misses a bound while another meets it is noise around that
    estimate; the planner measures such a configuration a third time). An out-of-memory in any
    repeat makes the configuration out of memory; runs that were not valid measurements are
    left out while a valid one exists."""
    if len(runs) == 1:
        return runs[0]
    failed = [m for m in runs if m.status == "oom"]
    ok = [m for m in runs if m.status == "ok"]
    if failed or not ok:
        return failed[-1] if failed else runs[-1]
    lat = {
        x.key: _typical([p for m in ok if (p := m.percentiles(x.key)) is not None])
        for x in LATENCY_METRICS
        if all(m.percentiles(x.key) is not None for m in ok)
    }
    seen = [m.concurrency for m in ok if m.concurrency is not None]
    return Measurement(
        status="ok",
        **lat,  # type: ignore[arg-type]
        output_tokens_per_s_per_gpu=statistics.fmean(
            m.output_tokens_per_s_per_gpu or 0.0 for m in ok
        ),
        requests=sum(m.requests for m in ok),
        errors=sum(m.errors for m in ok),
        duration_s=sum(m.duration_s for m in ok),
        concurrency=min(seen) if len(seen) == len(ok) else None,
    )


@dataclass(frozen=True)
class Evidence:
    """Everything measured or in flight, and what a decision reads of it, computed once.

    Built from the request (whose SLO judges each typical run) and the runs per configuration;
    every other field is derived at construction."""

    request: InitVar[TuningRequest]
    runs: Mapping[TrialConfig, tuple[Measurement, ...]] = field(default_factory=dict)
    in_flight: frozenset[TrialConfig] = frozenset()
    covers: tuple[TrialConfig, ...] = ()  # measured to cover a structure
    transient_retries: int = 1  # SearchSettings.transient_retries
    # -- derived
    measured: dict[TrialConfig, Measurement] = field(init=False)  # the typical runs
    # Configurations whose typical run failed with `error`, with the failure's signature.
    failures: dict[TrialConfig, Signature] = field(init=False)
    # Configurations whose only runs failed transiently: to be re-run before they count.
    retry: frozenset[TrialConfig] = field(init=False)
    checks: dict[TrialConfig, list[Check]] = field(init=False)  # of the typical runs
    counts: dict[TrialConfig, int] = field(init=False)  # runs per configuration that count
    executed: int = field(init=False)  # executed trials, repeats and transient failures included
    # The runs that count as evidence (transient failures awaiting their re-run left out): what
    # a decision is seeded by, so that a transient failure changes nothing but the budget.
    counted_runs: int = field(init=False)
    # Per configuration, whether each of its runs met every bound (None: not a valid run).
    runs_meet: dict[TrialConfig, tuple[bool | None, ...]] = field(init=False)
    # Per measured configuration, the least room its typical run leaves inside a bound.
    room: dict[TrialConfig, float] = field(init=False)
    feasible: dict[TrialConfig, Measurement] = field(init=False)
    # Per measured configuration, the objective of its typical run: tok/s/GPU x worth.
    values: dict[TrialConfig, float] = field(init=False)
    # The highest objective: mean tok/s/GPU x worth (ties: fewer GPUs).
    best: TrialConfig | None = field(init=False)
    best_tps: float = field(init=False)
    # What a decision from this evidence depends on (runs per configuration, what is in flight):
    # equal states decide alike, so a decision is reused.
    state: State = field(init=False)

    def __post_init__(self, request: TuningRequest) -> None:
        put = object.__setattr__
        kept = {c: counted(ms, self.transient_retries) for c, ms in self.runs.items()}
        measured = {c: combine(ms) for c, ms in kept.items() if ms}
        failures = {
            c: sig for c, m in measured.items() if (sig := failure_signature(m)) is not None
        }
        checks = {c: slo.check(request, m) for c, m in measured.items()}
        runs_meet = {
            c: tuple(all(ch.ok for ch in slo.check(request, m)) if m.status == "ok" else None
                     for m in ms)
            for c, ms in kept.items() if ms
        }  # fmt: skip
        room = {c: min((ch.headroom for ch in cs), default=math.inf) for c, cs in checks.items()}
        feasible = {
            c: m
            for c, m in measured.items()
            if m.status == "ok" and checks.get(c) and all(ch.ok for ch in checks[c])
        }
        # Its objective: tok/s/GPU x what that is worth on its pool (pools.worth: 1 on one pool).
        values = {
            c: (m.output_tokens_per_s_per_gpu or 0.0) * pools.worth(request, c)
            for c, m in measured.items()
        }
        best = max(feasible, key=lambda c: (values[c], -c.tp, c)) if feasible else None
        counts = {c: len(ms) for c, ms in kept.items() if ms}
        put(self, "measured", measured)
        put(self, "failures", failures)
        put(self, "retry", frozenset(c for c, ms in kept.items() if not ms))
        put(self, "checks", checks)
        put(self, "counts", counts)
        put(self, "executed", sum(len(ms) for ms in self.runs.values()))
        put(self, "counted_runs", sum(counts.values()))
        put(self, "runs_meet", runs_meet)
        put(self, "room", room)
        put(self, "feasible", feasible)
        put(self, "values", values)
        put(self, "best", best)
        # The best's objective: its tok/s/GPU, x its pool's worth where there are several.
        put(self, "best_tps", values[best] if best else 0.0)
        put(self, "state", (frozenset(counts.items()), self.in_flight, self.executed))


# ------------------------------------------------------------------ valid measurements


def decode_bound(model: ModelArch, gpu: Gpu, cfg: TrialConfig) -> float:
    """The most output tok/s/GPU `cfg` can physically make: every decode step streams the
    weights once (the layers' weights of the experts a token touches, and the LM head; the input
    embedding is a lookup), so a replica running B sequences makes at most
    B x bandwidth / (weight bytes) output tokens per second per GPU, whatever else it does."""
    streamed = (model.active_params - model.embedding_params) * QUANTIZATIONS[
        cfg.quantization
    ].weight_bytes
    return cfg.max_batch_size * gpu.hbm_bandwidth_gbs * 1e9 / max(streamed, 1.0)


def judge(
    m: Measurement,
    cfg: TrialConfig,
    *,
    model: ModelArch,
    gpu: Gpu,
    output_tokens: int,
    margin: float,
    short_output: float,
    speedup: float = 1.0,
) -> Measurement:
    """`m`, or the same measurement marked `invalid` with why it cannot be true.

    Args:
        m: What the trial measured.
        cfg: The configuration it ran.
        model: The model served (its weight bytes per token).
        gpu: The GPU (its peak memory bandwidth).
        output_tokens: The requested output length per request.
        margin: How far above the decode bound a measurement may be (datasheet rounding).
        short_output: How far below the requested length the mean output may fall.
        speedup: How much faster than the GPU the backend's clock runs (a time-scaled
            simulated server); the bound scales with it.
    """
    if m.status != "ok":
        return m
    tps = m.output_tokens_per_s_per_gpu or 0.0
    bound = decode_bound(model, gpu, cfg) * speedup
    if tps > bound * margin:
        return m.invalid(
            f"{tps:.0f} tok/s/GPU is {tps / bound:.1f}x what streaming the weights once per "
            f"decode step allows ({bound:.0f} at batch {cfg.max_batch_size} and "
            f"{gpu.hbm_bandwidth_gbs:.0f} GB/s): not a valid measurement (did generation stop "
            "early?)"
        )
    mean = m.output_tokens_mean
    if mean is not None and output_tokens > 0 and mean < output_tokens * (1 - short_output):
        return m.invalid(
            f"responses averaged {mean:.0f} output tokens of the {output_tokens} requested "
            f"({1 - mean / output_tokens:.0%} short: the model stopped early): the trial "
            "measured a shorter workload"
        )
    return m
