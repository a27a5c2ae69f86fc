"""Tune: request -> search space -> memory pruning -> Optuna search -> report.

`tune()` is what both `infertune tune` (locally) and the operator's tuner Job call. It prints
nothing: whoever runs it watches through its hooks (`on_start`, `on_phase`, `on_trial`; the
CLI's progress bar is one).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import optuna

from infertune_tuner import __version__, defaults, slo
from infertune_tuner.backends import make_backend
from infertune_tuner.backends.base import BenchmarkBackend, OnPhase
from infertune_tuner.config import TrialConfig
from infertune_tuner.journal import lock_study, storage_fault
from infertune_tuner.measurement import Measurement
from infertune_tuner.metrics import LATENCY_METRICS, OBJECTIVE, latency_metric
from infertune_tuner.packing import GpuSet, slots
from infertune_tuner.perfmodel.latency import Prediction, predict
from infertune_tuner.request import TuningRequest
from infertune_tuner.result import (
    Best,
    ConfigOut,
    Excluded,
    Metrics,
    NearMiss,
    Predicted,
    Report,
    SloCheck,
    Trial,
    TrialState,
)
from infertune_tuner.search.classify import Exclusion
from infertune_tuner.search.driver import Search, SearchOutcome, study_name
from infertune_tuner.search.evidence import Known
from infertune_tuner.search.planner import Planner
from infertune_tuner.search.records import current_trials, executed_trials, known_from
from infertune_tuner.search.settings import SearchSettings
from infertune_tuner.search.untried import untried_groups
from infertune_tuner.space import SearchSpace, build_space
from infertune_tuner.stop import INTERRUPTED, StopKind, StopReason
from infertune_tuner.storage import ClaimLock, mask_url, open_storage

log = logging.getLogger(__name__)
REPORTED = "reported_at"  # study attribute: the executed trials when the report was written
OnTrial = Callable[[TrialConfig, Measurement, list[SloCheck], Known], None]


@dataclass(frozen=True)
class StudyStart:
    """What `on_start` learns before the first trial: the study and what it already holds."""

    study: str
    resumed_trials: int  # executed trials an earlier run left in the study (it resumes them)
    max_trials: int
    notes: tuple[str, ...] = ()  # repairs made to the study's storage before it opened


def prior_predictions(request: TuningRequest, space: SearchSpace) -> dict[TrialConfig, Prediction]:
    model, gpu, work = request.resolve_model(), request.resolve_gpu(), request.work
    # Keyed by the configuration searched; predicted as the server runs it (space.effective).
    return {c: predict(model, gpu, space.effective(c), work) for c in space.configs}


def _metrics(m: Measurement) -> Metrics | None:
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


def build_report(
    request: TuningRequest,
    space: SearchSpace,
    priors: dict[TrialConfig, Prediction],
    study: optuna.Study,
    *,
    backend: str,
    stop: StopReason,
    duration_s: float,
    run: str | None = None,
    planner: Planner | None = None,
) -> Report:
    planner = planner or Planner(request, space, priors, seed=request.tuning.seed or 0)
    executed = current_trials(study, run)
    known = known_from(request, study, run)
    known.in_flight.clear()
    trials: list[Trial] = []
    resumed = 0  # trials an earlier run of the same study executed
    for e in executed:
        if run is not None and e.run != run:
            resumed += 1
        p = priors.get(e.config)
        trials.append(
            Trial(
                number=e.number,
                config=ConfigOut.of(e.config),
                state=_state(e.measurement),
                executed=True,
                slo_ok=all(c.ok for c in e.checks) if e.checks else None,
                metrics=_metrics(e.measurement),
                predicted=Predicted.of(p) if p else None,
                reason=e.measurement.reason,
                slo_checks=e.checks,
                duration_s=round(e.measurement.duration_s, 3) or None,
                purpose=e.purpose,
            )
        )
    assessment = planner.assess(known, include_in_flight=False)
    number = max((t.number for t in trials), default=-1) + 1
    for cfg in space.configs:
        if cfg in known.measured:
            continue
        p = priors[cfg]
        ruling = planner.ruling(cfg, known)
        if ruling is None or ruling.exclusion == Exclusion.TWIN:
            continue  # a candidate the search did not need, or covered: see the untried groups
        trials.append(
            Trial(
                number=number,
                config=ConfigOut.of(cfg),
                state="infeasible_predicted",
                executed=False,
                predicted=Predicted.of(p),
                reason=ruling.text(),
            )
        )
        number += 1

    best = None
    top = known.best()
    if top is not None:
        metrics = _metrics(known.measured[top])
        assert metrics is not None
        last = max(e.number for e in executed if e.config == top)
        best = Best(
            config=ConfigOut.of(top),
            metrics=metrics,
            trial=last,
            repeats=known.repeats(top),
            noise=_noise(known.runs[top], request),
        )
    misses: list[NearMiss] = []
    if best is None:
        measured = [
            (c, m) for c, m in known.measured.items() if _metrics(m) and known.checks.get(c)
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
                )
            )
    converged = stop.kind == StopKind.CONVERGED
    uncovered = (
        [g.structure.label() for g in planner.gaps(known, assessment)]
        if top is not None and not converged and request.tuning.sampler == "auto"
        else []
    )
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
        best=best,
        executed_trials=len(executed),
        resumed_trials=resumed,
        nearest_misses=misses,
        stop=stop.kind,
        stopped_reason=str(stop),
        # A structure that could still hold the optimum was never measured (the budget or the
        # clock ran out first): the posterior's number would rest on the model alone there.
        confidence=None if uncovered else round(assessment.confidence, 4),
        uncovered=uncovered,
        untried=untried_groups(planner, known, assessment, converged=converged),
        duration_s=round(duration_s, 3),
        generated_at=datetime.now(UTC).isoformat(timespec="seconds"),
        infertune_version=__version__,
    )


def tune(
    request: TuningRequest,
    *,
    backend: str | BenchmarkBackend = defaults.LOCAL_BACKEND,
    out_dir: Path,
    server_command: str | None = None,
    backend_factory: Callable[[int], BenchmarkBackend] | None = None,
    on_start: Callable[[StudyStart], None] | None = None,
    on_phase: OnPhase | None = None,
    on_trial: OnTrial | None = None,
    gpus: int | None = None,
    settings: SearchSettings | None = None,
) -> Report | None:
    """Run (or resume) the study for `request` and return the report (not yet written).

    On a shared (RDB) storage this process is one worker of the study among any others given
    the same request: it returns the report only when it is the worker that sees the study end
    (no trial running anywhere, and no report yet for what the study holds), else None.

    Args:
        request: What to tune.
        backend: A backend name (``simulated``, ``replay:PATH``, ``triton`` ...) or an instance.
        out_dir: Where the study journal (and the triton backend's trial folders) live; a
            re-run with the same folder resumes the study.
        server_command: The triton backend's server command template (tests, simserver).
        backend_factory: Builds the backend of worker ``i`` (overrides ``backend``).
        on_start: Called once the study is open, before the first trial.
        on_phase: Called as a long trial moves on (starting server, loading model, warm-up,
            measuring).
        on_trial: Called after every executed trial with what is known so far.
        gpus: The GPUs this worker holds (triton backend): trials are packed into them, as
            many at once as the smallest TP of the space fits (see packing.py).
        settings: The search's constants (default: `SearchSettings()`, each with its evidence).

    Returns:
        The report: every trial, the best feasible configuration (or the nearest misses) and
        why the search stopped; None for a worker that leaves the report to another.
    """
    started = time.monotonic()
    model, gpu = request.resolve_model(), request.resolve_gpu()
    backend_name = backend if isinstance(backend, str) else backend.name
    space = build_space(request, model, gpu, backend_name)
    priors = prior_predictions(request, space)
    seed = request.tuning.seed if request.tuning.seed is not None else defaults.SEED

    workers = request.tuning.parallelism
    shared = bool(request.tuning.storage)
    # Workers of a shared study may share an output folder: their trial folders must not clash.
    tag = f"{uuid.uuid4().hex[:8]}-" if shared else ""
    gpu_set = GpuSet(gpus) if gpus and backend_name == "triton" else None
    if gpu_set is not None:
        workers = slots(gpu_set.gpus, space.tensor_parallel)
    if backend_factory is None:
        if isinstance(backend, str):
            spec = backend

            def backend_factory(i: int) -> BenchmarkBackend:
                return make_backend(
                    spec, request, seed=seed, server_command=server_command,
                    workdir=out_dir / f"worker-{tag}{i}", on_phase=on_phase, gpus=gpu_set,
                )  # fmt: skip
        else:
            instance = backend
            workers = 1  # one backend instance cannot serve several worker threads

            def backend_factory(i: int) -> BenchmarkBackend:
                return instance

    if backend_name == "triton" and workers > 1 and gpu_set is None:
        # Real trials own the GPUs of their pod: several workers in one process would fight over
        # them. Parallel real tuning = several tuner pods (workers) on one shared RDB study.
        log.warning("triton backend: running 1 worker (parallelism %d needs one pod each)", workers)
        workers = 1
    name = study_name(request, backend_name)
    lock = None if shared else lock_study(out_dir)  # one run per journal; RDB: workers join
    backends: list[BenchmarkBackend] = []
    try:
        storage = open_storage(request.tuning.storage, out_dir)
        backends.extend(backend_factory(i) for i in range(workers))
        study = optuna.create_study(
            study_name=name, storage=storage, direction="maximize", load_if_exists=True
        )
        deadline = (
            started + request.tuning.timeout_minutes * 60
            if request.tuning.timeout_minutes
            else None
        )
        search = Search(
            request, space, priors, study, seed=seed, on_trial=on_trial, deadline=deadline,
            lock=ClaimLock(storage, name), shared=shared, settings=settings,
        )  # fmt: skip
        if not shared:  # no other process works on a journal: what still runs was interrupted
            search.recover_interrupted()
        if on_start is not None:
            notes = tuple(lock.notes) if lock else ()
            on_start(
                StudyStart(study.study_name, len(executed_trials(study)), search.max_trials, notes)
            )
        try:
            outcome = search.run(backends)
        except KeyboardInterrupt:  # Ctrl-C: the report of the trials done, then exit 130
            outcome = SearchOutcome(INTERRUPTED, study)
        except Exception as exc:
            if (fault := storage_fault(exc)) is None:
                raise
            raise fault from None  # the disk, not the search: the caller says which file
        if shared and not _last_worker(search):
            return None
        return build_report(
            request, space, priors, outcome.study, backend=backend_name,
            stop=outcome.stop, duration_s=time.monotonic() - started,
            run=search.scope, planner=search.planner,
        )  # fmt: skip
    finally:
        for b in backends:
            b.close()
        if lock is not None:
            lock.release()


def _last_worker(search: Search) -> bool:
    """Whether this worker writes the report: no trial runs anywhere (a dead worker's trial
    is failed first) and no report was written yet for what the study now holds."""
    with search.lock():
        if search.others_running():
            return False
        executed = len(executed_trials(search.study))
        if search.study.user_attrs.get(REPORTED) == executed:
            return False
        search.study.set_user_attr(REPORTED, executed)
        return True


def write_report(report: Report, out_dir: Path) -> list[Path]:
    """Write report.json, report.md and report.html into out_dir."""
    from infertune_tuner.report import render_html, render_markdown

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "report.json", out_dir / "report.md", out_dir / "report.html"]
    paths[0].write_text(report.to_json() + "\n", encoding="utf-8")
    paths[1].write_text(render_markdown(report), encoding="utf-8")
    paths[2].write_text(render_html(report), encoding="utf-8")
    return paths
