"""The tuning report (`report.json`, schema `infertune.report/v1`) as pydantic models.

The operator reads it from the report ConfigMap; `infertune report` renders it; tests and tools
depend on the field names below.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag, TypeAdapter, model_validator

from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import TrialPhase
from infertune_tuner.metrics import LATENCY_METRICS, OBJECTIVE, latency_metric
from infertune_tuner.perfmodel.factors import DEFAULT_STACK
from infertune_tuner.perfmodel.latency import Percentiles, Prediction
from infertune_tuner.request import TuningRequest
from infertune_tuner.schema import Record, with_fields
from infertune_tuner.stop import StopKind

REPORT_SCHEMA = "infertune.report/v1"
# invalid: measured, but physically implausible or a shorter workload (search/evidence.py, judge);
# interrupted: started, but stopped (Ctrl-C, its worker died) before it measured anything
TrialState = Literal["complete", "infeasible_predicted", "oom", "failed", "invalid", "interrupted"]


class ConfigOut(Record):
    tp: int
    max_batch_size: int
    quantization: str
    kv_cache_dtype: str
    # The pool it ran on, where the request lists several (left out of the JSON on one pool).
    gpu: str | None = Field(default=None, exclude_if=lambda v: v is None)

    @classmethod
    def of(cls, cfg: TrialConfig) -> ConfigOut:
        return cls(**cfg.as_dict())

    def to_config(self) -> TrialConfig:
        return TrialConfig(
            self.tp, self.max_batch_size, self.quantization, self.kv_cache_dtype, self.gpu or ""
        )

    def label(self) -> str:
        return self.to_config().label()


class PercentilesOut(Record):
    p50: float
    p95: float
    p99: float

    @classmethod
    def of(cls, p: Percentiles) -> PercentilesOut:
        return cls(p50=round(p.p50, 3), p95=round(p.p95, 3), p99=round(p.p99, 3))

    def get(self, name: str) -> float:
        return float(getattr(self, name))


@with_fields({m.key: (PercentilesOut, ...) for m in LATENCY_METRICS})
class Metrics(Record):
    """Measured (or predicted) metrics of one configuration: one PercentilesOut field per
    latency metric of the registry (``ttft_ms``, ``itl_ms``, ``e2e_ms``) and the objective."""

    output_tokens_per_s_per_gpu: float

    @classmethod
    def latency_fields(cls, source: object) -> dict[str, PercentilesOut]:
        """Each registered metric's Percentiles on ``source`` (a Measurement, a Prediction)."""
        return {m.key: PercentilesOut.of(m.of(source)) for m in LATENCY_METRICS}

    def percentiles(self, metric: str) -> PercentilesOut:
        value: PercentilesOut = latency_metric(metric).of(self)
        return value

    def latency(self, metric: str, percentile: str) -> float:
        return self.percentiles(metric).get(percentile)


class Predicted(Metrics):
    """What the performance model predicted: the measured metrics' shape plus the memory fit."""

    fits: bool
    weights_gib_per_gpu: float
    kv_cache_gib_per_gpu: float
    max_concurrent_sequences: int

    @classmethod
    def of(cls, p: Prediction) -> Predicted:
        return cls(
            fits=p.fits,
            weights_gib_per_gpu=round(p.memory.weights_gib_per_gpu, 3),
            kv_cache_gib_per_gpu=round(p.memory.kv_cache_gib_per_gpu, 3),
            max_concurrent_sequences=p.memory.max_concurrent_sequences,
            **cls.latency_fields(p),
            output_tokens_per_s_per_gpu=round(p.output_tokens_per_s_per_gpu, 3),
        )


class SloCheck(Record):
    """One latency bound checked against a trial's measurement."""

    bound: str  # "E2E p95 <= 25600 ms"
    metric: str
    percentile: str
    limit_ms: float
    value_ms: float
    ok: bool

    @property
    def headroom(self) -> float:
        """The room left, relative to the bound: (limit - value) / limit (< 0: missed)."""
        return (self.limit_ms - self.value_ms) / self.limit_ms

    @property
    def log_room(self) -> float:
        return math.log(self.limit_ms / max(self.value_ms, 1e-9))

    @property
    def violation(self) -> float:
        """Optuna's constraint value: <= 0 means met (the relative excess over the bound)."""
        return self.value_ms / self.limit_ms - 1.0

    @property
    def constraint_key(self) -> str:
        return f"{self.metric}/{self.percentile}"

    def miss(self) -> str:
        """How it was missed, for a person: "E2E p95 28000 ms > 25600 ms (+9%)"."""
        label = latency_metric(self.metric).label
        return (
            f"{label} {self.percentile} {self.value_ms:.0f} ms > {self.limit_ms:g} ms "
            f"(+{-self.headroom:.0%})"
        )


class FloorCheck(Record):
    """The tok/s/GPU floor (`spec.slo.minOutputTokensPerSecPerGpu`) checked against a trial."""

    kind: Literal["floor"] = "floor"
    bound: str  # "tok/s/GPU >= 400"
    limit_tps: float
    value_tps: float
    ok: bool

    @model_validator(mode="before")
    @classmethod
    def _recorded_before_it_had_a_type(cls, data: Any) -> Any:
        """Studies and reports of earlier versions kept the floor as a latency-shaped check
        (its tok/s/GPU in `limit_ms` / `value_ms`): read them as the floor they were."""
        if isinstance(data, dict) and "limit_ms" in data:
            data = {k: v for k, v in data.items() if k not in ("metric", "percentile")}
            data["limit_tps"], data["value_tps"] = data.pop("limit_ms"), data.pop("value_ms")
            data["kind"] = "floor"
        return data

    @property
    def headroom(self) -> float:
        """The room left, relative to the floor: (value - limit) / limit (< 0: missed)."""
        return (self.value_tps - self.limit_tps) / self.limit_tps

    @property
    def log_room(self) -> float:
        return math.log(max(self.value_tps, 1e-9) / self.limit_tps)

    @property
    def violation(self) -> float:
        return self.limit_tps / max(self.value_tps, 1e-9) - 1.0

    @property
    def constraint_key(self) -> str:
        return f"{OBJECTIVE.key}/mean"

    def miss(self) -> str:
        return f"{OBJECTIVE.label} {self.value_tps:.0f} < {self.limit_tps:g}"


def _check_kind(value: Any) -> str:
    if isinstance(value, dict):
        floor = value.get("kind") == "floor" or value.get("metric") == OBJECTIVE.key
        return "floor" if floor else "latency"
    return "floor" if isinstance(value, FloorCheck) else "latency"


# A check of one SLO bound: a latency bound, or the tok/s/GPU floor.
Check = Annotated[
    Annotated[SloCheck, Tag("latency")] | Annotated[FloorCheck, Tag("floor")],
    Discriminator(_check_kind),
]
_CHECKS: TypeAdapter[list[Check]] = TypeAdapter(list[Check])


def checks_of(data: Any) -> list[Check]:
    """SLO checks as recorded (a trial's attribute, a report's JSON), each as its type."""
    return _CHECKS.validate_python(data)


class Headroom(Record):
    """How far the chosen configuration's typical run sits inside one SLO bound, weighed against
    the pool's run-to-run noise (slo.room): what a deployment of it can expect of the bound."""

    bound: str  # "TTFT p95 <= 1500 ms", or the tok/s/GPU floor
    metric: str  # as SloCheck: a latency metric's key, or the objective's for the floor
    percentile: str
    value_ms: float  # the typical run's value (for the floor: its tok/s/GPU)
    limit_ms: float
    headroom: float  # relative room: (limit - value) / limit; for the floor (value - limit) / limit
    noise: float  # run-to-run noise of one run of the quantity (log sd; learned from repeats)
    p_meets: float  # P(a fresh run of the configuration meets the bound)
    # The room is at least two run-to-run SDs (slo.SETTLED_SDS): a fresh run meets it >= 97.7 %.
    settled: bool


class Chances(Record):
    """What the search believed of a configuration when it chose to measure it: its posterior
    given the trials before (search/planner.py). The report sets them beside what the trial
    measured; benchmarks/tuner_efficiency.py checks over many runs that they come true as often
    as stated (a confidence worth printing rests on chances that do)."""

    p_success: float  # P(it fits and meets every SLO bound)
    # P(it also beats the incumbent's true tok/s/GPU by more than the improvement the search
    # asks for, 2 %); while nothing had met the SLO, P(it succeeds).
    p_beat: float
    # The best measured so far (None: nothing met the SLO); with parallel workers, possibly a
    # configuration in flight, believed at its posterior mean (search/posterior.py).
    incumbent: ConfigOut | None = None
    # The incumbent's measured tok/s/GPU (mean over its runs) times 1 + that improvement.
    to_beat_tps: float
    estimate_tps: float  # the posterior's estimate of its tok/s/GPU (median)
    confidence: float | None = None  # the run's confidence the optimum was found, before it


class Trial(Record):
    number: int
    config: ConfigOut
    state: TrialState
    executed: bool
    slo_ok: bool | None = None
    metrics: Metrics | None = None
    predicted: Predicted | None = None
    reason: str | None = None
    phase: TrialPhase | None = None  # the phase a failed trial died in (None: unknown)
    slo_checks: list[Check] = Field(default_factory=list)
    duration_s: float | None = None
    # probe | explore | cover | confirm (report/view.py PURPOSES says what each means)
    purpose: str | None = None
    chances: Chances | None = None  # None: not chosen by `auto` (another sampler, a retry)


class MeasuredConfig(Record):
    """One measured configuration, its repeats combined into the typical run (the mean
    tok/s/GPU and each latency percentile's geometric mean: what the SLO was checked against)."""

    config: ConfigOut
    trials: list[int]  # the executed trials that measured it
    state: TrialState  # complete | oom | failed | invalid
    slo_ok: bool | None = None
    metrics: Metrics | None = None
    # The most requests seen decoding at once (below the max batch: the KV cache capped it).
    concurrency: float | None = None


class Best(Record):
    """The chosen configuration. With repeats, `metrics` holds the typical run: the mean
    tok/s/GPU and the geometric mean of every latency percentile (what the SLO was checked
    against; search/evidence.py `combine`)."""

    config: ConfigOut
    metrics: Metrics
    trial: int
    repeats: int = 1
    # Relative spread (max - min) / mean between repeats, per quantity ("tok/s/GPU", "E2E p95").
    noise: dict[str, float] = Field(default_factory=dict)
    # Per SLO bound (and the tok/s/GPU floor), the room the typical run leaves and what it is
    # worth against the pool's run-to-run noise.
    headroom: list[Headroom] = Field(default_factory=list)
    # Where the request lists several pools: the pool it runs on, and what a million output
    # tokens cost there (its price per GPU-hour / its tok/s/GPU); left out on one pool.
    gpu: str | None = Field(default=None, exclude_if=lambda v: v is None)
    cost_per_million_output_tokens: float | None = Field(
        default=None, exclude_if=lambda v: v is None
    )


PoolVerdict = Literal["chosen", "costlier", "missed_slo", "ruled_out", "not_reached", "excluded"]


class PoolOutcome(Record):
    """One pool of a several-pool request: its best measured configuration and why it won or
    lost (pools.py: the cheapest per million output tokens that meets the SLO wins)."""

    product: str
    price_per_gpu_hour: float
    verdict: PoolVerdict
    reason: str  # for a person: "costs 38 % more per token than ...", "never measured: ..."
    executed_trials: int
    best: ConfigOut | None = None  # its best SLO-meeting measured configuration
    output_tokens_per_s_per_gpu: float | None = None
    cost_per_million_output_tokens: float | None = None
    # Posterior P(one of its untried configurations beats the chosen one by more than 2 %).
    p_beat: float | None = None


UntriedKind = Literal["memory", "neighbour", "twin", "failed", "fit", "slo", "posterior", "stopped"]


class FailedStructure(Record):
    """Trials that failed, by what they share (search/failures.py): a structure whose failures
    share one signature (not tried further), an isolated failure, or a transient one (re-run)."""

    kind: Literal["structure", "isolated", "transient"]
    structure: str  # "w4a16_awq", "TP8", "fp8 + KV fp8"; a configuration label otherwise
    signature: str  # the phase and the normalised first error line (signatures.py)
    trials: list[int]  # the trials that failed
    excluded: int = 0  # untried configurations not tried further because of it
    probability: float | None = None  # that one structure explains these failures
    # Values of the space (dimension and value) none of whose trials ran: "quantization=w4a16_awq".
    never_ran: list[str] = Field(default_factory=list)


class UntriedConfig(Record):
    config: str  # label, e.g. tp8/bs64/fp8/kv-auto
    detail: str | None = None
    p_beat: float | None = None  # posterior P(fits, meets the SLO and beats the best by > 2 %)


class UntriedGroup(Record):
    """Configurations of the space that were never measured, grouped by why."""

    kind: UntriedKind
    reason: str
    count: int
    by_tp: dict[str, int]
    max_p_beat: float | None = None
    configs: list[UntriedConfig] = Field(default_factory=list)


class Excluded(Record):
    """A value of the search space left out before any prediction (GPU lacks it, accuracy...)."""

    field: str
    value: str
    reason: str


class NearTie(Record):
    """A measured, SLO-meeting configuration within measurement noise of the best: the
    posterior gives it a real chance of being more than 2 % faster (what lowers the confidence
    below 1 - P(an untried configuration beats the best))."""

    config: ConfigOut
    output_tokens_per_s_per_gpu: float
    p_beat: float


class NearMiss(Record):
    trial: int
    config: ConfigOut
    output_tokens_per_s_per_gpu: float
    violations: list[str]  # each missed bound, for a person (`missed` says it for programs)
    missed: list[Check] = Field(default_factory=list)  # the typical run's missed checks


class Report(Record):
    schema_: Literal["infertune.report/v1"] = Field(default="infertune.report/v1", alias="schema")
    request: dict[str, Any]
    backend: str
    sampler: str
    # The stack whose efficiency factors the prior's predictions used (run.prior_predictions
    # predicts with the default stack: the TensorRT-LLM infertune deploys).
    prior_stack: str = DEFAULT_STACK
    space_size: int
    excluded: list[Excluded] = Field(default_factory=list)
    trials: list[Trial]
    # Every measured configuration once (the plot's points, a replay table's rows).
    measured: list[MeasuredConfig] = Field(default_factory=list)
    best: Best | None
    executed_trials: int
    resumed_trials: int = 0  # of the executed ones, how many an earlier run left in the study
    nearest_misses: list[NearMiss] = Field(default_factory=list)
    # Why the search stopped: its kind (what programs read) and the sentence (what people read).
    stop: StopKind | None = None
    stopped_reason: str
    # Posterior probability that no untried configuration beats the best by more than 2 %; None
    # when it is not claimed (`uncovered` structures were never measured near their best).
    confidence: float | None = None
    # P(an untried configuration beats the best by more than 2 %): the search's stop rule; the
    # rest of 1 - confidence is `near_ties` (measured configurations within noise of the best).
    p_untried_beats: float | None = None
    near_ties: list[NearTie] = Field(default_factory=list)
    # TP sizes / quantizations that could still hold the optimum, never measured near their
    # predicted best (search/planner.py, gaps): the search stopped (budget, timeout) before them.
    uncovered: list[str] = Field(default_factory=list)
    untried: list[UntriedGroup] = Field(default_factory=list)
    # What could not run, and why (search/failures.py): the confidence covers the rest.
    could_not_run: list[FailedStructure] = Field(default_factory=list)
    # Per pool where the request lists several (empty, and left out, on one pool).
    pools: list[PoolOutcome] = Field(default_factory=list, exclude_if=lambda v: not v)
    duration_s: float
    generated_at: str
    infertune_version: str

    model_config = ConfigDict(populate_by_name=True)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)

    @property
    def feasible(self) -> bool:
        return self.best is not None

    def parsed_request(self) -> TuningRequest:
        return TuningRequest.model_validate(self.request)
