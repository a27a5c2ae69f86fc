"""What the study holds about each trial, and reading it back.

Every executed trial carries its configuration, measurement and SLO checks as user attributes;
a trial *in flight* is one that a worker (thread or process) has claimed: RUNNING with its
configuration recorded, or WAITING to be re-run after its worker died.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement
from infertune_tuner.metrics import LATENCY_METRICS
from infertune_tuner.perfmodel.latency import Percentiles
from infertune_tuner.request import TuningRequest
from infertune_tuner.result import Chances, SloCheck
from infertune_tuner.search.evidence import Known

ATTR_CONFIG = "config"
ATTR_MEASUREMENT = "measurement"
ATTR_CHECKS = "slo_checks"
ATTR_CONSTRAINTS = "constraints"
ATTR_SKIP = "skipped"
ATTR_RUN = "run"
ATTR_PURPOSE = "purpose"
ATTR_CHANCES = "chances"  # what the posterior gave the configuration when `auto` chose it
CLAIMED = (TrialState.RUNNING, TrialState.WAITING)


def config_of(params: Mapping[str, Any]) -> TrialConfig:
    """The configuration a trial's parameters (or its recorded configuration) stand for."""
    return TrialConfig(
        int(params["tp"]),
        int(params["max_batch_size"]),
        str(params["quantization"]),
        str(params["kv_cache_dtype"]),
    )


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
    )


@dataclass
class ExecutedTrial:
    number: int
    config: TrialConfig
    measurement: Measurement
    checks: list[SloCheck]
    run: str | None = None
    purpose: str = "explore"
    chances: Chances | None = None


def chances_of(t: FrozenTrial) -> Chances | None:
    """The chances recorded on a trial when `auto` chose it (None: another sampler chose it)."""
    recorded = t.user_attrs.get(ATTR_CHANCES)
    return Chances.model_validate(recorded) if recorded is not None else None


def _executed(t: FrozenTrial) -> ExecutedTrial | None:
    if ATTR_MEASUREMENT not in t.user_attrs or ATTR_CONFIG not in t.user_attrs:
        return None
    return ExecutedTrial(
        t.number,
        config_of(t.user_attrs[ATTR_CONFIG]),
        measurement_from_attr(t.user_attrs[ATTR_MEASUREMENT]),
        [SloCheck.model_validate(c) for c in t.user_attrs.get(ATTR_CHECKS, [])],
        t.user_attrs.get(ATTR_RUN),
        t.user_attrs.get(ATTR_PURPOSE, "explore"),
        chances_of(t),
    )


DONE = (TrialState.COMPLETE, TrialState.FAIL)


def executed_trials(study: Study, trials: list[FrozenTrial] | None = None) -> list[ExecutedTrial]:
    """Every trial that measured something (`trials`: the study's trials, when already read)."""
    if trials is None:
        trials = study.get_trials(deepcopy=False, states=DONE)
    return [e for t in trials if t.state in DONE and (e := _executed(t)) is not None]


def current_trials(
    study: Study,
    run: str | None = None,
    extra: FrozenTrial | None = None,
    trials: list[FrozenTrial] | None = None,
) -> list[ExecutedTrial]:
    """The executed trials that count, in trial order (repeats of a configuration included).

    Trials that failed with `error` in an *earlier* run are left out, so a re-run after fixing
    the set-up (server command, checkpoint) retries them; OOMs and measurements are kept for
    good (the study keeps everything). `run` None: every trial counts (workers of a shared
    study). `extra`: a trial just measured but not yet told."""
    done = executed_trials(study, trials)
    if extra is not None and (e := _executed(extra)) is not None:
        done = [t for t in done if t.number != e.number] + [e]
    out = [
        e
        for e in done
        if not (run is not None and e.measurement.status == "error" and e.run != run)
    ]
    return sorted(out, key=lambda e: e.number)


def claimed(
    trials: list[FrozenTrial],
    exclude: int | None = None,
    decided: Mapping[int, TrialConfig] | None = None,
) -> set[TrialConfig]:
    """Configurations in flight: claimed by a running trial or waiting to be re-run.

    `decided`: what a sampler of this process chose for trials by number. A running trial's
    choice is in flight from the moment it is made, before its objective records it."""
    decided = decided or {}
    out = set()
    for t in trials:
        if t.state not in CLAIMED or t.number == exclude:
            continue
        if ATTR_CONFIG in t.user_attrs:
            out.add(config_of(t.user_attrs[ATTR_CONFIG]))
        elif t.number in decided:
            out.add(decided[t.number])
    return out


def known_from(
    request: TuningRequest,
    study: Study,
    run: str | None = None,
    extra: FrozenTrial | None = None,
    decided: Mapping[int, TrialConfig] | None = None,
) -> Known:
    """What the study knows: every current measurement and the configurations in flight.

    Args:
        request: The tuning request (its SLO judges each measurement).
        study: The study; its storage is read once.
        run: The run whose `error` trials count (None: every run's, as for shared workers).
        extra: A trial just measured but not yet told (it is not in flight).
        decided: Choices a sampler of this process made for running trials (`claimed`).
    """
    trials = study.get_trials(deepcopy=False)  # one read of the storage
    runs: dict[TrialConfig, list[Measurement]] = {}
    covers = []
    for e in current_trials(study, run, extra, trials):
        runs.setdefault(e.config, []).append(e.measurement)
        if e.purpose == "cover":
            covers.append(e.config)
    exclude = extra.number if extra else None
    return Known.build(request, runs, claimed(trials, exclude, decided), covers)


def deciding(trials: list[FrozenTrial], exclude: int | None = None) -> bool:
    """Whether some running trial has no configuration yet: a worker is choosing one, or is
    waiting for trials in flight before it can."""
    return any(
        t.state == TrialState.RUNNING and ATTR_CONFIG not in t.user_attrs and t.number != exclude
        for t in trials
    )
